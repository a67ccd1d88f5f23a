"""Per-pool forecast: the pure function the daemon calls on its refit schedule.

    forecast_pool(series, capacity_requests, now, settings) -> PoolForecast

`series` maps a history series name (monitor/model/schema.py: one name, one meaning) to a pandas
Series of its history (DatetimeIndex or Unix seconds). The series forecast:
  "load"            peak concurrent requests (active + queued) per interval: served load
  "offered"         load + shed arrivals x mean service time: the offered load -> the capacity series
                    when its forecast is defined, else "load" (`PoolForecast.capacity_series` says which)
  "arrival_rate"    model calls finished per second (arrivals, on average)
  "kv_tokens"       peak live KV tokens per interval
  "sessions"        concurrent agent sessions
  "task_arrivals:<task_type>"  task starts per second by task type
Any subset may be present. Only the capacity series is compared with `capacity_requests` (concurrent requests at
the knee) for the time to exhaustion. No I/O, no clock: `now` is passed in.

The result is typed (`PoolForecast`: per horizon a `Horizon`, per series a `SeriesOutlook`, the
capacity series' forecast path); it travels on the snapshot (monitor/model/ `PoolSnapshot.forecast`)
and monitor/export/samples.py renders the catalogue's forecast metrics from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
import pandas as pd

from monitor.forecast.rolling_origin import ForecastSettings, forecast_series
from monitor.forecast.series import SeriesError, prepare
from monitor.model import schema

CAPACITY_SERIES = "load"
OFFERED_SERIES = "offered"  # the capacity series instead of `load` when its forecast is defined
SERIES = tuple(schema.key(n) for n in ("load", "offered", "arrival_rate", "kv_tokens", "sessions"))
TASK_PREFIX = schema.SERIES["task_arrivals"].name + ":"
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


@dataclass(frozen=True)
class Horizon:
    """The forecast over one horizon from the end of the history."""

    mean: float  # the mean forecast at the horizon's end
    upper: float  # its upper band (PoolSettings.upper_level)
    peak: float  # the highest mean forecast within the horizon
    peak_upper: float  # the highest upper band within it
    peak_timestamp: float
    end_timestamp: float
    peak_upper_80: Optional[float] = None  # the highest 80 % band within it

    def as_dict(self) -> dict:
        return {"mean": self.mean, "upper": self.upper, "peak": self.peak, "peak_upper": self.peak_upper,
                "peak_upper_80": self.peak_upper_80,
                "peak_timestamp": self.peak_timestamp, "end_timestamp": self.end_timestamp}


@dataclass(frozen=True)
class SeriesOutlook:
    """One series' forecast: the model chosen and how it did in its backtest, or why there is none."""

    defined: bool
    reason: Optional[str] = None
    history_points: Optional[int] = None
    model: Optional[str] = None
    selected_by: Optional[str] = None
    skill: dict = field(default_factory=dict)  # model -> backtest scores (mase, coverage80, ...)
    errors: dict = field(default_factory=dict)  # model -> failures / time-outs
    fit_seconds: Optional[float] = None
    backtest_seconds: Optional[float] = None
    calibrated: bool = False
    horizons: dict[str, Optional[Horizon]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out: dict = {"defined": self.defined, "reason": self.reason, "history_points": self.history_points}
        if self.model is not None or self.defined:
            out.update(model=self.model, selected_by=self.selected_by, skill=self.skill, errors=self.errors,
                       fit_seconds=self.fit_seconds, backtest_seconds=self.backtest_seconds,
                       calibrated=self.calibrated)
        if self.horizons:
            out["horizons"] = _horizons_dict(self.horizons)
        return out


@dataclass(frozen=True)
class ForecastPath:
    """The capacity series' forecast, point by point (for charts and tests; not in the JSON)."""

    timestamps: np.ndarray
    mean: np.ndarray
    upper: np.ndarray
    lower: np.ndarray


@dataclass(frozen=True)
class PoolForecast:
    last_fit_timestamp: float
    series: dict[str, SeriesOutlook] = field(default_factory=dict)
    horizons: dict[str, Optional[Horizon]] = field(default_factory=dict)  # of the capacity series
    exhaustion_seconds: Optional[float] = None  # until its upper band reaches capacity_requests
    capacity_requests: Optional[float] = None
    path: Optional[ForecastPath] = field(default=None, compare=False)
    capacity_series: str = CAPACITY_SERIES  # "offered" or "load": what horizons and exhaustion are of

    def as_dict(self) -> dict:
        """The JSON shape of `headroom once --json` and /api/v1/snapshot (no forecast path)."""
        return {"last_fit_timestamp": self.last_fit_timestamp, "capacity_requests": self.capacity_requests,
                "capacity_series": self.capacity_series,
                "exhaustion_seconds": self.exhaustion_seconds, "horizons": _horizons_dict(self.horizons),
                "series": {name: s.as_dict() for name, s in self.series.items()}}


def _horizons_dict(horizons: dict[str, Optional[Horizon]]) -> dict:
    return {h: (s.as_dict() if s is not None else {}) for h, s in horizons.items()}


def _horizon_summary(times: np.ndarray, mean: np.ndarray, upper: np.ndarray, last_ts: float,
                     seconds: float, upper_80: Optional[np.ndarray] = None) -> Optional[Horizon]:
    sel = times <= last_ts + seconds + 1e-6
    if not sel.any():
        return None
    t, m, u = times[sel], mean[sel], upper[sel]
    i = int(np.argmax(m))
    return Horizon(mean=float(m[-1]), upper=float(u[-1]), peak=float(m[i]), peak_upper=float(np.max(u)),
                   peak_timestamp=float(t[i]), end_timestamp=float(t[-1]),
                   peak_upper_80=float(np.max(upper_80[sel])) if upper_80 is not None else None)


def exhaustion_seconds(times: np.ndarray, upper: np.ndarray, capacity: float | None, now: float,
                       current: float | None = None) -> float | None:
    """Seconds from `now` until `upper` first reaches `capacity` at or after `now` (a path point
    before `now`, e.g. of a refit made before a wall-clock step forward, is past); +Inf when it never
    does within the forecast; 0 when the current value is already there; None without a capacity."""
    if capacity is None or not math.isfinite(capacity) or capacity <= 0:
        return None
    if current is not None and current >= capacity:
        return 0.0
    hit = np.flatnonzero((upper >= capacity) & (np.asarray(times) >= now))
    if len(hit) == 0:
        return math.inf
    return max(0.0, float(times[hit[0]]) - now)


def forecast_pool(series: dict[str, pd.Series], capacity_requests: float | None, now: float,
                  settings: PoolSettings = PoolSettings()) -> PoolForecast:
    outlooks: dict[str, SeriesOutlook] = {}
    candidates: dict[str, dict] = {}  # capacity-series candidate -> its horizons, exhaustion, path
    longest = max(HORIZONS[h] for h in settings.horizons)
    for name, raw in series.items():
        if not valid_series_name(name):
            raise ValueError(f"unknown series {name!r}; expected one of {', '.join(SERIES)} "
                             f"or {TASK_PREFIX}<task_type>")
        try:
            prep = prepare(raw, settings.step_seconds)
        except SeriesError as exc:
            outlooks[name] = SeriesOutlook(False, reason=str(exc), history_points=int(np.isfinite(
                pd.to_numeric(raw, errors="coerce")).sum()) if isinstance(raw, pd.Series) else 0)
            continue
        res = forecast_series(prep, max(1, int(math.ceil(longest / prep.step))), settings.forecast)
        outlook = SeriesOutlook(res.defined, reason=res.reason, history_points=int(prep.observed.sum()),
                                model=res.model, selected_by=res.selected_by, skill=res.skill,
                                errors=res.errors, fit_seconds=res.fit_seconds,
                                backtest_seconds=res.backtest_seconds, calibrated=res.calibration is not None)
        fc = res.forecast
        if res.defined and fc is not None:  # a defined result carries its forecast
            times = prep.end + prep.step * np.arange(1, len(fc.mean) + 1)
            upper = fc.upper(settings.upper_level)
            upper_80 = fc.upper(0.80)
            horizons = {h: _horizon_summary(times, fc.mean, upper, prep.end, HORIZONS[h], upper_80)
                        for h in settings.horizons}
            outlook = replace(outlook, horizons=horizons)
            if name in (CAPACITY_SERIES, OFFERED_SERIES):
                current = float(prep.values[-1]) if prep.observed[-1] else None
                candidates[name] = {
                    "horizons": horizons, "capacity_series": name,
                    "exhaustion_seconds": exhaustion_seconds(times, upper, capacity_requests, now, current),
                    "path": ForecastPath(times, fc.mean, upper, fc.lower(settings.upper_level))}
        outlooks[name] = outlook
    pool = candidates.get(OFFERED_SERIES) or candidates.get(CAPACITY_SERIES) or {}
    return PoolForecast(now, outlooks, capacity_requests=capacity_requests, **pool)
