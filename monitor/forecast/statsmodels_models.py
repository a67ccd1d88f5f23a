"""The statsmodels-based forecast models (pure; statsmodels is imported on first fit).

Holt-Winters with a multiplicative daily season and damped trend (`ets`, at most the last week), the
same on hourly and 30-minute means (`ets_1h`, `ets_30m`), MSTL with daily and weekly seasons
on hourly means (`mstl`; each period kept only when the history holds more than two full periods,
because statsmodels' MSTL silently drops a period of half the series length or more), and SARIMAX
on hourly aggregates (`sarimax`). Native bands are model-based; monitor/forecast/rolling_origin.py replaces them
with bands calibrated on backtest residuals.
"""
from __future__ import annotations

import math

import numpy as np

from monitor.forecast.model_base import FitError, Fitted, Forecast, Model, TooShort, _ConstantFit, _normal_bands, _quiet
from monitor.forecast.series import Prepared

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
        from statsmodels.tsa.holtwinters import ExponentialSmoothing  # noqa: PLC0415
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
        return block_length(prep, self.block_seconds)

    def min_history(self, prep: Prepared) -> int:
        return 2 * prep.per_day + max(10, prep.per_day // 4)

    def fit(self, prep: Prepared) -> Fitted:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing  # noqa: PLC0415
        self.check(prep)
        k = self._k(prep)
        agg, within = block_means(prep, k)
        means = agg.values.astype(float)
        if np.ptp(means) == 0:
            return _ConstantFit(self.name, float(prep.values[-1]))
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
        sigma = float(np.sqrt(np.var(means - fitted) + (np.mean(within) if k > 1 else 0)))
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


def block_length(prep: Prepared, seconds: float) -> int:
    """Points per block of about `seconds` that tile a day exactly (1: no aggregation)."""
    k = max(1, int(round(seconds / prep.step)))
    while k > 1 and prep.per_day % k:
        k -= 1
    return k


def block_means(prep: Prepared, k: int) -> tuple[Prepared, np.ndarray]:
    """Means of consecutive `k`-point blocks ending at the last point (a leading remainder is
    dropped), as a series at k times the step (a block is observed when any of its points was),
    and each block's variance around its mean."""
    a = prep.n - (prep.n // k) * k
    blocks = prep.values[a:].reshape(-1, k)
    observed = np.asarray(prep.observed[a:].reshape(-1, k).any(axis=1))
    return Prepared(prep.start + a * prep.step, prep.step * k, blocks.mean(axis=1), observed), blocks.var(axis=1)


class MSTLModel(Model):
    """MSTL seasonals (repeated from their last cycle) + damped-trend ETS on the adjusted series,
    on hourly means for a sub-hourly series (spread back to the native step by interpolation): a
    weekly period of 2016 five-minute points made each fit take 13-15 s for detail the hourly
    seasonals carry as well (hourly and coarser series are fitted as they are)."""

    name = "mstl"
    block_seconds = 3600.0

    def _k(self, prep: Prepared) -> int:
        return block_length(prep, self.block_seconds)

    def min_history(self, prep: Prepared) -> int:
        k = self._k(prep)
        return (2 * prep.per_day // k + 1) * k  # more than two days of blocks

    def fit(self, prep: Prepared) -> Fitted:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing  # noqa: PLC0415
        from statsmodels.tsa.seasonal import MSTL  # noqa: PLC0415
        self.check(prep)
        k = self._k(prep)
        agg, within = block_means(prep, k) if k > 1 else (prep, np.zeros(prep.n))
        periods = mstl_periods(agg)
        if not periods:
            raise TooShort("mstl: no seasonal period fits in the history")
        y = agg.values.astype(float)
        if np.ptp(y) == 0:
            return _ConstantFit(self.name, float(prep.values[-1]))
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
        resid = (adjusted - np.asarray(res.fittedvalues))[agg.observed]
        # block-mean residuals, plus the spread of points around their block's mean
        sigma = float(np.sqrt(np.var(resid) + float(np.mean(within[agg.observed]))))
        return _MSTLFit(self.name, res, seas, periods, sigma, float(res.params.get("smoothing_level", 0.5)),
                        k, float(y[-1]))


class _MSTLFit(Fitted):
    def __init__(self, name, res, seas, periods, sigma, alpha, k=1, last_block=0.0):
        self.model_name, self.res, self.seas, self.periods = name, res, seas, periods
        self.sigma, self.alpha, self.k, self.last_block = sigma, alpha, k, last_block

    def forecast(self, h: int) -> Forecast:
        nb = h if self.k == 1 else int(math.ceil(h / self.k)) + 1
        base = np.asarray(self.res.forecast(nb), dtype=float)
        n = self.seas.shape[0]
        for j, p in enumerate(self.periods):
            last = self.seas[n - p:, j]
            base = base + last[np.arange(nb) % p]
        if self.k > 1:
            base = _interp_blocks(base, self.last_block, self.k, h)
        mean = np.maximum(base, 0.0)
        sigma = self.sigma * np.sqrt(1.0 + self.alpha ** 2 * np.arange(h) / self.k)
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
        from statsmodels.tsa.statespace.sarimax import SARIMAX  # noqa: PLC0415
        self.check(prep)
        k = self._agg(prep)
        agg, within = block_means(prep, k)  # hours end at the last point
        hourly = agg.values.astype(float)[-21 * 24:]
        within_var = float(np.mean(within)) if k > 1 else 0.0
        if np.ptp(hourly) == 0:
            return _ConstantFit(self.name, float(prep.values[-1]))
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
