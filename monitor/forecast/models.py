"""Forecast models behind one small interface (pure: no I/O, no clocks): the registry.

    model = MODELS["ets"]                      # a Model: name, min_history(prep), fit(prep)
    fitted = model.fit(prepared)               # raises TooShort / FitError, never returns junk
    fc = fitted.forecast(h)                    # Forecast: mean, bands {0.8: (lo, hi), 0.95: ...}

Models: seasonal naive (one day, one week, one week on this week's level) as baselines
(monitor/forecast/naive.py); Holt-Winters with a multiplicative daily season and damped trend
(statsmodels ExponentialSmoothing, initial states optimised, at most the last week), also fitted on
hourly and 30-minute means (`ets_1h`, `ets_30m`); MSTL with daily and weekly seasons on hourly
means; SARIMAX on hourly aggregates (seasonal MA at 24 h) for sub-hourly series
(monitor/forecast/statsmodels_models.py);
and `ets_week`, Holt-Winters averaged with the weekly naive (a combination: see `Combination`, here).
The interface (`Model`, `Fitted`, `Forecast`, `TooShort`, `FitError`, `LEVELS`) lives in
monitor/forecast/model_base.py; every name stays importable from this module.

Native intervals here are model-based; `monitor.forecast.rolling_origin` replaces them with bands
calibrated on rolling-origin backtest residuals when enough are available.
"""
from __future__ import annotations

import numpy as np

from monitor.forecast.model_base import (  # noqa: F401
    LEVELS,
    FitError,
    Fitted,
    Forecast,
    Model,
    TooShort,
    Z,
    _clip_bands,
    _ConstantFit,
    _normal_bands,
    _quiet,
)
from monitor.forecast.naive import LevelWeeklyNaive, SeasonalNaive, _SNaiveFit  # noqa: F401
from monitor.forecast.series import Prepared
from monitor.forecast.statsmodels_models import (  # noqa: F401
    AggregatedHoltWinters,
    HoltWinters,
    HourlyHoltWinters,
    HourlySARIMAX,
    MSTLModel,
    mstl_periods,
)

# --- equal-weight combination -------------------------------------------------------------------

def combine(forecasts: list[Forecast], name: str) -> Forecast:
    """Equal-weight average of forecasts of the same length: the means, and each band edge (the
    backtest calibration replaces these bands when it has enough residuals)."""
    mean = np.mean([f.mean for f in forecasts], axis=0)
    bands = {lv: (np.mean([f.bands[lv][0] for f in forecasts], axis=0),
                  np.mean([f.bands[lv][1] for f in forecasts], axis=0)) for lv in LEVELS}
    return Forecast(mean, _clip_bands(mean, bands), name)


class Combination(Model):
    """The average of member models' forecasts. `ets_week` averages Holt-Winters (daily season,
    adaptive level) with the one-week seasonal naive, which carries the weekday pattern that one or
    two weeks of history cannot teach a fitted weekly season; it needs a week of history plus the
    naive's residual margin, so shorter series never see it."""

    def __init__(self, name: str, members: tuple[str, ...]):
        self.name, self.members = name, members

    def min_history(self, prep: Prepared) -> int:
        return max(MODELS[m].min_history(prep) for m in self.members)

    def fit(self, prep: Prepared) -> Fitted:
        self.check(prep)
        return _CombinationFit(self.name, [MODELS[m].fit(prep) for m in self.members])


class _CombinationFit(Fitted):
    def __init__(self, name, fits):
        self.model_name, self.fits = name, fits

    def forecast(self, h: int) -> Forecast:
        return combine([f.forecast(h) for f in self.fits], self.model_name)


MODELS: dict[str, Model] = {
    "snaive_day": SeasonalNaive("day"),
    "snaive_week": SeasonalNaive("week"),
    "snaive_week_level": LevelWeeklyNaive(),
    "ets": HoltWinters(),
    "ets_30m": AggregatedHoltWinters(),
    "ets_1h": HourlyHoltWinters(),
    "mstl": MSTLModel(),
    "sarimax": HourlySARIMAX(),
}
MODELS["ets_week"] = Combination("ets_week", ("ets", "snaive_week"))

# the order tried when the preferred model cannot be fitted (best first, baselines last)
FALLBACK_ORDER = ("ets_week", "ets", "ets_1h", "ets_30m", "mstl", "sarimax", "snaive_week_level", "snaive_week",
                  "snaive_day")
# the candidates a refit backtests by default: the fallback order without `ets_30m` (`ets_1h` is
# cheaper and was as good) and `mstl` (never selected on the benchmark traces when it was a
# candidate), so the whole refit, selection included, stays under 2 s of CPU on one core
DEFAULT_MODELS = ("ets_week", "ets", "ets_1h", "sarimax", "snaive_week_level", "snaive_week", "snaive_day")


def get_model(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown forecast model {name!r}; known: {', '.join(MODELS)}") from None
