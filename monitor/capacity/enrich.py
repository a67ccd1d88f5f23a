"""The capacity enricher: runs after derivation in every cycle (monitor/wiring.py picks it up).

For each pool it
  1. feeds the pool's `KneeEstimator` one observation per replica and cycle, from the replica's
     newest reading and the newest one at least `knee_min_span_seconds` (30) older:
     load = e2e seconds finished in the interval / interval (Little's law: the
     time-averaged active + queued requests), latency = the interval's mean of the knee signal's
     histogram (queue time by default), KV = live KV tokens;
  2. keeps the prior up to date from the engine's limits (pools.<name>.max_num_seqs, KV capacity
     per replica / measured KV tokens per request);
  3. reads the gateway bodies of the cycle into task readings and derives per-task numbers
     (arrival rate, calls per task, latency quantiles, sessions, SLO share and burn rates);
  4. joins DCGM power to the pool's replicas;
  5. fills `pool.capacity` (compute_capacity's dict + "samples") and `pool.tasks` (per task type +
     "samples"), the samples being (catalogue name, labels without pool, value).

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
SLO targets come from the `slos:` section (monitor.capacity.slo.SloSettings.from_dict) and from
pools.<name>.slo (ttft_p95_seconds: 0.5 style keys).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Optional

from monitor.derive import histogram as histo
from monitor.capacity.headroom import CapacitySettings, compute_capacity
from monitor.capacity.knee import KneeEstimator, prior_knee
from monitor.capacity.power import key_map, power_by_pool
from monitor.capacity.slo import SloSettings, SloTracker, Target
from monitor.capacity.tasks import call_latency_by_class, derive_tasks
from monitor.model import Histogram, PoolSnapshot
from monitor.sources.gateway import GatewayConfig, GatewayReading, iter_samples, read_gateway

log = logging.getLogger(__name__)

CAPACITY_KEYS = {"knee_signal", "knee_min_span_seconds", "min_confidence", "min_change", "confirmations", "min_observations",
                 "kv_tokens_per_request", "active_requests_per_session", "task_pools", "task_classes"}
SIGNAL_HIST = {"queue": "queue", "ttft": "ttft", "e2e": "e2e", "itl": "itl", "e2e_per_token": "e2e"}
QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.95", "p95"), ("0.99", "p99"))


def capacity_samples(c: dict) -> list[tuple[str, dict, float]]:
    """compute_capacity's dict -> (catalogue name, labels without pool, value)."""
    out: list[tuple[str, dict, float]] = []

    def add(name, labels, value):
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out.append((name, labels, float(value)))

    add("headroom_knee_requests", {}, c.get("knee_requests"))
    add("headroom_knee_kv_tokens", {}, c.get("knee_kv_tokens"))
    info = c.get("knee_info") or {}
    if info:
        add("headroom_knee_info", {"source": info["source"], "signal": info["signal"]}, 1.0)
    add("headroom_knee_confidence_ratio", {}, c.get("knee_confidence_ratio"))
    add("headroom_utilisation_ratio", {}, c.get("utilisation_ratio"))
    for scenario, v in (c.get("ratio") or {}).items():
        add("headroom_ratio", {"scenario": scenario}, v)
    for scenario, v in (c.get("headroom_requests") or {}).items():
        add("headroom_headroom_requests", {"scenario": scenario}, v)
    for limit, v in (c.get("capacity_requests") or {}).items():
        add("headroom_capacity_requests", {"limit": limit}, v)
    add("headroom_sessions", {}, c.get("sessions"))
    add("headroom_session_capacity", {}, c.get("session_capacity"))
    add("headroom_power_watts", {}, c.get("power_watts"))
    add("headroom_sessions_per_megawatt", {}, c.get("sessions_per_megawatt"))
    return out


def task_samples(tasks: dict, classes: dict) -> list[tuple[str, dict, float]]:
    """derive_tasks' dict (+ SLO windows) and call latency by class -> samples."""
    out: list[tuple[str, dict, float]] = []

    def add(name, labels, value):
        if value is not None and math.isfinite(value):
            out.append((name, labels, float(value)))

    for tt, d in sorted(tasks.items()):
        lab = {"task_type": tt}
        add("headroom_task_arrival_rate", lab, d.get("arrival_rate"))
        add("headroom_task_calls_per_task", lab, d.get("calls_per_task"))
        for q, key in QUANTILES:
            add("headroom_task_latency_seconds", {**lab, "quantile": q}, (d.get("task_latency") or {}).get(key))
        add("headroom_slo_violation_ratio", lab, d.get("slo_violation_ratio"))
        for window, v in (d.get("slo_burn_rate") or {}).items():
            add("headroom_slo_burn_rate", {**lab, "window": window}, v)
    for cls, q in sorted(classes.items()):
        for label, key in QUANTILES:
            add("headroom_call_latency_seconds", {"class": cls, "quantile": label}, getattr(q, key))
    return out


def interval_observation(newer, older, signal: str) -> Optional[tuple[float, Optional[float], float]]:
    """(load, kv tokens, latency) of one replica between two readings; None when not measurable."""
    dt = newer.timestamp - older.timestamp
    if dt <= 0:
        return None
    e2e_new, e2e_old = newer.histograms.get("e2e"), older.histograms.get("e2e")
    sig_new, sig_old = newer.histograms.get(SIGNAL_HIST[signal]), older.histograms.get(SIGNAL_HIST[signal])
    if not (e2e_new and e2e_old and sig_new and sig_old):
        return None
    e2e, sig = e2e_new.minus(e2e_old), sig_new.minus(sig_old)
    if e2e is None or sig is None or sig.count <= 0:
        return None
    latency = sig.sum / sig.count
    if signal == "e2e_per_token":
        gen = newer.counters.get("generation_tokens"), older.counters.get("generation_tokens")
        if None in gen or gen[0] <= gen[1]:
            return None
        latency = e2e.sum / (gen[0] - gen[1])
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


class CapacityEnricher:
    __name__ = "capacity"

    def __init__(self, cfg) -> None:
        section: dict[str, Any] = dict(getattr(cfg, "capacity", {}) or {})
        unknown = sorted(set(section) - CAPACITY_KEYS)
        if unknown:
            raise ValueError(f"capacity: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(CAPACITY_KEYS))}")
        self.cfg = cfg
        self.signal = section.get("knee_signal", "queue")
        if self.signal not in SIGNAL_HIST:
            raise ValueError(f"capacity.knee_signal must be one of {', '.join(SIGNAL_HIST)}, got {self.signal!r}")
        self.knee_opts = {k: section[k] for k in ("min_confidence", "min_change", "confirmations", "min_observations")
                          if k in section}
        self.min_span = float(section.get("knee_min_span_seconds", 30.0))
        self.kv_per_request = section.get("kv_tokens_per_request")
        self.per_session = section.get("active_requests_per_session")
        self.task_pools: dict = dict(section.get("task_pools") or {})
        self.task_classes: dict = dict(section.get("task_classes") or {})
        self.slo = SloSettings.from_dict(getattr(cfg, "slos", None))
        for pool, ps in (getattr(cfg, "pools", {}) or {}).items():
            if getattr(ps, "slo", None):
                self.slo.pool_targets[pool] = SloSettings.from_dict({"pools": {pool: ps.slo}}).pool_targets[pool]
        self.window = float(getattr(cfg, "latency_window", 300.0))
        self.tracker = SloTracker(self.slo.windows, keep_seconds=max([self.window, *self.slo.windows.values()]) * 1.1)
        self.knees: dict[str, KneeEstimator] = {}
        self.seen: dict[str, float] = {}  # "target|model" -> timestamp of the newest reading observed
        self.gateway_prev: dict[int, GatewayReading] = {}

    # ------------------------------------------------------------------ knee
    def _estimator(self, pool: str) -> KneeEstimator:
        est = self.knees.get(pool)
        if est is None:
            est = self.knees[pool] = KneeEstimator(self.signal, **self.knee_opts)
        return est

    def _prior(self, p: PoolSnapshot, max_num_seqs: Optional[int]):
        kv_cap = (p.kv_tokens_capacity / p.replicas) if (p.kv_tokens_capacity and p.replicas) else None
        per_req = None
        if p.kv_tokens_live and p.active_requests:
            per_req = p.kv_tokens_live / p.active_requests
        elif self.kv_per_request:
            per_req = float(self.kv_per_request)
        return prior_knee(max_num_seqs, kv_cap, per_req)

    def _observe(self, p: PoolSnapshot, pipeline) -> None:
        est = self._estimator(p.pool)
        from monitor.derive.core import pool_of  # the pipeline's own pool mapping

        for key, dq in getattr(pipeline, "history", {}).items():
            if len(dq) < 2 or pool_of(dq[-1], self.cfg.pool_by) != p.pool:
                continue
            newer = dq[-1]
            if self.seen.get(key) == newer.timestamp:
                continue  # this interval was observed already (a replica that did not answer)
            self.seen[key] = newer.timestamp
            older = older_reading(dq, self.min_span)
            obs = interval_observation(newer, older, self.signal)
            if obs is not None:
                est.observe(*obs)

    # ------------------------------------------------------------------ tasks
    def _gateway_readings(self, pools: list[PoolSnapshot], pipeline, now: float) -> list:
        """[(pool or None, gateway config, reading, previous reading)] for this cycle's bodies.

        A gateway configured with `pool` feeds that pool; with one pool, it feeds that pool; else a
        gateway with a model label is read once per pool, keeping the series of the pool's model,
        and the application convention (no model label) is split by capacity.task_pools."""
        out = []
        for i, (src, text) in enumerate(getattr(pipeline, "gateway_texts", []) or []):
            if text is None:
                continue
            base = GatewayConfig(kind=src.kind, task_label=src.task_label, session_label=src.session_label,
                                 task_classes=self.task_classes)
            if getattr(src, "pool", None):
                plan = [(src.pool, base)]
            elif len(pools) == 1:
                plan = [(pools[0].pool, base)]
            elif base.model:
                plan = [(p.pool, GatewayConfig(kind=src.kind, task_label=src.task_label,
                                               session_label=src.session_label, task_classes=self.task_classes,
                                               models=(p.model,))) for p in pools]
            else:
                plan = [(None, base)]
            for pool, gcfg in plan:
                try:
                    reading = read_gateway(text, gcfg, now)
                except ValueError as exc:
                    log.warning("gateway %s: %s", getattr(src, "url", i), exc)
                    break
                key = (i, pool)
                prev = self.gateway_prev.get(key)
                if prev is not None and prev.timestamp >= now:
                    prev = None
                self.gateway_prev[key] = reading
                out.append((pool, gcfg, reading, prev))
        return out

    def _tasks(self, pools: list[PoolSnapshot], pipeline, now: float) -> dict[str, dict]:
        """pool -> {task_type: derived dict}, plus "_classes" -> {class: Quantiles}."""
        by_pool: dict[str, dict] = {}
        names = {p.pool for p in pools}
        for pool, gcfg, reading, prev in self._gateway_readings(pools, pipeline, now):
            derived = derive_tasks(reading, prev, gcfg, self.slo)
            for tt, d in derived.items():
                target_pool = self.task_pools.get(tt, pool)
                if target_pool not in names:
                    continue
                t = reading.tasks[tt]
                if gcfg.models and t.calls == 0 and t.call_latency is None and t.tasks_started is None:
                    continue  # no series of this pool's model for the task type
                entry = by_pool.setdefault(target_pool, {})
                if tt in entry and entry[tt].get("calls_per_task_source") == "app":
                    continue  # the same task type from two sources: the app's numbers win
                self._slo_windows(target_pool, tt, t, d, now)
                entry[tt] = d
            classes = call_latency_by_class(reading, prev)
            if pool in names and classes:
                by_pool.setdefault(pool, {}).setdefault("_classes", {}).update(classes)
        return by_pool

    def _slo_windows(self, pool: str, tt: str, t, d: dict, now: float) -> None:
        target = self.slo.task_target(tt)
        if target is None:
            return
        h = t.task_duration if target.signal == "task" else (t.ttft if target.signal == "ttft" else t.call_latency)
        if h is None:
            return
        total = histo.total(h)
        bad = (histo.fraction_above(h, target.seconds) or 0.0) * total
        key = (pool, tt)
        try:
            self.tracker.observe(key, now, total, bad)
        except ValueError:
            return
        ratio = self.tracker.ratio(key, self.window)
        if ratio is not None:
            d["slo_violation_ratio"] = ratio
            d["slo_window_seconds"] = self.window
        d["slo_burn_rate"] = self.tracker.burn_rates(key, target)

    def _pool_slos(self, p: PoolSnapshot, pipeline, now: float) -> dict:
        """Pool-level latency targets (ttft, e2e, queue, itl) over the summed replica histograms."""
        out = {}
        targets: list[Target] = self.slo.pool_targets.get(p.pool, [])
        if not targets:
            return out
        from monitor.derive.core import pool_of

        newest = [dq[-1] for dq in getattr(pipeline, "history", {}).values()
                  if dq and pool_of(dq[-1], self.cfg.pool_by) == p.pool]
        for target in targets:
            h = _sum_hist([r.histograms[target.signal] for r in newest if target.signal in r.histograms])
            if h is None:
                continue
            key = (p.pool, f"pool:{target.signal}")
            total = histo.total(h)
            try:
                self.tracker.observe(key, now, total, (histo.fraction_above(h, target.seconds) or 0.0) * total)
            except ValueError:
                continue
            out[f"pool:{target.signal}"] = {
                "slo_target_seconds": target.seconds, "slo_objective": target.objective,
                "slo_violation_ratio": self.tracker.ratio(key, self.window),
                "slo_burn_rate": self.tracker.burn_rates(key, target),
            }
        return out

    # ------------------------------------------------------------------ power
    def _power(self, pools: list[PoolSnapshot], pipeline) -> dict[str, float]:
        texts = [t for _, t in (getattr(pipeline, "dcgm_texts", []) or []) if t]
        if not texts:
            return {}
        from monitor.derive.core import pool_of

        reps = [(pool_of(dq[-1], self.cfg.pool_by), dq[-1].target, dq[-1].labels)
                for dq in getattr(pipeline, "history", {}).values() if dq]
        keys = key_map(reps)
        first = getattr(self.cfg, "dcgm_replica_label", None)
        watts: dict[str, float] = {}
        for text in texts:
            try:
                w, unmatched = power_by_pool(iter_samples(text), keys, first_label=first)
            except ValueError as exc:
                log.warning("dcgm: %s", exc)
                continue
            for pool, v in w.items():
                watts[pool] = watts.get(pool, 0.0) + v
        return watts

    # ------------------------------------------------------------------ the hook
    def __call__(self, pools: list[PoolSnapshot], pipeline) -> None:
        now = float(pipeline.clock()) if hasattr(pipeline, "clock") else max(
            (p.last_fresh_timestamp or 0.0 for p in pools), default=0.0)
        tasks = self._tasks(pools, pipeline, now)
        power = self._power(pools, pipeline)
        for p in pools:
            ps = self.cfg.pool_settings(p.pool)
            est = self._estimator(p.pool)
            est.set_prior(self._prior(p, ps.max_num_seqs))
            if not p.stale:
                self._observe(p, pipeline)
            knee = est.estimate()
            ptasks = tasks.get(p.pool, {})
            classes = ptasks.pop("_classes", {})
            sessions = None
            vals = [d["sessions"] for d in ptasks.values() if d.get("sessions") is not None]
            if vals:
                sessions = float(sum(vals))
            settings = CapacitySettings(max_num_seqs=ps.max_num_seqs, kv_tokens_per_request=self.kv_per_request,
                                        watts_per_replica=ps.watts_per_replica,
                                        active_requests_per_session=self.per_session)
            if p.stale or p.replicas == 0:
                p.capacity = {"knee_requests": None, "knee_detail": "pool is stale: values withheld", "samples": []}
            else:
                cap = compute_capacity(p, knee, settings, power.get(p.pool), sessions)
                cap["samples"] = capacity_samples(cap)
                p.capacity = cap
            pool_slos = self._pool_slos(p, pipeline, now)
            p.tasks = {**ptasks, **pool_slos,
                       "_call_latency_by_class": {c: q.as_dict() for c, q in classes.items()}}
            p.tasks["samples"] = task_samples({**ptasks, **pool_slos}, classes)


def make_enricher(cfg) -> CapacityEnricher:
    return CapacityEnricher(cfg)
