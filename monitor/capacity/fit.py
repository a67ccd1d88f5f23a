"""The fleet-wide view: where would N more agent sessions fit?

Per pool (its extra pool_by labels, e.g. its cluster, beside its name): the spare sessions, the
pool's headroom in concurrent requests before the knee over the active requests one session holds
(`Capacity.active_requests_per_session`: measured, else configured), rounded down to whole
sessions; the same with the pool's largest replica lost. Sorted most spare first (ties by cluster,
then pool), so the first row is where new work fits best. A stale pool, or one whose headroom or
session size is unknown, is left out of the fits: nothing is promised about it; `unknown` names
those pools and why, so "fits nowhere" (every pool known, none takes them) is never said when the
answer is unknown (an idle fleet has no measured session size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

from ..model import PoolSnapshot


@dataclass(frozen=True)
class Fit:
    key: str  # the pool's key (monitor/model/poolkey.py)
    pool: str  # its name (the `pool` label)
    labels: tuple[tuple[str, str], ...]  # its other pool_by labels, e.g. (("cluster", "a"),)
    spare_sessions: float
    spare_sessions_n_minus_1: Optional[float]

    def as_dict(self) -> dict:
        return {**dict(self.labels), "pool": self.pool, "spare_sessions": self.spare_sessions,
                "spare_sessions_n_minus_1": self.spare_sessions_n_minus_1}


def _spare(requests: Optional[float], per_session: float) -> Optional[float]:
    if requests is None or not math.isfinite(requests):
        return None
    return float(math.floor(requests / per_session + 1e-9))  # whole sessions, rounded down: never promise more


def fleet_fit(pools: Iterable[PoolSnapshot]) -> list[Fit]:
    """Spare sessions per pool, most first."""
    out = []
    for p in pools:
        c = p.capacity
        if p.stale or c is None or c.withheld or not c.active_requests_per_session:
            continue
        spare = _spare(c.headroom_requests.current, c.active_requests_per_session)
        if spare is None:
            continue
        out.append(Fit(p.pool, p.name, tuple(sorted(p.extra_labels.items())), spare,
                       _spare(c.headroom_requests.n_minus_1, c.active_requests_per_session)))
    out.sort(key=lambda f: (-f.spare_sessions, f.labels, f.pool))
    return out


def unknown(pools: Iterable[PoolSnapshot]) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    """The pools `fleet_fit` leaves out, each (name, other pool_by labels, why its answer is unknown)."""
    out = []
    for p in pools:
        c = p.capacity
        if p.stale:
            why = "stale (its sources did not answer)"
        elif c is None or c.withheld:
            why = "no capacity known"
        elif not c.active_requests_per_session:
            why = "no session size (no agent sessions measured, none configured)"
        elif c.headroom_requests.current is None or not math.isfinite(c.headroom_requests.current):
            why = "headroom unknown"
        else:
            continue
        out.append((p.name, tuple(sorted(p.extra_labels.items())), why))
    return sorted(out, key=lambda u: (u[1], u[0]))


def where_fits(fits: list[Fit], sessions: float) -> list[Fit]:
    """The pools that take `sessions` more sessions each (most spare first)."""
    return [f for f in fits if f.spare_sessions >= sessions]


__all__ = ["Fit", "fleet_fit", "unknown", "where_fits"]
