"""What the history actually covers, and the figures that depend on it (pure: no I/O, no clock).

A digest is written for a week, but on a fresh install the history holds 20 minutes of it. Every
figure that scales with time is therefore taken over the *covered* part of the week, never over a
nominal 168 hours:

    step_of(series, default)        the history's step (median spacing of its buckets)
    covered(series, start, end, s)  the buckets [b, b + s) of the week holding a value, as seconds
    tasks_in(rate, start, end, s)   tasks in the week from a tasks-per-second series: a whole number
    cost(...)                       GPU-hours, energy and cost per 1,000 tasks over the covered hours
                                    (content.py passes the hours the tasks were counted in)

Tasks completed, not started: a task type's count is its completions (the history's
`task_completions:<type>`, the application's task-duration histogram's count) where the history
has them; only where it has none is it the tasks started, and the digest says "started" there
(in an overload many started tasks never complete: 444 started, 270 completed). One count of
tasks: `tasks_in` rounds each task type's count to a whole number once, and every table and figure
(the task table, the cost table, the per-task costs, the JSON) uses those numbers and their sum.
No cost per task is given from fewer than `MIN_TASKS_FOR_COST` tasks: a handful of tasks over a
few minutes says nothing about what a task costs (the digest says "too few tasks").
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Iterable, Optional
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

WEEK = 7 * 86400.0
HOUR = 3600.0
MIN_TASKS_FOR_COST = 100  # tasks counted in the covered hours below which no cost per task is given
TOO_FEW_TASKS = "too few tasks"


def window(s: pd.Series, start: float, end: float) -> pd.Series:
    """The part of `s` (indexed by Unix seconds) in [start, end)."""
    idx = s.index.to_numpy(dtype=float)
    return s[(idx >= start) & (idx < end)]


_in = window


def fmt_time(ts: Optional[float], tz: str, with_date: bool = True) -> Optional[str]:
    """'Tue 2026-11-24 10:00 UTC', or 'Tuesday 10:00 UTC' without the date."""
    if ts is None or not math.isfinite(ts):
        return None
    d = datetime.fromtimestamp(ts, tz=timezone.utc).astimezone(ZoneInfo(tz))
    text = d.strftime("%a %Y-%m-%d %H:%M" if with_date else "%A %H:%M")
    return f"{text} {d.tzname()}"


def step_of(series: Iterable[Optional[pd.Series]], default: float) -> float:
    """The spacing of the history's buckets: the smallest median spacing among the series with at
    least two points, else `default` (the step the history was read at)."""
    steps = []
    for s in series:
        if s is not None and len(s) > 1:
            d = np.diff(s.index.to_numpy(dtype=float))
            d = d[d > 0]
            if len(d):
                steps.append(float(np.median(d)))
    return min(steps) if steps else float(default)


def covered(series: Iterable[Optional[pd.Series]], start: float, end: float, step: float) -> dict:
    """The part of [start, end) the history covers: buckets of `step` seconds in which any of
    `series` has a value. {"seconds", "hours", "first", "last_end", "share", "buckets"}; first /
    last_end None when nothing is covered."""
    buckets: set[float] = set()
    for s in series:
        if s is None or s.empty:
            continue
        t = _in(s, start, end).index.to_numpy(dtype=float)
        buckets.update(np.floor(t / step) * step)
    seconds = len(buckets) * step
    return {"seconds": seconds, "hours": seconds / 3600.0,
            "first": min(buckets) if buckets else None,
            "last_end": (max(buckets) + step) if buckets else None,
            "share": seconds / (end - start) if end > start else 0.0, "buckets": buckets}


def tasks_in(rate: pd.Series, start: float, end: float, step: float) -> int:
    """Tasks in [start, end) (started or completed, as the series is) from a tasks-per-second series
    whose values cover `step` seconds each: sum(rate) x step, rounded once to a whole number."""
    w = _in(rate, start, end)
    return int(round(float(w.sum()) * step))


def energy_kwh(power: Optional[pd.Series], start: float, end: float, step: float,
               buckets: Optional[set] = None) -> Optional[float]:
    """kWh of a watts series whose values cover `step` seconds each (None without one), over the
    buckets `covered` returned when given (the hours the tasks were counted in)."""
    if power is None:
        return None
    w = _in(power, start, end)
    if buckets is not None:
        w = w[np.isin(np.floor(w.index.to_numpy(dtype=float) / step) * step, sorted(buckets))]
    if w.empty:
        return None
    return float(w.sum()) * step / 3.6e6


def cost(*, replicas: int, gpus_per_replica: int, covered_hours: float, kwh: Optional[float],
         tasks: list[dict], prices, utilisation_mean: Optional[float]) -> dict:
    """The cost section of a pool over the covered hours. `tasks`: the pool's task rows with their
    whole `tasks` counts (`counted`: "completed", or "started" where completions are not measured)
    and, where known, tokens per task; their per-task private cost is set here (shared out by
    tokens), or left None below the minimum."""
    total = sum(int(t["tasks"]) for t in tasks)
    gpu_hours = replicas * gpus_per_replica * covered_hours
    gpu_cost = gpu_hours * prices.gpu_hour
    energy_cost = kwh * prices.energy_kwh if kwh is not None else None
    private = gpu_cost + (energy_cost or 0.0)
    priced = [t for t in tasks if t.get("input_tokens_per_task") is not None]
    tokens_total = sum((t["input_tokens_per_task"] + t["output_tokens_per_task"]) * t["tasks"] for t in priced)
    api_total = sum(t["api_cost_per_1000"] / 1000.0 * t["tasks"] for t in priced)
    enough = total >= MIN_TASKS_FOR_COST
    out = {"currency": prices.currency, "covered_hours": covered_hours, "gpu_hours": gpu_hours,
           "gpu_cost": gpu_cost, "energy_kwh": kwh, "energy_cost": energy_cost, "private_cost": private,
           "utilisation_mean": utilisation_mean, "tasks": total, "counted": counted_as(tasks),
           "min_tasks": MIN_TASKS_FOR_COST, "per_task_note": None if enough else TOO_FEW_TASKS,
           "private_per_1000": (private / total * 1000.0) if enough else None,
           "api_name": prices.api.name, "api_cost": api_total if tokens_total > 0 else None,
           "api_per_1000": (api_total / total * 1000.0) if (enough and tokens_total > 0) else None}
    out["private_over_api"] = (out["private_per_1000"] / out["api_per_1000"]) \
        if out["private_per_1000"] and out["api_per_1000"] else None
    for t in tasks:
        t["private_cost_per_1000"] = None
        if enough and tokens_total > 0 and t.get("input_tokens_per_task") is not None and t["tasks"] > 0:
            share = (t["input_tokens_per_task"] + t["output_tokens_per_task"]) * t["tasks"] / tokens_total
            t["private_cost_per_1000"] = private * share / t["tasks"] * 1000.0
    return out



def counted_as(tasks: list[dict]) -> str:
    """What a set of task rows counts: "completed", "started", or "completed and started" (some
    task types without completions in the history); "completed" for none."""
    kinds = {t["counted"] for t in tasks}
    if len(kinds) > 1:
        return "completed and started"
    return kinds.pop() if kinds else "completed"
