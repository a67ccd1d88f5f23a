"""Capacity, utilisation and headroom of a pool (pure).

`pool_capacity(pool, knee, settings, power_watts, sessions)` returns a `Capacity` (monitor/model/)
whose fields are the catalogue's capacity metrics without the `headroom_` prefix (the exporter,
monitor/export/samples.py, turns them into samples); `compute_capacity(...)` is the same as the
plain dict of the JSON document (`Capacity.as_dict()`), for callers that want plain data (the
digest). Fields and the metric each becomes (scenario / limit fields carry the metric's label):

    knee_requests               headroom_knee_requests{pool}
    knee_kv_tokens              headroom_knee_kv_tokens{pool}
    knee_source, knee_signal    headroom_knee_info{pool, source, signal}
    knee_confidence_ratio       headroom_knee_confidence_ratio{pool}
    knee_implausible            headroom_knee_implausible{pool}
    utilisation_ratio           headroom_utilisation_ratio{pool}
    ratio                       headroom_ratio{pool, scenario}             (Scenarios: current, n_minus_1, instant)
    headroom_requests           headroom_headroom_requests{pool, scenario}
    capacity_requests           headroom_capacity_requests{pool, limit}    (Limits: slots, kv, knee, slo, lora, effective)
    sessions                    headroom_sessions{pool}
    session_capacity            headroom_session_capacity{pool}
    power_watts                 headroom_power_watts{pool}
    sessions_per_megawatt       headroom_sessions_per_megawatt{pool}

plus explanatory fields that are not metrics (limiting_factor, load_requests, kv_tokens_per_request,
kv_tokens_per_request_source, power_source, n_minus_1_share, knee_detail). None means "not known"
and must not be exported.

Definitions (per pool, N = replicas answering):
  load              = active + engine queued + gateway queued requests, averaged over the latency
                      window (`load`, given by the cycle); `instant`: this cycle's
  slots capacity    = max_num_seqs x N
  kv capacity       = KV capacity tokens / mean KV tokens per request (the steady figure the cycle
                      keeps when given, else live KV / running requests, else the configured
                      kv_tokens_per_request)
  knee capacity     = knee requests per replica x N
  slo capacity      = only while a latency target is over its allowed share over the window: the
                      load scaled down, load x allowed / over (monitor/capacity/slo_limit.py)
  lora capacity     = only while requests wait for a LoRA adapter slot: active x slots / adapters
                      wanted (monitor/capacity/lora.py)
  effective         = the smallest of those known; its name is the limiting factor
  utilisation       = load / effective;   headroom ratio = 1 - load / effective (negative when over)
  N-1               = effective x (1 - largest replica's share), the share from per-replica KV
                      capacity when every replica reports it, else 1/N; None ("no N-1", not
                      exported) for a pool of one working replica
  session capacity  = effective / (load / sessions) - the active requests one session holds today
                      (configured active_requests_per_session when there is no load to measure)
  sessions per MW   = session capacity / (power in MW); power from DCGM (passed in) or
                      watts_per_replica x N from the configuration
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from monitor.capacity.knee import Knee
from monitor.capacity.lora import lora_limit
from monitor.model import Capacity, Limits, PoolSnapshot, Scenarios


@dataclass(frozen=True)
class CapacitySettings:
    max_num_seqs: Optional[int] = None  # per replica (vLLM --max-num-seqs)
    kv_tokens_per_request: Optional[float] = None  # fallback for the mean KV tokens per request
    watts_per_replica: Optional[float] = None  # used when no DCGM power is known
    active_requests_per_session: Optional[float] = None  # fallback when the pool is idle

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_tokens_per_request", "watts_per_replica", "active_requests_per_session"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"capacity setting {name} must be a number > 0, got {v!r}")

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "CapacitySettings":
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown capacity setting(s): {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(cls.__dataclass_fields__))}")
        return cls(**d)


def _ratio(load: Optional[float], cap: Optional[float]) -> Optional[float]:
    if cap is None or load is None:
        return None
    if cap <= 0:
        return -math.inf if load > 0 else None
    return 1.0 - load / cap


def _less(cap: Optional[float], load: Optional[float]) -> Optional[float]:
    return cap - load if (cap is not None and load is not None) else None


def largest_replica_share(pool: PoolSnapshot) -> Optional[float]:
    """Share of the pool's capacity held by its largest answering, working (not stalled) replica."""
    n = pool.replicas - pool.stalled_replicas
    if n <= 0:
        return None
    caps = [r.kv_tokens_capacity for r in pool.replica_detail if r.up and not r.stalled]
    known = [c for c in caps if c is not None and c > 0]
    if len(caps) == n and len(known) == len(caps):
        return max(known) / sum(known)
    return 1.0 / n


def compute_capacity(pool: PoolSnapshot, knee: Knee, settings: CapacitySettings,
                     power_watts: Optional[float] = None, sessions: Optional[float] = None) -> dict:
    """`pool_capacity(...)` as the plain dict of the JSON document."""
    return pool_capacity(pool, knee, settings, power_watts, sessions).as_dict()


def _kv_per_request(pool: PoolSnapshot, knee: Knee, settings: CapacitySettings
                    ) -> tuple[Optional[float], Optional[str]]:
    """Mean KV tokens per request: measured when requests are running, else configured."""
    if pool.kv_tokens_live is not None and pool.active_requests and pool.active_requests > 0 and pool.kv_tokens_live > 0:
        return pool.kv_tokens_live / pool.active_requests, "measured"
    if settings.kv_tokens_per_request:
        return float(settings.kv_tokens_per_request), "configured"
    if knee.kv_tokens and knee.requests:
        return knee.kv_tokens / knee.requests, "knee"
    return None, None


def pool_capacity(pool: PoolSnapshot, knee: Knee, settings: CapacitySettings,
                  power_watts: Optional[float] = None, sessions: Optional[float] = None, *,
                  kv_per_request: Optional[tuple[float, str]] = None,
                  load: Optional[tuple] = None,
                  slo: Optional[tuple[float, dict]] = None) -> Capacity:
    """`kv_per_request`: (KV tokens per request, its source) kept steady by the caller (the cycle's
    `SteadyPrior`), used for the KV limit instead of this snapshot's own measurement, which moves
    with every cycle. `load`: (the load averaged over the latency window, the seconds it covers[, how
    it was found]): what `current`, N-1, utilisation and sessions judge (default: this cycle's load,
    as `instant`).
    `slo`: (the slo limit, the target over its allowed share that sets it:
    monitor/capacity/slo_limit.py), one more limit."""
    if not isinstance(pool, PoolSnapshot):
        raise TypeError("pool_capacity needs a PoolSnapshot")
    # a stalled replica holds work but completes none: it is no capacity (as if lost)
    n = pool.replicas - pool.stalled_replicas
    if n < 0:
        raise ValueError(f"pool {pool.pool}: replicas must be >= 0, got {n}")
    instant = pool.load_requests  # None: the engines' active or queued count is unknown
    judged: Optional[float]  # the load judged: `load`'s mean, else this cycle's
    load_window: Optional[float]
    load_source: Optional[str]
    if load is not None and instant is not None:
        judged, load_window, load_source = (tuple(load) + ("window_mean",))[:3]
    else:
        judged, load_window, load_source = instant, None, "instant" if instant is not None else None
    kv_per_req, kv_src = kv_per_request or _kv_per_request(pool, knee, settings)
    kv_capacity = (pool.kv_tokens_capacity or 0.0) - pool.stalled_kv_tokens_capacity

    caps: dict[str, Optional[float]] = {"slots": None, "kv": None, "knee": None,
                                        "slo": slo[0] if slo is not None else None, "lora": lora_limit(pool)}
    if settings.max_num_seqs:
        caps["slots"] = float(settings.max_num_seqs * n)
    if pool.kv_tokens_capacity and kv_per_req:
        caps["kv"] = max(kv_capacity, 0.0) / kv_per_req
    # a slow replica (monitor/derive/slow.py) holds its slots but serves 1 / ratio of a peer's
    # tokens: its share of the knee is discounted by 1 - 1 / ratio (`slow_capacity_lost`)
    n_knee = max(0.0, n - pool.slow_capacity_lost)
    if knee.requests is not None:
        caps["knee"] = float(knee.requests * n_knee)
    known = {k: v for k, v in caps.items() if v is not None}
    limiting = min(known, key=known.__getitem__) if known else None
    effective = known[limiting] if limiting is not None else None

    # a pool of one working replica has no N-1 (losing it leaves nothing): None, never -Inf
    share = largest_replica_share(pool) if n >= 2 else None
    cap_n1 = effective * (1.0 - share) if (effective is not None and share is not None) else None

    # sessions
    per_session, ps_src = None, None
    if sessions is not None and sessions > 0 and judged is not None and judged > 0:
        per_session, ps_src = judged / sessions, "measured"
    elif settings.active_requests_per_session:
        per_session, ps_src = float(settings.active_requests_per_session), "configured"
    session_capacity = effective / per_session if (effective is not None and per_session) else None

    power, power_src = None, None
    if power_watts is not None and power_watts > 0:
        power, power_src = float(power_watts), "dcgm"
    elif settings.watts_per_replica and n > 0:
        power, power_src = float(settings.watts_per_replica * n), "configured"
    spmw = session_capacity / (power / 1e6) if (session_capacity is not None and power) else None

    return Capacity(
        knee_requests=caps["knee"],
        knee_kv_tokens=knee.kv_tokens * n_knee if knee.kv_tokens is not None else None,
        knee_source=knee.source, knee_signal=knee.signal,
        knee_confidence_ratio=float(knee.confidence),
        knee_implausible=bool(knee.implausible),
        utilisation_ratio=(judged / effective) if (effective and judged is not None) else None,
        ratio=Scenarios(_ratio(judged, effective), _ratio(judged, cap_n1), _ratio(instant, effective)),
        headroom_requests=Scenarios(_less(effective, judged), _less(cap_n1, judged), _less(effective, instant)),
        capacity_requests=Limits(caps["slots"], caps["kv"], caps["knee"], effective, caps["slo"], caps["lora"]),
        sessions=sessions, session_capacity=session_capacity, power_watts=power,
        sessions_per_megawatt=spmw,
        limiting_factor=limiting, load_requests=judged, load_requests_instant=instant,
        load_window_seconds=load_window, load_source=load_source,
        slo_limited_by=slo[1] if slo is not None else None,
        kv_tokens_per_request=kv_per_req, kv_tokens_per_request_source=kv_src,
        active_requests_per_session=per_session, active_requests_per_session_source=ps_src,
        power_source=power_src, n_minus_1_share=share, knee_detail=knee.detail,
    )


def recommended_replicas(peak_upper: Optional[float], knee_requests: Optional[float],
                         replicas: int) -> Optional[int]:
    """The fewest replicas for which `peak_upper` (a forecast's highest upper band over a horizon,
    concurrent requests) stays at or below the knee capacity with one replica lost:
    the smallest N with (N - 1) x knee per replica >= peak_upper. The knee per replica is the
    pool's knee over the replicas it was measured on. None when either is unknown."""
    if peak_upper is None or knee_requests is None or replicas < 1 or not knee_requests > 0:
        return None
    if not math.isfinite(peak_upper):
        return None
    per_replica = knee_requests / replicas
    if peak_upper <= 0:
        return 1
    return int(math.ceil(peak_upper / per_replica - 1e-9)) + 1
