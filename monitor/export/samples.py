"""Snapshot -> exported samples: the one renderer. Every name comes from the catalogue.

    Renderer().render(snapshot, status) -> {metric name: [(labels, value), ...]}

Everything exported is read from typed data: the cycle's `Snapshot` (its pools with their
`Capacity`, `PoolTasks` and forecast, the sources, the error counts, the pipeline's own counters and
the forecaster's latest refit) and the daemon's `ProcessStatus` (its web server's counters and the
digest's outbox). No other module builds metric samples. A pool is named by its key
(monitor/model/poolkey.py): with `global.pool_by: [cluster, model_name]` the key's labels are added beside
`pool` here, in one place, on every pool and replica series (`pool="m",cluster="a"`). Each sample is checked against the
catalogue here (name and label names), so nothing unlisted is ever exported; None is never exported.

A renderer keeps two things between renders: how many series its cardinality cap cut, per metric
(`headroom_dropped_series{what="<metric>"}`, a counter), and how many parts of its renders failed
(`headroom_render_errors{family}`). A render never fails as a whole for one bad part: a sample the
catalogue refuses (a pool key's label clashing with the metric's own) is dropped and counted under
its family; a pool, the forecasts, the snapshot's other series or the process status that raises
while rendered is dropped and counted under `pool`, `forecast`, `snapshot` or `status`; the rest is
served. Label values are data: text that cannot be written as UTF-8 (a lone surrogate) is replaced
(U+FFFD) here, as the last line (the cycle replaces and counts it where it comes in: monitor/pipeline/cycle.py).
The daemon has one renderer (monitor/export/collector.py `Exposition`).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

from monitor.kit.text import valid_text

from .. import __version__
from ..model import Capacity, PoolSnapshot, PoolTasks, Snapshot
from ..model.catalogue import BY_NAME
from ..model.poolkey import split
from .edge_samples import edge_samples
from .spare_samples import spare_samples

Samples = dict[str, list[tuple[dict[str, str], float]]]
log = logging.getLogger(__name__)

# Cardinality cap per exported metric: a misconfigured label (a session id used as the task type)
# must not flood Prometheus. What is cut is counted in headroom_dropped_series{what="<metric>"}.
MAX_SERIES_PER_METRIC = 10_000

# the `q` label's values (not `quantile`: Prometheus reserves that label for summaries, and
# `promtool check metrics` refuses it on a gauge)
QUANTILE_FIELDS = (("0.5", "p50"), ("0.9", "p90"), ("0.95", "p95"), ("0.99", "p99"), ("mean", "mean"))
QUANTILES = QUANTILE_FIELDS[:4]  # task and call latency: no mean


class UnknownMetric(KeyError):
    pass


@dataclass(frozen=True)
class DigestStatus:
    """The weekly digest's outbox (monitor/digest/metrics.py reads it)."""

    pending_deliveries: float
    last_success_timestamp: Optional[float] = None  # None until a week reached every destination


@dataclass(frozen=True)
class ProcessStatus:
    """What the daemon knows besides the cycle, read when a snapshot is rendered."""

    web_events: dict[str, float] = field(default_factory=dict)  # the web server's counters, by event
    web_open_connections: Optional[float] = None
    digest: Optional[DigestStatus] = None
    store_errors: dict[str, float] = field(default_factory=dict)  # the history store's failures, by operation
    shard: Optional[tuple[int, int]] = None  # (index, total) of this daemon: headroom_shards


@dataclass(frozen=True)
class Cadence:
    """The cycle's cadence, read when /metrics is scraped (not when a snapshot is rendered), so the age
    grows while cycles are stopped."""

    last_cycle_age_seconds: Optional[float]  # monotonic; None before the first cycle
    interval_seconds: float


class Renderer:
    def __init__(self, max_series_per_metric: int = MAX_SERIES_PER_METRIC):
        self.max_series = max_series_per_metric
        self.dropped: dict[str, float] = {}  # metric -> series cut so far
        self.errors: dict[str, float] = {}  # family (or part) -> samples / parts dropped by a failure so far

    def failed(self, family: str, detail: str) -> None:
        """A part of a render dropped: counted, and logged the first time for that family."""
        if family not in self.errors:
            log.warning("render: %s dropped (%s); the rest is served, counted in headroom_render_errors_total",
                        family, detail[:300])
        self.errors[family] = self.errors.get(family, 0.0) + 1

    def render(self, snap: Optional[Snapshot], status: Optional[ProcessStatus] = None) -> Samples:
        out = Rows(self)
        out.add("headroom_build_info", {"version": __version__}, 1.0)
        if snap is not None:
            for p in snap.pools:
                out.part("pool", pool_samples, out, p)
            out.part("snapshot", _snapshot_samples, out, snap)
        if status is not None:
            out.part("status", _status_samples, out, status)
        for what, v in sorted(self.dropped.items()):
            out.add("headroom_dropped_series", {"what": what}, v)
        return out.samples

    def live(self, cadence: Optional[Cadence]) -> Samples:
        """The samples computed at each scrape: the cycle's cadence and the render errors (they must
        move while the body of the last good render is served)."""
        out = Rows(self)
        if cadence is not None:
            out.add("headroom_last_cycle_age_seconds", {}, cadence.last_cycle_age_seconds)
            out.add("headroom_cycle_interval_seconds", {}, cadence.interval_seconds)
        for family, v in sorted(list(self.errors.items())):
            out.add("headroom_render_errors", {"family": family}, v)
        return out.samples


def snapshot_samples(snap: Optional[Snapshot], status: Optional[ProcessStatus] = None) -> Samples:
    """One render by a fresh renderer (its cut counts start at 0)."""
    return Renderer().render(snap, status)


def digest_samples(status: Optional[DigestStatus]) -> list[tuple[str, dict, float]]:
    """The digest metrics of one outbox status, as (name, labels, value)."""
    out = Rows(Renderer())
    if status is not None:
        _digest(out, status)
    return [(name, labels, value) for name, rows in out.samples.items() for labels, value in rows]


class Rows:
    """The samples of one render, each checked against the catalogue as it is added (the
    renderer's cap counts what it cuts)."""

    def __init__(self, renderer: Renderer):
        self.renderer = renderer
        self.samples: Samples = {}

    def part(self, what: str, fn, *args) -> None:
        """Render one part (a pool, the forecasts, the snapshot's series, the status) by `fn`: the
        samples it added are kept only when it finishes; one that raises is dropped whole and counted
        under `what`."""
        before = {name: len(rows) for name, rows in self.samples.items()}
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 -- one part must never take the others with it
            for name in list(self.samples):
                del self.samples[name][before.get(name, 0):]
                if not self.samples[name]:
                    del self.samples[name]
            self.renderer.failed(what, f"{type(exc).__name__}: {exc}")

    def add(self, name: str, labels: dict[str, str], value: Optional[float]) -> None:
        """One sample, checked against the catalogue; one it refuses is dropped and counted (an
        unknown name is a programming error and raises)."""
        if value is None:
            return
        mdef = BY_NAME.get(name)
        if mdef is None:
            raise UnknownMetric(f"{name} is not in monitor/model/catalogue.py")
        pool, extra = split(labels["pool"]) if "pool" in labels else (None, ())
        clash = [k for k, _ in extra if k in labels]
        if set(labels) != set(mdef.labels) or clash:
            why = (f"its pool key carries {clash}, labels of its own" if clash else
                   f"takes labels {list(mdef.labels)}, got {sorted(labels)}")
            self.renderer.failed(name, f"{name} {why}")
            return
        if pool is not None and (extra or pool != labels["pool"]):  # pool="<name>", each key label beside it
            labels = {**labels, "pool": pool, **dict(extra)}
        if not all(v.isascii() for v in labels.values()):
            labels = {k: valid_text(v) for k, v in labels.items()}
        rows = self.samples.setdefault(name, [])
        if len(rows) >= self.renderer.max_series and name != "headroom_dropped_series":
            self.renderer.dropped[name] = self.renderer.dropped.get(name, 0.0) + 1
            return
        rows.append((labels, float(value)))


def pool_samples(out: Rows, p: PoolSnapshot) -> None:
    pl = {"pool": p.pool}
    out.add("headroom_pool_stale", pl, 1.0 if p.stale else 0.0)
    out.add("headroom_pool_last_fresh_timestamp_seconds", pl, p.last_fresh_timestamp)
    out.add("headroom_replicas", pl, p.replicas)
    out.add("headroom_replicas_configured", pl, p.replicas_configured)
    for r in p.replica_detail:
        rl = {"pool": p.pool, "replica": r.replica}
        out.add("headroom_replica_up", rl, 1.0 if r.up else 0.0)
        if r.up:
            out.add("headroom_replica_stalled", rl, 1.0 if r.stalled else 0.0)
            out.add("headroom_replica_slow", rl, 1.0 if r.slow else 0.0)
            out.add("headroom_replica_latency_ratio", rl, r.latency_ratio)
            out.add("headroom_replica_active_requests", rl, r.active_requests)
            out.add("headroom_replica_queued_requests", rl, r.queued_requests)
            out.add("headroom_replica_kv_tokens", rl, r.kv_tokens_live)
            out.add("headroom_replica_kv_tokens_low", rl, r.kv_tokens_live_low)
            out.add("headroom_replica_kv_tokens_high", rl, r.kv_tokens_live_high)
        out.add("headroom_replica_kv_capacity_tokens", rl, r.kv_tokens_capacity)
        for tier, t in sorted(r.kv_tiers.items()):
            out.add("headroom_replica_kv_tier_capacity_tokens", {**rl, "tier": tier, "source": t.source}, t.tokens)
        out.add("headroom_replica_kv_capacity_changes", rl, r.kv_capacity_changes)
    # a gateway's queue is this cycle's reading of the gateway, fresh when the replicas are down too
    # (exactly when users wait)
    for gateway, v in sorted(p.gateway_queued.items()):
        out.add("headroom_gateway_queued_requests",
                {"pool": p.pool, "gateway": gateway, "source": p.gateway_queued_source.get(gateway, "queue")}, v)
    if p.gateway_queued:
        out.add("headroom_queued_requests", {"pool": p.pool, "where": "gateway"}, p.gateway_queued_requests)
    if p.spare is not None:  # also with no replica answering: the budget says 0, a gate fails closed
        spare_samples(out, p.pool, p.spare)
    if p.replicas == 0:
        return  # nothing fresh to say about this pool: withhold rather than repeat old values
    out.add("headroom_active_requests", pl, p.active_requests)
    out.add("headroom_queued_requests", {"pool": p.pool, "where": "engine"}, p.queued_requests)
    for reason, v in sorted(p.queued_by_reason.items()):
        out.add("headroom_queued_requests_by_reason", {"pool": p.pool, "reason": reason}, v)
    for state, by_priority in (("running", p.active_by_priority), ("queued", p.queued_by_priority)):
        for priority, v in sorted(by_priority.items()):
            out.add("headroom_priority_requests", {"pool": p.pool, "priority": priority, "state": state}, v)
    for kv_pool, v in sorted(p.kv_pool_usage.items()):
        out.add("headroom_kv_pool_usage_ratio", {"pool": p.pool, "kv_pool": kv_pool}, v)
    if p.gateway_added_latency is not None:
        for label, attr in QUANTILE_FIELDS:
            out.add("headroom_gateway_added_latency_seconds", {"pool": p.pool, "q": label},
                    getattr(p.gateway_added_latency, attr))
    out.add("headroom_kv_tokens", pl, p.kv_tokens_live)
    out.add("headroom_kv_tokens_low", pl, p.kv_tokens_live_low)
    out.add("headroom_kv_tokens_high", pl, p.kv_tokens_live_high)
    out.add("headroom_rendering_requests", pl, p.rendering_requests)
    for reason, rate in sorted(p.shed_rates.items()):
        out.add("headroom_shed_requests_rate", {"pool": p.pool, "reason": reason}, rate)
    out.add("headroom_offered_requests", pl, p.offered_requests)
    out.add("headroom_kv_capacity_tokens", pl, p.kv_tokens_capacity)
    edge_samples(out, p)
    out.add("headroom_kv_usage_ratio", pl, p.kv_usage_ratio)
    out.add("headroom_completion_rate", pl, p.completion_rate)
    out.add("headroom_prompt_tokens_rate", pl, p.prompt_tokens_rate)
    out.add("headroom_generation_tokens_rate", pl, p.generation_tokens_rate)
    out.add("headroom_prefix_cache_hit_ratio", pl, p.prefix_cache_hit_ratio)
    out.add("headroom_preemption_rate", pl, p.preemption_rate)
    for kind, q in sorted(p.latency.items()):
        for label, attr in QUANTILE_FIELDS:
            out.add("headroom_latency_seconds", {"pool": p.pool, "kind": kind, "q": label},
                    getattr(q, attr))
    out.add("headroom_littles_law_ratio", pl, p.littles_law_ratio)
    out.add("headroom_replica_lead_time_seconds", pl, p.replica_lead_time_seconds)
    for horizon, n in sorted(p.recommended_replicas.items()):
        out.add("headroom_recommended_replicas", {"pool": p.pool, "horizon": horizon}, float(n))
    if p.capacity is not None:
        capacity_samples(out, p.pool, p.capacity)
    if p.tasks is not None:
        task_samples(out, p.pool, p.tasks)



def capacity_samples(out: Rows, pool: str, c: Capacity) -> None:
    """A pool's `Capacity`; NaN is not exported (an infinite ratio is)."""
    if c.withheld:
        return
    pl = {"pool": pool}

    def add(name: str, labels: dict, value: Optional[float]) -> None:
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out.add(name, {**pl, **labels}, value)

    add("headroom_knee_requests", {}, c.knee_requests)
    add("headroom_knee_kv_tokens", {}, c.knee_kv_tokens)
    if c.knee_source is not None:
        add("headroom_knee_info", {"source": c.knee_source, "signal": c.knee_signal}, 1.0)
    add("headroom_knee_confidence_ratio", {}, c.knee_confidence_ratio)
    if c.knee_implausible is not None:
        add("headroom_knee_implausible", {}, 1.0 if c.knee_implausible else 0.0)
    if c.knee_source is not None:
        add("headroom_knee_suspect", {}, 1.0 if c.knee_suspect else 0.0)
    add("headroom_utilisation_ratio", {}, c.utilisation_ratio)
    for scenario, v in c.ratio.as_dict().items():
        add("headroom_ratio", {"scenario": scenario}, v)
    for scenario, v in c.headroom_requests.as_dict().items():
        add("headroom_headroom_requests", {"scenario": scenario}, v)
    for limit, v in c.capacity_requests.as_dict().items():
        add("headroom_capacity_requests", {"limit": limit}, v)
    add("headroom_sessions", {}, c.sessions)
    add("headroom_session_capacity", {}, c.session_capacity)
    add("headroom_power_watts", {}, c.power_watts)
    add("headroom_sessions_per_megawatt", {}, c.sessions_per_megawatt)


def task_samples(out: Rows, pool: str, tasks: PoolTasks) -> None:
    """Per task type (and pool-level SLO, as task_type "pool:<signal>"), then per call class;
    only finite values."""

    def add(name: str, labels: dict, value: Optional[float]) -> None:
        if value is not None and math.isfinite(value):
            out.add(name, {"pool": pool, **labels}, value)

    entries: dict = {**tasks.by_type, **tasks.slos}
    for tt, t in sorted(entries.items()):
        lab = {"task_type": tt}
        add("headroom_task_arrival_rate", lab, getattr(t, "arrival_rate", None))
        add("headroom_task_completion_rate", lab, getattr(t, "completion_rate", None))
        add("headroom_task_calls_per_task", lab, getattr(t, "calls_per_task", None))
        latency = getattr(t, "task_latency", None)
        if latency is not None:
            for q, key in QUANTILES:
                add("headroom_task_latency_seconds", {**lab, "q": q}, getattr(latency, key))
        add("headroom_slo_violation_ratio", lab, t.slo_violation_ratio)
        if t.slo_violation_ratio is not None:  # the objective beside the ratio it is compared with
            add("headroom_slo_objective_ratio", lab, t.slo_objective)
        for window, v in t.slo_burn_rate.items():
            add("headroom_slo_burn_rate", {**lab, "window": window}, v)
    for cls, by_class in sorted(tasks.call_latency_by_class.items()):
        for label, key in QUANTILES:
            add("headroom_call_latency_seconds", {"class": cls, "q": label}, getattr(by_class, key))


def forecast_samples(out: Rows, refit, pools=()) -> None:
    """The forecaster's latest refit (`RefitResult`): every pool it forecast, undefined values left
    out (never exported as 0). A pool of this cycle exports its own `PoolSnapshot.forecast` (the
    refit with the time to exhaustion counted from this cycle), as the JSON does."""
    out.add("headroom_forecast_last_fit_timestamp_seconds", {}, float(refit.finished))
    mine = {p.pool: p.forecast for p in pools if p.forecast is not None}
    for pool, result in sorted(refit.pools.items()):
        pool_forecast_samples(out, pool, mine.get(pool, result))


def pool_forecast_samples(out: Rows, pool: str, result) -> None:
    for h, s in result.horizons.items():
        if s is None:
            continue
        labels = {"pool": pool, "horizon": h}
        out.add("headroom_forecast_requests", labels, s.mean)
        out.add("headroom_forecast_peak_requests", labels, s.peak)
        out.add("headroom_forecast_peak_requests_upper", labels, s.peak_upper)
        out.add("headroom_forecast_peak_timestamp_seconds", labels, s.peak_timestamp)
    out.add("headroom_exhaustion_seconds", {"pool": pool}, result.exhaustion_seconds)
    for name, entry in result.series.items():
        out.add("headroom_history_points", {"pool": pool, "series": name}, entry.history_points)
        if not entry.defined:
            continue
        out.add("headroom_forecast_selected_info", {"pool": pool, "series": name, "model": entry.model}, 1.0)
        for model, sk in entry.skill.items():
            labels = {"pool": pool, "series": name, "model": model}
            out.add("headroom_forecast_mase", labels, sk.get("mase"))
            for lv in ("0.8", "0.95"):
                out.add("headroom_forecast_coverage_ratio", {**labels, "level": lv},
                        sk.get("coverage" + str(int(float(lv) * 100))))


def _snapshot_samples(out: Rows, snap: Snapshot) -> None:
    seen = set()
    for st in snap.sources:
        key = (st.source, st.target)
        if key in seen:
            continue
        seen.add(key)
        out.add("headroom_source_up", {"source": st.source, "target": st.target}, 1.0 if st.up else 0.0)
        if st.duration_seconds is not None:
            out.add("headroom_source_duration_seconds", {"source": st.source, "target": st.target},
                    st.duration_seconds)
        if st.up and st.source == "vllm":
            out.add("headroom_source_missing_families", {"source": st.source, "target": st.target},
                    float(len(st.missing)))
            for family in st.missing:
                out.add("headroom_source_missing_family_info",
                        {"source": st.source, "target": st.target, "family": family}, 1.0)
    for part, v in sorted(snap.source_stale_seconds.items()):
        if v == v:  # NaN: never read yet, nothing to say
            out.add("headroom_source_stale_seconds", {"source": "prometheus", "part": part}, v)
    for source_target, v in sorted(snap.slow.items()):
        source, _, target = source_target.partition("|")
        out.add("headroom_source_slow", {"source": source, "target": target}, v)
    for source_reason, v in sorted(snap.errors.items()):
        source, _, reason = source_reason.partition("|")
        out.add("headroom_source_errors", {"source": source, "reason": reason}, v)
    out.add("headroom_cycle_duration_seconds", {}, snap.cycle_duration_seconds)
    out.add("headroom_last_success_timestamp_seconds", {}, snap.last_success_timestamp)
    out.add("headroom_cycles", {}, float(snap.cycles))
    for clock, steps in (("headroom", snap.clock_steps), ("query_layer", snap.query_clock_steps)):
        for direction, v in sorted(steps.items()):
            out.add("headroom_clock_steps", {"clock": clock, "direction": direction}, v)
    for what, v in sorted(snap.dropped.items()):
        out.add("headroom_dropped_series", {"what": what}, v)
    for kind, v in sorted(snap.anomalies.items()):
        out.add("headroom_input_anomalies", {"kind": kind}, v)
    if snap.forecast is not None:
        out.part("forecast", forecast_samples, out, snap.forecast, snap.pools)


def _status_samples(out: Rows, status: ProcessStatus) -> None:
    for event, v in status.web_events.items():
        out.add("headroom_web_events", {"event": event}, v)
    out.add("headroom_web_open_connections", {}, status.web_open_connections)
    for operation, v in sorted(status.store_errors.items()):
        out.add("headroom_store_errors", {"operation": operation}, v)
    if status.digest is not None:
        _digest(out, status.digest)
    if status.shard is not None:
        out.add("headroom_shards", {"shard": str(status.shard[0])}, float(status.shard[1]))


def _digest(out: Rows, status: DigestStatus) -> None:
    out.add("headroom_digest_pending_deliveries", {}, status.pending_deliveries)
    out.add("headroom_digest_last_success_timestamp_seconds", {}, status.last_success_timestamp)


__all__ = ["Cadence", "DigestStatus", "MAX_SERIES_PER_METRIC", "ProcessStatus", "Renderer", "Samples", "UnknownMetric",
           "digest_samples", "snapshot_samples"]
