"""Demand that was turned away at the gateways or given up by the application, per pool: the gateway
and client half of headroom_shed_requests_rate (the engines' half, `rejected` and `aborted`, comes
from their counters in monitor/derive/core.py).

Give-ups (docs/capacity.md, "Give-ups"): the application's `agent_calls_abandoned_total{task_type}`
is read with the task metrics (monitor/sources/gateway.py) as the reason `abandoned`. A give-up the
engine noticed is also its `aborted` (vLLM `finished_reason="abort"`), so `add_gateway_shed` keeps
as `abandoned` only the give-ups beyond the engines' aborts: summing the reasons counts each once.

A gateway's failed calls are classified as they are read (monitor/sources/gateway_schema.py
`shed_reason`: 429 `gateway_rate_limited`, 408 / 504 / a timeout class `gateway_timeout`, 5xx
`gateway_error`; a client's own 4xx is not demand turned away); here their increase over the task
window, per second, is summed per pool (a task type mapped elsewhere by capacity.task_pools counts
there). Counter resets read as PromQL's increase(): the new value.
"""
from __future__ import annotations

from typing import Iterable, Optional

from monitor.derive.counters import increase


def gateway_shed_rates(planned: Iterable[tuple], pools: set[str]) -> dict[str, dict[str, float]]:
    """pool -> {reason: requests per second} from the cycle's gateway readings and the readings
    a window back (gateway_plan.py `plan_gateways`: (pool, config, reading, older, covered, routes),
    routes being capacity.task_pools resolved in the gateway's scope); a reading without an older
    one says nothing yet."""
    out: dict[str, dict[str, float]] = {}
    for pool, _cfg, reading, older, _covered, routes in planned:
        if older is None or reading.timestamp <= older.timestamp:
            continue
        dt = reading.timestamp - older.timestamp
        for tt, t in reading.tasks.items():
            target = routes.get(tt, pool)
            if target not in pools or not t.failed_by_reason:
                continue
            old = older.tasks.get(tt)
            mine = out.setdefault(target, {})
            for reason, value in t.failed_by_reason.items():
                before: Optional[float] = old.failed_by_reason.get(reason, 0.0) if old is not None else 0.0
                d = increase(value, before)
                if d is not None:
                    mine[reason] = mine.get(reason, 0.0) + d / dt
    return out


def add_gateway_shed(engine: dict[str, float], gateway: dict[str, float]) -> dict[str, float]:
    """A pool's shed rates by reason: the engines' (`rejected`, `aborted`) with the gateways' and the
    application's added; the application's give-ups (`abandoned`) less the engines' aborts, never
    below 0 (a give-up the engine aborted is one give-up, in `aborted`). Unknown stays unknown: an
    engine reporting no aborts subtracts nothing."""
    out = dict(engine)
    for reason, rate in gateway.items():
        if reason == "abandoned":
            rate = max(0.0, rate - engine.get("aborted", 0.0))
        out[reason] = out.get(reason, 0.0) + rate
    return out
