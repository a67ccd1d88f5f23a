"""What waits in front of the engines, put on the pools it waits for (pure).

Each llm-d / inference-gateway / Dynamo body of the cycle was read into `GatewayQueues`
(monitor/sources/gateway_queue.py). A queue row belongs to: the gateway's `pool` when the config
sets one (every request of that gateway feeds one pool); else its gateway pool label mapped by the
gateway's `pools:`; else the one pool serving the row's model (a model served by two pools is not
split: that queue is left out and counted as `gateway_queue_unmapped`). A sum that overflows is
left out too (unknown, never +Inf), counted as `gateway_queue_overflow`. The result is
`PoolSnapshot.gateway_queued[<gateway URL>]`, part of `PoolSnapshot.load_requests`.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from ..model import PoolSnapshot
from ..sources.gateway import GatewayScrape
from ..sources.gateway_queue import pool_of_served_models, queued_by_pool


def apply_gateway_queues(pools: Sequence[PoolSnapshot], gateways: Sequence[GatewayScrape],
                         gateway_pools: Sequence[dict], anomalies: dict) -> None:
    """Fill `gateway_queued` of `pools` from the cycle's gateway scrapes; `gateway_pools[i]` is
    sources.gateways[i].pools. Bad values and unmapped rows are counted into `anomalies`."""
    by_name = {p.pool: p for p in pools}
    served = {p.pool: p.model for p in pools}
    for scrape in gateways:
        if scrape.error is not None and scrape.error.startswith("too_large"):
            anomalies["gateway_too_large"] = anomalies.get("gateway_too_large", 0.0) + 1  # not parsed
        queues = scrape.queues
        if queues is None:
            continue
        for reason, n in queues.anomalies.items():
            key = "gateway_queue_" + reason.split(":", 1)[0]
            anomalies[key] = anomalies.get(key, 0.0) + n
        mapping = gateway_pools[scrape.index] if scrape.index < len(gateway_pools) else {}
        default = pool_of_served_models(served, mapping)

        def pool_of(label: Optional[str], model: Optional[str], fixed=scrape.pool, default=default):
            pool = fixed if fixed is not None else default(label, model)
            return pool if pool in by_name else None

        overflow: dict = {}
        for pool, queued in queued_by_pool(queues, pool_of, overflow).items():
            mine = by_name[pool].gateway_queued
            mine[scrape.url] = mine.get(scrape.url, 0.0) + queued
        if overflow:
            anomalies["gateway_queue_overflow"] = anomalies.get("gateway_queue_overflow", 0.0) + sum(overflow.values())
        unmapped = sum(1 for q in queues if q.queued is not None and pool_of(q.pool_label, q.model) is None)
        if unmapped:
            anomalies["gateway_queue_unmapped"] = anomalies.get("gateway_queue_unmapped", 0.0) + unmapped
    for p in pools:  # several gateways' finite queues may still overflow together: unknown, not +Inf
        if p.gateway_queued and not math.isfinite(sum(p.gateway_queued.values()) + (p.load_requests or 0.0)):
            p.gateway_queued.clear()
            anomalies["gateway_queue_overflow"] = anomalies.get("gateway_queue_overflow", 0.0) + 1
