"""How long a new replica takes to serve, measured (pure): from its first successful scrape to the
first cycle its completed-request counter has moved.

Only replicas first seen after headroom's first cycle count (the ones present at start-up were not
watched coming up). The measurement starts once the replica answers /metrics, so it leaves out
scheduling, image pull and model load before that; `pools.<pool>.replica_lead_time`, when set,
is used instead (docs/capacity.md). The newest measurement per pool is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..model import ReplicaReading
from .core import pool_of


@dataclass
class LeadTimes:
    seen: set = field(default_factory=set)  # "target|model" ever read
    waiting: dict = field(default_factory=dict)  # "target|model" -> (first scrape time, completions then)
    measured: dict = field(default_factory=dict)  # pool -> seconds, the newest measurement

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds`: the first-scrape times move with it."""
        self.waiting = {key: (t + seconds, done) for key, (t, done) in self.waiting.items()}

    def observe(self, readings: Iterable[ReplicaReading], pool_by: str, first_cycle: bool) -> None:
        for r in readings:
            key = f"{r.target}|{r.model}"
            done: Optional[float] = r.counters.get("request_success")
            if key not in self.seen:
                self.seen.add(key)
                if not first_cycle and done is not None:
                    self.waiting[key] = (r.timestamp, done)
                continue
            start = self.waiting.get(key)
            if start is not None and done is not None and done > start[1]:
                self.measured[pool_of(r, pool_by)] = max(0.0, r.timestamp - start[0])
                del self.waiting[key]
