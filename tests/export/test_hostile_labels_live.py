"""Nothing a source says can stop the renderer (issue 38, Build 1), through the real daemon on loopback.

One target exposes the legal label value `model_name="evil{replica=\"x\"}"` under the default
`pool_by: model_name`. Before the fix its pool key was parsed back as `pool="evil",replica="x"`,
every render raised and /metrics, / and /api/v1/snapshot stayed frozen at that cycle while /-/ready
said 200. Here the cycle counter in each body must keep moving (waited on with a deadline), the
hostile pool is exported under its own name, its neighbour is untouched, and /-/ready stays 200
because the daemon really is cycling and publishing.
"""
from __future__ import annotations

import subprocess

import pytest
import requests
from bodies import vllm_body
from prometheus_client.parser import text_string_to_metric_families
from servers import MetricsServer, Prometheus, headroom_run, samples, scrape_config, wait_for, wait_http
from tiers import starts_servers

from monitor.config import Config, PrometheusSource
from monitor.config.inputs import pipeline_settings
from monitor.export.collector import Exposition
from monitor.kit.process import stop_process
from monitor.pipeline.cycle import Pipeline

pytestmark = pytest.mark.live

EVIL = 'evil{replica="x"}'  # the label value as the target means it
EVIL_IN_TEXT = 'evil{replica=\\"x\\"}'  # the same value escaped in the exposition text


def cycles_in(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "headroom_cycles_total":
                return s.value
    return -1.0


@pytest.fixture
@starts_servers
def targets():
    plain, evil = MetricsServer(), MetricsServer()
    plain.bodies["/metrics"] = vllm_body("tiny")
    evil.bodies["/metrics"] = vllm_body(EVIL_IN_TEXT)
    yield plain, evil
    plain.stop()
    evil.stop()


def _daemon(tmp_path, sources: str) -> tuple[subprocess.Popen, str]:
    """`headroom run` at 1 s cycles on `sources` (YAML of the sources section), for up to 180 s: (process, base URL)."""
    return headroom_run(tmp_path, "global:\n  interval: 1s\n  scrape_timeout: 1s\n" + sources, 180)


def test_a_label_value_that_looks_like_labels_never_freezes_what_is_served(targets, tmp_path):
    plain, evil = targets
    proc, base = _daemon(tmp_path, f"sources:\n  vllm:\n    targets: [{plain.url('/metrics')}, {evil.url('/metrics')}]\n")
    try:
        wait_http(base + "/-/ready", timeout=90)
        first = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text, lambda t: cycles_in(t) >= 1,
                         timeout=60, what="a cycle in /metrics")
        start = cycles_in(first)
        # the body moves on: three more cycles are served, not one frozen body
        text = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text,
                        lambda t: cycles_in(t) >= start + 3, timeout=60, what="/metrics moving past the first cycles")
        then = requests.get(base + "/api/v1/snapshot", timeout=5).json()["timestamp"]
        doc = wait_for(lambda: requests.get(base + "/api/v1/snapshot", timeout=5).json(),
                       lambda d: d["timestamp"] >= then + 2 and len(d["pools"]) == 2, timeout=60,
                       what="/api/v1/snapshot moving on with both pools")
        page = requests.get(base + "/", timeout=5)
        ready = requests.get(base + "/-/ready", timeout=5)
    finally:
        stop_process(proc, 20)

    assert ready.status_code == 200, ready.text
    # the hostile pool is exported under its own name: the value is data, never labels
    replicas = samples(text, "headroom_replicas")
    assert replicas == {(("pool", "tiny"),): 1.0, (("pool", EVIL),): 1.0}, replicas
    assert all("replica" not in dict(k) for k in replicas)
    assert samples(text, "headroom_render_errors_total") == {}
    assert sorted(p["pool"] for p in doc["pools"]) == sorted(["tiny", EVIL])
    assert all("key" not in p for p in doc["pools"])
    assert page.status_code == 200
    assert "evil{replica=&quot;x&quot;}" in page.text


# an alert of headroom's whose summary carries a lone surrogate, as a JSON answer may (\ud800)
ALERTS = ('{"status":"success","data":{"alerts":[{"labels":{"alertname":"HeadroomLow","pool":"tiny",'
          '"severity":"warning","cluster":"\\ud800"},"annotations":{"summary":"low \\ud800 headroom"},'
          '"state":"firing","activeAt":"2026-12-06T00:00:00Z"}]}}')


def test_a_lone_surrogate_in_an_alert_breaks_neither_the_page_nor_metrics(tmp_path):
    replica, alerts = MetricsServer(), MetricsServer(content_type="application/json")
    replica.bodies["/metrics"] = vllm_body("tiny")
    alerts.bodies["/api/v1/alerts"] = ALERTS
    proc, base = _daemon(tmp_path, f"sources:\n  vllm:\n    targets: [{replica.url('/metrics')}]\n"
                                   f"  alerts: {{url: '{alerts.url('')}', kind: prometheus}}\n")
    try:
        wait_http(base + "/-/ready", timeout=90)
        raw = wait_for(lambda: requests.get(base + "/metrics", timeout=5).content,
                       lambda b: b'kind="invalid_text"' in b, timeout=60, what="the replaced text counted")
        page = requests.get(base + "/", timeout=5)
        doc = requests.get(base + "/api/v1/snapshot", timeout=5)
    finally:
        stop_process(proc, 20)
        replica.stop()
        alerts.stop()
    text = raw.decode("utf-8")  # strict: the body is UTF-8
    assert samples(text, "headroom_input_anomalies_total")[(("kind", "invalid_text"),)] >= 2
    assert page.status_code == 200
    assert "low \ufffd headroom" in page.content.decode("utf-8")
    assert doc.status_code == 200 and doc.json()["alerts"][0]["summary"] == "low \ufffd headroom"


def test_prometheus_mode_keys_the_hostile_model_as_direct_mode_does(targets, tmp_path):
    # the same value read back from a real Prometheus: its replica and its series land on one pool
    # named by it, rendered with the rest
    plain, evil = targets
    prom = Prometheus(str(tmp_path), scrape_config({"vllm": [(f"127.0.0.1:{s.port}", None) for s in (plain, evil)]}))
    try:
        prom.wait_for('count(vllm:num_requests_running{job="vllm"}) == 2', timeout=60)
        pipeline = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=prom.url, selector='job="vllm"'))))
        try:
            pipeline.run_cycle()
            snap = pipeline.run_cycle()
        finally:
            pipeline.close()
    finally:
        prom.stop()
    assert [s.up for s in snap.sources if s.source == "prometheus"] == [True]
    pools = {p.name: p for p in snap.pools}
    assert set(pools) == {"tiny", EVIL}
    assert pools[EVIL].replicas == 1 and pools[EVIL].extra_labels == {}
    exp = Exposition()
    assert exp.update(snap)
    text = exp.body().decode("utf-8")
    assert samples(text, "headroom_replicas") == {(("pool", "tiny"),): 1.0, (("pool", EVIL),): 1.0}
    assert samples(text, "headroom_render_errors_total") == {}
