"""A seeded office-agent load series for the forecast benchmark (issue 17): six weeks at 10 minutes.

Shape (concurrent requests of one pool; UTC; every number below is a parameter of `office_series`):
- working days: a morning ramp from 07:30 to a first peak at 10:30, a lunch dip (12:00-13:30, -25 %),
  an afternoon peak at 15:00, a decline to the evening floor by 19:00; the floor is 8 % of the peak;
- weekends (and the public holiday): 15 % of a working day's peak in the daytime, the floor at night;
- a nightly batch every day from 01:00 to 03:00 at 40 % of the peak (scheduled, calendar-blind);
- growth: +1 % per working day, compounding (about +5 % a week);
- a step change: a team onboarding on the first day of week 4 adds 20 % to the working-day level;
- one public holiday: the Tuesday of week 6 (it is scored);
- noise: multiplicative, lognormal with sigma 0.08 per point, seeded.
The series starts on Monday 2026-09-07 00:00 UTC; the holiday is 2026-10-13.
"""
from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd

START = dt.datetime(2026, 9, 7, tzinfo=dt.timezone.utc)  # a Monday
HOLIDAY = dt.date(2026, 10, 13)  # the Tuesday of week 6


def _working_shape(hour: np.ndarray) -> np.ndarray:
    """0..1 over a working day (hours as floats)."""
    ramp = np.clip((hour - 7.5) / 3.0, 0, 1)  # 07:30 -> 10:30
    decline = np.clip((19.0 - hour) / 3.0, 0, 1)  # 16:00 -> 19:00
    day = np.minimum(ramp, decline)
    afternoon = 1.0 + 0.1 * np.exp(-((hour - 15.0) ** 2) / 2.0)  # the afternoon peak is a little higher
    lunch = np.where((hour >= 12.0) & (hour < 13.5), 0.75, 1.0)
    return np.clip(day * afternoon * lunch / 1.1, 0, 1)


def office_series(seed: int = 7, weeks: int = 6, step_seconds: float = 600.0, peak: float = 120.0) -> pd.Series:
    n = int(weeks * 7 * 86400 / step_seconds)
    t = START.timestamp() + step_seconds * np.arange(n)
    when = pd.to_datetime(t, unit="s", utc=True)
    hour = (when.hour + when.minute / 60.0).to_numpy(float)
    dates = when.date
    weekday = when.day_of_week.to_numpy()
    off = (weekday >= 5) | (dates == HOLIDAY)
    working_days = np.cumsum(np.r_[0, (~off[1:]) & (hour[1:] == 0)]) if n else np.zeros(0)
    level = peak * 1.01 ** working_days
    level = np.where(when >= START + dt.timedelta(weeks=3), level * 1.2, level)
    floor = 0.08
    shape = np.where(off, 0.15 * np.minimum(np.clip((hour - 8) / 2, 0, 1), np.clip((18 - hour) / 2, 0, 1)),
                     _working_shape(hour))
    y = level * np.maximum(shape, floor)
    batch = (hour >= 1.0) & (hour < 3.0)
    y = np.where(batch, np.maximum(y, 0.4 * peak * 1.01 ** working_days), y)
    rng = np.random.default_rng(seed)
    y = y * rng.lognormal(0.0, 0.08, n)
    return pd.Series(y, index=t)
