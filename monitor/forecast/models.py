"""Forecast models behind one small interface (pure: no I/O, no clocks).

    model = MODELS["ets"]                      # a Model: name, min_history(prep), fit(prep)
    fitted = model.fit(prepared)               # raises TooShort / FitError, never returns junk
    fc = fitted.forecast(h)                    # Forecast: mean, bands {0.8: (lo, hi), 0.95: ...}

Models: seasonal naive (one day, one week) as baselines; Holt-Winters with a multiplicative daily
season and damped trend (statsmodels ExponentialSmoothing, initial states optimised, at most the last
week), also fitted on hourly and 30-minute means (`ets_1h`, `ets_30m`) and averaged with the weekly
naive (`ets_week`, a combination: see `Combination`); MSTL with daily
and weekly seasons (each period kept only when the history holds more than two full periods, because
statsmodels' MSTL silently drops a period of half the series length or more); SARIMAX on hourly
aggregates (seasonal MA at 24 h) for sub-hourly series.

Native intervals here are model-based; `monitor.forecast.backtest` replaces them with bands
calibrated on rolling-origin backtest residuals when enough are available.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from monitor.forecast.series import Prepared

LEVELS = (0.8, 0.95)
Z = {0.8: 1.2815515655446004, 0.95: 1.959963984540054}


class TooShort(ValueError):
    """History shorter than the model's minimum; the message says how much is needed."""


class FitError(RuntimeError):
    """The model could not be fitted on this series."""


@dataclass
class Forecast:
    mean: np.ndarray
    bands: dict[float, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    model: str = ""

    def lower(self, level: float) -> np.ndarray:
        return self.bands[level][0]

    def upper(self, level: float) -> np.ndarray:
        return self.bands[level][1]


def _clip_bands(mean: np.ndarray, bands: dict) -> dict:
    out = {}
    for level, (lo, hi) in bands.items():
        lo = np.minimum(np.maximum(lo, 0.0), mean)
        hi = np.maximum(hi, mean)
        out[level] = (lo, hi)
    return out


def _normal_bands(mean: np.ndarray, sigma: np.ndarray) -> dict:
    return _clip_bands(mean, {lv: (mean - Z[lv] * sigma, mean + Z[lv] * sigma) for lv in LEVELS})


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")
    return ctx


class Model:
    name = "model"

    def min_history(self, prep: Prepared) -> int:  # points
        raise NotImplementedError

    def check(self, prep: Prepared) -> None:
        need = self.min_history(prep)
        if prep.n < need:
            raise TooShort(f"{self.name} needs at least {need} points "
                           f"({need * prep.step / 3600:.1f} h), history has {prep.n}")

    def fit(self, prep: Prepared) -> "Fitted":
        raise NotImplementedError


class Fitted:
    model_name = "model"

    def forecast(self, h: int) -> Forecast:
        raise NotImplementedError


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


# --- Holt-Winters / ETS -------------------------------------------------------------------------

class HoltWinters(Model):
    """Damped additive trend, multiplicative daily season (additive when the series touches zero)."""

    def __init__(self, seasonal: str = "mul", damped: bool = True, init: str = "estimated",
                 max_days: float | None = 7.0):
        self.seasonal, self.damped, self.init = seasonal, damped, init
        # fit on the last week at most: the optimiser estimates every initial seasonal state, and its
        # cost grows with the history; one daily season needs no more than a week, and the weekly
        # pattern comes from `ets_week` (ETS cannot learn a weekly season from a week or two anyway)
        self.max_days = max_days
        self.name = "ets"

    def min_history(self, prep: Prepared) -> int:
        return 2 * prep.per_day + max(10, prep.per_day // 4)

    def fit(self, prep: Prepared) -> Fitted:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing
        self.check(prep)
        if self.max_days is not None and prep.n > self.max_days * prep.per_day:
            prep = prep.slice(prep.n - int(round(self.max_days * prep.per_day)), prep.n)
        y = prep.values.astype(float)
        m = prep.per_day
        seasonal = self.seasonal
        if np.ptp(y) == 0:
            return _ConstantFit(self.name, float(y[-1]))
        if seasonal == "mul" and np.min(y) <= 0:
            seasonal = "add"
        ctx = _quiet()
        try:
            res = ExponentialSmoothing(y, trend="add", damped_trend=self.damped, seasonal=seasonal,
                                       seasonal_periods=m, initialization_method=self.init).fit()
        except (ValueError, np.linalg.LinAlgError) as exc:
            raise FitError(f"ets: {exc}") from exc
        finally:
            ctx.__exit__(None, None, None)
        fitted = np.asarray(res.fittedvalues)
        if not np.all(np.isfinite(fitted)):
            raise FitError("ets: non-finite fitted values")
        ok = prep.observed
        if seasonal == "mul":
            rel = (y[ok] - fitted[ok]) / np.maximum(fitted[ok], 1e-12)
            sigma_rel = float(np.std(rel))
        else:
            sigma_rel = None
        sigma_abs = float(np.std((y - fitted)[ok]))
        return _ETSFit(self.name, res, float(res.params.get("smoothing_level", 0.5)), sigma_rel,
                       sigma_abs)


class _ETSFit(Fitted):
    def __init__(self, name, res, alpha, sigma_rel, sigma_abs):
        self.model_name, self.res, self.alpha = name, res, alpha
        self.sigma_rel, self.sigma_abs = sigma_rel, sigma_abs

    def forecast(self, h: int) -> Forecast:
        mean = np.maximum(np.asarray(self.res.forecast(h), dtype=float), 0.0)
        growth = np.sqrt(1.0 + self.alpha ** 2 * np.arange(h))  # ETS(A,N,N) variance growth
        sigma = (self.sigma_rel * mean if self.sigma_rel is not None else self.sigma_abs) * growth
        return Forecast(mean, _normal_bands(mean, sigma), self.model_name)


class _ConstantFit(Fitted):
    def __init__(self, name, value):
        self.model_name, self.value = name, value

    def forecast(self, h: int) -> Forecast:
        mean = np.full(h, self.value)
        return Forecast(mean, {lv: (mean.copy(), mean.copy()) for lv in LEVELS}, self.model_name)


# --- Holt-Winters on 30-minute means ------------------------------------------------------------

def _interp_blocks(block_means: np.ndarray, last_block: float, k: int, h: int) -> np.ndarray:
    """Spread block-mean forecasts back to points: block centres at (j + 0.5) k after the end."""
    xs = np.concatenate([[-0.5 * k], (np.arange(len(block_means)) + 0.5) * k])
    ys = np.concatenate([[last_block], block_means])
    return np.interp(np.arange(1, h + 1) - 0.5, xs, ys)


class AggregatedHoltWinters(Model):
    """The `ets` model fitted on 30-minute means (less noise in the seasonal states of a noisy
    series), spread back to the native step by interpolation."""

    name = "ets_30m"
    block_seconds = 1800.0

    def _k(self, prep: Prepared) -> int:
        k = max(1, int(round(self.block_seconds / prep.step)))
        while k > 1 and prep.per_day % k:
            k -= 1
        return k

    def min_history(self, prep: Prepared) -> int:
        return 2 * prep.per_day + max(10, prep.per_day // 4)

    def fit(self, prep: Prepared) -> Fitted:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing
        self.check(prep)
        k = self._k(prep)
        y = prep.values.astype(float)
        usable = (len(y) // k) * k
        blocks = y[len(y) - usable:].reshape(-1, k)
        means = blocks.mean(axis=1)
        if np.ptp(means) == 0:
            return _ConstantFit(self.name, float(y[-1]))
        seasonal = "mul" if np.min(means) > 0 else "add"
        ctx = _quiet()
        try:
            res = ExponentialSmoothing(means, trend="add", damped_trend=True, seasonal=seasonal,
                                       seasonal_periods=prep.per_day // k,
                                       initialization_method="estimated").fit()
        except (ValueError, np.linalg.LinAlgError) as exc:
            raise FitError(f"{self.name}: {exc}") from exc
        finally:
            ctx.__exit__(None, None, None)
        fitted = np.asarray(res.fittedvalues)
        if not np.all(np.isfinite(fitted)):
            raise FitError(f"{self.name}: non-finite fitted values")
        sigma = float(np.sqrt(np.var(means - fitted) + (np.mean(blocks.var(axis=1)) if k > 1 else 0)))
        return _AggFit(self.name, res, k, float(means[-1]), sigma,
                       float(res.params.get("smoothing_level", 0.5)))


class _AggFit(Fitted):
    def __init__(self, name, res, k, last_block, sigma, alpha):
        self.model_name, self.res, self.k, self.last_block = name, res, k, last_block
        self.sigma, self.alpha = sigma, alpha

    def forecast(self, h: int) -> Forecast:
        nb = int(math.ceil(h / self.k)) + 1
        bm = np.asarray(self.res.forecast(nb), dtype=float)
        mean = np.maximum(_interp_blocks(bm, self.last_block, self.k, h), 0.0)
        sigma = self.sigma * np.sqrt(1.0 + self.alpha ** 2 * np.arange(h) / self.k)
        return Forecast(mean, _normal_bands(mean, sigma), self.model_name)


class HourlyHoltWinters(AggregatedHoltWinters):
    """The same on hourly means: a 24-state daily season, cheaper to fit than the 30-minute one,
    and hourly means carry less of a spiky sub-hourly series' noise into the seasonal states."""

    name = "ets_1h"
    block_seconds = 3600.0


# --- MSTL ---------------------------------------------------------------------------------------

def mstl_periods(prep: Prepared) -> list[int]:
    """Daily and weekly periods that the history can support (more than two full periods each)."""
    return [p for p in (prep.per_day, prep.per_week) if p >= 2 and prep.n > 2 * p]


class MSTLModel(Model):
    """MSTL seasonals (repeated from their last cycle) + damped-trend ETS on the adjusted series."""

    name = "mstl"

    def min_history(self, prep: Prepared) -> int:
        return 2 * prep.per_day + 1

    def fit(self, prep: Prepared) -> Fitted:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing
        from statsmodels.tsa.seasonal import MSTL
        self.check(prep)
        periods = mstl_periods(prep)
        if not periods:
            raise TooShort("mstl: no seasonal period fits in the history")
        y = prep.values.astype(float)
        if np.ptp(y) == 0:
            return _ConstantFit(self.name, float(y[-1]))
        ctx = _quiet()
        try:
            dec = MSTL(y, periods=periods).fit()
            seas = np.asarray(dec.seasonal)
            seas = seas.reshape(len(y), -1)
            adjusted = y - seas.sum(axis=1)
            res = ExponentialSmoothing(adjusted, trend="add", damped_trend=True,
                                       initialization_method="estimated").fit()
        except (ValueError, np.linalg.LinAlgError) as exc:
            raise FitError(f"mstl: {exc}") from exc
        finally:
            ctx.__exit__(None, None, None)
        resid = (adjusted - np.asarray(res.fittedvalues))[prep.observed]
        return _MSTLFit(self.name, res, seas, periods, float(np.std(resid)),
                        float(res.params.get("smoothing_level", 0.5)))


class _MSTLFit(Fitted):
    def __init__(self, name, res, seas, periods, sigma, alpha):
        self.model_name, self.res, self.seas, self.periods = name, res, seas, periods
        self.sigma, self.alpha = sigma, alpha

    def forecast(self, h: int) -> Forecast:
        base = np.asarray(self.res.forecast(h), dtype=float)
        n = self.seas.shape[0]
        for j, p in enumerate(self.periods):
            last = self.seas[n - p:, j]
            base = base + last[np.arange(h) % p]
        mean = np.maximum(base, 0.0)
        sigma = self.sigma * np.sqrt(1.0 + self.alpha ** 2 * np.arange(h))
        return Forecast(mean, _normal_bands(mean, sigma), self.model_name)


# --- SARIMAX on hourly aggregates ---------------------------------------------------------------

class HourlySARIMAX(Model):
    """SARIMA(2,0,1)(0,1,0)[24] on hourly means, spread back to the native step by interpolation.

    The seasonal difference is taken before estimation (a seasonal MA term made the state-space fit
    10-20x slower for no gain on the traces), then integrated back when forecasting.
    """

    name = "sarimax"
    season = 24

    def _agg(self, prep: Prepared) -> int:
        return max(1, int(round(3600.0 / prep.step)))

    def min_history(self, prep: Prepared) -> int:
        return 3 * 24 * self._agg(prep)

    def fit(self, prep: Prepared) -> Fitted:
        from statsmodels.tsa.statespace.sarimax import SARIMAX
        self.check(prep)
        k = self._agg(prep)
        y = prep.values.astype(float)
        usable = (len(y) // k) * k
        blocks = y[len(y) - usable:].reshape(-1, k)  # hours end at the last point
        hourly = blocks.mean(axis=1)[-21 * 24:]
        within_var = float(np.mean(blocks.var(axis=1))) if k > 1 else 0.0
        if np.ptp(hourly) == 0:
            return _ConstantFit(self.name, float(y[-1]))
        s = self.season
        z = hourly[s:] - hourly[:-s]
        scale = float(np.mean(np.abs(hourly))) or 1.0
        ctx = _quiet()
        try:
            res = SARIMAX(z / scale, order=(2, 0, 1), trend="n").fit(disp=False, maxiter=80)
        except (ValueError, np.linalg.LinAlgError) as exc:
            raise FitError(f"sarimax: {exc}") from exc
        finally:
            ctx.__exit__(None, None, None)
        return _SARIMAXFit(self.name, res, scale, k, hourly, s, within_var)


class _SARIMAXFit(Fitted):
    def __init__(self, name, res, scale, k, hourly, season, within_var):
        self.model_name, self.res, self.scale, self.k = name, res, scale, k
        self.hourly, self.season, self.within_var = hourly, season, within_var

    def forecast(self, h: int) -> Forecast:
        s = self.season
        hours = int(math.ceil(h / self.k)) + 1
        pred = self.res.get_forecast(hours)
        zm = np.asarray(pred.predicted_mean) * self.scale
        zvar = np.asarray(pred.var_pred_mean) * self.scale ** 2
        hist = list(self.hourly)
        hvar = np.zeros(hours)
        for j in range(hours):
            hist.append(hist[-s] + zm[j])
            hvar[j] = zvar[j] + (hvar[j - s] if j >= s else 0.0)
        hm = np.asarray(hist[len(self.hourly):])
        # hour centres at (j + 0.5) * k points after the last observed hour end
        xs = np.concatenate([[-0.5 * self.k], (np.arange(hours) + 0.5) * self.k])
        ys = np.concatenate([[self.hourly[-1]], hm])
        t = np.arange(1, h + 1) - 0.5
        mean = np.maximum(np.interp(t, xs, ys), 0.0)
        # hourly variance is for hourly means; add the spread of points around their hour's mean
        sigma = np.sqrt(np.interp(t, xs[1:], hvar) + self.within_var)
        return Forecast(mean, _normal_bands(mean, sigma), self.model_name)


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
# cheaper and was as good) and `mstl` (never selected on the benchmark traces, ~1 s per refit), so
# the whole refit, selection included, stays under 5 s of CPU on one core
DEFAULT_MODELS = ("ets_week", "ets", "ets_1h", "sarimax", "snaive_week_level", "snaive_week", "snaive_day")


def get_model(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown forecast model {name!r}; known: {', '.join(MODELS)}") from None
