"""The Prometheus source against VictoriaMetrics (the Debian single-node package), as it would run
against a VictoriaMetrics cluster, Thanos or Mimir query endpoint: same numbers as the direct scrape,
and query_range history for the forecasts."""
import shutil
import subprocess
import time

import pytest
from bodies import vllm_gauges as body
from servers import MetricsServer, free_port, same_as_direct, wait_http

from monitor.config import Config, PrometheusSource
from monitor.config.inputs import pipeline_settings
from monitor.kit.process import stop_process
from monitor.pipeline.cycle import Pipeline
from monitor.sources.prometheus import PrometheusClient

pytestmark = pytest.mark.live


@pytest.fixture
def victoria(tmp_path):
    binary = shutil.which("victoria-metrics")
    if not binary:
        pytest.skip("victoria-metrics not installed")
    servers = [MetricsServer() for _ in range(2)]
    for s, (r, w, u) in zip(servers, [(8, 5, 0.75), (2, 0, 0.125)]):
        s.bodies["/metrics"] = body(r, w, u)
    scrape = tmp_path / "scrape.yml"
    scrape.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vllm\n    static_configs:\n"
                      "      - targets: [" + ", ".join(f"'127.0.0.1:{s.port}'" for s in servers) + "]\n")
    port = free_port()
    log = open(tmp_path / "vm.log", "w")
    proc = subprocess.Popen([binary, f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
                             f"-promscrape.config={scrape}", "-retentionPeriod=1y", "-search.latencyOffset=0s"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        yield f"http://127.0.0.1:{port}", servers
    finally:
        stop_process(proc, 20)
        log.close()
        for s in servers:
            s.stop()


def test_victoriametrics_source_equals_direct(victoria):
    url, servers = victoria
    client = PrometheusClient(url)
    end = time.monotonic() + 90
    while time.monotonic() < end:
        got = client.query('count(vllm:e2e_request_latency_seconds_bucket{job="vllm"})')
        if got and got[0][1] == 44:
            break
        time.sleep(0.5)
    else:
        pytest.fail("VictoriaMetrics did not scrape both fixture replicas")
    _, v = same_as_direct(servers, url)
    assert (v.active_requests, v.queued_requests) == (10, 5)
    # history for the forecasts comes through query_range on the same endpoint
    now = time.time()
    series = client.query_range('sum(vllm:num_requests_running{job="vllm"})', now - 30, now, 1)
    assert series and all(value == 10 for _, value in series[0][1][-3:])


def test_query_errors_are_reported_not_raised(victoria):
    url, _ = victoria
    pipe = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=url, selector='job="vllm",oops'))))
    try:
        snap = pipe.run_cycle()
    finally:
        pipe.close()
    [status] = [s for s in snap.sources if s.source == "prometheus"]
    assert not status.up and status.error in ("query", "http")
