"""A pool's spare capacity as samples (monitor/export/samples.py `pool_samples` calls it)."""
from __future__ import annotations

from ..model import Spare


def spare_samples(out, pool: str, spare: Spare) -> None:
    """A pool's spare capacity (monitor/model/spare.py): the budget always (0 when stale: a gate
    reading it fails closed), the horizons' spare requests when known."""
    pl = {"pool": pool}
    out.add("headroom_deferrable_budget_ratio", pl, spare.budget_ratio)
    out.add("headroom_deferrable_requests", pl, spare.deferrable_requests)
    for horizon, n in spare.requests.items():
        out.add("headroom_spare_requests", {"pool": pool, "horizon": horizon}, n)
