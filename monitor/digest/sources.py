"""Digest input from headroom's history: the embedded HistoryStore (direct mode) or Prometheus.

History covers the two weeks before `week_end` plus one more (for "how last week's forecast did"
the forecast is refitted on what came before last week). What history does not carry comes from
`digest.pools.<name>` (replicas, knee per replica, GPUs, watts) and `digest.tasks.<name>` (tokens
per call, calls per task). A pool without replicas or a knee there is reported with "n/a".
"""
from __future__ import annotations

import math
from typing import Optional

import pandas as pd

from monitor.digest.content import WEEK, DigestError, DigestInput, PoolInput
from monitor.digest.settings import DigestSettings, PoolFacts

SERIES = ("active_requests", "queued_requests", "kv_tokens", "sessions", "call_arrival_rate",
          "power_watts")
TASK_PREFIXES = ("task_arrivals:", "task_latency:", "slo_violation_ratio:")
HISTORY_WEEKS = 3


def _pool_input(name: str, series: dict[str, pd.Series], settings: DigestSettings) -> PoolInput:
    f = settings.pools.get(name) or settings.pools.get("*") or PoolFacts()
    if not f.replicas:
        raise DigestError(f"pool {name}: set digest.pools.{name}.replicas (history does not carry it)")
    knee = f.knee_requests_per_replica
    if knee is None and f.max_num_seqs:
        knee = float(f.max_num_seqs)  # the engine's slot limit: a prior, until a knee is configured
    tasks = {t: tf for t, tf in settings.tasks.items() if tf.pool in (None, name)}
    return PoolInput(name=name, series=series, replicas=f.replicas, knee_requests_per_replica=knee,
                     knee_source="configured" if f.knee_requests_per_replica else "prior",
                     gpus_per_replica=f.gpus_per_replica, max_num_seqs=f.max_num_seqs,
                     kv_capacity_tokens_per_replica=f.kv_capacity_tokens_per_replica,
                     idle_watts_per_gpu=f.idle_watts_per_gpu, max_watts_per_gpu=f.max_watts_per_gpu,
                     tasks=tasks)


def from_store(store, week_end: float, settings: DigestSettings, pools: Optional[list[str]] = None) -> DigestInput:
    """Every pool of the store (or `pools`), its known series over the last HISTORY_WEEKS weeks.

    The daemon stores "active_requests" as active + queued (monitor/wiring.py history_points, the
    concurrency the knee is about) and "queued_requests" beside it; active alone is their difference.
    """
    start = week_end - HISTORY_WEEKS * WEEK
    keys = store.series_keys()
    names = sorted({p for p, _ in keys}) if pools is None else pools
    out = []
    for pool in names:
        series = {}
        for p, s in keys:
            if p != pool or not (s in SERIES or s.startswith(TASK_PREFIXES)):
                continue
            q = store.query(pool, s, start, week_end - 1e-3, step=settings.history_step, agg="max")
            if len(q):
                series[s] = q
        if "active_requests" in series and "queued_requests" in series:
            load, queued = series["active_requests"], series["queued_requests"]
            series["active_requests"] = (load - queued.reindex(load.index).fillna(0.0)).clip(lower=0.0)
        if series:
            out.append(_pool_input(pool, series, settings))
    if not out:
        raise DigestError(f"the history store {store.path} holds no pool series before {week_end:.0f}")
    return DigestInput(week_end, out, source=f"history store {store.path}")


def prometheus_queries(step: float) -> dict[str, str]:
    w = f"{int(step)}s"
    return {
        "active_requests": f"max_over_time((sum by (pool) (headroom_active_requests))[{w}:])",
        "queued_requests": f"max_over_time((sum by (pool) (headroom_queued_requests))[{w}:])",
        "kv_tokens": f"max_over_time((sum by (pool) (headroom_kv_tokens))[{w}:])",
        "sessions": f"max_over_time((sum by (pool) (headroom_sessions))[{w}:])",
        "power_watts": f"avg_over_time((sum by (pool) (headroom_power_watts))[{w}:])",
        "task_arrivals": "sum by (pool, task_type) (headroom_task_arrival_rate)",
        "slo_violation_ratio": "max by (pool, task_type) (headroom_slo_violation_ratio)",
    }


def from_prometheus(client, week_end: float, settings: DigestSettings, max_points: int = 10000) -> DigestInput:
    """History from any Prometheus-compatible API (`client.query_range` as in
    monitor.sources.prometheus), reading headroom's own exported metrics."""
    step = settings.history_step
    start = week_end - HISTORY_WEEKS * WEEK
    end = week_end - step
    data: dict[str, dict[str, dict[float, float]]] = {}
    span = step * (max_points - 1)
    for name, promql in prometheus_queries(step).items():
        a = start
        while a <= end:
            b = min(end, a + span)
            for labels, samples in client.query_range(promql, a, b, step):
                pool = labels.get("pool")
                if not pool:
                    continue
                key = name
                if name in ("task_arrivals", "slo_violation_ratio"):
                    if not labels.get("task_type"):
                        continue
                    key = f"{name}:{labels['task_type']}"
                bucket = data.setdefault(pool, {}).setdefault(key, {})
                for ts, v in samples:
                    if math.isfinite(float(v)):
                        bucket[float(ts)] = float(v)
            a = b + step
    out = [_pool_input(pool, {k: pd.Series(v, dtype=float).sort_index() for k, v in series.items()}, settings)
           for pool, series in sorted(data.items())]
    if not out:
        raise DigestError("Prometheus returned no headroom_* series for the last weeks")
    return DigestInput(week_end, out, source="Prometheus")
