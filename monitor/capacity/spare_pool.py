"""A pool's spare-capacity inputs from its snapshot (pure): what monitor/capacity/spare.py reads.

    p.spare = spare_for(p, SpareSettings(...), now)      # monitor/step/cycle_step.py, after the forecast is attached

  - the limit: the pool's knee, or a lower engine limit (slots, KV) when one is known; the `slo`
    limit is not a ceiling but the "over its SLO now" signal (the budget falls to 0);
  - the load now: the capacity layer's (averaged over the latency window), else this cycle's;
    the deferrable part of it: per deferrable task type (capacity.task_classes) its calls per second
    x their mean latency (Little's law) over the task window; the interactive load is the rest;
  - the forecast: the capacity series' path and its upper band (pools.forecast upper_level, 95 %).
    History keeps no interactive-only series yet, so the whole load's forecast stands for the
    interactive load's: deferrable work that ran in the history is counted as interactive, and the
    spare is under-, never over-stated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from monitor.capacity.settings import DEFERRABLE
from monitor.capacity.spare import SpareInputs, pool_spare
from monitor.model import PoolSnapshot, Spare


@dataclass(frozen=True)
class SpareSettings:
    margin: float = 0.2
    max_age: float = 3600.0
    budget_horizon: float = 900.0
    deferrable_priorities: tuple[str, ...] = ()  # engine priority values that are deferrable work

    @classmethod
    def of(cls, capacity) -> "SpareSettings":
        """From the `capacity:` section (monitor/capacity/settings.py `Capacity`)."""
        return cls(capacity.spare_margin, capacity.spare_max_age, capacity.spare_budget_horizon,
                   tuple(capacity.deferrable_priorities))


def deferrable_load(p: PoolSnapshot, priorities: tuple[str, ...] = ()) -> Optional[float]:
    """Concurrent deferrable requests now: per deferrable task type its calls per second x their
    mean latency (Little's law); where the pool's task types are not known, the requests the engines
    run at the deferrable `priorities` (SGLang's `priority` bands; capacity.deferrable_priorities);
    None when neither says, 0.0 when none of the task types is deferrable."""
    if p.tasks is None or not p.tasks.by_type:
        if priorities and p.active_by_priority:
            return float(sum(p.active_by_priority.get(v, 0.0) for v in priorities))
        return None
    total = 0.0
    for t in p.tasks.by_type.values():
        if t.call_class not in DEFERRABLE or t.call_rate == 0:
            continue
        if t.call_rate is None or t.call_latency is None or t.call_latency.mean is None:
            return None
        total += t.call_rate * t.call_latency.mean
    return total


def limit_of(p: PoolSnapshot) -> Optional[float]:
    c = p.capacity
    if c is None or c.withheld:
        return None
    known = [v for v in (c.capacity_requests.slots, c.capacity_requests.kv, c.knee_requests) if v is not None]
    return min(known) if known else None


def spare_inputs(p: PoolSnapshot, settings: SpareSettings) -> SpareInputs:
    c = p.capacity
    load = c.load_requests if c is not None and c.load_requests is not None else p.load_requests
    deferrable = deferrable_load(p, settings.deferrable_priorities)
    interactive = max(0.0, load - (deferrable or 0.0)) if load is not None else None
    fc = p.forecast
    path = fc.path if fc is not None else None
    return SpareInputs(
        knee_requests=limit_of(p), margin=settings.margin,
        timestamps=path.timestamps if path is not None else (),
        upper=path.upper if path is not None else (),
        fit_timestamp=fc.last_fit_timestamp if fc is not None and path is not None else None,
        interactive_now=interactive, deferrable_now=deferrable, pool_stale=p.stale,
        over_slo=c is not None and c.capacity_requests.slo is not None,
        max_age=settings.max_age, budget_horizon=settings.budget_horizon)


def spare_for(p: PoolSnapshot, settings: SpareSettings, now: float) -> Spare:
    return pool_spare(spare_inputs(p, settings), now)
