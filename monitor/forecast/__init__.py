"""Peak forecasts, time to exhaustion and continuous backtests (issue 5).

Public entry points:
- `monitor.forecast.pool.forecast_pool(series, capacity_requests, now, settings)`: what the daemon
  calls per pool on its refit schedule; `metric_samples(pool, result)` turns the result into the
  catalogue's forecast metrics.
- `monitor.forecast.scheduler.ForecastScheduler`: APScheduler job refitting every N minutes, with
  time-boxed fits and a thread-safe `latest` result for the exporter.
- `monitor.forecast.store.HistoryStore`: direct-mode history (SQLite WAL, retention, downsampling).
- `monitor.forecast.history.fetch_history(client, start, end, step)`: Prometheus-mode history.
- `monitor.forecast.backtest.forecast_series` / `monitor.forecast.models.MODELS`: the models,
  rolling-origin selection and calibrated bands; `headroom backtest` is `monitor.forecast.cli`.
"""
