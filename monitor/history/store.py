"""The embedded store under the history schema, and the one place callers import it from.

    HistoryStore, StoreError          the SQLite store itself (monitor/history/sqlite_store.py)
    open_store, store_problem, Opened  opening it as the daemon does (monitor/history/store_open.py)
    points_from_snapshot(snapshot)   the points one cycle adds, in the schema's names (pure)
    StoreHistory(store).load(...)     {pool: {series: Series}}, buckets as monitor/model/schema.py says
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

from monitor.history.sqlite_store import HistoryStore, StoreError
from monitor.history.store_open import Opened, open_store, store_problem
from monitor.model import schema

__all__ = ["HistoryStore", "Opened", "StoreError", "StoreHistory", "open_store", "points_from_snapshot",
           "store_problem"]


def points_from_snapshot(snapshot) -> list[tuple[str, str, float, float]]:
    """(pool, series, ts, value) for every fresh pool of a `monitor.model.Snapshot`: active and
    queued requests apart, their sum as `load`, and what else the cycle knows (kv_tokens,
    arrival_rate = the completion rate, sessions and power_watts from the pool's `Capacity`, per
    task type its arrivals and SLO violation ratio). A stale pool or one without replicas adds
    nothing; unknown values are left out."""
    out: list[tuple[str, str, float, float]] = []
    t = float(snapshot.timestamp)

    def add(pool: str, key: str, value: Optional[float]) -> None:
        if value is not None and math.isfinite(float(value)):
            out.append((pool, key, t, float(value)))

    for p in snapshot.pools:
        if p.stale or p.replicas == 0:
            continue
        add(p.pool, "active_requests", p.active_requests)
        add(p.pool, "queued_requests", p.queued_requests)
        add(p.pool, "load", p.load_requests)
        add(p.pool, "offered", p.offered_requests)
        add(p.pool, "kv_tokens", p.kv_tokens_live)
        add(p.pool, "arrival_rate", p.completion_rate)
        if p.capacity is not None:
            add(p.pool, "sessions", p.capacity.sessions)
            add(p.pool, "power_watts", p.capacity.power_watts)
        for task, stats in sorted((p.tasks.by_type if p.tasks is not None else {}).items()):
            add(p.pool, schema.key("task_arrivals", task), stats.arrival_rate)
            add(p.pool, schema.key("task_completions", task), stats.completion_rate)
            add(p.pool, schema.key("slo_violation_ratio", task), stats.slo_violation_ratio)
    return out


class StoreHistory:
    """`HistorySource` over a `HistoryStore` (anything with its
    `series_keys()` and `query(pool, series, start, end, step, agg)`)."""

    def __init__(self, store):
        self.store = store
        self.describe = f"history store {getattr(store, 'path', '')}".strip()

    def load(self, pools: Optional[Iterable[str]], start: float, end: float, step: float,
             series: Optional[Iterable[str]] = None) -> schema.History:
        w = schema.window(start, end, step)
        wanted = set(schema.names(series))
        pool_set = None if pools is None else set(pools)
        out: schema.History = {}
        if w.count == 0:
            return out
        for pool, k in self.store.series_keys():
            if (pool_set is not None and pool not in pool_set) or not schema.is_known(k):
                continue
            spec, _ = schema.parse(k)
            if spec.name not in wanted:
                continue
            # the store's buckets are floor(ts / step) * step: ask for [first, end) only (ms precision)
            s = self.store.query(pool, k, w.first, w.end - 1e-3, step=step, agg=spec.agg)
            if len(s):
                out.setdefault(pool, {})[k] = s.rename(None)
        return out
