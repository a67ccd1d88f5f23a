"""History for the forecasts in Prometheus mode: `query_range` over any Prometheus-compatible API.

The client is any object with
    query_range(query: str, start: float, end: float, step: float)
        -> list[tuple[dict, list[tuple[float, float]]]]      # (labels, [(ts, value), ...]) per series
(`monitor.sources.prometheus` provides it). Long ranges are split into chunks of at most
`max_points` steps (Prometheus refuses more than 11,000 points per series). No clock is read here.

Default PromQL reads headroom's own exported metrics as Prometheus recorded them, so the `pool` label
is already there; every query can be overridden (e.g. to read vLLM metrics directly).
"""
from __future__ import annotations

import math
from typing import Protocol

import pandas as pd

from monitor.forecast.pool import SERIES, TASK_PREFIX


class RangeClient(Protocol):
    def query_range(self, query: str, start: float, end: float, step: float
                    ) -> list[tuple[dict, list[tuple[float, float]]]]: ...


def default_queries(step: float = 300.0) -> dict[str, str]:
    """PromQL per series; `{w}` windows are the step (peaks per interval use max_over_time)."""
    w = f"{int(step)}s"
    return {
        "arrival_rate": "sum by (pool) (headroom_completion_rate)",
        "active_requests": f"max_over_time((sum by (pool) (headroom_active_requests) + "
                           f"sum by (pool) (headroom_queued_requests))[{w}:])",
        "kv_tokens": f"max_over_time((sum by (pool) (headroom_kv_tokens))[{w}:])",
        "sessions": f"max_over_time((sum by (pool) (headroom_sessions))[{w}:])",
        "task_arrivals": "sum by (pool, task_type) (headroom_task_arrival_rate)",
    }


def _chunks(start: float, end: float, step: float, max_points: int):
    span = step * (max_points - 1)
    a = start
    while a <= end:
        b = min(end, a + span)
        yield a, b
        a = b + step


def fetch_history(client: RangeClient, start: float, end: float, step: float = 300.0,
                  queries: dict[str, str] | None = None, pool_label: str = "pool",
                  task_label: str = "task_type", max_points: int = 10000
                  ) -> dict[str, dict[str, pd.Series]]:
    """{pool: {series: pandas Series indexed by Unix seconds}} for every series of every query.

    Series names are those of `monitor.forecast.pool` ("task_arrivals" results become
    "task_arrivals:<task_type>"). A result without the pool label is skipped (it cannot be placed).
    """
    if not (step > 0 and math.isfinite(step)):
        raise ValueError(f"step must be a positive number of seconds, got {step!r}")
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    queries = default_queries(step) if queries is None else queries
    for name in queries:
        if name not in SERIES and name != "task_arrivals":
            raise ValueError(f"unknown history series {name!r}; known: "
                             f"{', '.join(SERIES + ('task_arrivals',))}")
    out: dict[str, dict[str, dict[float, float]]] = {}
    for name, promql in queries.items():
        for a, b in _chunks(start, end, step, max_points):
            for labels, samples in client.query_range(promql, a, b, step):
                pool = labels.get(pool_label)
                if not pool:
                    continue
                key = name
                if name == "task_arrivals":
                    task = labels.get(task_label)
                    if not task:
                        continue
                    key = TASK_PREFIX + task
                bucket = out.setdefault(pool, {}).setdefault(key, {})
                for ts, value in samples:
                    bucket[float(ts)] = float(value)
    return {pool: {k: pd.Series(v, dtype=float).sort_index() for k, v in series.items()}
            for pool, series in out.items()}
