"""Seasonal naive baselines (pure): the last day, the last week, and the last week on this week's level.

The backtest holds every selected model to the best of them on the same folds.
"""
from __future__ import annotations

import numpy as np

from monitor.forecast.model_base import LEVELS, Fitted, Forecast, Model, _clip_bands
from monitor.forecast.series import Prepared

# --- seasonal naive -----------------------------------------------------------------------------

class SeasonalNaive(Model):
    def __init__(self, period: str = "day"):
        if period not in ("day", "week"):
            raise ValueError(f"seasonal naive period must be day or week, got {period!r}")
        self.period = period
        self.name = f"snaive_{period}"

    def _m(self, prep: Prepared) -> int:
        return prep.per_day if self.period == "day" else prep.per_week

    def min_history(self, prep: Prepared) -> int:
        return self._m(prep) + max(2, prep.per_day // 4)  # one season + some residuals

    def fit(self, prep: Prepared) -> Fitted:
        self.check(prep)
        m = self._m(prep)
        y = prep.values
        resid = y[m:] - y[:-m]
        ok = prep.observed[m:] & prep.observed[:-m]
        resid = resid[ok] if ok.any() else resid
        return _SNaiveFit(self.name, y[-m:].copy(), m, resid)


class _SNaiveFit(Fitted):
    def __init__(self, name, last, m, resid):
        self.model_name, self.last, self.m, self.resid = name, last, m, resid

    def forecast(self, h: int) -> Forecast:
        k = np.arange(h)
        mean = self.last[k % self.m]
        seasons = (k // self.m + 1).astype(float)
        bands = {}
        for lv in LEVELS:
            lo_q, hi_q = np.quantile(self.resid, [(1 - lv) / 2, 1 - (1 - lv) / 2])
            bands[lv] = (mean + lo_q * np.sqrt(seasons), mean + hi_q * np.sqrt(seasons))
        return Forecast(mean, _clip_bands(mean, bands), self.model_name)


class LevelWeeklyNaive(SeasonalNaive):
    """Last week, scaled by the recent growth: the week before's shape on this week's level.

    growth g = (mean of the last `level_days` days) / (mean of the same days one week earlier),
    over the points observed in both, clipped to [0.5, 2]; the forecast for t is g x y(t - 1 week).
    The residuals (for the bands) are those of the same rule one week back. Needs two weeks.
    A growing office fleet is the case: the plain weekly naive forecasts last week's level."""

    level_days = 2
    name = "snaive_week_level"

    def __init__(self):
        self.period = "week"

    def min_history(self, prep: Prepared) -> int:
        return 2 * prep.per_week + max(2, prep.per_day // 4)

    def _growth(self, y: np.ndarray, ok: np.ndarray, end: int, m: int, d: int) -> float:
        now, before = slice(end - d, end), slice(end - d - m, end - m)
        both = ok[now] & ok[before]
        if not both.any():
            return 1.0
        a, b = float(np.mean(y[now][both])), float(np.mean(y[before][both]))
        return float(np.clip(a / b, 0.5, 2.0)) if b > 0 else 1.0

    def fit(self, prep: Prepared) -> Fitted:
        self.check(prep)
        m, d = prep.per_week, self.level_days * prep.per_day
        y, ok = prep.values, prep.observed
        g = self._growth(y, ok, len(y), m, d)
        g_back = self._growth(y, ok, len(y) - m, m, d)  # the same rule one week earlier
        resid = y[-m:] - g_back * y[-2 * m:-m]
        both = ok[-m:] & ok[-2 * m:-m]
        resid = resid[both] if both.any() else resid
        return _SNaiveFit(self.name, g * y[-m:], m, resid)
