"""Snapshot -> exported samples (pure). Every name comes from the catalogue.

Pools, capacity, tasks and forecasts put extra samples into `PoolSnapshot.capacity["samples"]`,
`.tasks["samples"]` and `.forecast["samples"]` as (metric name, labels without `pool`, value);
they are checked against the catalogue here, so nothing unlisted is ever exported.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

from .. import __version__
from ..catalogue import BY_NAME
from ..model import PoolSnapshot, Snapshot

Samples = dict[str, list[tuple[dict[str, str], float]]]

# Cardinality cap per exported metric: a misconfigured label (a session id used as the task type)
# must not flood Prometheus. What is cut is counted in headroom_dropped_series{what="<metric>"}.
MAX_SERIES_PER_METRIC = 10_000
DROPPED: dict[str, float] = {}

QUANTILE_FIELDS = (("0.5", "p50"), ("0.9", "p90"), ("0.95", "p95"), ("0.99", "p99"), ("mean", "mean"))


class UnknownMetric(KeyError):
    pass


def _add(out: Samples, name: str, labels: dict[str, str], value: Optional[float]) -> None:
    if value is None:
        return
    mdef = BY_NAME.get(name)
    if mdef is None:
        raise UnknownMetric(f"{name} is not in monitor/catalogue.py")
    if set(labels) != set(mdef.labels):
        raise UnknownMetric(f"{name} takes labels {mdef.labels}, got {tuple(labels)}")
    rows = out.setdefault(name, [])
    if len(rows) >= MAX_SERIES_PER_METRIC and name != "headroom_dropped_series":
        DROPPED[name] = DROPPED.get(name, 0.0) + 1
        return
    rows.append((labels, float(value)))


def pool_samples(out: Samples, p: PoolSnapshot) -> None:
    pl = {"pool": p.pool}
    _add(out, "headroom_pool_stale", pl, 1.0 if p.stale else 0.0)
    _add(out, "headroom_pool_last_fresh_timestamp_seconds", pl, p.last_fresh_timestamp)
    _add(out, "headroom_replicas", pl, p.replicas)
    _add(out, "headroom_replicas_configured", pl, p.replicas_configured)
    for r in p.replica_detail:
        rl = {"pool": p.pool, "replica": r.replica}
        _add(out, "headroom_replica_up", rl, 1.0 if r.up else 0.0)
        if r.up:
            _add(out, "headroom_replica_active_requests", rl, r.active_requests)
            _add(out, "headroom_replica_queued_requests", rl, r.queued_requests)
            _add(out, "headroom_replica_kv_tokens", rl, r.kv_tokens_live)
        _add(out, "headroom_replica_kv_capacity_tokens", rl, r.kv_tokens_capacity)
    if p.replicas == 0:
        return  # nothing fresh to say about this pool: withhold rather than repeat old values
    _add(out, "headroom_active_requests", pl, p.active_requests)
    _add(out, "headroom_queued_requests", pl, p.queued_requests)
    for reason, v in sorted(p.queued_by_reason.items()):
        _add(out, "headroom_queued_requests_by_reason", {"pool": p.pool, "reason": reason}, v)
    _add(out, "headroom_kv_tokens", pl, p.kv_tokens_live)
    _add(out, "headroom_kv_capacity_tokens", pl, p.kv_tokens_capacity)
    _add(out, "headroom_kv_usage_ratio", pl, p.kv_usage_ratio)
    _add(out, "headroom_completion_rate", pl, p.completion_rate)
    _add(out, "headroom_prompt_tokens_rate", pl, p.prompt_tokens_rate)
    _add(out, "headroom_generation_tokens_rate", pl, p.generation_tokens_rate)
    _add(out, "headroom_prefix_cache_hit_ratio", pl, p.prefix_cache_hit_ratio)
    _add(out, "headroom_preemption_rate", pl, p.preemption_rate)
    for kind, q in sorted(p.latency.items()):
        for label, attr in QUANTILE_FIELDS:
            _add(out, "headroom_latency_seconds", {"pool": p.pool, "kind": kind, "quantile": label},
                 getattr(q, attr))
    _add(out, "headroom_littles_law_ratio", pl, p.littles_law_ratio)
    for section in (p.capacity, p.tasks, p.forecast):
        for name, labels, value in section.get("samples", ()):
            _add(out, name, {"pool": p.pool, **labels}, value)


def snapshot_samples(snap: Optional[Snapshot], extra: Iterable[tuple[str, dict[str, str], float]] = ()) -> Samples:
    out: Samples = {}
    _add(out, "headroom_build_info", {"version": __version__}, 1.0)
    if snap is None:
        for name, labels, value in extra:
            _add(out, name, labels, value)
        return out
    for p in snap.pools:
        pool_samples(out, p)
    seen = set()
    for st in snap.sources:
        key = (st.source, st.target)
        if key in seen:
            continue
        seen.add(key)
        _add(out, "headroom_source_up", {"source": st.source, "target": st.target}, 1.0 if st.up else 0.0)
    for key, v in sorted(snap.errors.items()):
        source, _, reason = key.partition("|")
        _add(out, "headroom_source_errors", {"source": source, "reason": reason}, v)
    _add(out, "headroom_cycle_duration_seconds", {}, snap.cycle_duration_seconds)
    _add(out, "headroom_last_success_timestamp_seconds", {}, snap.last_success_timestamp)
    for name, labels, value in extra:
        _add(out, name, labels, value)
    for what, v in sorted(DROPPED.items()):
        _add(out, "headroom_dropped_series", {"what": what}, v)
    return out


def finite_or_inf(v: Optional[float]) -> Optional[float]:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v
