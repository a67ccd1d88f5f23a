"""What waits in front of the engines, put on the pools it waits for (pure).

Each llm-d / inference-gateway / Dynamo body of the cycle was read into `GatewayQueues`
(monitor/readings.py; monitor/sources/gateway_queue.py reads them). A queue row belongs to: the
gateway's `pool` when the config sets one (every request of that gateway feeds one pool); else its
gateway pool label mapped by the gateway's `pools:`; else the one pool serving the row's model (a
model served by two pools is not split: that queue is left out and counted as
`gateway_queue_unmapped`). Each is looked for among the pools of the gateway's scope only
(sources.gateways[i].labels, monitor/derive/gateway_scope.py): a gateway labelled {cluster: a}
puts its queue on cluster a's pool of that model; one without labels in front of two clusters
serving the model leaves it out (unmapped), never counting it twice. A sum that overflows is left
out too (unknown, never +Inf), counted as `gateway_queue_overflow`. The result is `PoolSnapshot.gateway_queued[<gateway URL>]`, part of
`PoolSnapshot.load_requests`.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Optional, Sequence

from ..model import PoolSnapshot
from ..readings import GatewayQueue, GatewayScrape, finite_only
from .gateway_scope import Scope


def queued_by_pool(queues: Iterable[GatewayQueue],
                   pool_of: Callable[[Optional[str], Optional[str]], Optional[str]],
                   anomalies: Optional[dict] = None) -> dict[str, float]:
    """Queued requests per headroom pool. `pool_of(gateway pool label, model)` names the pool, or None
    (not counted). A pool none of whose rows has a known `queued` is absent, not 0; so is one whose
    sum overflows (counted into `anomalies` as `overflow:queued`)."""
    out: dict[str, float] = {}
    for q in queues:
        if q.queued is None:
            continue
        pool = pool_of(q.pool_label, q.model)
        if pool is not None:
            out[pool] = out.get(pool, 0.0) + q.queued
    return finite_only(out, anomalies)


def pool_of_in_scope(scope: Scope, fixed: Optional[str], mapping: Mapping[str, str]
            ) -> Callable[[Optional[str], Optional[str]], Optional[str]]:
    """`pool_of` of one gateway: its `pool`, else its `pools:` map, else the model's one pool,
    each resolved in its scope (a name two pools in scope answer to is no pool: left out)."""
    pinned = scope.named(fixed)[0] if fixed is not None else None
    labels = {label: scope.named(pool)[0] for label, pool in mapping.items()}

    def pool_of(label: Optional[str], model: Optional[str]) -> Optional[str]:
        if fixed is not None:
            return pinned
        if label is not None and label in labels:
            return labels[label]
        return scope.serving(model)[0]

    return pool_of


def apply_gateway_queues(pools: Sequence[PoolSnapshot], gateways: Sequence[GatewayScrape],
                         gateway_pools: Sequence[dict], anomalies: dict,
                         fleet: Optional[Sequence[tuple[str, str]]] = None) -> None:
    """Fill `gateway_queued` of `pools` from the cycle's gateway scrapes; `gateway_pools[i]` is
    sources.gateways[i].pools; `fleet`: (pool, model) of every pool, also those of other shards
    (default: `pools`), over which a name or model must be one pool's. Bad values and unmapped rows
    are counted into `anomalies` (a row of a pool another shard owns is neither)."""
    by_name = {p.pool: p for p in pools}
    served = dict(fleet) if fleet else {p.pool: p.model for p in pools}
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
        scoped = pool_of_in_scope(Scope(served.items(), scrape.labels), scrape.pool, mapping)

        def pool_of(label: Optional[str], model: Optional[str], scoped=scoped) -> Optional[str]:
            pool = scoped(label, model)
            return pool if pool in by_name else None

        overflow: dict = {}
        for pool, queued in queued_by_pool(queues, pool_of, overflow).items():
            mine = by_name[pool].gateway_queued
            mine[scrape.url] = mine.get(scrape.url, 0.0) + queued
        if overflow:
            anomalies["gateway_queue_overflow"] = anomalies.get("gateway_queue_overflow", 0.0) + sum(overflow.values())
        unmapped = sum(1 for q in queues if q.queued is not None and scoped(q.pool_label, q.model) is None)
        if unmapped:
            anomalies["gateway_queue_unmapped"] = anomalies.get("gateway_queue_unmapped", 0.0) + unmapped
    for p in pools:  # several gateways' finite queues may still overflow together: unknown, not +Inf
        if p.gateway_queued and not math.isfinite(sum(p.gateway_queued.values()) + (p.load_requests or 0.0)):
            p.gateway_queued.clear()
            anomalies["gateway_queue_overflow"] = anomalies.get("gateway_queue_overflow", 0.0) + 1
