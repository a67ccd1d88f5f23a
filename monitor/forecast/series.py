"""Turning raw history into a regular series the models can fit (pure: no I/O, no clocks).

A series arrives as a pandas Series indexed by time (a DatetimeIndex, or floats in Unix seconds). It
may have gaps, duplicate timestamps, NaN, and negative values (a rate computed across an upstream
counter reset). `prepare` puts it on a regular grid, marks what is missing, and fills the gaps for
fitting only; scoring always uses the `observed` mask so filled points are never scored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

DAY = 86400.0
WEEK = 7 * DAY


class SeriesError(ValueError):
    """The series cannot be used at all (wrong type, no numbers); the message says why."""


@dataclass
class Prepared:
    """A regular series: `values` filled for fitting, `observed` True where a real point was."""

    start: float  # Unix seconds of values[0]
    step: float  # seconds between points
    values: np.ndarray
    observed: np.ndarray  # bool mask

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def end(self) -> float:
        """Unix seconds of the last point."""
        return self.start + (self.n - 1) * self.step

    @property
    def per_day(self) -> int:
        return int(round(DAY / self.step))

    @property
    def per_week(self) -> int:
        return int(round(WEEK / self.step))

    def times(self) -> np.ndarray:
        return self.start + self.step * np.arange(self.n)

    def head(self, k: int) -> "Prepared":
        return Prepared(self.start, self.step, self.values[:k].copy(), self.observed[:k].copy())

    def slice(self, a: int, b: int) -> "Prepared":
        return Prepared(self.start + a * self.step, self.step, self.values[a:b].copy(),
                        self.observed[a:b].copy())


def to_seconds_index(series: pd.Series) -> pd.Series:
    """Same values, index in float Unix seconds; raises SeriesError on an index that is not time."""
    if not isinstance(series, pd.Series):
        raise SeriesError(f"expected a pandas Series, got {type(series).__name__}")
    idx = series.index
    if isinstance(idx, pd.DatetimeIndex):
        if idx.tz is None:
            idx = idx.tz_localize("UTC")
        secs = np.asarray((idx - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1), dtype=np.float64)
    else:
        try:
            secs = np.asarray(idx, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise SeriesError(f"series index is neither datetimes nor Unix seconds: {exc}") from exc
    vals = pd.to_numeric(pd.Series(np.asarray(series.values)), errors="coerce").to_numpy(np.float64)
    return pd.Series(vals, index=secs)


def infer_step(seconds: np.ndarray) -> float:
    """The most common spacing of sorted, distinct timestamps."""
    d = np.diff(np.unique(seconds))
    d = d[d > 0]
    if len(d) == 0:
        raise SeriesError("need at least two distinct timestamps to infer the step")
    vals, counts = np.unique(np.round(d, 3), return_counts=True)
    return float(vals[np.argmax(counts)])


def prepare(series: pd.Series, step: float | None = None, *, max_missing_ratio: float = 0.5,
            missing_below: float | None = None) -> Prepared:
    """Regular grid at `step` (inferred when None), mean of points per slot.

    Negative values and NaN are missing. `missing_below` marks values below that threshold missing
    (collection gaps that show up as zero rates). Missing points are filled from one day earlier
    when that was observed, else by linear interpolation, else with the nearest observed value.
    """
    s = to_seconds_index(series)
    s = s[np.isfinite(s.index.to_numpy())]
    if len(s) == 0:
        raise SeriesError("series is empty")
    if step is None:
        step = infer_step(s.index.to_numpy())
    if not (step > 0 and math.isfinite(step)):
        raise SeriesError(f"step must be a positive number of seconds, got {step!r}")
    vals = s.to_numpy()
    bad = ~np.isfinite(vals) | (vals < 0)
    if missing_below is not None:
        bad |= vals < missing_below
    secs = s.index.to_numpy()
    start = float(np.min(secs))
    start = math.floor(start / step) * step if abs(start / step - round(start / step)) > 1e-9 \
        else round(start / step) * step
    slot = np.floor((secs - start) / step + 1e-9).astype(np.int64)
    n = int(slot.max()) + 1
    sums = np.zeros(n)
    counts = np.zeros(n)
    good = ~bad
    np.add.at(sums, slot[good], vals[good])
    np.add.at(counts, slot[good], 1)
    observed = counts > 0
    values = np.full(n, np.nan)
    values[observed] = sums[observed] / counts[observed]
    if not observed.any():
        raise SeriesError("series has no usable values (all NaN, negative or below the threshold)")
    missing_ratio = 1.0 - observed.mean()
    if missing_ratio > max_missing_ratio:
        raise SeriesError(f"{missing_ratio:.0%} of the points are missing (more than "
                          f"{max_missing_ratio:.0%}); the series cannot be forecast")
    return Prepared(start, float(step), fill_gaps(values, int(round(DAY / step))), observed)


def fill_gaps(values: np.ndarray, per_day: int) -> np.ndarray:
    out = values.copy()
    miss = np.isnan(out)
    if not miss.any():
        return out
    if 0 < per_day < len(out):
        for i in np.flatnonzero(miss):
            j = i - per_day
            if j >= 0 and not np.isnan(out[j]):
                out[i] = out[j]
    miss = np.isnan(out)
    if miss.any():
        idx = np.arange(len(out))
        out[miss] = np.interp(idx[miss], idx[~miss], out[~miss])
    return out
