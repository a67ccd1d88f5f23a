"""Peak forecasts, time to exhaustion and continuous backtests (issue 5).

Public entry points:
- `monitor.forecast.pool.forecast_pool(series, capacity_requests, now, settings)`: what the daemon
  calls per pool on its refit schedule; its typed result rides on the snapshot, and
  monitor/export/samples.py renders it into the catalogue's forecast metrics.
- `monitor.forecast.scheduler.ForecastScheduler`: a scheduled job (monitor/ticker.py) refitting every N minutes, with
  time-boxed fits and a thread-safe `latest` result for the exporter.
- `monitor.forecast.store.HistoryStore`: direct-mode history (SQLite WAL, retention, downsampling).
- `monitor.forecast.history.forecast_history(source, now)`: the forecast series from a history
  source of monitor/history/ (the store in direct mode, Prometheus in Prometheus mode).
- `monitor.forecast.backtest.forecast_series` / `monitor.forecast.models.MODELS`: the models,
  rolling-origin selection and calibrated bands; `headroom backtest` is `monitor.commands.backtest`.
"""
