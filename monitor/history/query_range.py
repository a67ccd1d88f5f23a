"""History from any Prometheus-compatible query API: the one `query_range` reader.

The client is any object with
    query_range(query: str, start: float, end: float, step: float)
        -> list[tuple[dict, list[tuple[float, float]]]]      # (labels, [(ts, value), ...]) per series
(`monitor.sources.prometheus.PrometheusClient` provides it, with auth, TLS and retries).

`read_range` is the chunked loop: a range is split into queries of at most `max_points` evaluation
times each (Prometheus refuses more than 11,000 points per series), and the chunks are merged.

`PrometheusHistory` is the Prometheus-backed `HistorySource` (monitor/model/schema.py). Each schema
series is one or more instant-vector expressions in priority order (`default_queries`):
  1. headroom's own exported series as Prometheus recorded them (`max by (pool)`, `max by (pool, cluster)`
     with `global.pool_by: [cluster, model_name]`, keyed as monitor/model/poolkey.py keys them: the two pods of an
     HA pair export the same value, they are not added up);
  2. for the request and KV series, the same quantity straight from vLLM's series summed by
     `model_name` (or the label pools are made of), for a Prometheus that holds months of vLLM
     history and no (or little) headroom history yet.
Per pool and series the first expression wins in every bucket where it has a value; a later one
fills the buckets where it has none (before headroom was installed, or while it was down).

A bucket [b, b + step) is read as `max_over_time` / `avg_over_time` of the expression sampled every
`resolution` seconds (default 60) at b, b + resolution, ..., b + step - resolution: a subquery
evaluated at t = b + step - resolution over (t - step + resolution / 2, t], the same points under
Prometheus 2's closed and Prometheus 3's left-open ranges (subquery points are aligned to multiples
of the resolution). On data scraped every `resolution` seconds this is the bucket's exact max /
mean, as the store computes it; finer data is sampled, not all seen. No clock is read here.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol

from monitor.model import schema
from monitor.model.poolkey import PoolBy, make_key, name_of, normalise

MAX_POINTS = 10_000  # evaluation times per query; Prometheus' limit is 11,000 per series


class RangeClient(Protocol):
    def query_range(self, query: str, start: float, end: float, step: float
                    ) -> list[tuple[dict, list[tuple[float, float]]]]: ...


def chunks(start: float, end: float, step: float, max_points: int = MAX_POINTS
           ) -> list[tuple[float, float]]:
    """(first, last) evaluation times of each query covering start, start + step, ... <= end."""
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"step must be a positive number of seconds, got {step!r}")
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points!r}")
    n = math.floor((end - start) / step + 1e-9) + 1
    return [(start + i * step, start + (min(n, i + max_points) - 1) * step)
            for i in range(0, n, max_points)]


def read_range(client: RangeClient, query: str, start: float, end: float, step: float,
               max_points: int = MAX_POINTS) -> list[tuple[dict[str, str], dict[float, float]]]:
    """Every series `query` returns over [start, end] at `step`: (labels, {ts: value}), chunked
    under `max_points` and merged by label set. NaN and infinite values are left out."""
    merged: dict[frozenset, tuple[dict[str, str], dict[float, float]]] = {}
    for a, b in chunks(start, end, step, max_points):
        for labels, samples in client.query_range(query, a, b, step):
            entry = merged.setdefault(frozenset(labels.items()), (dict(labels), {}))
            for ts, value in samples:
                v = float(value)
                if math.isfinite(v):
                    entry[1][float(ts)] = v
    return list(merged.values())


@dataclass(frozen=True)
class Query:
    """An instant-vector expression for one schema series; `pool_label` names the pool, `extra` are
    the other pool_by labels (`cluster`) its key carries (monitor/model/poolkey.py)."""
    expr: str
    pool_label: str = "pool"
    origin: str = "headroom"  # headroom | vllm
    extra: tuple[str, ...] = ()

    def key(self, labels: dict[str, str]) -> Optional[str]:
        """The pool key of a result series; None without the pool label."""
        name = labels.get(self.pool_label)
        if not name:
            return None
        return make_key(name, {e: labels.get(e, "") for e in self.extra}, self.extra)


# series of several meanings told apart by a label: the history series reads one (headroom_queued_requests
# where="engine"; its series written before the label have none, so `!=` keeps them)
ONLY = {"headroom_queued_requests": 'where!="gateway"'}


def _matchers(*parts: str) -> str:
    inner = [p.strip().strip("{}") for p in parts if p and p.strip().strip("{}")]
    return "{" + ", ".join(inner) + "}" if inner else ""


def pool_matcher(label: str, pools: Optional[Iterable[str]]) -> str:
    """`label=~"a|b"` matching exactly these pools (RE2, anchored by Prometheus); "" for None."""
    if pools is None:
        return ""
    alt = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", p) for p in sorted({name_of(k) for k in pools}))
    return f'{label}=~"' + alt.replace("\\", "\\\\").replace('"', '\\"') + '"'


def headroom_queries(selector: str = "", pools: Optional[Iterable[str]] = None,
                     extra: tuple[str, ...] = ()) -> dict[str, Query]:
    """headroom's exported series, one per pool (HA duplicates merged with max); `extra`: the
    pool_by labels beside `pool` (a pool is (pool, cluster) with [cluster, model_name])."""
    m = _matchers(selector, pool_matcher("pool", pools))
    pool = ", ".join(("pool",) + extra)

    def one(metric: str, by: str = pool) -> str:
        return f"max by ({by}) ({metric}{_matchers(m, ONLY.get(metric, ''))})"
    out = {name: Query(one(spec.metric, f"{pool}, task_type" if spec.per_task else pool), extra=extra)
           for name, spec in schema.SERIES.items() if spec.metric}
    out["load"] = Query(f"{one('headroom_active_requests')} + {one('headroom_queued_requests')}", extra=extra)
    return out


def vllm_queries(selector: str = "", pool_label: str = "model_name",
                 pools: Optional[Iterable[str]] = None, extra: tuple[str, ...] = ()) -> dict[str, Query]:
    """The request, KV and completion series straight from vLLM, summed per pool (`pool_label`).
    KV capacity is the `kv_cache_size_tokens` label of `vllm:cache_config_info` (vLLM >= 0.26),
    read back as a number with the histogram_quantile trick of rules/headroom.rules.yaml; the info
    metric carries no model_name, so it is joined on (job, instance, engine)."""
    m = _matchers('model_name!=""', selector, pool_matcher(pool_label, pools))
    info = "vllm:cache_config_info" + _matchers(selector, 'kv_cache_size_tokens=~"[0-9]+"')
    capacity = (f'histogram_quantile(1, max by (job, instance, engine, le) ('
                f'label_replace({info}, "le", "$1", "kv_cache_size_tokens", "(.+)") or '
                f'label_replace({info}, "le", "+Inf", "__name__", ".+")))')
    by = ", ".join(extra + (pool_label,))
    running = f"sum by ({by}) (vllm:num_requests_running{m})"
    waiting = f"sum by ({by}) (vllm:num_requests_waiting{m})"
    kv = (f"sum by ({by}) (vllm:kv_cache_usage_perc{m} "
          f"* on (job, instance, engine) group_left () {capacity})")
    done = f"sum by ({by}) (rate(vllm:request_success_total{m}[5m]))"
    return {name: Query(expr, pool_label, "vllm", extra) for name, expr in (
        ("active_requests", running), ("queued_requests", waiting), ("load", f"{running} + {waiting}"),
        ("kv_tokens", kv), ("arrival_rate", done))}


def default_queries(selector: str = "", vllm_selector: str = "", vllm_pool_label: str = "model_name",
                    vllm: bool = True, pools: Optional[Iterable[str]] = None,
                    extra: tuple[str, ...] = ()) -> dict[str, list[Query]]:
    """Per schema series, its expressions in priority order: headroom's, then vLLM's (if `vllm`)."""
    own = headroom_queries(selector, pools, extra)
    raw = vllm_queries(vllm_selector, vllm_pool_label, pools, extra) if vllm else {}
    return {name: [q for q in (own.get(name), raw.get(name)) if q is not None]
            for name in schema.SERIES if name in own or name in raw}


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def bucket_query(expr: str, agg: str, step: float, resolution: float) -> str:
    """PromQL whose value at t = b + step - resolution is the max / mean of `expr` over [b, b + step)."""
    fn = {"max": "max_over_time", "mean": "avg_over_time"}[agg]
    return f"{fn}(({expr})[{_duration(step - resolution / 2)}:{_duration(resolution)}])"


class PrometheusHistory:
    """`HistorySource` over a `RangeClient`: see the module docstring for the queries and buckets.

    `queries` replaces `default_queries` (then `pools` filters the results, it does not narrow
    the queries); `vllm=False` reads headroom's own series only."""

    def __init__(self, client: RangeClient, *, selector: str = "", vllm_selector: str = "",
                 vllm_pool_label: str = "model_name", vllm: bool = True,
                 resolution: Optional[float] = None, max_points: int = MAX_POINTS,
                 queries: Optional[dict[str, list[Query]]] = None, extra: tuple[str, ...] = ()):
        if resolution is not None and not (math.isfinite(resolution) and resolution > 0):
            raise ValueError(f"resolution must be a positive number of seconds, got {resolution!r}")
        if queries is not None:
            schema.names(queries)  # unknown series names fail here
        self.client, self.resolution, self.max_points = client, resolution, int(max_points)
        self.selector, self.vllm_selector = selector, vllm_selector
        self.vllm_pool_label, self.vllm, self.queries = vllm_pool_label, vllm, queries
        self.extra = tuple(extra)  # pool_by labels beside the pool's (monitor/model/poolkey.py)
        self.describe = "Prometheus"

    @classmethod
    def from_config(cls, src, pool_by: PoolBy = "model_name", client: Optional[RangeClient] = None,
                    **kwargs) -> "PrometheusHistory":
        """From `cfg.prometheus` (monitor.config.PrometheusSource): its client (auth, TLS, retries)
        and its selector for the vLLM series; vLLM pools are made of the `pool_by` labels (the last
        names the pool, the others are carried in its key)."""
        by = normalise(pool_by)
        if client is None:
            from monitor.sources.prometheus import PrometheusClient  # noqa: PLC0415
            client = PrometheusClient.from_config(src)
        return cls(client, vllm_selector=src.selector, vllm_pool_label=by[-1], extra=by[:-1], **kwargs)

    def resolution_for(self, step: float) -> float:
        """Seconds between the samples taken within a bucket: `resolution`, by default 60 s when the
        step is a whole number of minutes, else the step (one sample per bucket)."""
        res = self.resolution
        if res is None:
            res = 60.0 if round(step * 1000) % 60000 == 0 else step
        ms, res_ms = round(step * 1000), round(res * 1000)
        if abs(ms - step * 1000) > 1e-6 or res_ms == 0 or ms % res_ms:
            raise ValueError(f"step ({step:g} s) must be a whole multiple of the resolution ({res:g} s)")
        return float(res)

    def read(self, q: Query, agg: str, w: schema.Window
             ) -> dict[tuple[str, Optional[str]], dict[float, float]]:
        """One expression over the window's buckets: {(pool, task type or None): {b: value}}."""
        res = self.resolution_for(w.step)
        offset = w.step - res  # each bucket is evaluated at its last sampling point
        out: dict[tuple[str, Optional[str]], dict[float, float]] = {}
        for labels, points in read_range(self.client, bucket_query(q.expr, agg, w.step, res),
                                         w.first + offset, w.end - w.step + offset, w.step,
                                         self.max_points):
            pool = q.key(labels)
            if not pool:
                continue  # a result without the pool label cannot be placed
            bucket = out.setdefault((pool, labels.get(schema.TASK_LABEL) or None), {})
            for ts, v in points.items():
                bucket[round((ts - offset) * 1000.0) / 1000.0] = v
        return out

    def load(self, pools: Optional[Iterable[str]], start: float, end: float, step: float,
             series: Optional[Iterable[str]] = None) -> schema.History:
        w = schema.window(start, end, step)
        wanted = schema.names(series)
        self.resolution_for(step)  # a step that does not fit fails before any query
        pool_set = None if pools is None else set(pools)
        if w.count == 0 or pool_set == set():
            return {}
        queries = self.queries if self.queries is not None else default_queries(
            self.selector, self.vllm_selector, self.vllm_pool_label, self.vllm, pool_set, self.extra)
        merged: dict[str, dict[str, dict[float, float]]] = {}
        for name in wanted:
            spec = schema.SERIES[name]
            for q in queries.get(name, []):  # in priority order: the first value of a bucket wins
                for (pool, task), points in self.read(q, spec.agg, w).items():
                    if (pool_set is not None and pool not in pool_set) or spec.per_task != bool(task):
                        continue
                    target = merged.setdefault(pool, {}).setdefault(schema.key(name, task), {})
                    for ts, v in points.items():
                        target.setdefault(ts, v)
        return {pool: {k: schema.to_series(v) for k, v in sorted(ser.items()) if v}
                for pool, ser in sorted(merged.items())}
