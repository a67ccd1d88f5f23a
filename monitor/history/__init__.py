"""headroom's history: one schema, one store writer, one Prometheus range reader.

| module | what |
| --- | --- |
| (`monitor/model/schema.py`) | the schema itself, on the model floor: the series (one name, one meaning, one per-step aggregation each), the bucket rule, `HistorySource` |
| `store.py` | the embedded store's one import: `HistoryStore` and `open_store` (re-exported), `points_from_snapshot` (what a cycle writes to it) and `StoreHistory` (direct mode) |
| `sqlite_store.py` | `HistoryStore`: SQLite WAL, idempotent appends keyed by (pool, series, resolution, ts), range queries with max / mean per step, retention, downsampling into (max, sum, count) rollups, the SLO counts table |
| `store_open.py` | `open_store` / `store_problem`: the store as far as it can be used (a corrupt file moved aside, an unwritable one read only) |
| `forecast_history.py` | `forecast_history(source, now, days, step)`: the series the forecasts fit, from any `HistorySource` |
| `query_range.py` | `read_range` (the chunked `query_range` loop) and `PrometheusHistory` (Prometheus mode: headroom's series, else vLLM's) |
| `slo_history.py` | the SLO burn windows' history: the tracker saved in / restored from the store, or `PrometheusWindows` (Prometheus mode) |

The forecasts (`forecast_history.py`, called by monitor/pipeline/forecaster.py) and the digest (monitor/digest/sources.py) read through
a `HistorySource`; neither knows which one.
"""
