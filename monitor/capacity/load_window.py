"""The load headroom judges: averaged over the latency window, not one cycle's (pure).

With agent sessions, one cycle's active + queued requests swings with every tool wait (a session
between two calls holds nothing): headroom on it moved between +0.7 and -1.9 within minutes on a real
engine, and alerts on its median never held. `current` and N-1 are judged on the pool's load averaged
over the latency window (`global.latency_window`), time-weighted over the cycles (trapezoids: an
irregular cycle counts for its own time); `instant` keeps this cycle's.

    window = LoadWindows(300.0)
    mean, seconds = window.mean("pool", now, load)   # records the cycle's load, returns the mean
"""
from __future__ import annotations

from collections import deque
from typing import Optional


class LoadWindows:
    """Each pool's (time, load) over the last `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.series: dict[str, deque] = {}

    def mean(self, pool: str, now: float, load: Optional[float]) -> Optional[tuple[float, float]]:
        """Record this cycle's load of `pool`; (its time-weighted mean over the window, the seconds
        the mean covers: 0 with one cycle), or None when the load is unknown (nothing recorded)."""
        if load is None:
            return None
        points = self.series.setdefault(pool, deque())
        while points and points[-1][0] >= now:  # a repeated or earlier time replaces what it covers
            points.pop()
        points.append((now, float(load)))
        while len(points) > 1 and points[1][0] <= now - self.seconds:
            points.popleft()
        if len(points) < 2:
            return float(load), 0.0
        pts = list(points)
        area = sum((b[0] - a[0]) * (a[1] + b[1]) / 2.0 for a, b in zip(pts, pts[1:]))
        span = pts[-1][0] - pts[0][0]
        return area / span, span

    def shift_time(self, seconds: float) -> None:
        self.series = {pool: deque((t + seconds, v) for t, v in pts) for pool, pts in self.series.items()}

    def forget(self, pool: str) -> None:
        self.series.pop(pool, None)


__all__ = ["LoadWindows"]
