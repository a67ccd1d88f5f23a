"""The capacity layer of a cycle: plain data in, typed results on the pools (monitor/step/cycle_step.py `step`).

    state = CapacityState(inputs)                         # CapacityInputs (monitor/capacity/inputs.py)
    assessed = assess(state, pools, history, gateways, dcgm, now)   # pool -> Assessed; no pool changed

`assess` reads no clock and does no I/O: `history` is the cycle's recent readings per replica,
`gateways` and `dcgm` the cycle's gateway and DCGM readings (`GatewayScrape`, `DcgmReading`:
monitor/model/readings.py; the cycle's `collect` parsed the bodies), `now` the cycle's time. What it
keeps between cycles is `state`: one `KneeEstimator` per pool, the SLO windows, each gateway's
previous reading.

SLO burn windows: a window is None until its history covers it (monitor/capacity/slo.py). The
application hands the state its history (monitor/history/slo_history.py `keep_windows`): in direct mode the
tracker is restored from the embedded store and saved after every cycle; in Prometheus mode the
cycle's `collect` reads the task targets' windows from Prometheus (monitor/pipeline/cycle.py) and `assess`
gets them as `slo_windows` (None: not read, or the read failed: the tracker's are used; so are they
for a task type Prometheus has no series of). Each task type's `slo_source` says which
("prometheus" | "tracker").
For each pool it
  1. feeds the pool's `KneeEstimator` one observation per replica and cycle, from the replica's
     newest reading and the newest one at least `knee_min_span_seconds` (30) older:
     load = e2e seconds finished in the interval / interval (Little's law: the
     time-averaged active + queued requests), latency = the interval's mean of the knee signal's
     histogram (queue time by default), KV = live KV tokens;
  2. keeps the prior up to date from the engine's limits (pools.<name>.max_num_seqs, KV capacity
     per replica / KV tokens per request), steady between cycles (monitor/capacity/knee.py
     `SteadyPrior`: the measured KV tokens per request enter as a median with hysteresis, and the
     capacity's KV limit counts with the same figure);
  3. turns the gateway readings of the cycle into per-task numbers (monitor/capacity/tasks.py:
     arrival rate, calls per task, latency quantiles, sessions) over the task window (each
     gateway's reading one window back, `TaskWindow`) with SLO shares and burn rates; which pool a
     gateway's reading feeds (its scope: sources.gateways[i].labels) is monitor/capacity/gateway_plan.py;
  4. joins DCGM power to the pool's replicas (monitor/capacity/power.py);
  5. marks a learned knee suspect when the engine changed under it (KV capacity per replica,
     speculative acceptance: monitor/capacity/knee_suspect.py) and gives LMCache's CPU tier its
     configured capacity (it has no capacity gauge);
  6. returns each pool's `capacity` (a `Capacity`, monitor/capacity/headroom.py) and `tasks` (a
     `PoolTasks`) in an `Assessed`, which monitor/step/cycle_step.py attaches; monitor/export/samples.py renders
     both. The load `current` and N-1 judge is the pool's load (active + engine queued + gateway
     queued) averaged over the latency window (monitor/capacity/load_window.py, time-weighted over
     the cycles); `instant` judges this cycle's. Every
     latency target of the pool is judged over the latency window (`_judge`): one over its allowed
     share is the `slo` limit (monitor/capacity/slo_limit.py).

Configuration (`capacity:` section; every key optional):
    knee_signal: queue            # queue | ttft | e2e_per_token | e2e | itl
    knee_min_span_seconds: 30     # Little's-law window of one observation (successive ones overlap)
    min_confidence: 0.6
    min_change: 0.10
    confirmations: 3
    min_observations: 30
    kv_tokens_per_request: 2000   # fallback when no request is running
    active_requests_per_session: 1.0
    task_pools: {policy_question: chat-8b}   # task type -> pool (app metrics carry no pool)
    task_classes: {nightly_batch: batch}     # task type -> call class (default interactive)
    task_window: 10m              # tasks, calls per task, sessions (default global.latency_window)
The section is declared and checked in monitor/config/headroom_yml.py (`Capacity`); SLO targets come
from the `slos:` section and pools.<name>.slo, read into `SloSettings` by monitor/capacity/slo_settings.py.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence, TypedDict

from monitor.capacity.gateway_estimate import engines_in_flight, estimate_gateway_queues
from monitor.capacity.gateway_latency import added_latency, gateway_call_histograms, gateway_call_totals
from monitor.capacity.gateway_plan import Planned, plan_gateways
from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.inputs import CapacityInputs
from monitor.capacity.knee import KneeEstimator, SteadyPrior
from monitor.capacity.knee_suspect import KneeWatch, suspect
from monitor.capacity.load_window import LoadWindows
from monitor.capacity.power import key_map, power_by_pool
from monitor.capacity.settings import KNEE_SIGNAL_HISTOGRAM as SIGNAL_HIST  # the one knee-signal list
from monitor.capacity.shed import add_gateway_shed, gateway_shed_rates
from monitor.capacity.slo import SloTracker
from monitor.capacity.slo_judge import pool_slos as slo_pools
from monitor.capacity.slo_judge import slo_windows
from monitor.capacity.slo_limit import Judged, slo_limit
from monitor.capacity.tasks import TaskWindow, call_latency_by_class, derive_tasks, join_sources
from monitor.derive import histogram as histo
from monitor.derive.core import pool_of
from monitor.derive.counters import histogram_increase, increase
from monitor.derive.kv_band import kv_band
from monitor.model import Capacity, PoolSnapshot, PoolTasks, Quantiles, ReplicaReading, TaskStats
from monitor.model.readings import DcgmReading, GatewayConfig, GatewayScrape

STALE = "pool is stale: values withheld"

History = Mapping[str, Sequence[ReplicaReading]]  # "target|model" -> readings, oldest first

log = logging.getLogger(__name__)


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
    # live KV as the pool reports it: partial last blocks corrected (monitor/derive/kv_band.py)
    unit = None if newer.kv_unit_exact else newer.kv_unit_max
    return e2e.sum / dt, kv_band(newer.kv_live_tokens, newer.running, newer.block_size, None, unit).estimate, latency


def older_reading(readings, min_span: float):
    """The newest reading at least `min_span` seconds before the last one (else the oldest).

    Little's law needs a window several times the requests' time in system: requests finishing in
    lumps (a batch ends together) make short intervals noisy. Successive observations then overlap."""
    newer = readings[-1]
    for r in reversed(list(readings)[:-1]):
        if newer.timestamp - r.timestamp >= min_span:
            return r
    return readings[0]


class KneeOptions(TypedDict):
    """The capacity.* settings every pool's KneeEstimator is made with."""
    min_confidence: float
    min_change: float
    confirmations: int
    min_observations: int


class CapacityState:
    """The capacity layer's settings (checked here) and what it keeps from one cycle to the next."""

    def __init__(self, inputs: CapacityInputs) -> None:
        """`inputs`: the capacity layer's settings, typed and checked where the configuration is read
        (monitor/config/inputs.py `capacity_inputs`); the SLO targets merged there."""
        c = inputs.capacity
        self.inputs = inputs
        self.signal = c.knee_signal
        if self.signal not in SIGNAL_HIST:
            raise ValueError(f"capacity.knee_signal must be one of {', '.join(SIGNAL_HIST)}, got {self.signal!r}")
        self.knee_opts: KneeOptions = {"min_confidence": c.min_confidence, "min_change": c.min_change,
                                       "confirmations": c.confirmations, "min_observations": c.min_observations}
        self.min_span = float(c.knee_min_span_seconds)
        self.kv_per_request = c.kv_tokens_per_request
        self.per_session = c.active_requests_per_session
        self.task_pools: dict = dict(c.task_pools)
        self.task_classes: dict = dict(c.task_classes)
        self.slo = inputs.slos
        self.window = float(inputs.latency_window)
        self.tracker = SloTracker(self.slo.windows, keep_seconds=max([self.window, *self.slo.windows.values()]) * 1.1,
                                  tolerance=float(inputs.interval))
        # Prometheus mode: {(signal, task type): {window: histogram or None}} read by this cycle's
        # collect (monitor/history/slo_history.py PrometheusWindows); None: not read, or the read failed
        self.slo_cycle_windows: Optional[dict] = None
        self.slo_task_pools: dict[str, dict[str, float]] = {}  # task type -> {pool it was seen in: when}
        self.knees: dict[str, KneeEstimator] = {}
        self.knee_watch: dict[str, KneeWatch] = {}  # pool -> what its learned knee was learned on
        self.priors: dict[str, SteadyPrior] = {}
        self.seen: dict[str, float] = {}  # "target|model" -> timestamp of the newest reading observed
        self.task_window = float(c.task_window or self.window)
        self.gateway_windows: dict[tuple[int, Optional[str]], TaskWindow] = {}
        self.gateways_warned: set[int] = set()  # gateways whose unattributed readings were logged
        self.pool_seen: dict[str, float] = {}  # pool -> the last cycle it was assessed
        self.loads = LoadWindows(self.window)  # each pool's load over the latency window
        self.gateway_loads = LoadWindows(self.window)  # each pool's gateway-queued requests over it
        self.judged: dict[str, list[Judged]] = {}  # pool -> its latency targets judged this cycle

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds` (monitor/step/cycle_state.py CycleState.shift_time): the SLO windows,
        the gateway task windows and the knee's last observed reading times move with it."""
        self.tracker.shift_time(seconds)
        for window in self.gateway_windows.values():
            window.shift_time(seconds)
        self.seen = {key: t + seconds for key, t in self.seen.items()}
        self.pool_seen = {pool: t + seconds for pool, t in self.pool_seen.items()}
        self.loads.shift_time(seconds)
        self.gateway_loads.shift_time(seconds)
        self.slo_task_pools = {tt: {pool: t + seconds for pool, t in pools.items()}
                               for tt, pools in self.slo_task_pools.items()}

    def expire(self, before: float) -> None:
        """Forget what was last seen before `before` (global.forget_after ago): the knee estimator of
        a pool not assessed since and its steady prior, replicas' last observed readings, gateway task
        windows, SLO windows and the pools a task type's burn windows were seen in."""
        for pool in [p for p, t in self.pool_seen.items() if t < before]:
            del self.pool_seen[pool]
            self.knees.pop(pool, None)
            self.knee_watch.pop(pool, None)
            self.priors.pop(pool, None)
            self.loads.forget(pool)
            self.gateway_loads.forget(pool)
        for task_type, pools in list(self.slo_task_pools.items()):
            for pool in [p for p, t in pools.items() if t < before]:
                del pools[pool]
            if not pools:
                del self.slo_task_pools[task_type]
        for key in [k for k, t in self.seen.items() if t < before]:
            del self.seen[key]
        for gateway_pool in [k for k, w in self.gateway_windows.items()
                             if not w.readings or w.readings[-1].timestamp < before]:
            del self.gateway_windows[gateway_pool]
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

    def steady_prior(self, pool: str) -> SteadyPrior:
        sp = self.priors.get(pool)
        if sp is None:
            sp = self.priors[pool] = SteadyPrior(float(self.kv_per_request) if self.kv_per_request else None)
        return sp

    def prior(self, p: PoolSnapshot, max_num_seqs: Optional[int]):
        """The pool's prior knee, steady between cycles: it changes only when the limits do
        (`SteadyPrior`: the measured KV tokens per request enter as a median, with hysteresis)."""
        kv_cap = (p.kv_tokens_capacity / p.replicas) if (p.kv_tokens_capacity and p.replicas) else None
        per_req = None
        if p.kv_tokens_live and p.active_requests and not p.stale:
            per_req = p.kv_tokens_live / p.active_requests
        return self.steady_prior(p.pool).update(max_num_seqs, kv_cap, per_req)




# ---------------------------------------------------------------------- the cycle's assessment

@dataclass(frozen=True)
class Assessed:
    """One pool's results of the capacity layer; `step` attaches them to the pool (monitor/step/cycle_step.py).
    `gateway_queued` and `gateway_queued_source` hold the engines' own queue readings too, with the
    gateways' estimated queues added (monitor/capacity/gateway_estimate.py)."""

    capacity: Capacity
    tasks: PoolTasks
    gateway_queued: dict[str, float]
    gateway_queued_source: dict[str, str]
    shed_rates: dict[str, float]
    gateway_added_latency: Optional[Quantiles]
    kv_tiers: dict


def assess(state: CapacityState, pools: Sequence[PoolSnapshot], history: History,
           gateways: Sequence[GatewayScrape] = (), dcgm: Sequence[DcgmReading] = (), now: float = 0.0,
           slo_windows: Optional[dict] = None, anomalies: Optional[dict] = None,
           fleet: Optional[Sequence[tuple[str, str]]] = None) -> dict[str, Assessed]:
    """Pool -> its capacity, tasks and what the gateways add (see the module docstring); no pool is
    changed. Gateway readings no pool could be given alone are counted into `anomalies`; `fleet`:
    (pool, model) of every pool, other shards' too, the gateways' scopes are taken over (gateway_plan.py)."""
    state.slo_cycle_windows = slo_windows
    state.judged = {}
    # the pools' working copies (the callers' are never changed): the gateways' estimated queues and
    # shed join a copy's load before the load is judged
    pools = [replace(p, gateway_queued=dict(p.gateway_queued), gateway_queued_source=dict(p.gateway_queued_source))
             for p in pools]
    names = {p.pool for p in pools}
    planned = plan_gateways(state, fleet or [(p.pool, p.model) for p in pools], gateways, anomalies, names)
    tasks = _tasks(state, pools, planned, now)
    estimate_gateway_queues(pools, gateways, state.gateway_windows)  # on the copies, before the load is judged
    shed = gateway_shed_rates(planned, names)
    gateway_calls = gateway_call_histograms(planned, names)
    call_totals = gateway_call_totals(planned, names)
    power = _power(state, history, dcgm)
    by_pool: dict[str, dict] = {}  # one pass over the history: the work stays linear in series
    for key, readings in history.items():
        if readings:
            by_pool.setdefault(pool_of(readings[-1], state.inputs.pool_by), {})[key] = readings
    out: dict[str, Assessed] = {}
    for p in pools:
        mine = by_pool.get(p.pool, {})
        ps = state.inputs.pool_settings(p.pool)
        est = state.estimator(p.pool)
        state.pool_seen[p.pool] = now
        est.set_prior(state.prior(p, ps.max_num_seqs))
        if not p.stale:
            _observe(state, est, mine)
        knee = est.estimate()
        by_type, classes = tasks.get(p.pool, ({}, {}))
        if p.pool in shed:
            p.shed_rates = add_gateway_shed(p.shed_rates, shed[p.pool])  # p: this call's copy
        vals = [t.sessions for t in by_type.values() if t.sessions is not None]
        sessions = float(sum(vals)) if vals else None
        settings = CapacitySettings(max_num_seqs=ps.max_num_seqs, kv_tokens_per_request=state.kv_per_request,
                                    watts_per_replica=ps.watts_per_replica,
                                    active_requests_per_session=state.per_session)
        pool_slos = slo_pools(state, p, mine, now, call_totals.get(p.pool))
        if p.pool in gateway_calls:
            p.gateway_added_latency = added_latency(histo.quantiles(gateway_calls[p.pool]), p.latency.get("e2e"))
        if p.stale or p.replicas == 0:
            capacity = Capacity(knee_detail=STALE, withheld=True)
        else:
            capacity = _capacity(state, p, knee, settings, power.get(p.pool), sessions, now)
        out[p.pool] = Assessed(capacity, PoolTasks(by_type, pool_slos, classes), p.gateway_queued,
                               p.gateway_queued_source, p.shed_rates, p.gateway_added_latency,
                               configured_lmcache(p, ps.lmcache_cpu_bytes_per_replica))
    return out


def _capacity(state: CapacityState, p: PoolSnapshot, knee, settings: CapacitySettings, watts: Optional[float],
              sessions: Optional[float], now: float) -> Capacity:
    """A fresh pool's capacity: its knee against the load judged over the latency window, its
    latency targets' limit, and whether the engine changed under the learned knee."""
    sp = state.steady_prior(p.pool)
    steady = (sp.kv_tokens_per_request, sp.kv_source) if sp.kv_tokens_per_request and sp.kv_source else None
    load = _judged_load(state, p, now)
    limit = slo_limit(load[0] if load else None, state.judged.get(p.pool, ()))
    capacity = pool_capacity(p, knee, settings, watts, sessions, kv_per_request=steady,
                             load=load, slo=(limit[0], limit[1].as_dict()) if limit else None)
    per_replica = p.kv_tokens_capacity / p.replicas if p.kv_tokens_capacity else None
    why = suspect(state.knee_watch.setdefault(p.pool, KneeWatch()), knee, p.spec_acceptance_ratio, per_replica)
    return replace(capacity, knee_suspect=why)


def configured_lmcache(p: PoolSnapshot, per_replica: Optional[float]) -> dict:
    """The pool's KV tiers, LMCache's CPU tier given its capacity: LMCache has no capacity gauge, so it
    is the configured bytes per replica (pools.<pool>.lmcache_cpu_bytes_per_replica, LMCache's
    max_local_cpu_size) x replicas answering, where the replicas report the tier."""
    tier = p.kv_tiers.get("lmcache_cpu")
    if tier is None or not per_replica:
        return p.kv_tiers
    return {**p.kv_tiers, "lmcache_cpu": replace(tier, capacity_bytes=per_replica * p.replicas, source="configured")}


def _judged_load(state: CapacityState, p: PoolSnapshot, now: float) -> Optional[tuple[float, float, str]]:
    """(the load `current` judges, the seconds it covers, how it was found): the engines' by Little's
    law over the rate window (completion rate x mean e2e: every request's time in the engines, not
    15-s samples of it) plus the gateway-queued requests averaged over the latency window; the
    time-weighted mean of the cycles' loads while Little's law is unknown (module load_window.py)."""
    averaged = state.loads.mean(p.pool, now, p.load_requests)
    gateway = state.gateway_loads.mean(p.pool, now, p.gateway_queued_requests or 0.0)
    littles = engines_in_flight(p)
    if averaged is None:
        return None
    if littles is None or gateway is None or not p.window_seconds:
        return averaged[0], averaged[1], "window_mean"
    return littles + gateway[0], p.window_seconds, "littles_law"


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

def _tasks(state: CapacityState, pools: list[PoolSnapshot], planned: list[Planned], now: float
           ) -> dict[str, tuple[dict[str, TaskStats], dict[str, Quantiles]]]:
    """pool -> ({task_type: TaskStats}, {call class: Quantiles})."""
    by_pool: dict[str, tuple[dict[str, TaskStats], dict[str, Quantiles]]] = {}
    names = {p.pool for p in pools}
    for pool, gcfg, reading, prev, covered, routes in planned:
        for tt, stats in derive_tasks(reading, prev, gcfg, state.slo, covered).items():
            target_pool = routes.get(tt, pool)
            if target_pool not in names:
                continue
            t = reading.tasks[tt]
            if gcfg.models and t.calls == 0 and t.call_latency is None and t.tasks_started is None:
                continue  # no series of this pool's model for the task type
            entry = by_pool.setdefault(target_pool, ({}, {}))[0]
            stats = slo_windows(state, target_pool, t, stats, now)
            # the same task type from two sources (the gateway and the application): joined
            entry[tt] = join_sources(entry[tt], stats) if tt in entry else stats
        classes = call_latency_by_class(reading, prev)
        if pool in names and classes:
            by_pool.setdefault(pool, ({}, {}))[1].update(classes)
    return by_pool


# ---------------------------------------------------------------------- power

def _power(state: CapacityState, history: History, dcgm: Sequence[DcgmReading]) -> dict[str, float]:
    if not dcgm:
        return {}
    reps = [(pool_of(rs[-1], state.inputs.pool_by), rs[-1].target, rs[-1].labels) for rs in history.values() if rs]
    keys = key_map(reps)
    first = state.inputs.dcgm_replica_label
    watts: dict[str, float] = {}
    for reading in dcgm:
        w, _unmatched = power_by_pool(reading.samples, keys, first_label=first)
        for pool, v in w.items():
            watts[pool] = watts.get(pool, 0.0) + v
    return watts
