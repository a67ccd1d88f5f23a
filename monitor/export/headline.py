"""The landing page's headline headroom: judged as the capacity alerts judge it.

The alerts read the median of a window (`quantile_over_time(0.5, headroom_ratio{scenario="current"}[5m])`
for HeadroomCriticallyLow, 10 minutes for HeadroomLow: rules/headroom.alerts.yaml), not the latest
sample, so a closed-loop agent load that swings the instant value between +0.7 and -0.8 at every tool
wait neither fires nor clears them on one cycle. The page's big figure is that same median over the
last HEADLINE_WINDOW seconds of cycles; the instant value and N-1 stand beside it, labelled.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Optional

from ..kit.numbers import fixed
from ..model import Capacity, PoolSnapshot, Snapshot

HEADLINE_WINDOW = 300.0  # HeadroomCriticallyLow's window


class Ratios:
    """Every cycle's current headroom ratio per pool over the last HEADLINE_WINDOW seconds."""

    def __init__(self) -> None:
        self.by_pool: dict[str, deque] = {}

    def add(self, snap: Snapshot) -> None:
        for p in snap.pools:
            ratio = p.capacity.ratio.current if p.capacity is not None else None
            if ratio is not None and math.isfinite(ratio):
                self.by_pool.setdefault(p.pool, deque()).append((snap.timestamp, ratio))
        for pool in list(self.by_pool):
            dq = self.by_pool[pool]
            while dq and snap.timestamp - dq[0][0] > HEADLINE_WINDOW:
                dq.popleft()
            if not dq:
                del self.by_pool[pool]

    def shift_time(self, seconds: float) -> None:
        for pool, dq in self.by_pool.items():
            self.by_pool[pool] = deque((t + seconds, r) for t, r in dq)

    def get(self, pool: str) -> list:
        return list(self.by_pool.get(pool, ()))


def pct(ratio: Optional[float]) -> str:
    return fixed(ratio * 100, ".0f") + "%" if ratio is not None else "–"


def median(samples) -> Optional[float]:
    values = sorted(r for _, r in samples)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def headline(p: PoolSnapshot, cap: Capacity, samples: list) -> tuple[str, str]:
    """(card class, the headroom KPI's HTML): the median of the last HEADLINE_WINDOW seconds as the
    big figure (the card's colour follows it), the instant value and N-1 beside it, labelled."""
    ratio = cap.ratio.current
    middle = median(samples) if ratio is not None else None
    shown = middle if middle is not None else ratio
    cls = "ok"
    if shown is not None and shown < 0.1:
        cls = "bad"
    elif shown is not None and shown < 0.25:
        cls = "warn"
    ratio_n1 = cap.ratio.n_minus_1
    headroom_n1 = pct(ratio_n1)
    if ratio_n1 is None and ratio is not None and p.replicas - p.stalled_replicas == 1:
        headroom_n1 = "no N-1"  # one working replica: nothing is left when it is lost
    window = HEADLINE_WINDOW / 60
    if middle is None:
        how = f"headroom now (instant) · N-1: {headroom_n1}"
    else:
        span = (samples[-1][0] - samples[0][0]) / 60 if len(samples) > 1 else 0.0
        over = (f"median of the last {window:.0f} min" if span >= window - 0.5 else
                f"median of the {len(samples)} cycle{'s' if len(samples) != 1 else ''} so far "
                f"({fixed(span, '.0f')} of {window:.0f} min)")
        how = (f"headroom, {over}: the window the capacity alerts judge (HeadroomCriticallyLow; "
               f"HeadroomLow 10 min) · now (instant): {pct(ratio)} · N-1 now: {headroom_n1}")
    return cls, f'<div><b class="{cls}">{pct(shown)}</b><span>{how}</span></div>'
