"""What the spare-capacity core says of a pool (monitor/capacity/spare.py computes it): plain data."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

SPARE_HORIZONS = {"now": 0.0, "1h": 3600.0, "6h": 6 * 3600.0, "1d": 86400.0}  # headroom_spare_requests{horizon}
DAY_SECONDS = 86400.0
WEEK_SECONDS = 7 * DAY_SECONDS


@dataclass(frozen=True)
class SpareWindow:
    """From `start` to `end` (Unix seconds) `requests` concurrent deferrable requests fit."""

    start: float
    end: float
    requests: float

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "requests": self.requests}


@dataclass(frozen=True)
class Spare:
    """A pool's spare capacity for deferrable work until the forecast's end.

    `ceiling`: knee x (1 - margin), the concurrency the interactive load and the deferrable load
    share; `requests`: per horizon (SPARE_HORIZONS) the fewest that fit from now to its end (None:
    not known, e.g. the forecast ends before it); `windows`: the spare over the next 7 days, merged
    (only spans where at least one request fits); `budget_ratio`: the deferrable budget D in [0, 1]
    (0 when `reason` says the data is stale or the pool is over its SLO now); `reason` says why."""

    ceiling: Optional[float] = None
    requests: dict[str, Optional[float]] = field(default_factory=dict)
    windows: tuple[SpareWindow, ...] = ()
    budget_ratio: float = 0.0
    reason: str = ""
    interactive_requests: Optional[float] = None  # the interactive load now (load less the deferrable)
    deferrable_requests: Optional[float] = None  # the deferrable load now (None: no task classes seen)
    timestamp: float = 0.0  # the `now` it was computed for

    def windows_until(self, end: float) -> list[SpareWindow]:
        """The windows clipped to end at `end` (e.g. now + 24 h)."""
        return [SpareWindow(w.start, min(w.end, end), w.requests) for w in self.windows if w.start < end]

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of a pool's `spare` in /api/v1/snapshot, the next 24 hours' windows in the
        forecast's steps (the 7 days' on an hourly grid are added by monitor/export/snapshot_json.py)."""
        return {"ceiling_requests": self.ceiling, "requests": dict(self.requests),
                "budget_ratio": self.budget_ratio, "reason": self.reason,
                "interactive_requests": self.interactive_requests,
                "deferrable_requests": self.deferrable_requests,
                "windows_24h": [w.as_dict() for w in self.windows_until(self.timestamp + DAY_SECONDS)]}
