"""The query layer's clock, as Prometheus mode reads it (issue 38).

Every query of a Prometheus-mode cycle is asked at the query layer's own now: the first one without
`time`, the others at the time the query layer evaluated the first at (its samples' timestamp), so
one cycle reads one instant of the query layer and never headroom's clock (a step of headroom's
clock back used to read the past: the values of 45 s ago, exported as fresh).

The same timestamps tell when the query layer's clock steps: between two cycles it must advance as
far as a clock that never steps (the boot-time clock) did, give or take how long each request took.
More than `tolerance` seconds beyond that is a step, counted by direction and logged once.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from monitor.kit.ticker import steady_clock

log = logging.getLogger("monitor.sources.prometheus")

STEP_TOLERANCE = 1.0  # seconds, as the wall-clock check of monitor/pipeline/cycle.py


class QueryClock:
    """One cycle's query time (`at`, None until an answer gave one) and the steps of the query
    layer's clock (`steps`: back, forward). `begin()` at each cycle, `query(...)` for each query."""

    def __init__(self, steady: Callable[[], float] = steady_clock, tolerance: float = STEP_TOLERANCE):
        self.steady = steady
        self.tolerance = tolerance
        self.steps: dict[str, float] = {"back": 0.0, "forward": 0.0}
        self.at: Optional[float] = None
        self._mark: Optional[tuple[float, float, float]] = None  # (query time, steady before, steady after)

    def begin(self) -> None:
        self.at = None

    def query(self, client, query: str, deadline: Optional[float], warnings: Optional[list] = None, **kw) -> list:
        """`client.query` at the cycle's query time; the first answer with samples sets it."""
        if self.at is not None:
            return client.query(query, at=self.at, deadline=deadline, warnings=warnings, **kw)
        stamps: list[float] = []
        before = self.steady()
        got = client.query(query, at=None, deadline=deadline, warnings=warnings, stamps=stamps, **kw)
        if stamps:
            self.at = stamps[0]
            self._check((stamps[0], before, self.steady()))
        return got

    def _check(self, mark: tuple[float, float, float]) -> None:
        previous, self._mark = self._mark, mark
        if previous is None:
            return
        moved = mark[0] - previous[0]
        least, most = mark[1] - previous[2], mark[2] - previous[1]  # how far it may have moved, by the steady clock
        jump = moved - most if moved > most else moved - least if moved < least else 0.0
        if abs(jump) <= self.tolerance:
            return
        direction = "back" if jump < 0 else "forward"
        self.steps[direction] += 1
        log.warning("the query layer's clock stepped %s by %.1f s since the previous cycle (its answers' time against "
                    "headroom's boot-time clock); headroom reads at the query layer's time "
                    "(headroom_clock_steps_total{clock=\"query_layer\"} counts steps)", direction, abs(jump))
