"""headroom's history: one schema, one store writer, one Prometheus range reader.

| module | what |
| --- | --- |
| (`monitor/schema.py`) | the schema itself, on the model floor: the series (one name, one meaning, one per-step aggregation each), the bucket rule, `HistorySource` |
| `store.py` | `points_from_snapshot` (what a cycle writes to the embedded store) and `StoreHistory` (direct mode) |
| `prometheus.py` | `read_range` (the chunked `query_range` loop) and `PrometheusHistory` (Prometheus mode: headroom's series, else vLLM's) |
| `slo.py` | the SLO burn windows' history: the tracker saved in / restored from the store, or `PrometheusWindows` (Prometheus mode) |

The forecasts (monitor/forecast/history.py) and the digest (monitor/digest/sources.py) read through
a `HistorySource`; neither knows which one.
"""
from monitor.schema import SERIES, HistorySource, Window, window

__all__ = ["SERIES", "HistorySource", "Window", "window"]
