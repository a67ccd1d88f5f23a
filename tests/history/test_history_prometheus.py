"""The Prometheus history source against a real Prometheus 2.42, backfilled with promtool, and the
store-backed source fed from the same generated history: the same pools, series, timestamps and values.

The fleet's history (headroom_lab.sim.history, 14 days at one point a minute, busy enough to queue at its
peaks) is backfilled as vLLM replica gauges for all 14 days and as headroom's exported series for
the last 4 only: a Prometheus that held vLLM long before headroom was installed. The store holds
what headroom would have written over the 14 days (`schema_history`).
"""
from __future__ import annotations

import math
import shutil
import time

import pytest

from headroom_lab.sim.fleet import load_config, theoretical_knee
from headroom_lab.sim.history import generate_history, schema_history, write_openmetrics
from monitor.capacity.settings import PoolSettings
from monitor.config import PrometheusSource
from monitor.digest.content import build_digest
from monitor.digest.settings import from_dict
from monitor.digest.sources import from_prometheus, from_store
from monitor.history.forecast_history import forecast_history
from monitor.history.query_range import PrometheusHistory
from monitor.history.store import HistoryStore, StoreHistory
from monitor.sources.prometheus import PrometheusClient

pytestmark = [pytest.mark.live, pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                                   reason="needs the prometheus and promtool binaries")]

DAY = 86400.0
STEP = 300.0
FROM_VLLM = ("active_requests", "queued_requests", "load", "kv_tokens")  # derivable from vLLM's gauges


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, prometheus_on_history):
    d = tmp_path_factory.mktemp("history-prom")
    end = math.floor(time.time() / 3600) * 3600 - 3600  # recent: inside Prometheus' retention
    df = generate_history(None, days=14, step_s=60, end=end, level=1.3, seed=2)
    truth = schema_history(df)
    since = end - 4 * DAY  # headroom's own series start here, on a bucket boundary
    write_openmetrics(df, str(d / "h.om"), headroom=truth[truth["timestamp"] >= since])
    prom = prometheus_on_history(d / "h.om", max_block_duration="24h")
    (d / "h.om").unlink()
    store = HistoryStore(str(d / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None)
    store.append((r.pool, r.series, float(r.timestamp), float(r.value)) for r in truth.itertuples(index=False))
    try:
        yield {"url": prom.url, "store": store, "end": float(end), "since": float(since),
               "start": float(end - 14 * DAY + STEP), "truth": truth}
    finally:
        store.close()


def _same(a, b):
    assert list(a.index) == list(b.index)
    assert a.to_numpy() == pytest.approx(b.to_numpy(), rel=1e-9, abs=1e-9)


def test_prometheus_and_store_sources_agree_on_pools_series_times_and_values(fleet):
    st = StoreHistory(fleet["store"]).load(None, fleet["start"], fleet["end"], STEP)
    pr = PrometheusHistory(PrometheusClient(fleet["url"])).load(None, fleet["start"], fleet["end"], STEP)
    assert sorted(pr) == sorted(st) == sorted(fleet["truth"]["pool"].unique())
    for pool in st:
        assert sorted(pr[pool]) == sorted(st[pool])
        assert len(st[pool]) == 7 + len([k for k in st[pool] if k.startswith("task_arrivals:")]) >= 9  # offered too
        for name, s in st[pool].items():
            assert len(s) == (fleet["end"] - fleet["start"]) // STEP  # every complete bucket
            if name in FROM_VLLM:  # vLLM's gauges for 10 days, headroom's for the last 4
                _same(pr[pool][name], s)
            else:  # headroom's own series only: since it was installed
                _same(pr[pool][name], s[s.index >= fleet["since"]])
        # the data tells load from the sum of the peaks: queues build and drain within buckets
        both = st[pool]["active_requests"] + st[pool]["queued_requests"]
        assert (both > st[pool]["load"] + 0.5).sum() > 20 and (both >= st[pool]["load"]).all()


def test_without_the_vllm_fallback_history_starts_when_headroom_did(fleet):
    src = PrometheusHistory(PrometheusClient(fleet["url"]), vllm=False)
    pr = src.load(None, fleet["start"], fleet["end"], STEP, series=FROM_VLLM)
    st = StoreHistory(fleet["store"]).load(None, fleet["start"], fleet["end"], STEP, series=FROM_VLLM)
    for pool, series in st.items():
        assert sorted(pr[pool]) == sorted(series)
        for name, s in series.items():
            _same(pr[pool][name], s[s.index >= fleet["since"]])


def test_chunked_reads_return_what_one_query_returns(fleet):
    client = PrometheusClient(fleet["url"])
    whole = PrometheusHistory(client).load(None, fleet["start"], fleet["end"], STEP, series=["load"])
    calls = []

    class Counting:
        def query_range(self, *a):
            calls.append(a)
            return client.query_range(*a)
    chunked = PrometheusHistory(Counting(), max_points=500).load(None, fleet["start"], fleet["end"], STEP,
                                                                 series=["load"])
    n = int((fleet["end"] - fleet["start"]) // STEP)
    assert len(calls) == 2 * math.ceil(n / 500)  # headroom's query and vLLM's, each in chunks
    for pool, series in whole.items():
        _same(chunked[pool]["load"], series["load"])


def test_forecast_history_from_prometheus_has_the_weeks_before_headroom(fleet):
    now = fleet["end"] + 17.0  # mid-bucket: the bucket it is in is not complete
    source = PrometheusHistory.from_config(PrometheusSource(url=fleet["url"]), pool_by="model_name")
    h = forecast_history(source, now, days=35, step=STEP)  # what the daemon calls in Prometheus mode
    for series in h.values():
        assert set(series) >= {"load", "kv_tokens", "arrival_rate", "sessions"}
        assert series["load"].index[0] < fleet["since"] - 9 * DAY  # 10 days from vLLM
        assert series["load"].index[-1] == fleet["end"] - STEP
        assert series["sessions"].index[0] == fleet["since"]


def test_digest_load_peak_equals_the_stores_peak_of_that_hour(fleet):
    cfg = load_config(None)
    pools = {p.model_name: PoolSettings(replicas=p.replicas,
                                        knee_requests_per_replica=float(theoretical_knee(p, cfg.mix)["per_replica"]))
             for p in cfg.pools}
    settings = from_dict({"forecast": {"models": ["snaive_day"]}}, "<t>", pools=pools)
    week_end = fleet["end"]
    d_prom = build_digest(from_prometheus(PrometheusClient(fleet["url"]), week_end, settings), settings)
    d_store = build_digest(from_store(fleet["store"], week_end, settings), settings)
    assert [p["name"] for p in d_prom["pools"]] == [p["name"] for p in d_store["pools"]] == sorted(pools)
    for pp, ps in zip(d_prom["pools"], d_store["pools"]):
        for k in FROM_VLLM:  # sessions: Prometheus has headroom's only for the last 4 days
            assert pp["peaks"][k]["timestamp"] == ps["peaks"][k]["timestamp"]
            assert pp["peaks"][k]["value"] == pytest.approx(ps["peaks"][k]["value"], rel=1e-9)
        # every hour of the week: the digest's load (active + queued) is the store's peak of load
        hourly = fleet["store"].query(pp["name"], "load", week_end - 7 * DAY, week_end - 1e-3, step=3600)
        for d in (pp, ps):
            h, cap = d["_headroom"], d["knee"]["requests"]
            assert list(h["times"]) == list(hourly.index)
            assert cap * (1.0 - h["current"]) == pytest.approx(hourly.to_numpy(), rel=1e-9)
        peak = pp["peaks"]["load"]
        hour = math.floor(peak["timestamp"] / 3600) * 3600
        assert peak["value"] == pytest.approx(float(hourly[hour]), rel=1e-12) == float(hourly.max())
