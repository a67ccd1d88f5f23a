"""The history the forecasts fit, from any `HistorySource` (the embedded store in direct mode,
Prometheus in Prometheus mode). It reads through a source, so it sits on the history edge; the
series names are the forecast core's (monitor/forecast/pool.py).

    forecast_history(source, now, days=35, step=300, pools=None) -> {pool: {series: pandas.Series}}

Only the series `monitor.forecast.pool` forecasts are read (`load`, `arrival_rate`, `kv_tokens`,
`sessions`, `task_arrivals:<task_type>`), over the complete `step` buckets of the `days` before `now`:
peaks per step for the gauges, means for the rates (monitor/model/schema.py). `now` is passed in.
"""
from __future__ import annotations

from typing import Iterable, Optional

from monitor.forecast.pool import SERIES, TASK_PREFIX, valid_series_name
from monitor.model.schema import History, HistorySource

__all__ = ["FORECAST_SERIES", "forecast_history"]
DAY = 86400.0
FORECAST_SERIES = SERIES + (TASK_PREFIX.rstrip(":"),)


def forecast_history(source: HistorySource, now: float, days: float = 35.0, step: float = 300.0,
                     pools: Optional[Iterable[str]] = None) -> History:
    """{pool: {series: Series indexed by Unix seconds}} for the forecasts; a pool with none of the
    forecast series is left out."""
    if not days > 0:
        raise ValueError(f"days must be positive, got {days!r}")
    data = source.load(pools, now - days * DAY, now, step, series=FORECAST_SERIES)
    out = {pool: {k: s for k, s in series.items() if valid_series_name(k)} for pool, series in data.items()}
    return {pool: series for pool, series in out.items() if series}
