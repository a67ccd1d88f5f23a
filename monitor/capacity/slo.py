"""Latency SLOs: fraction over target and multi-window error-budget burn rates.

A target is "q of observations at or under `seconds`" (e.g. p95 task completion <= 30 s means
objective 0.95, error budget 0.05). The violation ratio is the share of observations over
`seconds`; the burn rate over a window is that share divided by the budget (1 = spending the budget
exactly as fast as the SLO allows). Bad counts come from the cumulative histograms, so they are
exact when the target is a bucket bound and interpolated inside the bucket otherwise.

`SloTracker` keeps (timestamp, cumulative total, cumulative bad) per key so several windows can be
answered from one series of scrapes; it is stateful but does no I/O and reads no clock.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from monitor.derive import histogram as histo
from monitor.model import Histogram

# the latency signals a pool target may be on (a task target's signal is "task")
SIGNALS = ("ttft", "e2e", "queue", "itl", "call")


@dataclass(frozen=True)
class Target:
    seconds: float  # latency target
    objective: float = 0.95  # share of observations that must be at or under it
    signal: str = "task"  # "task" (task completion), "call", "ttft"

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"SLO target seconds must be > 0, got {self.seconds}")
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO objective must be within (0, 1), got {self.objective}")

    @property
    def budget(self) -> float:
        return 1.0 - self.objective


@dataclass
class SloSettings:
    """Targets per task type and per pool, as read from `slos:` and `pools.<pool>.slo` by
    monitor/config/slo.py (docs/capacity.md)."""

    task_targets: dict[str, Target] = field(default_factory=dict)  # task type -> target
    default_task_target: Optional[Target] = None
    pool_targets: dict[str, list[Target]] = field(default_factory=dict)  # pool -> [ttft/call targets]
    # the SRE-workbook multi-window pairs the bundled burn-rate alerts use (1h/5m, 6h/30m, 1d/2h, 3d/6h)
    windows: dict[str, float] = field(default_factory=lambda: {
        "5m": 300.0, "30m": 1800.0, "1h": 3600.0, "2h": 7200.0, "6h": 21600.0, "1d": 86400.0, "3d": 259200.0})

    def task_target(self, task_type: str) -> Optional[Target]:
        return self.task_targets.get(task_type, self.default_task_target)


def violation_ratio(h: Optional[Histogram], target: Target) -> Optional[float]:
    """Share of the histogram's observations over the target (None without observations)."""
    if h is None:
        return None
    return histo.fraction_above(h, target.seconds)


def bad_count(h: Optional[Histogram], target: Target) -> Optional[tuple[float, float]]:
    """(total, over target) counts of a cumulative histogram."""
    if h is None:
        return None
    n = histo.total(h)
    frac = histo.fraction_above(h, target.seconds)
    return n, (frac or 0.0) * n


class SloTracker:
    """Cumulative (total, bad) per key over time -> burn rates over several windows."""

    def __init__(self, windows: dict[str, float], keep_seconds: Optional[float] = None) -> None:
        if not windows:
            raise ValueError("SloTracker needs at least one window")
        self.windows = dict(windows)
        self.keep = keep_seconds or max(self.windows.values()) * 1.1
        self._series: dict[object, deque] = {}
        self._offset: dict[object, tuple[float, float]] = {}
        self._last_raw: dict[object, tuple[float, float]] = {}
        self._since_thin: dict[object, int] = {}
        # resolution kept: every point for the last `dense_seconds`, then one per `sparse_step`, so a
        # 3-day window costs ~1,000 points per key, not one per cycle
        self.dense_seconds = min(3600.0, min(self.windows.values()) * 12)
        self.sparse_step = max(30.0, min(self.windows.values()) / 2, max(self.windows.values()) / 1000)

    def observe(self, key, timestamp: float, total: float, bad: float) -> None:
        """Record cumulative counts; a drop (counter reset) is rebased so history stays monotone."""
        off_t, off_b = self._offset.get(key, (0.0, 0.0))
        last = self._last_raw.get(key)
        if last is not None and (total < last[0] or bad < last[1] - 1e-9):
            prev = self._series[key][-1]
            off_t, off_b = prev[1], prev[2]
            self._offset[key] = (off_t, off_b)
        self._last_raw[key] = (total, bad)
        series = self._series.setdefault(key, deque())
        if series and timestamp <= series[-1][0]:
            raise ValueError(f"SLO observations must move forward in time ({timestamp} <= {series[-1][0]})")
        series.append((timestamp, total + off_t, bad + off_b))
        while len(series) > 2 and series[1][0] <= timestamp - self.keep:
            series.popleft()
        n = self._since_thin.get(key, 0) + 1
        self._since_thin[key] = n
        if n >= 100:
            self._since_thin[key] = 0
            self._thin(series, timestamp)

    def _thin(self, series: deque, now: float) -> None:
        """Drop intermediate old points (cumulative counts: only resolution is lost, never counts)."""
        kept: list = []
        for point in series:
            if kept and now - point[0] > self.dense_seconds and point[0] - kept[-1][0] < self.sparse_step:
                continue
            kept.append(point)
        if len(kept) < len(series):
            series.clear()
            series.extend(kept)

    def ratio(self, key, window_seconds: float) -> Optional[float]:
        """Share of bad observations in the last window_seconds (None without observations)."""
        series = self._series.get(key)
        if not series or len(series) < 2:
            return None
        now_ts, now_total, now_bad = series[-1]
        start = series[0]
        for point in series:  # the newest point at or before the window start
            if point[0] <= now_ts - window_seconds:
                start = point
            else:
                break
        d_total = now_total - start[1]
        if d_total <= 0:
            return None
        return (now_bad - start[2]) / d_total

    def forget(self, before: float) -> None:
        """Drop every key whose newest observation is older than `before` (a task type or pool gone)."""
        for key in [k for k, series in self._series.items() if not series or series[-1][0] < before]:
            for held in (self._series, self._offset, self._last_raw, self._since_thin):
                held.pop(key, None)

    def __len__(self) -> int:
        return len(self._series)

    def burn_rates(self, key, target: Target) -> dict[str, Optional[float]]:
        out = {}
        for name, secs in self.windows.items():
            r = self.ratio(key, secs)
            out[name] = None if r is None else r / target.budget
        return out
