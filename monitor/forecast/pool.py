"""Per-pool forecast: the pure function the daemon calls on its refit schedule.

    forecast_pool(series, capacity_requests, now, settings) -> dict

`series` maps a series name to a pandas Series of its history (DatetimeIndex or Unix seconds):
  "active_requests"  peak concurrent requests (active + queued) per interval  -> the capacity series
  "arrival_rate"     request arrivals per second
  "kv_tokens"        peak live KV tokens per interval
  "sessions"         concurrent agent sessions
  "task_arrivals:<task_type>"  task starts per second by task type
Any subset may be present. Only "active_requests" is compared with `capacity_requests` (concurrent
requests at the knee) for the time to exhaustion. No I/O, no clock: `now` is passed in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from monitor.forecast.backtest import ForecastSettings, forecast_series
from monitor.forecast.series import SeriesError, prepare

CAPACITY_SERIES = "active_requests"
SERIES = ("active_requests", "arrival_rate", "kv_tokens", "sessions")
TASK_PREFIX = "task_arrivals:"
HORIZONS = {"1h": 3600.0, "1d": 86400.0, "1w": 7 * 86400.0}


@dataclass(frozen=True)
class PoolSettings:
    forecast: ForecastSettings = ForecastSettings()
    horizons: tuple[str, ...] = ("1h", "1d", "1w")
    step_seconds: float | None = None  # regular grid for the history (None: inferred)
    upper_level: float = 0.95

    def __post_init__(self):
        for h in self.horizons:
            if h not in HORIZONS:
                raise ValueError(f"unknown horizon {h!r}; known: {', '.join(HORIZONS)}")
        if self.upper_level not in (0.8, 0.95):
            raise ValueError("upper_level must be 0.8 or 0.95")


def valid_series_name(name: str) -> bool:
    return name in SERIES or (name.startswith(TASK_PREFIX) and len(name) > len(TASK_PREFIX))


def _horizon_summary(times: np.ndarray, mean: np.ndarray, upper: np.ndarray, last_ts: float,
                     seconds: float) -> dict:
    sel = times <= last_ts + seconds + 1e-6
    if not sel.any():
        return {}
    t, m, u = times[sel], mean[sel], upper[sel]
    i = int(np.argmax(m))
    return {"mean": float(m[-1]), "upper": float(u[-1]), "peak": float(m[i]),
            "peak_upper": float(np.max(u)), "peak_timestamp": float(t[i]),
            "end_timestamp": float(t[-1])}


def exhaustion_seconds(times: np.ndarray, upper: np.ndarray, capacity: float | None, now: float,
                       current: float | None = None) -> float | None:
    """Seconds from `now` until `upper` first reaches `capacity`; +Inf when it never does within
    the forecast; 0 when the current value is already there; None without a capacity."""
    if capacity is None or not math.isfinite(capacity) or capacity <= 0:
        return None
    if current is not None and current >= capacity:
        return 0.0
    hit = np.flatnonzero(upper >= capacity)
    if len(hit) == 0:
        return math.inf
    return max(0.0, float(times[hit[0]]) - now)


def forecast_pool(series: dict[str, pd.Series], capacity_requests: float | None, now: float,
                  settings: PoolSettings = PoolSettings()) -> dict:
    out: dict = {"last_fit_timestamp": now, "series": {}, "horizons": {},
                 "exhaustion_seconds": None, "capacity_requests": capacity_requests}
    longest = max(HORIZONS[h] for h in settings.horizons)
    for name, raw in series.items():
        if not valid_series_name(name):
            raise ValueError(f"unknown series {name!r}; expected one of {', '.join(SERIES)} "
                             f"or {TASK_PREFIX}<task_type>")
        entry: dict = {"defined": False}
        out["series"][name] = entry
        try:
            prep = prepare(raw, settings.step_seconds)
        except SeriesError as exc:
            entry.update(reason=str(exc), history_points=int(np.isfinite(
                pd.to_numeric(raw, errors="coerce")).sum()) if isinstance(raw, pd.Series) else 0)
            continue
        entry["history_points"] = int(prep.observed.sum())
        horizon_points = max(1, int(math.ceil(longest / prep.step)))
        res = forecast_series(prep, horizon_points, settings.forecast)
        entry.update(defined=res.defined, reason=res.reason, model=res.model,
                     selected_by=res.selected_by, skill=res.skill, errors=res.errors,
                     fit_seconds=res.fit_seconds, backtest_seconds=res.backtest_seconds,
                     calibrated=res.calibration is not None)
        if not res.defined:
            continue
        fc = res.forecast
        times = prep.end + prep.step * np.arange(1, len(fc.mean) + 1)
        upper = fc.upper(settings.upper_level)
        entry["horizons"] = {h: _horizon_summary(times, fc.mean, upper, prep.end, HORIZONS[h])
                             for h in settings.horizons}
        if name == CAPACITY_SERIES:
            out["horizons"] = entry["horizons"]
            current = float(prep.values[-1]) if prep.observed[-1] else None
            out["exhaustion_seconds"] = exhaustion_seconds(times, upper, capacity_requests, now,
                                                           current)
            out["forecast"] = {"timestamps": times, "mean": fc.mean, "upper": upper,
                               "lower": fc.lower(settings.upper_level)}
    return out


def metric_samples(pool: str, result: dict) -> list[tuple[str, dict, float]]:
    """The catalogue's forecast metrics for one pool's `forecast_pool` result, as
    (metric name, labels, value): what the exporter's collector yields. Undefined values are left
    out (never exported as 0). headroom_forecast_last_fit_timestamp_seconds has no pool label:
    the caller emits it once with the refit time."""
    out: list[tuple[str, dict, float]] = []
    for h, s in (result.get("horizons") or {}).items():
        if not s:
            continue
        labels = {"pool": pool, "horizon": h}
        out.append(("headroom_forecast_requests", labels, s["mean"]))
        out.append(("headroom_forecast_peak_requests", labels, s["peak"]))
        out.append(("headroom_forecast_peak_requests_upper", labels, s["peak_upper"]))
        out.append(("headroom_forecast_peak_timestamp_seconds", labels, s["peak_timestamp"]))
    if result.get("exhaustion_seconds") is not None:
        out.append(("headroom_exhaustion_seconds", {"pool": pool}, result["exhaustion_seconds"]))
    for name, entry in (result.get("series") or {}).items():
        if entry.get("history_points") is not None:
            out.append(("headroom_history_points", {"pool": pool, "series": name},
                        float(entry["history_points"])))
        if not entry.get("defined"):
            continue
        out.append(("headroom_forecast_selected_info",
                    {"pool": pool, "series": name, "model": entry["model"]}, 1.0))
        for model, sk in (entry.get("skill") or {}).items():
            if sk.get("mase") is not None:
                out.append(("headroom_forecast_mase", {"pool": pool, "series": name, "model": model},
                            sk["mase"]))
            for lv in ("0.8", "0.95"):
                cov = sk.get("coverage" + str(int(float(lv) * 100)))
                if cov is not None:
                    out.append(("headroom_forecast_coverage_ratio",
                                {"pool": pool, "series": name, "model": model, "level": lv}, cov))
    return out
