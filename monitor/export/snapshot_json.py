"""Snapshot -> the JSON document of `headroom once --json` and `/api/v1/snapshot`.

Shape (stable, documented in README):
    {"timestamp": ..., "pools": [{"pool", "model", "replicas", "active_requests", "queued_requests",
     "kv_tokens_live", "kv_tokens_capacity", ...}], "fit": [{"pool", "spare_sessions", ...}],
     "sources": [{"source", "target", "up", "error"}]}
With `global.pool_by: [cluster, model_name]` a pool also has "cluster" and "key" (monitor/model/poolkey.py).
Values that are not known are null; +Inf (e.g. no exhaustion within the horizon) is the string "+Inf".
A pool's "spare" is its spare capacity for deferrable work (monitor/model/spare_data.py: the windows over
24 h in the forecast's steps and over 7 d on an hourly grid, the horizons' minimums, the budget and why), the top-level "spare" the fleet's sums.
A pool's "capacity", "tasks" and "forecast" are the `as_dict()` of its typed results (monitor/model/,
monitor/forecast/pool.py), `{}` when there are none: the forecast is the one /metrics exports for the
same cycle.
"""
from __future__ import annotations

import math
from typing import Any

from ..capacity.fit import fleet_fit
from ..capacity.spare import cluster_spare, coarse
from ..kit.numbers import unsigned
from ..model import PoolSnapshot, Snapshot
from ..model.spare_data import WEEK_SECONDS


def clean(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return unsigned(v)  # never -0.0 (monitor/kit/numbers.py)
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


def pool_to_dict(p: PoolSnapshot) -> dict:
    # with a pool_by list, "pool" is the pool's name, its other labels ("cluster") stand beside it
    # and "key" is the one identity (monitor/model/poolkey.py); with one label neither is added
    extra = p.extra_labels
    return clean({
        "pool": p.name,
        **({**extra, "key": p.pool} if extra else {}),
        "model": p.model,
        "replicas": p.replicas,
        "replicas_configured": p.replicas_configured,
        "stale": p.stale,
        "active_requests": p.active_requests if p.replicas else None,
        "queued_requests": p.queued_requests if p.replicas else None,
        "queued_by_reason": p.queued_by_reason,
        "active_by_priority": p.active_by_priority if p.replicas else {},
        "queued_by_priority": p.queued_by_priority if p.replicas else {},
        "kv_pool_usage": p.kv_pool_usage if p.replicas else {},
        "gateway_queued_requests": p.gateway_queued_requests,
        "gateway_queued": dict(p.gateway_queued),
        "gateway_queued_source": dict(p.gateway_queued_source),
        "gateway_added_latency": p.gateway_added_latency.as_dict() if p.gateway_added_latency is not None else None,
        "load_requests": p.load_requests if p.replicas else None,
        "offered_requests": p.offered_requests if p.replicas else None,
        "shed_rates": dict(p.shed_rates),
        "slow_replicas": sum(1 for r in p.replica_detail if r.slow),
        "slow_capacity_lost": p.slow_capacity_lost,
        "engines": list(p.engines),
        "kv_tokens_live": p.kv_tokens_live,
        "kv_tokens_live_low": p.kv_tokens_live_low,
        "kv_tokens_live_high": p.kv_tokens_live_high,
        "kv_tokens_method": p.kv_tokens_method,
        "rendering_requests": p.rendering_requests,
        "kv_tokens_capacity": p.kv_tokens_capacity,
        "kv_usage_ratio": p.kv_usage_ratio,
        "completion_rate": p.completion_rate,
        "prompt_tokens_rate": p.prompt_tokens_rate,
        "generation_tokens_rate": p.generation_tokens_rate,
        "prefix_cache_hit_ratio": p.prefix_cache_hit_ratio,
        "preemption_rate": p.preemption_rate,
        "latency_seconds": {k: q.as_dict() for k, q in p.latency.items()},
        "mean_concurrency": p.mean_concurrency,
        "littles_law_ratio": p.littles_law_ratio,
        "window_seconds": p.window_seconds,
        "last_fresh_timestamp": p.last_fresh_timestamp,
        "replica_detail": [
            {"replica": r.replica, "up": r.up, "active_requests": r.active_requests,
             "queued_requests": r.queued_requests, "kv_tokens_live": r.kv_tokens_live,
             "kv_tokens_live_low": r.kv_tokens_live_low, "kv_tokens_live_high": r.kv_tokens_live_high,
             "kv_tokens_capacity": r.kv_tokens_capacity, "kv_capacity_changes": r.kv_capacity_changes,
             "slow": r.slow, "latency_ratio": r.latency_ratio,
             "kv_tiers": {tier: _tier(t) for tier, t in sorted(r.kv_tiers.items())}}
            for r in p.replica_detail
        ],
        "capacity": p.capacity.as_dict() if p.capacity is not None else {},
        "tasks": p.tasks.as_dict() if p.tasks is not None else {},
        "forecast": p.forecast.as_dict() if p.forecast is not None else {},
        "recommended_replicas": dict(p.recommended_replicas),
        "replica_lead_time_seconds": p.replica_lead_time_seconds,
        "replica_lead_time_source": p.replica_lead_time_source,
        **edges_to_dict(p),
        "spare": _spare(p),
    })


def _tier(t) -> dict:
    return {"tokens": t.tokens, "capacity_bytes": t.capacity_bytes, "used_bytes": t.used_bytes, "source": t.source}


def edges_to_dict(p: PoolSnapshot) -> dict:
    """The pool's edges (monitor/derive/edges.py): KV tiers, prefix hits by tier, speculative
    decoding, LoRA slots, LMCache; each {} or null when no replica reports it."""
    return {
        "kv_tiers": {tier: _tier(t) for tier, t in sorted(p.kv_tiers.items())},
        "prefix_cache_hit_tokens_rate": dict(p.prefix_hit_rates),
        "prefix_cache_hit_share": dict(p.prefix_hit_shares),
        "spec_decode": {"acceptance_ratio": p.spec_acceptance_ratio, "acceptance_length": p.spec_acceptance_length,
                        "acceptance_by_position": dict(p.spec_acceptance_by_position)},
        "lora_adapters": ({"max": p.lora.max_loras, "running": p.lora.running, "waiting": p.lora.waiting}
                          if p.lora is not None else None),
        "lmcache_hit_ratio": p.lmcache_hit_ratio,
        "kv_offload_allocation_failures_rate": p.kv_offload_allocation_failure_rate,
    }


def _spare(p: PoolSnapshot) -> dict:
    """The pool's spare: its own JSON shape, and the next 7 days' windows on an hourly grid (each
    hour the fewest requests that fit through it: at most 168 windows, whatever the forecast's step)."""
    if p.spare is None:
        return {}
    week = coarse(p.spare.windows, p.spare.timestamp, 3600.0, int(WEEK_SECONDS // 3600))
    return {**p.spare.as_dict(), "windows_7d_hourly": [w.as_dict() for w in week]}


def snapshot_to_dict(s: Snapshot) -> dict:
    return {
        "timestamp": s.timestamp,
        "pools": [pool_to_dict(p) for p in s.pools],
        # where more sessions fit: spare sessions per pool (and cluster), most first
        "fit": [clean(f.as_dict()) for f in fleet_fit(s.pools)],
        # spare capacity for deferrable work summed over the pools whose figure is known
        "spare": clean(cluster_spare({p.pool: p.spare for p in s.pools if p.spare is not None}).as_dict()),
        "sources": [clean({"source": st.source, "target": st.target, "up": st.up, "error": st.error,
                           "detail": st.detail}) for st in s.sources],
        "cycle_duration_seconds": clean(s.cycle_duration_seconds),
        "alerts": [clean(a.as_dict()) for a in s.alerts] if s.alerts is not None else None,
        # alerts past the cap and alert texts cut to it, since start (monitor/sources/alerts.py)
        "alerts_cut_total": s.anomalies.get("alerts_cut", 0.0),
        # gateway readings and queue rows no one pool of the gateway's scope takes, cycles since start
        # (a gateway without labels in front of two clusters serving a model: monitor/capacity/gateway_plan.py)
        "gateway_unattributed_total": s.anomalies.get("gateway_unattributed", 0.0),
        "gateway_queue_unmapped_total": s.anomalies.get("gateway_queue_unmapped", 0.0),
    }
