"""The capacity layer of a cycle: plain data in, typed results on the pools (monitor/step.py `step`).

    state = CapacityState(cfg)                            # settings checked; what is kept between cycles
    assess(state, pools, history, gateways, dcgm, now)    # fills pool.capacity and pool.tasks

`assess` reads no clock and does no I/O: `history` is the cycle's recent readings per replica,
`gateways` and `dcgm` the cycle's parsed gateway and DCGM bodies (monitor/sources/gateway.py,
monitor/sources/dcgm.py), `now` the cycle's time. What it keeps between cycles is `state`: one
`KneeEstimator` per pool, the SLO windows, each gateway's previous reading. For each pool it
  1. feeds the pool's `KneeEstimator` one observation per replica and cycle, from the replica's
     newest reading and the newest one at least `knee_min_span_seconds` (30) older:
     load = e2e seconds finished in the interval / interval (Little's law: the
     time-averaged active + queued requests), latency = the interval's mean of the knee signal's
     histogram (queue time by default), KV = live KV tokens;
  2. keeps the prior up to date from the engine's limits (pools.<name>.max_num_seqs, KV capacity
     per replica / measured KV tokens per request);
  3. turns the gateway readings of the cycle into per-task numbers (monitor/capacity/tasks.py:
     arrival rate, calls per task, latency quantiles, sessions) with SLO shares and burn rates;
  4. joins DCGM power to the pool's replicas (monitor/capacity/power.py);
  5. sets `pool.capacity` (a `Capacity`, monitor/capacity/headroom.py) and `pool.tasks` (a
     `PoolTasks`); monitor/export/samples.py renders both.

Configuration (`capacity:` section; every key optional):
    knee_signal: queue            # queue | ttft | e2e_per_token | e2e | itl
    knee_min_span_seconds: 30     # Little's-law window of one observation (successive ones overlap)
    min_confidence: 0.6
    min_change: 0.10
    confirmations: 3
    min_observations: 60
    kv_tokens_per_request: 2000   # fallback when no request is running
    active_requests_per_session: 1.0
    task_pools: {policy_question: chat-8b}   # task type -> pool (app metrics carry no pool)
    task_classes: {nightly_batch: batch}     # task type -> call class (default interactive)
The section is declared and checked in monitor/config/headroom.py (`Capacity`); SLO targets come
from the `slos:` section and pools.<name>.slo, read into `SloSettings` by monitor/config/slo.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

from monitor.derive import histogram as histo
from monitor.derive.core import pool_of
from monitor.derive.counters import histogram_increase, increase
from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.knee import KneeEstimator, prior_knee
from monitor.capacity.power import key_map, power_by_pool
from monitor.capacity.slo import SloTracker
from monitor.capacity.tasks import call_latency_by_class, derive_tasks
from monitor.model import Capacity, Histogram, PoolSlo, PoolSnapshot, PoolTasks, Quantiles, ReplicaReading, TaskStats
from monitor.sources.dcgm import DcgmReading
from monitor.sources.gateway import GatewayConfig, GatewayReading, GatewayScrape

SIGNAL_HIST = {"queue": "queue", "ttft": "ttft", "e2e": "e2e", "itl": "itl", "e2e_per_token": "e2e"}
STALE = "pool is stale: values withheld"

History = Mapping[str, Sequence[ReplicaReading]]  # "target|model" -> readings, oldest first


def interval_observation(newer, older, signal: str) -> Optional[tuple[float, Optional[float], float]]:
    """(load, kv tokens, latency) of one replica between two readings; None when not measurable."""
    dt = newer.timestamp - older.timestamp
    if dt <= 0:
        return None
    hist = SIGNAL_HIST[signal]
    e2e = histogram_increase(newer.histograms.get("e2e"), older.histograms.get("e2e"))
    sig = histogram_increase(newer.histograms.get(hist), older.histograms.get(hist))
    if e2e is None or sig is None or sig.count <= 0:
        return None
    latency = sig.sum / sig.count
    if signal == "e2e_per_token":
        tokens = increase(newer.counters.get("generation_tokens"), older.counters.get("generation_tokens"))
        if tokens is None or tokens <= 0:
            return None
        latency = e2e.sum / tokens
    return e2e.sum / dt, newer.kv_live_tokens, latency


def older_reading(readings, min_span: float):
    """The newest reading at least `min_span` seconds before the last one (else the oldest).

    Little's law needs a window several times the requests' time in system: requests finishing in
    lumps (a batch ends together) make short intervals noisy. Successive observations then overlap."""
    newer = readings[-1]
    for r in reversed(list(readings)[:-1]):
        if newer.timestamp - r.timestamp >= min_span:
            return r
    return readings[0]


def _sum_hist(hs: list[Histogram]) -> Optional[Histogram]:
    try:
        return histo.merge(hs)
    except ValueError:
        return None


class CapacityState:
    """The capacity layer's settings (checked here) and what it keeps from one cycle to the next."""

    def __init__(self, cfg) -> None:
        """`cfg` is the loaded configuration (monitor/config): its `capacity` and `slos` sections are
        typed and checked there; pools.<name>.slo targets join the `slos:` ones."""
        c = cfg.capacity
        self.cfg = cfg
        self.signal = c.knee_signal
        if self.signal not in SIGNAL_HIST:
            raise ValueError(f"capacity.knee_signal must be one of {', '.join(SIGNAL_HIST)}, got {self.signal!r}")
        self.knee_opts = {"min_confidence": c.min_confidence, "min_change": c.min_change,
                          "confirmations": c.confirmations, "min_observations": c.min_observations}
        self.min_span = float(c.knee_min_span_seconds)
        self.kv_per_request = c.kv_tokens_per_request
        self.per_session = c.active_requests_per_session
        self.task_pools: dict = dict(c.task_pools)
        self.task_classes: dict = dict(c.task_classes)
        self.slo = replace(cfg.slos, pool_targets={**cfg.slos.pool_targets, **{
            pool: list(ps.slo) for pool, ps in (cfg.pools or {}).items() if ps.slo}})
        self.window = float(getattr(cfg, "latency_window", 300.0))
        self.tracker = SloTracker(self.slo.windows, keep_seconds=max([self.window, *self.slo.windows.values()]) * 1.1)
        self.knees: dict[str, KneeEstimator] = {}
        self.seen: dict[str, float] = {}  # "target|model" -> timestamp of the newest reading observed
        self.gateway_prev: dict[tuple[int, Optional[str]], GatewayReading] = {}
        self.pool_seen: dict[str, float] = {}  # pool -> the last cycle it was assessed

    def expire(self, before: float) -> None:
        """Forget what was last seen before `before` (global.forget_after ago): the knee estimator of
        a pool not assessed since, replicas' last observed readings, gateway readings, SLO windows."""
        for pool in [p for p, t in self.pool_seen.items() if t < before]:
            del self.pool_seen[pool]
            self.knees.pop(pool, None)
        for key in [k for k, t in self.seen.items() if t < before]:
            del self.seen[key]
        for key in [k for k, r in self.gateway_prev.items() if r.timestamp < before]:
            del self.gateway_prev[key]
        self.tracker.forget(before)

    def gateway_config(self, kind: str, task_label: Optional[str], session_label: Optional[str]) -> GatewayConfig:
        """How a configured gateway's body is read (the cycle parses it with this)."""
        return GatewayConfig(kind=kind, task_label=task_label, session_label=session_label,
                             task_classes=self.task_classes)

    def estimator(self, pool: str) -> KneeEstimator:
        est = self.knees.get(pool)
        if est is None:
            est = self.knees[pool] = KneeEstimator(self.signal, **self.knee_opts)
        return est

    def prior(self, p: PoolSnapshot, max_num_seqs: Optional[int]):
        kv_cap = (p.kv_tokens_capacity / p.replicas) if (p.kv_tokens_capacity and p.replicas) else None
        per_req = None
        if p.kv_tokens_live and p.active_requests:
            per_req = p.kv_tokens_live / p.active_requests
        elif self.kv_per_request:
            per_req = float(self.kv_per_request)
        return prior_knee(max_num_seqs, kv_cap, per_req)




# ---------------------------------------------------------------------- the cycle's assessment

def assess(state: CapacityState, pools: list[PoolSnapshot], history: History,
           gateways: Sequence[GatewayScrape] = (), dcgm: Sequence[DcgmReading] = (), now: float = 0.0) -> None:
    """Set `capacity` and `tasks` on every pool of the cycle (see the module docstring)."""
    tasks = _tasks(state, pools, gateways, now)
    power = _power(state, history, dcgm)
    by_pool: dict[str, dict] = {}  # one pass over the history: the work stays linear in series
    for key, readings in history.items():
        if readings:
            by_pool.setdefault(pool_of(readings[-1], state.cfg.pool_by), {})[key] = readings
    for p in pools:
        mine = by_pool.get(p.pool, {})
        ps = state.cfg.pool_settings(p.pool)
        est = state.estimator(p.pool)
        state.pool_seen[p.pool] = now
        est.set_prior(state.prior(p, ps.max_num_seqs))
        if not p.stale:
            _observe(state, est, mine)
        knee = est.estimate()
        by_type, classes = tasks.get(p.pool, ({}, {}))
        vals = [t.sessions for t in by_type.values() if t.sessions is not None]
        sessions = float(sum(vals)) if vals else None
        settings = CapacitySettings(max_num_seqs=ps.max_num_seqs, kv_tokens_per_request=state.kv_per_request,
                                    watts_per_replica=ps.watts_per_replica,
                                    active_requests_per_session=state.per_session)
        if p.stale or p.replicas == 0:
            p.capacity = Capacity(knee_detail=STALE, withheld=True)
        else:
            p.capacity = pool_capacity(p, knee, settings, power.get(p.pool), sessions)
        p.tasks = PoolTasks(by_type, _pool_slos(state, p, mine, now), classes)


def _observe(state: CapacityState, est: KneeEstimator, history: History) -> None:
    """One knee observation per replica of the pool (`history`: the pool's own series)."""
    for key, readings in history.items():
        if len(readings) < 2:
            continue
        newer = readings[-1]
        if state.seen.get(key) == newer.timestamp:
            continue  # this interval was observed already (a replica that did not answer)
        state.seen[key] = newer.timestamp
        obs = interval_observation(newer, older_reading(readings, state.min_span), state.signal)
        if obs is not None:
            est.observe(*obs)


# ---------------------------------------------------------------------- tasks

Planned = tuple[Optional[str], GatewayConfig, GatewayReading, Optional[GatewayReading]]


def _gateway_readings(state: CapacityState, pools: list[PoolSnapshot], gateways: Sequence[GatewayScrape],
                      now: float) -> list[Planned]:
    """[(pool or None, how it was read, reading, previous reading)] for this cycle's gateway bodies.

    A gateway configured with `pool` feeds that pool; with one pool, it feeds that pool; else a
    gateway with a model label is read once per pool, keeping the series of the pool's model,
    and the application convention (no model label) is split by capacity.task_pools."""
    out = []
    for scrape in gateways:
        if scrape.reading is None:
            continue
        if scrape.pool:
            plan = [(scrape.pool, scrape.config, scrape.reading)]
        elif len(pools) == 1:
            plan = [(pools[0].pool, scrape.config, scrape.reading)]
        elif scrape.config.model:
            plan = [(p.pool, scrape.model_config(p.model), scrape.for_model(p.model)) for p in pools]
        else:
            plan = [(None, scrape.config, scrape.reading)]
        for pool, gcfg, reading in plan:
            key = (scrape.index, pool)
            prev = state.gateway_prev.get(key)
            if prev is not None and prev.timestamp >= now:
                prev = None
            state.gateway_prev[key] = reading
            out.append((pool, gcfg, reading, prev))
    return out


def _tasks(state: CapacityState, pools: list[PoolSnapshot], gateways: Sequence[GatewayScrape], now: float
           ) -> dict[str, tuple[dict[str, TaskStats], dict[str, Quantiles]]]:
    """pool -> ({task_type: TaskStats}, {call class: Quantiles})."""
    by_pool: dict[str, tuple[dict[str, TaskStats], dict[str, Quantiles]]] = {}
    names = {p.pool for p in pools}
    for pool, gcfg, reading, prev in _gateway_readings(state, pools, gateways, now):
        for tt, stats in derive_tasks(reading, prev, gcfg, state.slo).items():
            target_pool = state.task_pools.get(tt, pool)
            if target_pool not in names:
                continue
            t = reading.tasks[tt]
            if gcfg.models and t.calls == 0 and t.call_latency is None and t.tasks_started is None:
                continue  # no series of this pool's model for the task type
            entry = by_pool.setdefault(target_pool, ({}, {}))[0]
            if tt in entry and entry[tt].calls_per_task_source == "app":
                continue  # the same task type from two sources: the app's numbers win
            entry[tt] = _slo_windows(state, target_pool, t, stats, now)
        classes = call_latency_by_class(reading, prev)
        if pool in names and classes:
            by_pool.setdefault(pool, ({}, {}))[1].update(classes)
    return by_pool


def _slo_windows(state: CapacityState, pool: str, t, stats: TaskStats, now: float) -> TaskStats:
    """The task type's SLO share over the latency window and its burn rates (SloTracker)."""
    target = state.slo.task_target(stats.task_type)
    if target is None:
        return stats
    h = t.task_duration if target.signal == "task" else (t.ttft if target.signal == "ttft" else t.call_latency)
    if h is None:
        return stats
    total = histo.total(h)
    bad = (histo.fraction_above(h, target.seconds) or 0.0) * total
    key = (pool, stats.task_type)
    try:
        state.tracker.observe(key, now, total, bad)
    except ValueError:
        return stats
    ratio = state.tracker.ratio(key, state.window)
    if ratio is not None:
        stats = replace(stats, slo_violation_ratio=ratio, slo_window_seconds=state.window)
    return replace(stats, slo_burn_rate=state.tracker.burn_rates(key, target))


def _pool_slos(state: CapacityState, p: PoolSnapshot, history: History, now: float) -> dict[str, PoolSlo]:
    """Pool-level latency targets (ttft, e2e, queue, itl) over the summed replica histograms."""
    out: dict[str, PoolSlo] = {}
    targets = state.slo.pool_targets.get(p.pool, [])
    if not targets:
        return out
    newest = [rs[-1] for rs in history.values() if rs]  # the pool's own series
    for target in targets:
        h = _sum_hist([r.histograms[target.signal] for r in newest if target.signal in r.histograms])
        if h is None:
            continue
        slo = PoolSlo(target.signal, target.seconds, target.objective)
        total = histo.total(h)
        try:
            state.tracker.observe((p.pool, slo.key), now, total,
                                  (histo.fraction_above(h, target.seconds) or 0.0) * total)
        except ValueError:
            continue
        out[slo.key] = replace(slo, slo_violation_ratio=state.tracker.ratio((p.pool, slo.key), state.window),
                               slo_burn_rate=state.tracker.burn_rates((p.pool, slo.key), target))
    return out


# ---------------------------------------------------------------------- power

def _power(state: CapacityState, history: History, dcgm: Sequence[DcgmReading]) -> dict[str, float]:
    if not dcgm:
        return {}
    reps = [(pool_of(rs[-1], state.cfg.pool_by), rs[-1].target, rs[-1].labels) for rs in history.values() if rs]
    keys = key_map(reps)
    first = getattr(state.cfg, "dcgm_replica_label", None)
    watts: dict[str, float] = {}
    for reading in dcgm:
        w, _unmatched = power_by_pool(reading.samples, keys, first_label=first)
        for pool, v in w.items():
            watts[pool] = watts.get(pool, 0.0) + v
    return watts
