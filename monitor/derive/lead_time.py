"""How long a new replica takes to serve, measured (pure): from its first successful scrape to the
first cycle its completed-request counter has moved.

Only replicas first seen after headroom's first cycle count (the ones present at start-up were not
watched coming up). The measurement starts once the replica answers /metrics, so it leaves out
scheduling, image pull and model load before that; `pools.<pool>.replica_lead_time`, when set,
is used instead (docs/capacity.md). The newest measurement per pool is kept; replicas and pools
unseen for global.forget_after are forgotten (`expire`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..model import ReplicaReading
from ..model.poolkey import PoolBy
from .core import pool_of


@dataclass
class LeadTimes:
    seen: dict[str, float] = field(default_factory=dict)  # "target|model" -> timestamp of its newest reading
    waiting: dict[str, tuple[float, float]] = field(default_factory=dict)  # "target|model" -> (first scrape time, completions then)
    measured: dict[str, float] = field(default_factory=dict)  # pool -> seconds, the newest measurement
    pool_seen: dict[str, float] = field(default_factory=dict)  # pool -> timestamp of its newest reading

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds`: the first-scrape times move with it."""
        self.waiting = {key: (t + seconds, done) for key, (t, done) in self.waiting.items()}
        self.seen = {key: t + seconds for key, t in self.seen.items()}
        self.pool_seen = {pool: t + seconds for pool, t in self.pool_seen.items()}

    def observe(self, readings: Iterable[ReplicaReading], pool_by: PoolBy, first_cycle: bool) -> None:
        for r in readings:
            key = f"{r.target}|{r.model}"
            done: Optional[float] = r.counters.get("request_success")
            pool = pool_of(r, pool_by)
            self.pool_seen[pool] = max(r.timestamp, self.pool_seen.get(pool, r.timestamp))
            if key not in self.seen:
                self.seen[key] = r.timestamp
                if not first_cycle and done is not None:
                    self.waiting[key] = (r.timestamp, done)
                continue
            self.seen[key] = max(r.timestamp, self.seen[key])
            start = self.waiting.get(key)
            if start is not None and done is not None and done > start[1]:
                self.measured[pool] = max(0.0, r.timestamp - start[0])
                del self.waiting[key]

    def expire(self, before: float) -> None:
        """Forget replicas and pools whose newest reading is older than `before` (a replica seen
        again later counts as new: its lead time is measured again)."""
        for key in [k for k, t in self.seen.items() if t < before]:
            del self.seen[key]
            self.waiting.pop(key, None)
        for pool in [p for p, t in self.pool_seen.items() if t < before]:
            del self.pool_seen[pool]
            self.measured.pop(pool, None)
