"""The digest's forecasts (pure: no I/O, no clock): next week's hourly peaks from the history, how
last week's forecast (made before it) did against what happened, and the replica recommendation
from the forecast's upper bound. Used by monitor/digest/content.py.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from monitor.capacity.headroom import recommended_replicas
from monitor.digest.coverage import HOUR, WEEK, fmt_time
from monitor.digest.coverage import window as _window
from monitor.digest.settings import DigestSettings
from monitor.forecast.rolling_origin import ForecastSettings, forecast_series
from monitor.forecast.series import SeriesError, prepare


def hourly_max(s: pd.Series, step: float = HOUR) -> pd.Series:
    b = (np.floor(s.index.to_numpy() / step) * step)
    return s.groupby(b).max()


def forecast_week(history: pd.Series, origin: float, settings: DigestSettings, tz: str,
                  step: float = HOUR, agg: str = "max") -> dict:
    """Fit on `history` before `origin` (hourly peaks), forecast the 7 days from `origin`."""
    h = _window(history, -math.inf, origin)
    if h.empty:
        return {"defined": False, "reason": "no history before the forecast origin"}
    b = np.floor(h.index.to_numpy() / step) * step
    hourly = h.groupby(b).max() if agg == "max" else h.groupby(b).mean()
    try:
        prep = prepare(hourly, step)
    except SeriesError as exc:
        return {"defined": False, "reason": str(exc)}
    first = prep.end + step
    horizon = int(round((origin + WEEK - first) / step))
    if horizon < 1:
        return {"defined": False, "reason": "history reaches past the forecast week"}
    # backtest and calibrate on folds as long as the history allows (up to a week): a digest
    # forecasts a whole week, and folds of the last day alone (a weekend, for a Monday digest) would
    # calibrate the bands on quiet hours. Two folds, each leaving 7.5 days of training before it, so
    # the weekly seasonal naive can take part in the backtest.
    span = prep.n * step
    fold = min(WEEK, horizon * step, max(86400.0, (span - 7.5 * 86400.0) / 2))
    fold = math.floor(fold / step) * step
    res = forecast_series(prep, horizon, ForecastSettings(
        models=settings.forecast_models, folds=2, fold_horizon_seconds=fold,
        calibration_seconds=fold, max_folds=2))
    if not res.defined:
        return {"defined": False, "reason": res.reason}
    fc = res.forecast
    assert fc is not None  # a defined result has its forecast
    times = first + step * np.arange(horizon)
    keep = times >= origin - 1e-6
    times, mean = times[keep], fc.mean[keep]
    bands = {lv: (fc.lower(lv)[keep], fc.upper(lv)[keep]) for lv in (0.8, 0.95)}
    if len(times) == 0:
        return {"defined": False, "reason": "empty forecast"}
    i = int(np.argmax(mean))
    return {
        "defined": True, "model": res.model, "selected_by": res.selected_by,
        "calibrated": res.calibration is not None,
        "history_hours": int(prep.n), "origin": origin,
        "peak": float(mean[i]), "peak_timestamp": float(times[i]), "peak_when": fmt_time(float(times[i]), tz),
        "interval80": [float(bands[0.8][0][i]), float(bands[0.8][1][i])],
        "interval95": [float(bands[0.95][0][i]), float(bands[0.95][1][i])],
        "upper80_max": float(np.max(bands[0.8][1])), "upper95_max": float(np.max(bands[0.95][1])),
        "_times": times, "_mean": mean, "_bands": bands,
    }


def forecast_check(fc: dict, actual: pd.Series, step: float = HOUR) -> dict:
    """How a forecast of the week did against what happened (hourly peaks)."""
    if not fc.get("defined"):
        return {"defined": False, "reason": fc.get("reason", "no forecast")}
    b = np.floor(actual.index.to_numpy() / step) * step
    hourly = actual.groupby(b).max()
    t = fc["_times"]
    a = hourly.reindex(t).to_numpy()
    ok = np.isfinite(a)
    if not ok.any():
        return {"defined": False, "reason": "no actuals in the forecast week"}
    i = int(np.nanargmax(np.where(ok, a, -np.inf)))
    actual_peak, forecast_peak = float(a[i]), fc["peak"]
    cover = {}
    for lv in (0.8, 0.95):
        lo, hi = fc["_bands"][lv]
        cover[str(lv)] = float(np.mean((a[ok] >= lo[ok] - 1e-9) & (a[ok] <= hi[ok] + 1e-9)))
    err = forecast_peak - actual_peak
    lo95, hi95 = fc["interval95"]
    return {
        "defined": True, "model": fc["model"],
        "forecast_peak": forecast_peak, "forecast_peak_when": fc["peak_when"],
        "interval80": fc["interval80"], "interval95": fc["interval95"],
        "actual_peak": actual_peak, "actual_peak_timestamp": float(t[i]),
        "error": err, "error_ratio": (err / actual_peak) if actual_peak > 0 else None,
        "peak_timing_hours": (fc["peak_timestamp"] - float(t[i])) / 3600.0,
        "actual_peak_within_95": bool(lo95 <= actual_peak <= max(hi95, fc["upper95_max"])),
        "hourly_mape": float(np.mean(np.abs(fc["_mean"][ok] - a[ok]) / np.maximum(a[ok], 1.0))),
        "coverage": cover,
    }



def _recommend(name: str, replicas: int, per_rep: Optional[float], fc: dict, level: float,
               tz: str) -> dict:
    if not per_rep or not fc.get("defined"):
        return {"action": "unknown", "text": f"Pool {name}: no recommendation (no knee or no forecast)."}
    key = "upper95_max" if level == 0.95 else "upper80_max"
    upper = fc[key]
    lvl = f"{int(level * 100)}%"
    upper_series = fc["_bands"][level][1]
    times = fc["_times"]
    need = max(1, math.ceil(upper / per_rep - 1e-9))  # replicas to stay under the knee
    cap, cap_n1 = per_rep * replicas, per_rep * (replicas - 1)

    def first_cross(c):
        hit = np.flatnonzero(upper_series >= c)
        return float(times[hit[0]]) if len(hit) else None

    base = {"upper": upper, "level": level, "capacity_knee": cap, "capacity_n_minus_1": cap_n1,
            "replicas": replicas, "replicas_needed": need,
            # the same count /metrics exports as headroom_recommended_replicas (one definition)
            "replicas_needed_n_minus_1": recommended_replicas(upper, per_rep, 1)}
    if replicas < need:
        k = need - replicas
        by = first_cross(cap)
        when = fmt_time(by, tz, with_date=False) if by is not None else "next week"
        return {**base, "action": "add", "replicas_delta": k, "deadline": by, "text":
                f"Add {k} replica{'s' if k > 1 else ''} to pool {name} before {when}: the forecast "
                f"{lvl} upper bound ({upper:,.0f} concurrent requests) exceeds capacity at the knee "
                f"({cap:,.0f} with {replicas} replicas)."}
    n1 = base["replicas_needed_n_minus_1"]
    if replicas < n1:
        by = first_cross(cap_n1)
        when = fmt_time(by, tz, with_date=False) if by is not None else "next week"
        return {**base, "action": "add_for_n_minus_1", "replicas_delta": 1, "deadline": by, "text":
                f"Add one replica to pool {name} before {when} to keep N-1 cover: the forecast {lvl} "
                f"upper bound ({upper:,.0f}) fits the knee ({cap:,.0f}) but not the loss of a replica "
                f"({cap_n1:,.0f})."}
    spare = replicas - n1
    if spare >= 1:
        return {**base, "action": "remove", "replicas_delta": -spare, "deadline": None, "text":
                f"Pool {name} can lose {'a replica' if spare == 1 else f'{spare} replicas'}: the "
                f"forecast {lvl} upper bound ({upper:,.0f}) stays within N-1 capacity with "
                f"{replicas - spare} replicas ({per_rep * (replicas - spare - 1):,.0f})."}
    return {**base, "action": "keep", "replicas_delta": 0, "deadline": None, "text":
            f"Pool {name}: keep {replicas} replicas; the forecast {lvl} upper bound ({upper:,.0f}) "
            f"fits N-1 capacity ({cap_n1:,.0f}) with none to spare."}
