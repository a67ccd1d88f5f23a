"""Latency SLOs: fraction over target and multi-window error-budget burn rates.

A target is "q of observations at or under `seconds`" (e.g. p95 task completion <= 30 s means
objective 0.95, error budget 0.05). The violation ratio is the share of observations over
`seconds`; the burn rate over a window is that share divided by the budget (1 = spending the budget
exactly as fast as the SLO allows). Bad counts come from the cumulative histograms, so they are
exact when the target is a bucket bound and interpolated inside the bucket otherwise.

`SloTracker` keeps (timestamp, cumulative total, cumulative bad) per key so several windows can be
answered from one series of scrapes; it is stateful but does no I/O and reads no clock.

A window is *covered* when the key's oldest point held is at or before the window's start (within
`tolerance` seconds, a cycle's jitter); an uncovered window's burn rate is None (never the rate of
the shorter history there is). So is a window whose start falls in a gap of the history (the daemon
was down): its counts there cannot be told from the older ones. The start point may lie up to
`slack(window)` before the start: two cycles or a tenth of the window, plus the thinned spacing. What the tracker holds can be saved and restored (`journal=True`,
`drain`, `restore`: monitor/history/slo_history.py keeps it in the embedded store), so a restart keeps the
windows covered. `window_burn` turns counts read elsewhere (Prometheus' `increase` over the window)
into the same burn rate.
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
    monitor/capacity/slo_settings.py (docs/capacity.md)."""

    task_targets: dict[str, Target] = field(default_factory=dict)  # task type -> target
    default_task_target: Optional[Target] = None
    pool_targets: dict[str, list[Target]] = field(default_factory=dict)  # pool -> [ttft/call targets]
    # the SRE-workbook multi-window pairs the bundled burn-rate alerts use (1h/5m, 6h/30m, 1d/2h, 3d/6h),
    # and 5m/1m, the page that can fire minutes after an overload's start (or a restart)
    windows: dict[str, float] = field(default_factory=lambda: {
        "1m": 60.0, "5m": 300.0, "30m": 1800.0, "1h": 3600.0, "2h": 7200.0, "6h": 21600.0, "1d": 86400.0, "3d": 259200.0})

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


def window_burn(counts: Optional[tuple[float, float]], target: Target) -> Optional[float]:
    """Burn rate of (total, bad) counts over a window; None without observations."""
    if counts is None or not counts[0] > 0:
        return None
    return max(0.0, counts[1] / counts[0]) / target.budget  # an increase a hair below 0 is no burn, never -0.00


# a point as saved: (key, ts, total, bad, raw total, raw bad); total/bad are rebased over resets
Row = tuple[object, float, float, float, float, float]


class SloTracker:
    """Cumulative (total, bad) per key over time -> burn rates over several windows."""

    def __init__(self, windows: dict[str, float], keep_seconds: Optional[float] = None,
                 tolerance: float = 0.0, journal: bool = False) -> None:
        if not windows:
            raise ValueError("SloTracker needs at least one window")
        if not tolerance >= 0:
            raise ValueError(f"SloTracker tolerance must be >= 0 seconds, got {tolerance!r}")
        self.windows = dict(windows)
        self.keep = keep_seconds or max(self.windows.values()) * 1.1
        self.tolerance = float(tolerance)
        # with `journal`, what changed since the last `drain` (points added, (key, ts) dropped)
        self.journal = journal
        self._added: list[Row] = []
        self._dropped: list[tuple[object, float]] = []
        self._series: dict[object, deque] = {}
        self._offset: dict[object, tuple[float, float]] = {}
        self._last_raw: dict[object, tuple[float, float]] = {}
        self._since_thin: dict[object, int] = {}
        # resolution kept: every point for the last `dense_seconds`, then one per `sparse_step`, so a
        # 3-day window costs ~1,000 points per key, not one per cycle; a window under 5 minutes (the
        # 1m of the fast page) keeps the hour as dense as 5m does, or the 30m and 1h windows'
        # starts would be thinned to one point per `sparse_step` after 12 minutes
        self.dense_seconds = min(3600.0, max(300.0, min(self.windows.values())) * 12)
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
        if self.journal:
            self._added.append((key, timestamp, total + off_t, bad + off_b, total, bad))
        while len(series) > 2 and series[1][0] <= timestamp - self.keep:
            self._drop(key, series.popleft())
        n = self._since_thin.get(key, 0) + 1
        self._since_thin[key] = n
        if n >= 100:
            self._since_thin[key] = 0
            self._thin(key, series, timestamp)

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds` (monitor/pipeline/cycle.py): every point moves with it, counts
        unchanged; with `journal`, the saved points are replaced by the moved ones at the next save."""
        gone: set[tuple[object, float]] = set()
        for key, series in self._series.items():
            gone.update((key, p[0]) for p in series)
            moved = deque((t + seconds, total, bad) for t, total, bad in series)
            self._series[key] = moved
        if not self.journal:
            return
        # in bulk (one pass, not one per point): the old points deleted, the moved ones inserted
        self._added = [row for row in self._added if (row[0], row[1]) not in gone]
        self._dropped.extend(gone)
        for key, series in self._series.items():
            off_t, off_b = self._offset.get(key, (0.0, 0.0))
            self._added.extend((key, t, total, bad, total - off_t, bad - off_b) for t, total, bad in series)

    def _drop(self, key, point: tuple) -> None:
        """Journal a dropped point: deleted from the store (deletes go before inserts, monitor/forecast/
        store.py slo_apply), and no longer inserted if it was added since the last save."""
        if self.journal:
            ts = point[0]
            self._added = [row for row in self._added if row[1] != ts or row[0] != key]
            self._dropped.append((key, ts))

    def _thin(self, key, series: deque, now: float) -> None:
        """Drop intermediate old points (cumulative counts: only resolution is lost, never counts)."""
        kept: list = []
        for point in series:
            if kept and now - point[0] > self.dense_seconds and point[0] - kept[-1][0] < self.sparse_step:
                self._drop(key, point)
                continue
            kept.append(point)
        if len(kept) < len(series):
            series.clear()
            series.extend(kept)

    # ------------------------------------------------------------------ saving and restoring
    def drain(self) -> tuple[list[Row], list[tuple[object, float]]]:
        """(points added, (key, ts) of points dropped) since the last drain (`journal=True`)."""
        added, dropped = self._added, self._dropped
        self._added, self._dropped = [], []
        return added, dropped

    def requeue(self, added: list, dropped: list) -> None:
        """Put back what a failed save drained (before what was journalled since)."""
        self._added = list(added) + self._added
        self._dropped = list(dropped) + self._dropped

    def restore(self, rows) -> None:
        """Rebuild from saved rows (any order): each key's points, its rebase offset and last raw
        counts, so observing goes on as if the process had never stopped. Points older than
        `keep` before a key's newest are left out, as `observe` would have dropped them."""
        by_key: dict[object, list] = {}
        for key, ts, total, bad, raw_total, raw_bad in rows:
            by_key.setdefault(key, []).append((float(ts), float(total), float(bad), float(raw_total), float(raw_bad)))
        for key, points in by_key.items():
            points.sort()
            newest = points[-1]
            while len(points) > 2 and points[1][0] <= newest[0] - self.keep:
                points.pop(0)
            self._series[key] = deque((p[0], p[1], p[2]) for p in points)
            self._offset[key] = (newest[1] - newest[3], newest[2] - newest[4])
            self._last_raw[key] = (newest[3], newest[4])
            self._since_thin[key] = 0

    def keys(self) -> list:
        return list(self._series)

    # ------------------------------------------------------------------ windows
    def covered(self, key, window_seconds: float) -> bool:
        """Whether the key's history reaches back to the window's start (within `tolerance`)."""
        series = self._series.get(key)
        if not series or len(series) < 2:
            return False
        return series[0][0] <= series[-1][0] - window_seconds + self.tolerance

    def ratio(self, key, window_seconds: float) -> Optional[float]:
        """Share of bad observations in the last window_seconds (None without observations)."""
        counts = self.counts(key, window_seconds)
        return counts[1] / counts[0] if counts is not None else None

    def counts(self, key, window_seconds: float) -> Optional[tuple[float, float]]:
        """(observations, bad ones) in the last window_seconds (None without observations)."""
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
        return d_total, now_bad - start[2]

    def slack(self, window_seconds: float) -> float:
        """How far before a window's start its start point may lie (module docstring)."""
        thinned = self.sparse_step if window_seconds > self.dense_seconds else 0.0
        return max(2.0 * self.tolerance, 0.1 * window_seconds) + thinned

    def window_ratio(self, key, window_seconds: float) -> Optional[float]:
        """`ratio` over a covered window whose start is not in a gap of the history, else None."""
        if not self.covered(key, window_seconds):
            return None
        series = self._series[key]
        start = series[-1][0] - window_seconds
        before = [p[0] for p in series if p[0] <= start]
        if before and before[-1] < start - self.slack(window_seconds):
            return None
        return self.ratio(key, window_seconds)

    def forget(self, before: float) -> None:
        """Drop every key whose newest observation is older than `before` (a task type or pool gone)."""
        for key in [k for k, series in self._series.items() if not series or series[-1][0] < before]:
            for held in (self._series, self._offset, self._last_raw, self._since_thin):
                held.pop(key, None)

    def newest(self, key) -> Optional[float]:
        """When the key was last observed (None: never, or forgotten)."""
        series = self._series.get(key)
        return series[-1][0] if series else None

    def __len__(self) -> int:
        return len(self._series)

    def burn_rates(self, key, target: Target) -> dict[str, Optional[float]]:
        """window -> burn rate; None for a window the history does not cover yet, whose start is in
        a gap of the history, or without observations in it."""
        out = {}
        for name, secs in self.windows.items():
            r = self.window_ratio(key, secs)
            out[name] = None if r is None else max(0.0, r) / target.budget
        return out
