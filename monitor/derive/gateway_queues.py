"""What waits in front of the engines, put on the pools it waits for (pure).

Each llm-d / inference-gateway / Dynamo body of the cycle was read into `GatewayQueues`
(monitor/model/readings.py; monitor/sources/gateway_queue.py reads them). A queue row belongs to: the
gateway's `pool` when the config sets one (every request of that gateway feeds one pool); else its
gateway pool label mapped by the gateway's `pools:`; else the one pool serving the row's model (a
model served by two pools is not split: that queue is left out and counted as
`gateway_queue_unmapped`). Each is looked for among the pools of the gateway's scope only
(sources.gateways[i].labels, monitor/derive/gateway_scope.py): a gateway labelled {cluster: a}
puts its queue on cluster a's pool of that model; one without labels in front of two clusters
serving the model leaves it out (unmapped), never counting it twice. A sum that overflows is left
out too (unknown, never +Inf), counted as `gateway_queue_overflow`. The result is `PoolSnapshot.gateway_queued[<gateway URL>]`, part of
`PoolSnapshot.load_requests`, with `gateway_queued_source[<URL>] = "queue"`.

A gateway without a queue gauge but with a gauge of its requests in flight (LiteLLM
`litellm_in_flight_requests`, llm-d `llm_d_epp_request_running`: `GatewayReading.in_flight`) holds
in front of the engines what it has in flight beyond what the engines report running and waiting
(`in_flight_queues`): per pool, the in-flight requests of the gateways feeding it less its engines'
running + waiting less what gateway queue gauges already put on it (a LiteLLM in front of an llm-d
router: the router's queue is in LiteLLM's in-flight too; never counted twice), never below 0,
shared among those gateways in proportion to their in-flight counts (`source` "in_flight"). A
gateway's in-flight gauge carries no model: it is put on a pool only when the gateway feeds one pool
(its `pool:`, or one pool in its scope); else it is `gateway_queue_unmapped`. LiteLLM's gauge counts
every HTTP request, the /metrics scrape reading it too: one is taken off. What it counts includes the
engines' own front ends (a request tokenising in vLLM's API server is in neither running nor waiting):
the queue the engines cannot see, wherever it waits before the scheduler. Requests sent to the
engines around the gateway lower the figure (a lower bound then).
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Optional, Sequence

from ..model import PoolSnapshot
from ..model.readings import GatewayQueue, GatewayScrape, finite_only
from .gateway_scope import Scope


def queued_by_pool(queues: Iterable[GatewayQueue],
                   pool_of: Callable[[Optional[str], Optional[str]], Optional[str]],
                   anomalies: Optional[dict[str, float]] = None) -> dict[str, float]:
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
                         gateway_pools: Sequence[Mapping[str, str]], anomalies: dict[str, float],
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
        if queues is None or scrape.kept:  # a kept reading's queue is an earlier cycle's: not counted again
            continue
        for reason, n in queues.anomalies.items():
            key = "gateway_queue_" + reason.split(":", 1)[0]
            anomalies[key] = anomalies.get(key, 0.0) + n
        mapping = gateway_pools[scrape.index] if scrape.index < len(gateway_pools) else {}
        scoped = pool_of_in_scope(Scope(served.items(), scrape.labels), scrape.pool, mapping)

        def pool_of(label: Optional[str], model: Optional[str],
                    scoped: Callable[[Optional[str], Optional[str]], Optional[str]] = scoped) -> Optional[str]:
            pool = scoped(label, model)
            return pool if pool in by_name else None

        overflow: dict[str, float] = {}
        for pool, queued in queued_by_pool(queues, pool_of, overflow).items():
            mine = by_name[pool].gateway_queued
            mine[scrape.url] = mine.get(scrape.url, 0.0) + queued
            by_name[pool].gateway_queued_source[scrape.url] = "queue"
        if overflow:
            anomalies["gateway_queue_overflow"] = anomalies.get("gateway_queue_overflow", 0.0) + sum(overflow.values())
        unmapped = sum(1 for q in queues if q.queued is not None and scoped(q.pool_label, q.model) is None)
        if unmapped:
            anomalies["gateway_queue_unmapped"] = anomalies.get("gateway_queue_unmapped", 0.0) + unmapped
    in_flight_queues(pools, gateways, served, anomalies)
    for p in pools:  # several gateways' finite queues may still overflow together: unknown, not +Inf
        if p.gateway_queued and not math.isfinite(sum(p.gateway_queued.values()) + (p.load_requests or 0.0)):
            p.gateway_queued.clear()
            p.gateway_queued_source.clear()
            anomalies["gateway_queue_overflow"] = anomalies.get("gateway_queue_overflow", 0.0) + 1


# a gateway whose in-flight gauge counts the scrape that reads it (LiteLLM's ASGI middleware counts
# every HTTP request, /metrics included: an idle proxy reads 1)
SCRAPE_COUNTED = {"litellm": 1.0}


def in_flight_queues(pools: Sequence[PoolSnapshot], gateways: Sequence[GatewayScrape],
                     served: Mapping[str, str], anomalies: dict[str, float]) -> None:
    """Put on each pool what its gateways hold in flight beyond its engines (module docstring);
    `served`: {pool: model} of the whole fleet (a gateway's scope)."""
    by_name = {p.pool: p for p in pools}
    held: dict[str, dict[str, float]] = {}  # pool -> {gateway URL: requests in flight}
    for scrape in gateways:
        reading = scrape.reading
        if scrape.kept or reading is None or reading.in_flight is None or not math.isfinite(reading.in_flight):
            continue  # a kept reading's in-flight count is an earlier cycle's, not beside this cycle's engines
        if scrape.queues is not None and any(q.queued is not None for q in scrape.queues):
            continue  # its own queue gauge says what waits there
        scope = Scope(served.items(), scrape.labels)
        pool = scope.named(scrape.pool)[0] if scrape.pool is not None else scope.only()
        n = max(0.0, reading.in_flight - SCRAPE_COUNTED.get(reading.kind, 0.0))
        if pool is None:
            if n > 0:
                anomalies["gateway_queue_unmapped"] = anomalies.get("gateway_queue_unmapped", 0.0) + 1
            continue
        if pool in by_name:  # else another shard's pool
            mine = held.setdefault(pool, {})
            mine[scrape.url] = mine.get(scrape.url, 0.0) + n
    for pool, urls in held.items():
        p = by_name[pool]
        if p.active_requests is None or p.queued_requests is None:
            continue  # what the engines hold is unknown: so is what waits in front of them
        total = sum(urls.values())
        counted = sum(v for u, v in p.gateway_queued.items() if u not in urls)
        excess = max(0.0, total - p.active_requests - p.queued_requests - counted)
        for url, n in urls.items():
            p.gateway_queued[url] = excess * n / total if total > 0 else 0.0
            p.gateway_queued_source[url] = "in_flight"
