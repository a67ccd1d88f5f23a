"""Demand that was turned away at the gateways, per pool: the gateway half of
headroom_shed_requests_rate (the engines' half, `rejected` and `aborted`, comes from their counters in
monitor/derive/core.py).

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
