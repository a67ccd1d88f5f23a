"""The digest's "when to run deferrable work this week" (pure): next week's forecast through the
spare-capacity core (monitor/capacity/spare.py).

    blocks = spare_week(next_week_forecast, knee_requests, margin, origin, tz)

Each hour of next week's forecast (the point at t stands for [t, t + step)) leaves
floor(knee x (1 - margin) - its upper band) requests for deferrable work. A block is a run of hours
in which at least a quarter of that ceiling fits, at least `MIN_HOURS` long; it says the fewest
requests that fit through it (what a batch can count on) and its request-hours. The `TOP` blocks
with the most request-hours are listed in time order.
"""
from __future__ import annotations

import math
from typing import Optional

from monitor.capacity.spare import SpareInputs, ceiling_of, pool_spare, runs
from monitor.digest.coverage import HOUR, fmt_time

SHARE = 0.25  # a block holds at least this share of the ceiling throughout
MIN_HOURS = 2.0
TOP = 7


def spare_week(fc: dict, knee: Optional[float], margin: float, origin: float, tz: str,
               level: float = 0.95) -> dict:
    ceiling = ceiling_of(knee, margin)
    if not fc.get("defined"):
        return {"defined": False, "reason": f"no forecast: {fc.get('reason', 'no load history')}"}
    if ceiling is None:
        return {"defined": False, "reason": "the knee is not known"}
    times = [float(t) for t in fc["_times"]]
    inp = SpareInputs(knee_requests=knee, margin=margin, timestamps=times,
                      upper=[float(u) for u in fc["_bands"][level][1]], fit_timestamp=origin,
                      max_age=math.inf, budget_horizon=HOUR)
    spare = pool_spare(inp, origin)
    least = max(1.0, math.floor(ceiling * SHARE))
    held = [(w.start, w.end, w.requests) for w in runs(spare.windows, least)
            if w.end - w.start >= MIN_HOURS * HOUR - 1e-6]
    best = sorted(sorted(held, key=lambda r: -(r[2] * (r[1] - r[0])))[:TOP])
    blocks = [{"start": s, "end": e, "from": fmt_time(s, tz), "to": fmt_time(e, tz), "requests": n,
               "hours": (e - s) / HOUR, "request_hours": n * (e - s) / HOUR} for s, e, n in best]
    return {"defined": True, "ceiling": ceiling, "least_requests": least, "level": level, "blocks": blocks}
