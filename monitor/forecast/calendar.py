"""Working and non-working days, and forecasting a holiday as the non-working day it is (pure).

An office fleet's load follows the working week. A model that learned the week forecasts a
public holiday on a Tuesday as a Tuesday; `as_non_working` replaces the forecast of every point
that falls on a holiday (a non-working date that is not already a weekend day) with the same time
of day on the most recent non-working days of the history, so the backtest scores the holiday as
the day it is and the live forecast does not predict a working-day peak on it.

A `Calendar` is data: its dates, its recurring dates (month, day), the weekend, and optionally a
country's (and subdivision's) public holidays from the `holidays` library, read on use.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from monitor.forecast.models import Forecast
from monitor.forecast.series import Prepared

PROFILE_DAYS = 2  # the most recent non-working days whose time-of-day values form the profile


@dataclass(frozen=True)
class Calendar:
    timezone: str = "UTC"
    dates: frozenset = field(default_factory=frozenset)  # datetime.date
    recurring: frozenset = field(default_factory=frozenset)  # (month, day)
    country: Optional[str] = None
    subdivision: Optional[str] = None
    weekend: frozenset = frozenset({5, 6})  # Monday = 0

    def holiday(self, d: dt.date) -> bool:
        """A non-working date that is not a weekend day."""
        if d.weekday() in self.weekend:
            return False
        if d in self.dates or (d.month, d.day) in self.recurring:
            return True
        return self.country is not None and d in public_holidays(self.country, self.subdivision, d.year)

    def non_working(self, d: dt.date) -> bool:
        return d.weekday() in self.weekend or self.holiday(d)


@lru_cache(maxsize=64)
def public_holidays(country: str, subdivision: Optional[str], year: int) -> frozenset:
    import holidays  # noqa: PLC0415 - only when a country is configured
    return frozenset(holidays.country_holidays(country, subdiv=subdivision, years=year))


def _local(times: np.ndarray, tz: str) -> pd.DatetimeIndex:
    return pd.to_datetime(times, unit="s", utc=True).tz_convert(ZoneInfo(tz))


def as_non_working(prep: Prepared, fc: Forecast, cal: Calendar) -> Forecast:
    """`fc` (forecasting the points after `prep`) with every holiday point replaced by the mean of
    the same time of day on the last PROFILE_DAYS non-working days of `prep`; bands move with the
    mean (their width is kept). Unchanged when no forecast point is on a holiday, or the history
    has no non-working day yet."""
    h = len(fc.mean)
    times = prep.end + prep.step * np.arange(1, h + 1)
    local = _local(times, cal.timezone)
    dates = local.date
    hit = np.array([cal.holiday(d) for d in dates])
    if not hit.any():
        return fc
    per_day = prep.per_day
    hist = _local(prep.times(), cal.timezone)
    slot_of = lambda idx: ((idx.hour * 3600 + idx.minute * 60 + idx.second) // prep.step).astype(int) % per_day  # noqa: E731
    hist_dates = hist.date
    off = [d for d in sorted(set(hist_dates)) if cal.non_working(d)][-PROFILE_DAYS:]
    if not off:
        return fc
    sums, counts = np.zeros(per_day), np.zeros(per_day)
    use = np.isin(hist_dates, off) & prep.observed
    np.add.at(sums, slot_of(hist)[use], prep.values[use])
    np.add.at(counts, slot_of(hist)[use], 1)
    profile = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    new = profile[slot_of(local)]
    take = hit & np.isfinite(new)
    if not take.any():
        return fc
    mean = fc.mean.copy()
    shift = np.where(take, new - mean, 0.0)
    mean = mean + shift
    bands = {lv: (np.maximum(lo + shift, 0.0), np.maximum(hi + shift, 0.0)) for lv, (lo, hi) in fc.bands.items()}
    return Forecast(mean, bands, fc.model)
