"""How much a counter went up between two readings: one rule for every caller.

    increase(new, old)            -> Optional[float]
    histogram_increase(new, old)  -> Optional[Histogram]

The rule is PromQL's (`rate()` / `increase()` on two samples): a counter only goes up, so a value
lower than the one before means the process restarted and its counter began again from zero; the
increase across that reset is the new value itself. What was counted between the older reading and
the restart is lost, so the result is a lower bound, and never negative. Nothing on either side, or
a value below zero (no counter has one), is unknown: None, never 0.

A histogram is a set of counters (buckets, count, sum): when its count or any bucket went down, or
its bucket bounds changed (an engine restarted with another layout), it was reset and its increase
is the new histogram.

Callers: monitor/derive/core.py (pool rates and latency windows from replica readings),
monitor/capacity/tasks.py (task and call counts from gateway readings) and the knee's observations
in monitor/capacity/enrich.py.
"""
from __future__ import annotations

from typing import Optional

from ..model import Histogram


def increase(new: Optional[float], old: Optional[float]) -> Optional[float]:
    """`new - old`; `new` when the counter went down (a reset); None when either is unknown."""
    if new is None or old is None or new < 0 or old < 0:
        return None
    return new - old if new >= old else new


def histogram_increase(new: Optional[Histogram], old: Optional[Histogram]) -> Optional[Histogram]:
    """Bucket-wise `new - old`; `new` itself after a reset or a change of bounds; None when
    either is unknown."""
    if new is None or old is None:
        return None
    delta = new.minus(old)
    return new if delta is None else delta
