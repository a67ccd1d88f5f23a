"""Peak forecasts, time to exhaustion and continuous backtests (issue 5).

Public entry points:
- `monitor.forecast.pool.forecast_pool(series, capacity_requests, now, settings)`: what the daemon
  calls per pool on its refit schedule; its typed result rides on the snapshot, and
  monitor/export/samples.py renders it into the catalogue's forecast metrics.
- `monitor.forecast.rolling_origin.forecast_series` / `monitor.forecast.models.MODELS`: the models,
  rolling-origin selection and calibrated bands; `headroom backtest` is `monitor.commands.backtest`.

The package is pure: plain data in, `now` passed in, no process, no I/O; of monitor/history it
imports the schema only. What runs it lives elsewhere: the refit scheduler in monitor/pipeline/forecaster.py
(the application floor), the fits' time box and process pool in monitor/kit/timebox.py, the SQLite
store behind monitor/history/store.py, and `forecast_history(source, now)` (the forecast series
from a history source) in monitor/history/forecast_history.py.
"""
