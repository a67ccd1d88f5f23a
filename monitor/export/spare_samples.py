"""A pool's spare capacity as samples (monitor/export/samples.py `pool_samples` calls it)."""
from __future__ import annotations

import math
from typing import Optional

from ..model import Spare


def _finite(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None


def spare_samples(out, pool: str, spare: Spare) -> None:
    """A pool's spare capacity (monitor/model/spare_data.py): the budget always (0 when stale: a gate
    reading it fails closed), the horizons' spare requests when known."""
    pl = {"pool": pool}
    budget = spare.budget_ratio
    out.add("headroom_deferrable_budget_ratio", pl, budget if budget is not None and math.isfinite(budget) else 0.0)
    out.add("headroom_deferrable_requests", pl, _finite(spare.deferrable_requests))
    for horizon, n in spare.requests.items():
        out.add("headroom_spare_requests", {"pool": pool, "horizon": horizon}, _finite(n))
