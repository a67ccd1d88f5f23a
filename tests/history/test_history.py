"""monitor/history: the schema, the bucket rule, the chunked range reader (over a fake RangeClient),
the store-backed source and what a cycle writes. Pure: no subprocess, no socket (SQLite on tmp_path)."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from monitor.forecast.pool import CAPACITY_SERIES, TASK_PREFIX
from monitor.forecast.pool import SERIES as FORECAST_SERIES
from monitor.history.forecast_history import forecast_history
from monitor.history.query_range import (
    ONLY,
    PrometheusHistory,
    Query,
    bucket_query,
    chunks,
    default_queries,
    headroom_queries,
    pool_matcher,
    read_range,
)
from monitor.history.store import HistoryStore, StoreHistory, points_from_snapshot
from monitor.model import Capacity, PoolSlo, PoolSnapshot, PoolTasks, Snapshot, TaskStats, schema
from monitor.model.catalogue import BY_NAME


class FakeRange:
    """query_range over canned functions: `series[query]` is a list of (labels, f(t) -> value or None);
    every call is recorded. Evaluation times are start + k * step <= end, as Prometheus does."""

    def __init__(self, series):
        self.series, self.calls = series, []

    def query_range(self, query, start, end, step):
        self.calls.append((query, start, end, step))
        n = math.floor((end - start) / step + 1e-9) + 1
        out = []
        for key, items in self.series.items():
            if key not in query:
                continue
            for labels, f in items:
                samples = [(start + k * step, f(start + k * step)) for k in range(n)]
                samples = [(t, v) for t, v in samples if v is not None]
                if samples:
                    out.append((dict(labels), samples))
        return out


# ---- schema ---------------------------------------------------------------------------------------

def test_the_docstring_table_is_the_schema_row_by_row():
    rows = re.findall(r"^\| `([a-z_]+)(:<task_type>)?` +\| ([^|]+?) +\| ([^|]+?) +\| (max|mean) +\| ([^|]+?) *\|",
                      schema.__doc__, re.M)
    assert [r[0] for r in rows] == list(schema.SERIES)
    for name, task, meaning, unit, agg, metric in rows:
        spec = schema.SERIES[name]
        assert (meaning, unit, agg, bool(task)) == (spec.meaning, spec.unit, spec.agg, spec.per_task)
        if spec.metric:
            assert metric == f"`{spec.metric}`"


def test_one_name_one_meaning_active_queued_and_load_apart():
    assert schema.SERIES["active_requests"].metric == "headroom_active_requests"
    assert schema.SERIES["queued_requests"].metric == "headroom_queued_requests"
    assert schema.SERIES["load"].metric is None  # derived: active + queued at the same instant
    assert CAPACITY_SERIES == "load"
    for spec in schema.SERIES.values():  # the exported metric each series is read back from
        if spec.metric:
            # a metric of several meanings told apart by a label is read back with one of them
            told_apart = ("where",) if spec.metric in ONLY else ()
            assert BY_NAME[spec.metric].labels == (("pool", "task_type") if spec.per_task else ("pool",)) + told_apart
    # the engine queue: where="engine", and the series written before the label
    assert ONLY["headroom_queued_requests"] == 'where!="gateway"'
    assert 'headroom_queued_requests{where!="gateway"}' in headroom_queries()["queued_requests"].expr
    assert all(schema.is_known(s) for s in FORECAST_SERIES) and TASK_PREFIX == "task_arrivals:"


def test_keys_parse_and_unknown_names_are_named():
    assert schema.key("task_arrivals", "summarise") == "task_arrivals:summarise"
    spec, task = schema.parse("task_arrivals:summarise")
    assert (spec.name, spec.agg, task) == ("task_arrivals", "mean", "summarise")
    assert schema.parse("load") == (schema.SERIES["load"], None)
    with pytest.raises(ValueError, match="'latency'"):
        schema.parse("latency")
    with pytest.raises(ValueError, match="needs"):
        schema.key("task_arrivals")
    with pytest.raises(ValueError, match="takes no"):
        schema.key("load", "x")
    assert not schema.is_known("task_arrivals") and not schema.is_known("load:x")
    with pytest.raises(ValueError, match="'call_arrival_rate'"):
        schema.names(["call_arrival_rate"])


def test_window_holds_the_complete_buckets_only():
    w = schema.window(1000.0, 2000.0, 300.0)  # [1200, 1500), [1500, 1800); [1800, 2100) is not complete
    assert (w.first, w.count, w.end) == (1200.0, 2, 1800.0)
    assert schema.window(1200.0, 2100.0, 300.0).count == 3
    assert schema.window(1201.0, 1499.0, 300.0).count == 0
    with pytest.raises(ValueError, match="step"):
        schema.window(0, 10, 0)
    with pytest.raises(ValueError, match="before start"):
        schema.window(10, 0, 1)


# ---- the range reader -----------------------------------------------------------------------------

def test_chunks_cover_every_evaluation_time_once_under_the_limit():
    assert chunks(0.0, 100.0, 10.0, 4) == [(0.0, 30.0), (40.0, 70.0), (80.0, 100.0)]
    assert chunks(0.0, 100.0, 10.0, 11) == [(0.0, 100.0)]
    assert chunks(5.0, 5.0, 60.0) == [(5.0, 5.0)]
    with pytest.raises(ValueError, match="max_points"):
        chunks(0, 1, 1, 0)


def test_read_range_merges_chunks_by_label_set_and_drops_non_finite_values():
    def a(t):
        return t / 10.0

    def b(t):
        return math.nan if t == 50 else 1.0
    client = FakeRange({"q": [({"pool": "a"}, a), ({"pool": "b"}, b)]})
    got = read_range(client, "q", 0.0, 100.0, 10.0, max_points=3)
    assert len(client.calls) == 4 and all(c[2] - c[1] <= 2 * 10.0 for c in client.calls)
    by = {lab["pool"]: pts for lab, pts in got}
    assert by["a"] == {float(t): t / 10.0 for t in range(0, 101, 10)}
    assert sorted(by["b"]) == [float(t) for t in range(0, 101, 10) if t != 50]


def test_bucket_query_samples_each_bucket_at_the_resolution():
    assert bucket_query("x", "max", 300, 60) == "max_over_time((x)[270s:60s])"
    assert bucket_query("x", "mean", 300, 300) == "avg_over_time((x)[150s:300s])"
    assert bucket_query("x", "max", 90, 15) == "max_over_time((x)[82500ms:15s])"


def test_pool_matcher_escapes_regex_and_promql_quoting():
    assert pool_matcher("pool", None) == ""
    assert pool_matcher("model_name", ["m-1.5", 'a"b']) == 'model_name=~"a\\"b|m-1\\\\.5"'


def test_prometheus_source_buckets_prefers_headroom_and_fills_from_vllm():
    step, res = 300.0, 60.0
    # headroom's active series exists from 1500 on (value 100 + t); vLLM's since the start (t)
    head = FakeRange({
        "headroom_active_requests": [({"pool": "m"}, lambda t: 100.0 + t if t >= 1500 else None)],
        "vllm:num_requests_running": [({"model_name": "m"}, lambda t: t)],
        "headroom_task_arrival_rate": [({"pool": "m", "task_type": "mail"}, lambda t: 0.5),
                                       ({"pool": "m"}, lambda t: 9.0)],  # no task_type: not placeable
    })
    src = PrometheusHistory(head, resolution=res)
    h = src.load(None, 1200.0, 2400.0, step, series=["active_requests", "task_arrivals"])
    act = h["m"]["active_requests"]
    # each bucket b is evaluated at b + step - res and indexed by b
    assert list(act.index) == [1200.0, 1500.0, 1800.0, 2100.0]
    assert list(act) == [1200.0 + 240, 100.0 + 1500 + 240, 100.0 + 1800 + 240, 100.0 + 2100 + 240]
    assert list(h["m"]["task_arrivals:mail"]) == [0.5] * 4 and set(h["m"]) == {"active_requests",
                                                                                "task_arrivals:mail"}
    first = next(c for c in head.calls if "headroom_active_requests" in c[0])
    assert first[0].startswith("max_over_time((max by (pool) (headroom_active_requests))[270s:60s])")
    assert (first[1], first[2], first[3]) == (1440.0, 2340.0, 300.0)
    assert any(c[0].startswith("avg_over_time(") for c in head.calls if "task_arrival" in c[0])


def test_prometheus_source_narrows_queries_and_results_to_the_pools_asked():
    client = FakeRange({"headroom_sessions": [({"pool": "a"}, lambda t: 1.0), ({"pool": "b"}, lambda t: 2.0)]})
    h = PrometheusHistory(client).load(["a"], 0.0, 600.0, 300.0, series=["sessions"])
    assert set(h) == {"a"} and list(h["a"]["sessions"]) == [1.0, 1.0]
    assert all('pool=~"a"' in q for q, *_ in client.calls)
    assert PrometheusHistory(client).load([], 0.0, 600.0, 300.0) == {}


def test_vllm_fallback_can_be_turned_off_and_queries_overridden():
    no_vllm = default_queries(vllm=False)
    assert all(q.origin == "headroom" for qs in no_vllm.values() for q in qs)
    assert [q.origin for q in default_queries()["load"]] == ["headroom", "vllm"]
    assert 'job="x"' in default_queries(selector='job="x"')["sessions"][0].expr
    vl = default_queries(vllm_selector='job="vllm"', vllm_pool_label="team")["active_requests"][1]
    assert vl.pool_label == "team" and 'job="vllm"' in vl.expr and "sum by (team)" in vl.expr
    with pytest.raises(ValueError, match="unknown history series 'latency'"):
        PrometheusHistory(FakeRange({}), queries={"latency": [Query("up")]})
    with pytest.raises(ValueError, match="whole multiple of the resolution"):
        PrometheusHistory(FakeRange({}), resolution=60).load(None, 0, 1000, 90)


def test_from_config_reads_vllm_with_the_sources_selector_and_pool_label():
    from monitor.config import PrometheusSource
    client = FakeRange({'vllm:num_requests_running{model_name!="", job="vllm", team=~"a"}':
                        [({"team": "a"}, lambda t: 4.0)]})
    src = PrometheusHistory.from_config(PrometheusSource(url="http://127.0.0.1:9", selector='job="vllm"'),
                                        pool_by="team", client=client)
    h = src.load(["a"], 0.0, 300.0, 300.0, series=["active_requests"])
    assert list(h["a"]["active_requests"]) == [4.0]
    assert len(client.calls) == 2  # headroom's series first, then vLLM's


# ---- the store ------------------------------------------------------------------------------------

def test_store_source_takes_peaks_of_gauges_and_means_of_rates(tmp_path):
    pts = []
    for i in range(10):  # one point a minute from t=600: two 5-minute buckets [600, 900), [900, 1200)
        t = 600.0 + 60 * i
        a, q = [3, 7, 5, 1, 2, 8, 2, 2, 2, 2][i], [4, 0, 1, 0, 0, 0, 0, 6, 0, 0][i]
        pts += [("p", "active_requests", t, a), ("p", "queued_requests", t, q), ("p", "load", t, a + q),
                ("p", "arrival_rate", t, float(i)), ("p", "task_arrivals:mail", t, 1.0),
                ("p", "not_a_series", t, 1.0)]
    with HistoryStore(str(tmp_path / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None) as st:
        st.append(pts)
        h = StoreHistory(st).load(None, 600.0, 1200.0, 300.0)
        assert set(h["p"]) == {"active_requests", "queued_requests", "load", "arrival_rate", "task_arrivals:mail"}
        assert list(h["p"]["active_requests"]) == [7.0, 8.0]
        assert list(h["p"]["queued_requests"]) == [4.0, 6.0]
        assert list(h["p"]["load"]) == [7.0, 8.0]  # not 7 + 4, 8 + 6: the peak of the sum
        assert list(h["p"]["arrival_rate"]) == [2.0, 7.0]  # mean of 0..4, 5..9
        assert list(h["p"]["load"].index) == [600.0, 900.0]
        # an incomplete last bucket is left out; pools and series filter
        assert list(StoreHistory(st).load(["p"], 600.0, 1199.0, 300.0, ["load"])["p"]["load"]) == [7.0]
        assert StoreHistory(st).load(["other"], 600.0, 1200.0, 300.0) == {}
        assert StoreHistory(st).describe == f"history store {tmp_path / 'h.sqlite'}"


def test_points_from_snapshot_writes_active_queued_and_load_apart():
    fresh = PoolSnapshot(pool="a", model="a", replicas=2, active_requests=8, queued_requests=2,
                         kv_tokens_live=1000.0, completion_rate=None,
                         capacity=Capacity(sessions=4.0, power_watts=1400.0),
                         tasks=PoolTasks(by_type={"mail": TaskStats("mail", arrival_rate=0.5,
                                                                    slo_violation_ratio=0.1)},
                                         slos={"pool:ttft": PoolSlo("ttft", 2.0, 0.95, 0.2)}))
    stale = PoolSnapshot(pool="b", model="b", replicas=1, active_requests=3, stale=True)
    down = PoolSnapshot(pool="c", model="c", replicas=0)
    pts = points_from_snapshot(Snapshot(timestamp=100.0, pools=[fresh, stale, down]))
    assert {(p, s): v for p, s, t, v in pts} == {
        ("a", "active_requests"): 8.0, ("a", "queued_requests"): 2.0, ("a", "load"): 10.0,
        ("a", "kv_tokens"): 1000.0, ("a", "sessions"): 4.0, ("a", "power_watts"): 1400.0,
        ("a", "task_arrivals:mail"): 0.5, ("a", "slo_violation_ratio:mail"): 0.1}
    assert {t for *_, t, _ in pts} == {100.0} and all(schema.is_known(s) for _, s, _, _ in pts)


# ---- the forecasts' call --------------------------------------------------------------------------

class RecordingSource:
    describe = "fake"

    def __init__(self, data):
        self.data, self.calls = data, []

    def load(self, pools, start, end, step, series=None):
        self.calls.append((pools, start, end, step, tuple(series) if series else None))
        return self.data


def test_forecast_history_reads_the_forecast_series_before_now():
    s = pd.Series(np.arange(3.0), index=[0.0, 300.0, 600.0])
    src = RecordingSource({"a": {"load": s, "active_requests": s, "task_arrivals:mail": s},
                           "b": {"queued_requests": s}})
    h = forecast_history(src, now=10 * 86400.0, days=7, step=300)
    assert src.calls == [(None, 3 * 86400.0, 10 * 86400.0, 300, ("load", "offered", "arrival_rate", "kv_tokens",
                                                                 "sessions", "task_arrivals"))]
    assert set(h) == {"a"} and set(h["a"]) == {"load", "task_arrivals:mail"}
    with pytest.raises(ValueError, match="days"):
        forecast_history(src, now=0.0, days=0)


# ---- the simulated history in the schema ---------------------------------------------------------

def test_schema_history_is_what_headroom_would_have_recorded_from_the_replicas():
    from headroom_lab.sim.history import generate_history, schema_history
    df = generate_history(None, days=0.05, step_s=60, end=1764547200.0, level=1.3, seed=2)
    h = schema_history(df).set_index(["pool", "series", "timestamp"])["value"]
    rep = df[df["instance"] != ""]
    model = {"chat-8b": "meta-llama/Llama-3.1-8B-Instruct", "agent-70b": "meta-llama/Llama-3.3-70B-Instruct"}
    for pool, name in model.items():
        running = rep[(rep["pool"] == pool) & (rep["series"] == "vllm:num_requests_running")]
        waiting = rep[(rep["pool"] == pool) & (rep["series"] == "vllm:num_requests_waiting")]
        a = running.groupby("timestamp")["value"].sum()
        q = waiting.groupby("timestamp")["value"].sum()
        assert h[name, "active_requests"].to_numpy() == pytest.approx(a.to_numpy())
        assert h[name, "load"].to_numpy() == pytest.approx((a + q).to_numpy())
        counts = df[(df["pool"] == pool) & (df["series"].str.startswith("task_arrivals:"))]
        for task, g in counts.groupby("series"):
            assert h[name, task].to_numpy() == pytest.approx(g["value"].to_numpy() / 60.0)
    assert set(h.index.get_level_values("series").str.split(":").str[0]) <= set(schema.SERIES)
