"""`/api/v1/spare?pool=P&requests=N&hours=H`: when N deferrable requests fit for H hours on end.

    status, body = spare_answer(snapshot, "pool=chat&requests=4&hours=2")

200: {"pool", "fits": true, "window": {start, end, requests}, ...}: the earliest span of the pool's
spare windows (monitor/capacity/spare.py `earliest_fit`, over the next 7 days) that holds N for H
hours; or "fits": false, "reason": "none in the horizon" with the largest number that fits for H
hours ("largest_requests", "largest_window"); a pool whose spare is not known (stale data) answers
"fits": false with the reason, and no promise. 400: a parameter missing or bad, named in "error".
`pool` is the pool's name, or its key when global.pool_by has more than one label.
"""
from __future__ import annotations

import math
from typing import Optional
from urllib.parse import parse_qs

from ..capacity.spare import earliest_fit
from ..model import PoolSnapshot, Snapshot
from ..model.spare_data import WEEK_SECONDS
from .snapshot_json import clean

MAX_HOURS = WEEK_SECONDS / 3600.0


class BadParameter(ValueError):
    pass


def _one(params: dict, name: str) -> str:
    values = params.get(name)
    if not values:
        raise BadParameter(f"missing parameter {name!r}: /api/v1/spare?pool=P&requests=N&hours=H")
    if len(values) > 1:
        raise BadParameter(f"parameter {name!r} given {len(values)} times; give it once")
    return values[0]


def _number(params: dict, name: str, high: float) -> float:
    raw = _one(params, name)
    try:
        v = float(raw)
    except ValueError:
        raise BadParameter(f"parameter {name!r} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(v) or v <= 0 or v > high:
        raise BadParameter(f"parameter {name!r} must be above 0 and at most {high:g}, got {raw[:40]!r}")
    return v


def _pool(snap: Optional[Snapshot], name: str) -> PoolSnapshot:
    pools = snap.pools if snap is not None else []
    hits = [p for p in pools if p.pool == name] or [p for p in pools if p.name == name]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise BadParameter(f"parameter 'pool': {name[:80]!r} names {len(hits)} pools; give its key: "
                           + ", ".join(sorted(p.pool for p in hits)[:20]))
    known = ", ".join(sorted(p.pool for p in pools)[:20]) or "none yet"
    raise BadParameter(f"parameter 'pool': no pool {name[:80]!r}; known: {known}")


def spare_answer(snap: Optional[Snapshot], query: str) -> tuple[int, dict]:
    try:
        params = parse_qs(query, keep_blank_values=True, max_num_fields=20)
    except ValueError as exc:
        return 400, {"error": f"bad query string: {exc}"}
    try:
        unknown = sorted(set(params) - {"pool", "requests", "hours"})
        if unknown:
            raise BadParameter(f"unknown parameter {unknown[0][:40]!r}; expected pool, requests, hours")
        pool = _pool(snap, _one(params, "pool"))
        requests = _number(params, "requests", 1e9)
        hours = _number(params, "hours", MAX_HOURS)
    except BadParameter as exc:
        return 400, {"error": str(exc)}
    head = {"pool": pool.name, "requests": requests, "hours": hours}
    spare = pool.spare
    if spare is None or not spare.requests:
        reason = spare.reason if spare is not None else "no spare capacity computed for the pool yet"
        return 200, clean({**head, "fits": False, "reason": reason, "window": None})
    ans = earliest_fit(spare.windows, requests, hours * 3600.0).as_dict()
    return 200, clean({**head, **ans, "seconds": hours * 3600.0, "budget_ratio": spare.budget_ratio,
                       "budget_reason": spare.reason})
