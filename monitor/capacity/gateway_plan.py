"""Which pool each of the cycle's gateway readings feeds, and the reading one task window back.

    planned = plan_gateways(state, pools, gateways, anomalies)   # [Planned], in gateway order

A gateway feeds only the pools of its scope (monitor/derive/gateway_scope.py: the pools carrying its
`labels`, e.g. {cluster: a}; every pool for a gateway without labels). Inside that scope:
  - a gateway with `pool` feeds the pool of that name (or key);
  - with one pool in scope, that pool takes the whole reading;
  - else a gateway with a model label feeds each pool the reading of its model's series (read by
    the cycle's `collect`: `GatewayScrape.by_model`; a pool whose model it did not read gets none);
  - the application convention (no model label) goes by capacity.task_pools only.
capacity.task_pools targets resolve in the same scope. A name or a model that two pools in scope
answer to (a gateway without labels in front of two clusters serving the same model) is not
attributed: neither pool gets it, it is counted into `anomalies` as `gateway_unattributed` (one a
cycle and gateway) and logged once per gateway. Nothing is ever counted twice.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from monitor.capacity.tasks import TaskWindow
from monitor.derive.gateway_scope import Scope
from monitor.model.readings import GatewayConfig, GatewayReading, GatewayScrape

log = logging.getLogger(__name__)
UNATTRIBUTED_KIND = "gateway_unattributed"

# (pool key or None, how it was read, reading, older reading, whether a whole task window back,
#  {task type: pool key or None}: capacity.task_pools resolved in the gateway's scope)
Planned = tuple[Optional[str], GatewayConfig, GatewayReading, Optional[GatewayReading], bool, dict]
Plan = list[tuple[Optional[str], GatewayConfig, GatewayReading]]


def plan_gateways(state, served: Sequence[tuple[str, str]], gateways: Sequence[GatewayScrape],
                  anomalies: Optional[dict] = None, owned: Optional[set] = None) -> list[Planned]:
    """The cycle's gateway readings with their pools (see the module docstring). `state` is the
    capacity layer's (`CapacityState`): its task windows, task_pools and the gateways warned of;
    `served`: (pool, model) of every pool of the fleet, also those another shard owns (a pool not
    `owned` (default: all of them) is fed by another instance, and left out here)."""
    out: list[Planned] = []
    for scrape in gateways:
        if scrape.reading is None:
            continue
        scope = Scope(served, scrape.labels)
        plan, unattributed = _plan_one(scrape, scrape.reading, scope)
        routes, ambiguous = scope.routes(state.task_pools)
        if any(tt in scrape.reading.tasks for tt in ambiguous):
            unattributed.append("task types " + ", ".join(sorted(tt for tt in ambiguous if tt in scrape.reading.tasks)))
        if unattributed:
            _unattributed(state, scrape, unattributed, anomalies)
        for pool, gcfg, reading in plan:
            if owned is not None and pool is not None and pool not in owned:
                continue
            key = (scrape.index, pool)
            window = state.gateway_windows.get(key)
            if window is None:
                window = state.gateway_windows[key] = TaskWindow(state.task_window)
            window.add(reading)
            out.append((pool, gcfg, reading, *window.older(), routes))
    return out


def _plan_one(scrape: GatewayScrape, reading: GatewayReading, scope: Scope) -> tuple[Plan, list[str]]:
    """(pool, how read, reading) of one gateway (`reading`: its own); what was left unattributed, named for
    the log."""
    if scrape.pool:
        key, many = scope.named(scrape.pool)
        return [(key, scrape.config, reading)], ([f"pool {scrape.pool}"] if many else [])
    only = scope.only()
    if only is not None:
        return [(only, scrape.config, reading)], []
    if not scrape.config.model:
        return [(None, scrape.config, reading)], []
    plan: Plan = []
    left: list[str] = []
    for model in scope.pools.values():
        per_model = scrape.for_model(model)
        if per_model is None:
            continue
        owner, many = scope.serving(model)
        if owner is not None:
            plan.append((owner, scrape.model_config(model), per_model))
        elif many and _has_calls(per_model) and f"model {model}" not in left:
            left.append(f"model {model}")
    return plan, left


def _has_calls(reading: GatewayReading) -> bool:
    return any(t.calls_seen or t.call_latency is not None for t in reading.tasks.values())


def _unattributed(state, scrape: GatewayScrape, what: list[str], anomalies: Optional[dict]) -> None:
    if anomalies is not None:
        anomalies[UNATTRIBUTED_KIND] = anomalies.get(UNATTRIBUTED_KIND, 0.0) + 1.0
    if scrape.index not in state.gateways_warned:
        state.gateways_warned.add(scrape.index)
        log.warning("gateway %s: %s served by more than one pool it may feed (give the gateway labels, e.g. "
                    "{cluster: a}, in sources.gateways): not attributed to any pool, never counted twice "
                    "(headroom_input_anomalies_total{kind=\"%s\"} counts the cycles)",
                    scrape.url, "; ".join(what), UNATTRIBUTED_KIND)


__all__ = ["Plan", "Planned", "UNATTRIBUTED_KIND", "plan_gateways"]
