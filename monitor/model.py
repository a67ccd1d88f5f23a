"""Plain data shared by every layer. No I/O here, no clocks."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from .poolkey import extras_of, name_of


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: upper bounds (ascending, last is +Inf) and counts."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("histogram bounds and counts differ in length")

    @property
    def has_inf(self) -> bool:
        return bool(self.bounds) and math.isinf(self.bounds[-1])

    def minus(self, older: "Histogram") -> Optional["Histogram"]:
        """Bucket-wise delta against an older observation; None after a reset or a bound change."""
        if older.bounds != self.bounds or self.count < older.count:
            return None
        if not all(map(operator.ge, self.counts, older.counts)):
            return None  # a bucket went down: the counters were reset
        deltas = tuple(map(operator.sub, self.counts, older.counts))
        return Histogram(self.bounds, deltas, self.sum - older.sum, self.count - older.count)

    def plus(self, other: "Histogram") -> Optional["Histogram"]:
        if other.bounds != self.bounds:
            return None
        return Histogram(self.bounds, tuple(map(operator.add, self.counts, other.counts)),
                         self.sum + other.sum, self.count + other.count)


# Counter keys a ReplicaReading may carry (canonical names, independent of vLLM version).
COUNTERS = (
    "request_success",  # every finished request, all finished_reason values
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "admission_rejections",  # vllm:admission_rejections_total (0.32+): turned away by a queue limit
    "request_aborted",  # vllm:request_success_total{finished_reason="abort"}: given up (mostly while queued)
)

# headroom_shed_requests_rate reasons (the names agreed with the dashboards and alerts)
SHED_REASONS = ("rejected", "aborted", "gateway_rate_limited", "gateway_error", "gateway_timeout")

# Histogram keys a ReplicaReading may carry (canonical names).
HISTOGRAMS = (
    "ttft",  # vllm:time_to_first_token_seconds
    "itl",  # vllm:inter_token_latency_seconds (legacy: time_per_output_token_seconds)
    "e2e",  # vllm:e2e_request_latency_seconds
    "queue",  # vllm:request_queue_time_seconds
    "prefill",  # vllm:request_prefill_time_seconds
    "decode",  # vllm:request_decode_time_seconds
    "prompt_len",  # vllm:request_prompt_tokens
    "generation_len",  # vllm:request_generation_tokens
    "render",  # vllm:request_render_duration_seconds (0.34: templating + tokenisation before admission)
)


@dataclass
class ReplicaReading:
    """What one vLLM replica (one scrape target / Prometheus instance, one model) showed at one time.

    Engines of a data-parallel replica are already summed. Values that the engine did not expose are
    None (never invented).
    """

    target: str  # URL of the scrape, or the Prometheus `instance` label
    model: str  # model_name label
    timestamp: float  # seconds since the epoch, when the reading was taken
    labels: dict[str, str] = field(default_factory=dict)  # extra target labels (for pool_by)
    running: Optional[float] = None
    waiting: Optional[float] = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    kv_usage: Optional[float] = None  # 0..1, capacity-weighted over engines
    kv_capacity_tokens: Optional[float] = None
    kv_live_tokens: Optional[float] = None
    block_size: Optional[int] = None
    num_gpu_blocks: Optional[int] = None
    engines: int = 1
    counters: dict[str, float] = field(default_factory=dict)  # keys from COUNTERS
    histograms: dict[str, Histogram] = field(default_factory=dict)  # keys from HISTOGRAMS
    naming: str = "v1"  # "v1", "v0" (no engine label) or "legacy-v1" (gpu_cache_usage_perc)


@dataclass
class Quantiles:
    p50: Optional[float] = None
    p90: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    count: float = 0.0  # observations in the window
    # quantile name -> (side, bucket bound) when the value is only a bound of the true quantile:
    # ("upper", first bound): it fell in the first bucket, the true quantile is <= that bound (the
    # value is interpolated from 0); ("lower", last finite bound): it fell in the +Inf bucket, the
    # true quantile is >= that bound (the value is that bound). monitor/derive/histogram.py.
    bounds: dict[str, tuple[str, float]] = field(default_factory=dict)
    # quantile name -> (lower, upper) bound of the bucket it was interpolated in: the truth lies
    # there, wherever the interpolation put the value (a p95 of 14.0 s read in (10, 20] may be 11.3 s)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99,
                "mean": self.mean, "count": self.count,
                "bounds": {k: {"bound": side, "value": v} for k, (side, v) in self.bounds.items()},
                "buckets": {k: list(b) for k, b in self.buckets.items()}}


@dataclass
class ReplicaSnapshot:
    replica: str
    pool: str
    up: bool
    active_requests: Optional[float] = None
    queued_requests: Optional[float] = None
    kv_tokens_live: Optional[float] = None  # the estimate, partial last blocks corrected (derive/kv_band.py)
    kv_tokens_capacity: Optional[float] = None
    kv_usage_ratio: Optional[float] = None  # the engine's block usage
    power_watts: Optional[float] = None
    stalled: bool = False  # work running or waiting, nothing completed over global.stall_window
    kv_tokens_live_low: Optional[float] = None  # every running request's last block holding one token
    kv_tokens_live_high: Optional[float] = None  # what block usage implies (usage x capacity)
    kv_tokens_method: Optional[str] = None  # derive/kv_band.py KvBand.method
    kv_capacity_changes: float = 0.0  # KV capacity changes seen on this replica (counter)
    latency_ratio: Optional[float] = None  # its inter-token latency over its peers' (derive/slow.py)
    slow: bool = False  # the ratio stayed >= SLOW_RATIO for SLOW_HOLD seconds (monitor/step.py)


@dataclass(frozen=True)
class Scenarios:
    """A value now and with the pool's largest replica lost."""

    current: Optional[float] = None
    n_minus_1: Optional[float] = None

    def as_dict(self) -> dict:
        return {"current": self.current, "n_minus_1": self.n_minus_1}


@dataclass(frozen=True)
class Limits:
    """Concurrent requests a pool can hold, by limit; `effective` is the smallest known."""

    slots: Optional[float] = None
    kv: Optional[float] = None
    knee: Optional[float] = None
    effective: Optional[float] = None

    def as_dict(self) -> dict:
        return {"slots": self.slots, "kv": self.kv, "knee": self.knee, "effective": self.effective}


@dataclass(frozen=True)
class Capacity:
    """A pool's capacity and headroom in one cycle (monitor/capacity/headroom.py defines each).

    None is "not known" and is never exported. `withheld`: the pool is stale and nothing is said.
    """

    knee_requests: Optional[float] = None
    knee_kv_tokens: Optional[float] = None
    knee_source: Optional[str] = None  # "learned" or "prior"
    knee_signal: Optional[str] = None  # the latency signal ("limits" for a prior)
    knee_confidence_ratio: Optional[float] = None
    utilisation_ratio: Optional[float] = None
    ratio: Scenarios = Scenarios()
    headroom_requests: Scenarios = Scenarios()
    capacity_requests: Limits = Limits()
    sessions: Optional[float] = None
    session_capacity: Optional[float] = None
    power_watts: Optional[float] = None
    sessions_per_megawatt: Optional[float] = None
    # explanations (not metrics)
    limiting_factor: Optional[str] = None
    load_requests: Optional[float] = None
    kv_tokens_per_request: Optional[float] = None
    kv_tokens_per_request_source: Optional[str] = None
    active_requests_per_session: Optional[float] = None
    active_requests_per_session_source: Optional[str] = None
    power_source: Optional[str] = None
    n_minus_1_share: Optional[float] = None
    knee_detail: str = ""
    withheld: bool = False

    @property
    def exhaustion_requests(self) -> Optional[float]:
        """The concurrency a forecast's time to exhaustion is counted against: the effective
        capacity, else the knee."""
        effective = self.capacity_requests.effective
        return effective if effective is not None else self.knee_requests

    def as_dict(self) -> dict:
        """The JSON shape of `headroom once --json` and /api/v1/snapshot."""
        if self.withheld:
            return {"knee_requests": None, "knee_detail": self.knee_detail}
        return {
            "knee_requests": self.knee_requests, "knee_kv_tokens": self.knee_kv_tokens,
            "knee_info": {"source": self.knee_source, "signal": self.knee_signal},
            "knee_confidence_ratio": self.knee_confidence_ratio,
            "utilisation_ratio": self.utilisation_ratio, "ratio": self.ratio.as_dict(),
            "headroom_requests": self.headroom_requests.as_dict(),
            "capacity_requests": self.capacity_requests.as_dict(),
            "sessions": self.sessions, "session_capacity": self.session_capacity,
            "power_watts": self.power_watts, "sessions_per_megawatt": self.sessions_per_megawatt,
            "limiting_factor": self.limiting_factor, "load_requests": self.load_requests,
            "kv_tokens_per_request": self.kv_tokens_per_request,
            "kv_tokens_per_request_source": self.kv_tokens_per_request_source,
            "active_requests_per_session": self.active_requests_per_session,
            "active_requests_per_session_source": self.active_requests_per_session_source,
            "power_source": self.power_source, "n_minus_1_share": self.n_minus_1_share,
            "knee_detail": self.knee_detail,
        }


def _q(q: Optional[Quantiles]) -> Optional[dict]:
    return q.as_dict() if q is not None else None


@dataclass(frozen=True)
class TaskStats:
    """One task type over the window between two gateway readings (monitor/capacity/tasks.py)."""

    task_type: str
    tasks: Optional[float] = None  # tasks started in the window
    calls: Optional[float] = None  # model calls in the window
    arrival_rate: Optional[float] = None  # tasks per second
    call_rate: Optional[float] = None
    completed_tasks: Optional[float] = None
    calls_per_task: Optional[float] = None
    calls_per_task_source: Optional[str] = None
    task_latency: Optional[Quantiles] = None
    call_latency: Optional[Quantiles] = None
    ttft: Optional[Quantiles] = None
    sessions: Optional[float] = None
    sessions_source: Optional[str] = None
    call_class: str = "interactive"
    input_tokens_per_call: Optional[float] = None
    output_tokens_per_call: Optional[float] = None
    slo_target_seconds: Optional[float] = None
    slo_objective: Optional[float] = None
    slo_violation_ratio: Optional[float] = None
    slo_window_seconds: Optional[float] = None  # set when the ratio is over the SLO window
    slo_burn_rate: dict[str, Optional[float]] = field(default_factory=dict)  # window -> rate (None: not covered)
    slo_source: Optional[str] = None  # where the burn windows came from: "prometheus" | "tracker"

    def as_dict(self) -> dict:
        """The JSON shape; the SLO window's keys only when the task type has an SLO window."""
        out = {
            "tasks": self.tasks, "calls": self.calls, "arrival_rate": self.arrival_rate,
            "call_rate": self.call_rate, "completed_tasks": self.completed_tasks,
            "calls_per_task": self.calls_per_task, "calls_per_task_source": self.calls_per_task_source,
            "task_latency": _q(self.task_latency), "call_latency": _q(self.call_latency),
            "ttft": _q(self.ttft), "sessions": self.sessions, "sessions_source": self.sessions_source,
            "class": self.call_class, "input_tokens_per_call": self.input_tokens_per_call,
            "output_tokens_per_call": self.output_tokens_per_call,
            "slo_target_seconds": self.slo_target_seconds, "slo_objective": self.slo_objective,
            "slo_violation_ratio": self.slo_violation_ratio,
        }
        if self.slo_window_seconds is not None:
            out["slo_window_seconds"] = self.slo_window_seconds
        if self.slo_burn_rate:
            out["slo_burn_rate"] = dict(self.slo_burn_rate)
            out["slo_source"] = self.slo_source
        return out


@dataclass(frozen=True)
class PoolSlo:
    """A pool-level latency target (pools.<name>.slo) over the pool's summed replica histograms."""

    signal: str  # ttft, e2e, queue, itl
    slo_target_seconds: float
    slo_objective: float
    slo_violation_ratio: Optional[float] = None
    slo_burn_rate: dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"pool:{self.signal}"  # its task_type label in headroom_slo_* metrics

    def as_dict(self) -> dict:
        return {"slo_target_seconds": self.slo_target_seconds, "slo_objective": self.slo_objective,
                "slo_violation_ratio": self.slo_violation_ratio, "slo_burn_rate": dict(self.slo_burn_rate),
                "slo_source": "tracker"}  # the pool's summed replica histograms: always the tracker


@dataclass(frozen=True)
class PoolTasks:
    """What a pool's task types, its pool-level SLOs and its call classes showed this cycle."""

    by_type: dict[str, TaskStats] = field(default_factory=dict)
    slos: dict[str, PoolSlo] = field(default_factory=dict)  # keyed "pool:<signal>"
    call_latency_by_class: dict[str, Quantiles] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out: dict = {tt: t.as_dict() for tt, t in self.by_type.items()}
        out.update({k: s.as_dict() for k, s in self.slos.items()})
        out["_call_latency_by_class"] = {c: q.as_dict() for c, q in self.call_latency_by_class.items()}
        return out


class PoolForecastLike(Protocol):
    """What the lower floors read of one pool's forecast. The forecast core makes it
    (monitor/forecast/pool.py `PoolForecast`, which imports pandas); the model only names its shape."""

    last_fit_timestamp: float
    series: dict  # series name -> its outlook (model, skill, horizons, or why it is undefined)
    horizons: dict  # horizon ("1h", "1d", "1w") -> its summary of the capacity series, or None
    exhaustion_seconds: Optional[float]
    capacity_requests: Optional[float]
    path: Any  # the capacity series' forecast path (timestamps, mean, upper, lower) or None

    def as_dict(self) -> dict: ...


@dataclass(frozen=True)
class RefitResult:
    """One refit of every pool's forecasts (monitor/forecaster.py publishes it; each cycle reads it)."""

    pools: dict[str, PoolForecastLike] = field(default_factory=dict)  # pool -> forecast_pool(...)
    started: float = 0.0  # Unix time the refit began (the `now` given to the models)
    finished: float = 0.0
    duration_seconds: float = 0.0
    errors: dict = field(default_factory=dict)  # pool (or "history") -> error text
    runs: int = 0


@dataclass
class PoolSnapshot:
    pool: str
    model: str
    replicas: int  # replicas that answered this cycle
    replicas_configured: int = 0
    stalled_replicas: int = 0  # of those, replicas holding work without completing any (not capacity)
    stalled_kv_tokens_capacity: float = 0.0  # their KV capacity, left out of the pool's by the capacity layer
    # the engines' own gauges, summed; None when no replica exposed the family (unknown, never 0)
    active_requests: Optional[float] = 0.0
    queued_requests: Optional[float] = 0.0
    queued_by_reason: dict[str, float] = field(default_factory=dict)
    # requests waiting in front of the engines, in a router's or gateway's queue (llm-d / inference
    # gateway flow control, Dynamo's router), by gateway; {}: no gateway reports a queue for the pool
    gateway_queued: dict[str, float] = field(default_factory=dict)
    engines: tuple[str, ...] = ()  # the engine kinds serving the pool: "vllm", "sglang"
    kv_tokens_live: Optional[float] = None  # the estimate: partial last blocks corrected (derive/kv_band.py)
    kv_tokens_live_low: Optional[float] = None
    kv_tokens_live_high: Optional[float] = None  # what block usage implies (usage x capacity)
    kv_tokens_method: Optional[str] = None
    kv_tokens_capacity: Optional[float] = None
    kv_usage_ratio: Optional[float] = None  # the engines' block usage (high / capacity)
    # requests in chat templating / tokenisation before admission (vLLM 0.34 render histogram:
    # rate x mean duration = the increase of its _sum per second); None without the family
    rendering_requests: Optional[float] = None
    # requests per second turned away over the rate window, by reason (SHED_REASONS); {}: no source
    # reports any (unknown, not 0)
    shed_rates: dict[str, float] = field(default_factory=dict)
    queue_growth_rate: Optional[float] = None  # engine queue's change per second over the rate window
    # replicas' capacity lost to slowness: sum over slow replicas of 1 - 1 / latency ratio (step.py)
    slow_capacity_lost: float = 0.0
    # rates per second from counter deltas (None until two readings exist)
    completion_rate: Optional[float] = None
    prompt_tokens_rate: Optional[float] = None
    generation_tokens_rate: Optional[float] = None
    prefix_cache_hit_ratio: Optional[float] = None
    preemption_rate: Optional[float] = None
    latency: dict[str, Quantiles] = field(default_factory=dict)  # keys: ttft, itl, e2e, queue
    mean_concurrency: Optional[float] = None  # mean (active + queued) over the rate window
    littles_law_ratio: Optional[float] = None  # completion_rate * mean e2e / mean_concurrency
    window_seconds: Optional[float] = None
    stale: bool = False
    last_fresh_timestamp: Optional[float] = None
    replica_detail: list[ReplicaSnapshot] = field(default_factory=list)
    # Prometheus mode: the pool's cumulative latency histograms as the query layer summed them (for
    # pool SLOs); None: summed here from the replicas' (direct mode)
    latency_totals: Optional[dict[str, Histogram]] = None
    capacity: Optional[Capacity] = None  # monitor.capacity (knee, headroom, sessions, power)
    tasks: Optional[PoolTasks] = None  # monitor.capacity.tasks, from gateway / application metrics
    forecast: Optional[PoolForecastLike] = None  # the forecaster's latest result for this pool
    # horizon -> fewest replicas whose knee capacity with one lost holds the forecast's 95 % peak
    recommended_replicas: dict[str, int] = field(default_factory=dict)
    replica_lead_time_seconds: Optional[float] = None  # a new replica's start-up: configured, else measured
    replica_lead_time_source: Optional[str] = None  # "configured" (pools.<pool>.replica_lead_time) | "measured"

    @property
    def gateway_queued_requests(self) -> Optional[float]:
        return sum(self.gateway_queued.values()) if self.gateway_queued else None

    @property
    def name(self) -> str:
        """The `pool` label: the pool's name without the labels its key carries (monitor/poolkey.py)."""
        return name_of(self.pool)

    @property
    def extra_labels(self) -> dict[str, str]:
        """The pool_by labels carried beside `pool` (e.g. {"cluster": "a"}); {} with one pool_by label."""
        return extras_of(self.pool)

    @property
    def shed_rate(self) -> Optional[float]:
        """Requests per second turned away; None when no source reports any. The engines' reasons
        (rejected, aborted) and the gateways' (gateway_*) are not added: a gateway in front of the
        engines relays their rejections and sees its clients' give-ups as errors or timeouts, so the
        larger of the two sums is taken."""
        if not self.shed_rates:
            return None
        gateway = sum(v for k, v in self.shed_rates.items() if k.startswith("gateway_"))
        engine = sum(v for k, v in self.shed_rates.items() if not k.startswith("gateway_"))
        return max(gateway, engine)

    @property
    def offered_requests(self) -> Optional[float]:
        """The load offered to the pool in concurrent requests: the served active requests plus
        the arrivals not served, each holding a mean service time (by Little's law, what they would
        have held): the shed ones (`shed_rate`) and the queue's growth over the window (arrivals
        the engines have not caught up with, counted until they are served or shed). The service
        time is the window's mean end-to-end latency less its mean queue time. A steady queue adds
        nothing: its requests are served in turn (in `active_requests`) or shed. None when no
        source reports shed requests, or some arrivals were not served and no latency is known."""
        active, shed = self.active_requests, self.shed_rate
        if active is None or shed is None:
            return None
        unserved = shed + max(0.0, self.queue_growth_rate or 0.0)
        if unserved <= 0:
            return active
        e2e, queue = self.latency.get("e2e"), self.latency.get("queue")
        if e2e is None or e2e.mean is None:
            return None
        service = e2e.mean - (queue.mean if queue is not None and queue.mean is not None else 0.0)
        return active + unserved * max(0.0, service)

    @property
    def load_requests(self) -> Optional[float]:
        """What headroom, utilisation and the forecasts count: active + engine queued + gateway
        queued. Unknown (None) when the engines' active or queued count is."""
        if self.active_requests is None or self.queued_requests is None:
            return None
        return self.active_requests + self.queued_requests + (self.gateway_queued_requests or 0.0)


@dataclass(frozen=True)
class Alert:
    """One of headroom's alerts as the configured Prometheus or Alertmanager shows it."""

    name: str
    state: str  # "firing" | "pending" (Prometheus: its `for:` has not elapsed yet)
    severity: str = ""
    pool: Optional[str] = None
    summary: str = ""
    since: Optional[float] = None  # epoch seconds it became active
    labels: dict = field(default_factory=dict, hash=False, compare=False)

    def as_dict(self) -> dict:
        return {"alertname": self.name, "state": self.state, "severity": self.severity, "pool": self.pool,
                "summary": self.summary, "since": self.since}


@dataclass
class SourceStatus:
    source: str  # "vllm", "prometheus", "gateway", "dcgm"
    target: str
    up: bool
    error: Optional[str] = None  # reason: "timeout", "connect", "http_5xx", "parse", ...
    detail: Optional[str] = None
    duration_seconds: Optional[float] = None
    attempted: bool = True  # False while a failing target waits out its backoff (not a new error)
    missing: tuple = ()  # families of the metric contract the target did not expose (monitor/sources/vllm.py)


@dataclass
class Snapshot:
    timestamp: float
    pools: list[PoolSnapshot] = field(default_factory=list)
    sources: list[SourceStatus] = field(default_factory=list)
    cycle_duration_seconds: Optional[float] = None
    last_success_timestamp: Optional[float] = None
    errors: dict[str, float] = field(default_factory=dict)  # counters by reason, cumulative
    # the pipeline's own counters, cumulative: cycles run, series cut by the cardinality cap (by
    # what), malformed-but-usable input (by kind)
    cycles: int = 0
    dropped: dict[str, float] = field(default_factory=dict)
    anomalies: dict[str, float] = field(default_factory=dict)
    # the forecaster's latest refit as the cycle found it (every pool it forecast, also pools not in
    # this cycle); each pool's own result is also on PoolSnapshot.forecast
    forecast: Optional[RefitResult] = None
    # headroom's alerts from sources.alerts (None: no alerts source, or it did not answer this cycle)
    alerts: Optional[list[Alert]] = None
    alerts_ui: Optional[str] = None  # the alerts page of that source, for the landing page's link
    clock_steps: dict[str, float] = field(default_factory=dict)  # wall-clock steps found, by direction (cumulative)
    # Prometheus mode: per part of the read (replicas, histograms) the age of the values in use; 0 fresh
    source_stale_seconds: dict[str, float] = field(default_factory=dict)
