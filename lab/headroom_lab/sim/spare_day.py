"""A simulated office day on a driven clock: a batch of deferrable work scheduled by /api/v1/spare
against the same batch started at the morning peak (issue 39's proof).

The pool: `slots` requests served at once, first come first served (no engine priority), the rest
wait in one queue. Interactive calls arrive as a Poisson process whose rate follows an office day
(`PROFILE` x `peak_rate`), each holding a slot for an exponential time (mean `interactive_s`); a
call waiting more than `target_s` for its slot is over target. The batch: `batch_calls` deferrable
calls (mean `deferrable_s` each), kept `concurrency` in flight by a worker from its start until done.

headroom's side is its own code: the forecaster is stood in for by the profile's exact mean
concurrency m(t) with a Poisson upper band m + 1.645 sqrt(m) (the 95 % one-sided), re-issued every
`refit_s` for the next 24 h in `step_s` steps (the peak of each step); the knee is `slots`;
`monitor.capacity.spare.pool_spare` makes the windows and `monitor.export.spare_api.spare_answer`
(what /api/v1/spare answers) picks the batch's start: the earliest window holding `concurrency`
requests for the batch's expected duration x `slack`.

    day = run_day(DayParams(), start=None | "spare" | seconds since midnight, seed=1)
    day.interactive_over_ratio, day.batch_done_s, day.batch_start_s
Pure Python, deterministic for (params, start, seed); one day of the default pool takes ~2 s.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np

from monitor.capacity.spare_pool import SpareSettings, spare_for
from monitor.export.spare_api import spare_answer
from monitor.forecast.pool import ForecastPath, PoolForecast
from monitor.model import Capacity, Limits, PoolSnapshot, Snapshot

DAY = 86400.0
MIDNIGHT = 1_799_020_800.0  # a Monday, 00:00 UTC (2027-01-04)
# the office day: (hour, share of the peak arrival rate), linear between
PROFILE = ((0, 0.08), (7, 0.08), (9, 1.0), (11, 1.0), (12.5, 0.7), (14, 0.9), (16, 0.9), (19, 0.2),
           (21, 0.1), (24, 0.08))
Z95 = 1.645


@dataclass(frozen=True)
class DayParams:
    slots: int = 32
    peak_rate: float = 5.0  # interactive calls per second at the peak
    interactive_s: float = 4.0
    deferrable_s: float = 20.0
    target_s: float = 2.0  # an interactive call waiting longer for its slot is over target
    objective: float = 0.95  # at most 5 % over target over the day
    batch_calls: int = 8000
    concurrency: int = 16
    submitted_h: float = 8.0  # when the batch is handed to the scheduler
    margin: float = 0.2
    step_s: float = 300.0
    refit_s: float = 900.0
    slack: float = 1.25


@dataclass
class DayResult:
    start: str
    batch_start_s: Optional[float]
    batch_done_s: Optional[float]
    interactive_calls: int = 0
    interactive_over: int = 0
    over_by_hour: list = field(default_factory=list)  # share over target per hour of the day
    during_batch_over_ratio: Optional[float] = None
    answer: Optional[dict] = None  # what /api/v1/spare said

    @property
    def interactive_over_ratio(self) -> float:
        return self.interactive_over / self.interactive_calls if self.interactive_calls else 0.0

    def as_dict(self) -> dict:
        return {"start": self.start, "batch_start_h": _h(self.batch_start_s), "batch_done_h": _h(self.batch_done_s),
                "interactive_calls": self.interactive_calls, "interactive_over_ratio": self.interactive_over_ratio,
                "during_batch_over_ratio": self.during_batch_over_ratio,
                "worst_hour_over_ratio": max(self.over_by_hour) if self.over_by_hour else None}


def _h(s: Optional[float]) -> Optional[float]:
    return None if s is None else round(s / 3600.0, 3)


def rate_at(p: DayParams, t: float) -> float:
    """Interactive arrivals per second `t` seconds after midnight."""
    h = (t % DAY) / 3600.0
    for (h0, f0), (h1, f1) in zip(PROFILE, PROFILE[1:]):
        if h0 <= h <= h1:
            return p.peak_rate * (f0 + (f1 - f0) * (h - h0) / (h1 - h0))
    return p.peak_rate * PROFILE[-1][1]


def forecast_at(p: DayParams, now: float) -> PoolForecast:
    """The stand-in forecaster's refit at `now` (seconds after midnight): 24 h of `step_s` steps,
    each point labelled by its step's start (as the forecaster labels them), its value the upper
    band's peak over the step [t, t + step)."""
    n = int(DAY // p.step_s)
    ts = now + p.step_s * np.arange(0, n)
    upper = []
    for t in ts:
        m = max(rate_at(p, x) * p.interactive_s for x in np.linspace(t, t + p.step_s, 6))
        upper.append(m + Z95 * math.sqrt(m))
    arr = np.array(upper)
    return PoolForecast(MIDNIGHT + now, path=ForecastPath(MIDNIGHT + ts, arr, arr, arr))


def pool_at(p: DayParams, now: float, interactive_now: float) -> PoolSnapshot:
    """The pool as a cycle would see it at `now`, its spare attached (monitor/capacity/spare_pool.py)."""
    fit = now - (now % p.refit_s)
    pool = PoolSnapshot(pool="chat", model="m", replicas=1, active_requests=interactive_now, queued_requests=0.0,
                        capacity=Capacity(knee_requests=float(p.slots), load_requests=interactive_now,
                                          capacity_requests=Limits(knee=float(p.slots), effective=float(p.slots))),
                        forecast=forecast_at(p, fit))
    pool.spare = spare_for(pool, SpareSettings(margin=p.margin, max_age=2 * p.refit_s), MIDNIGHT + now)
    return pool


def schedule(p: DayParams, now: float, interactive_now: float) -> tuple[Optional[float], dict]:
    """The batch's start (seconds after midnight) as /api/v1/spare answers at `now`; None: no window."""
    hours = p.batch_calls * p.deferrable_s / p.concurrency / 3600.0 * p.slack
    snap = Snapshot(timestamp=MIDNIGHT + now, pools=[pool_at(p, now, interactive_now)])
    status, answer = spare_answer(snap, f"pool=chat&requests={p.concurrency}&hours={hours:.3f}")
    if status != 200 or not answer.get("fits"):
        return None, answer
    return max(now, answer["window"]["start"] - MIDNIGHT), answer


class _Pool:
    """The engine: `slots` served at once, one FCFS queue; events on a heap (the driven clock)."""

    def __init__(self, p: DayParams, rng: random.Random):
        self.p, self.rng = p, rng
        self.free, self.queue, self.events = p.slots, deque(), []
        self.in_flight = {"i": 0, "d": 0}
        self.started: list = []  # (arrived, kind) of the calls started since the loop last looked

    def submit(self, t: float, kind: str) -> None:
        self.queue.append((t, kind))
        self.dispatch(t)

    def dispatch(self, t: float) -> None:
        while self.free and self.queue:
            arrived, kind = self.queue.popleft()
            self.free -= 1
            self.in_flight[kind] += 1
            mean = self.p.interactive_s if kind == "i" else self.p.deferrable_s
            heapq.heappush(self.events, (t + self.rng.expovariate(1.0 / mean), 1, kind))
            self.started.append((arrived, kind))


def run_day(p: DayParams, start: Union[None, str, float] = "spare", seed: int = 1) -> DayResult:
    """One day from midnight. `start`: None (no batch), "spare" (the batch handed over at
    `submitted_h` and started where /api/v1/spare says), or seconds after midnight."""
    rng = random.Random(seed)
    pool = _Pool(p, rng)
    answer, begin = None, None
    if start == "spare":
        at = p.submitted_h * 3600.0
        heapq.heappush(pool.events, (at, 0, "schedule"))
    elif start is not None:
        begin = float(start)
        heapq.heappush(pool.events, (begin, 0, "batch"))
    heapq.heappush(pool.events, (rng.expovariate(p.peak_rate), 2, "arrive"))
    res = DayResult(str(start), begin, None, over_by_hour=[0.0] * 24)
    calls, over = [0] * 24, [0] * 24
    left, batch_over, batch_calls = p.batch_calls, 0, 0
    while pool.events:
        t, _, what = heapq.heappop(pool.events)
        if what == "arrive":
            if t < DAY:
                if rng.random() < rate_at(p, t) / p.peak_rate:  # thinning: the profile's rate
                    pool.submit(t, "i")
                heapq.heappush(pool.events, (t + rng.expovariate(p.peak_rate), 2, "arrive"))
        elif what == "schedule":
            begin, answer = schedule(p, t, pool.in_flight["i"])
            res.batch_start_s, res.answer = begin, answer
            if begin is not None:
                heapq.heappush(pool.events, (begin, 0, "batch"))
        elif what == "batch":
            for _ in range(min(p.concurrency, left)):
                left -= 1
                pool.submit(t, "d")
        else:  # a completion
            pool.free += 1
            pool.in_flight[what] -= 1
            if what == "d":
                if left > 0:
                    left -= 1
                    pool.queue.append((t, "d"))
                elif pool.in_flight["d"] == 0 and not any(k == "d" for _, k in pool.queue):
                    res.batch_done_s = t
            pool.dispatch(t)
        for arrived, kind in pool.started:
            if kind != "i":
                continue
            h = min(23, int(arrived // 3600))
            bad = (t - arrived) > p.target_s
            calls[h] += 1
            over[h] += bad
            if begin is not None and begin <= arrived and (res.batch_done_s is None or arrived <= res.batch_done_s):
                batch_calls += 1
                batch_over += bad
        pool.started = []
    res.interactive_calls, res.interactive_over = sum(calls), sum(over)
    res.over_by_hour = [o / c if c else 0.0 for o, c in zip(over, calls)]
    res.during_batch_over_ratio = batch_over / batch_calls if batch_calls else None
    res.answer = answer
    return res
