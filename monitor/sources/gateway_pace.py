"""A gateway slow under load is slow, not down: its timeout, its late answers, its kept reading.

A gateway's /metrics can be slow exactly when it matters: LiteLLM's took 2.5 s on average under an
overload (181 KB) and often more than the 5 s `global.scrape_timeout`, so a daemon marked it down
24-25 times in 25 minutes (HeadroomSourceDown pending) and read calls per task as null in 29 % of
its cycles. So a gateway is read once per cycle, with the pace below:

- its own timeout (`gateway_timeout`): `sources.gateways[].timeout`, else the larger of
  `global.scrape_timeout` and 60 % of `global.interval` (9 s at the 15 s default); the cycle waits
  for it (monitor/pipeline/cycle.py `cycle_deadline_seconds`), never more than 90 % of the interval;
- an answer after `global.scrape_timeout` is up, and slow (`SourceStatus.slow`, counted in
  `headroom_source_slow_total`; `headroom_source_duration_seconds` is how long it took);
- a request still running at the cycle deadline is not asked again (one request in flight,
  monitor/sources/deadline_pool.py `DeadlinePool`): its answer, when it comes, is the next cycle's reading,
  stamped when it arrived (`carry`);
- a cycle without an answer (the deadline, or the request's own timeout) keeps the gateway's last
  reading (the task windows go on from it rather than reading null) and reports it slow, up, for at
  most `SLOW_MISSES` cycles in a row; after that, or on any other failure (refused, HTTP error,
  unreadable), it is down as before.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from monitor.model.readings import GatewayScrape

SLOW_MISSES = 2  # cycles in a row a gateway may miss, its last reading kept, before it is down
SLOW_SHARE = 0.6  # of global.interval: the default gateway timeout (at least global.scrape_timeout)
MISSED = ("timeout", "deadline")  # failures that are a slow gateway's, not a broken one's


def gateway_timeout(gw: Any, scrape_timeout: float, interval: float) -> float:
    """Seconds a request to gateway `gw` may take (see the module docstring), given global.scrape_timeout
    and global.interval."""
    own = getattr(gw, "timeout", None)
    if own:
        return float(own)
    return max(float(scrape_timeout), SLOW_SHARE * float(interval))


@dataclass
class GatewayPace:
    """Per configured gateway (by index): its last good reading, its misses in a row, and a request
    that ran past the cycle deadline (its future and the wall time of the cycle that started it)."""

    last: dict[int, GatewayScrape] = field(default_factory=dict)
    misses: dict[int, int] = field(default_factory=dict)
    running: dict[int, tuple[Future, float]] = field(default_factory=dict)
    carried: dict[int, float] = field(default_factory=dict)  # this cycle's answers from an earlier request

    def carry(self, index: int) -> Optional[Future]:
        """The finished request of an earlier cycle whose answer is this cycle's reading (its start
        time kept in `carried`), else None (a new request is made, or the running one reports busy)."""
        pending = self.running.pop(index, None)
        if pending is None:
            return None
        if not pending[0].done():
            self.running[index] = pending  # still running: this cycle's request is `busy`
            return None
        self.carried[index] = pending[1]
        return pending[0]

    def still_running(self, index: int, future: Any, now: float) -> None:
        """A request had no answer at the cycle deadline: its answer is read when it comes."""
        if isinstance(future, Future) and not future.done():
            self.running[index] = (future, now)

    def stamp(self, index: int, now: float, took: float) -> tuple[float, bool]:
        """(when the answer read this cycle was taken, whether it is an earlier cycle's request's):
        now, or that request's start + its duration (never after now)."""
        began = self.carried.pop(index, None)
        return (now, False) if began is None else (min(now, began + took), True)

    def answered(self, index: int, scrape: GatewayScrape) -> None:
        self.misses[index] = 0
        if scrape.reading is not None and not scrape.error:
            self.last[index] = scrape

    def missed(self, index: int) -> Optional[GatewayScrape]:
        """A cycle without an answer: the last reading to keep (slow), or None (down)."""
        self.misses[index] = self.misses.get(index, 0) + 1
        last = self.last.get(index)
        if last is not None and self.misses[index] <= SLOW_MISSES:
            return last
        self.last.pop(index, None)
        return None

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds` (monitor/pipeline/cycle.py): the kept readings and the running
        requests' cycle times move with it, as the cycle state does, so a kept reading lands in its
        task window in order (a reading dated before the window's newest clears it)."""
        self.last = {i: _shifted(s, seconds) for i, s in self.last.items()}
        self.running = {i: (f, t + seconds) for i, (f, t) in self.running.items()}
        self.carried = {i: t + seconds for i, t in self.carried.items()}

    def failed(self, index: int) -> None:
        """Any other failure: down, nothing kept."""
        self.misses[index] = self.misses.get(index, 0) + 1
        self.last.pop(index, None)


def _shifted(scrape: GatewayScrape, seconds: float) -> GatewayScrape:
    def moved(reading):
        return None if reading is None else replace(reading, timestamp=reading.timestamp + seconds)
    return replace(scrape, timestamp=scrape.timestamp + seconds, reading=moved(scrape.reading),
                   by_model={m: moved(r) for m, r in scrape.by_model.items()})


__all__ = ["GatewayPace", "MISSED", "SLOW_MISSES", "gateway_timeout"]
