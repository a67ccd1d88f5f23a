"""`promtool check metrics` is clean on headroom's /metrics body of a busy simulated fleet.

The fleet (lab/headroom_lab/sim, on loopback: vLLM replicas, an Envoy AI Gateway, the application's task
metrics, DCGM) and the real Pipeline with its capacity layer follow one injected clock, advanced a
cycle at a time, so every family is filled (engine, task and call latency quantiles, knee, SLOs,
power). The body is what the daemon serves (monitor/export/collector.py `Exposition`). Before the
quantile label was renamed `q`, promtool refused the latency gauges (exit 3: a `quantile` label is
reserved for summaries)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from headroom_lab.sim.server import start_fleet
from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo_settings import read_slos
from monitor.config import Capacity, Config, GatewaySource, PoolSettings, Target
from monitor.config.inputs import capacity_inputs, pipeline_settings
from monitor.export.collector import Exposition
from monitor.pipeline.cycle import Pipeline

SMALL, LARGE = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"  # the default fleet's pools
pytestmark = pytest.mark.live  # tests/tiers.py: starts a simulated fleet on loopback and promtool


@pytest.fixture()
def busy_body():
    wall = [1_790_000_000.0]
    fleet = start_fleet(None, "steady", seed=3, warmup_s=120, clock=lambda: wall[0])
    try:
        cfg = Config(vllm_targets=[Target(u) for urls in fleet.replica_urls.values() for u in urls],
                     gateways=[GatewaySource(kind="envoy", url=fleet.gateway_url),
                               GatewaySource(kind="app", url=fleet.app_url)],
                     dcgm_targets=[Target(fleet.dcgm_url)], interval=15.0, latency_window=60.0,
                     pools={"*": PoolSettings(max_num_seqs=64)},
                     capacity=Capacity(task_pools={"policy_question": SMALL, "document_summary": SMALL,
                                                   "search_then_email": LARGE, "nightly_batch": LARGE}),
                     slos=read_slos({"windows": ["1m", "5m"]}))
        pipe = Pipeline(pipeline_settings(cfg), clock=lambda: wall[0], capacity=CapacityState(capacity_inputs(cfg)))
        exposition = Exposition()
        try:
            for _ in range(6):
                wall[0] += 15.0
                snap = pipe.run_cycle(wait_seconds=20.0)
                exposition.update(snap)
        finally:
            pipe.close()
        yield exposition.body().decode()
    finally:
        fleet.stop()


def test_promtool_check_metrics_is_clean_on_a_busy_fleets_body(busy_body):
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not installed (Debian package prometheus)"
    # the body is busy: every latency family is there, with its quantiles under `q`
    for name in ("headroom_latency_seconds", "headroom_task_latency_seconds", "headroom_call_latency_seconds"):
        lines = [line for line in busy_body.splitlines() if line.startswith(name + "{")]
        assert lines, f"{name} is not in the body"
        assert all('q="' in line and "quantile=" not in line for line in lines)
    res = subprocess.run([promtool, "check", "metrics"], input=busy_body, capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout + res.stderr) == (0, "")
