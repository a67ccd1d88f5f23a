"""Backtest scores and band calibration (pure): MASE / sMAPE / coverage of forecasts against what
happened, pooled over rolling-origin folds, and split-conformal style bands from their residuals.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from monitor.forecast.model_base import LEVELS, Forecast
from monitor.forecast.series import Prepared

# --- scores -------------------------------------------------------------------------------------

def mase_scale(prep: Prepared) -> float:
    """In-sample MAE of the one-day seasonal naive (over pairs where both points were observed);
    the one-step naive when the history is shorter than two days. NaN when it is zero."""
    m = prep.per_day if prep.n > 2 * prep.per_day else 1
    y, ok = prep.values, prep.observed
    if prep.n <= m:
        return math.nan
    pair = ok[m:] & ok[:-m]
    if not pair.any():
        return math.nan
    scale = float(np.mean(np.abs(y[m:] - y[:-m])[pair]))
    tiny = 1e-9 * float(np.mean(np.abs(y[ok]))) if ok.any() else 0.0
    return scale if scale > tiny else math.nan  # exactly periodic (up to rounding): undefined


def score(actual: np.ndarray, fc: Forecast, observed: np.ndarray, scale: float) -> dict:
    """MASE, sMAPE (percent), 80%/95% coverage, 95% band width over the mean actual."""
    ok = observed & np.isfinite(actual)
    if not ok.any():
        return {"mase": None, "smape": None, "coverage80": None, "coverage95": None,
                "width95_ratio": None, "points": 0}
    a, f = actual[ok], fc.mean[ok]
    err = np.abs(f - a)
    denom = np.abs(f) + np.abs(a)
    smape = float(np.mean(np.where(denom > 0, 2 * err / np.where(denom > 0, denom, 1), 0.0)) * 100)
    out = {"mase": float(np.mean(err) / scale) if scale and math.isfinite(scale) else None,
           "smape": smape, "points": int(ok.sum())}
    for lv in LEVELS:
        lo, hi = fc.bands[lv]
        out[f"coverage{int(lv * 100)}"] = float(np.mean((a >= lo[ok]) & (a <= hi[ok])))
    lo, hi = fc.bands[0.95]
    mean_a = float(np.mean(a))
    out["width95_ratio"] = float(np.mean(hi[ok] - lo[ok]) / mean_a) if mean_a > 0 else None
    return out


@dataclass
class Fold:
    origin: int  # index of the first forecast point
    forecast: Forecast
    actual: np.ndarray
    observed: np.ndarray


def pooled_score(folds: list[Fold], scale: float) -> dict:
    if not folds:
        return {}
    actual = np.concatenate([f.actual for f in folds])
    observed = np.concatenate([f.observed for f in folds])
    mean = np.concatenate([f.forecast.mean for f in folds])
    bands = {lv: (np.concatenate([f.forecast.bands[lv][0] for f in folds]),
                  np.concatenate([f.forecast.bands[lv][1] for f in folds])) for lv in LEVELS}
    out = score(actual, Forecast(mean, bands), observed, scale)
    out["folds"] = len(folds)
    return out


# --- calibration --------------------------------------------------------------------------------

@dataclass
class Calibration:
    kind: str  # "ratio" (a / f), "sqrt" ((a - f) / sqrt(f)) or "diff" (a - f)
    quantiles: dict[float, tuple[float, float]]  # level -> (lower, upper) of the scaled residual
    points: int


CALIBRATION_KINDS = ("sqrt", "ratio", "diff")


def _scale(mean: np.ndarray, kind: str) -> np.ndarray:
    if kind == "ratio":
        return mean
    if kind == "sqrt":
        return np.sqrt(mean)
    return np.ones_like(mean)


def calibrate(folds: list[Fold], min_points: int = 24, kind: str = "sqrt") -> Optional[Calibration]:
    """Empirical quantiles of backtest residuals, scaled so they transfer across levels:
    `sqrt` divides a - f by sqrt(f) (variance proportional to the level, as for counts), `ratio`
    divides by f, `diff` does not scale. Falls back to `diff` when a forecast is not positive."""
    if kind not in CALIBRATION_KINDS:
        raise ValueError(f"calibration kind must be one of {CALIBRATION_KINDS}, got {kind!r}")
    actual = np.concatenate([f.actual for f in folds]) if folds else np.array([])
    mean = np.concatenate([f.forecast.mean for f in folds]) if folds else np.array([])
    ok = np.concatenate([f.observed for f in folds]) if folds else np.array([], bool)
    if ok.sum() < min_points:
        return None
    a, f = actual[ok], mean[ok]
    n = len(a)
    if not np.all(f > 0):
        kind = "diff"
    r = (a / f) if kind == "ratio" else (a - f) / _scale(f, kind)
    qs = {}
    for lv in LEVELS:
        # split-conformal finite-sample correction on each tail
        lo_p = max(0.0, math.floor((n + 1) * (1 - lv) / 2) / n)
        hi_p = min(1.0, math.ceil((n + 1) * (1 - (1 - lv) / 2)) / n)
        qs[lv] = (float(np.quantile(r, lo_p)), float(np.quantile(r, hi_p)))
    return Calibration(kind, qs, n)


def apply_calibration(fc: Forecast, cal: Calibration) -> Forecast:
    bands = {}
    m = np.maximum(fc.mean, 0.0)
    for lv in LEVELS:
        qlo, qhi = cal.quantiles[lv]
        if cal.kind == "ratio":
            lo, hi = m * qlo, m * qhi
        else:
            sc = _scale(m, cal.kind)
            lo, hi = m + qlo * sc, m + qhi * sc
        bands[lv] = (np.minimum(np.maximum(lo, 0.0), fc.mean), np.maximum(hi, fc.mean))
    return Forecast(fc.mean, bands, fc.model)
