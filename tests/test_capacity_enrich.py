"""The capacity enricher inside the real Pipeline.build (derivation, enrichers, exporter samples),
fed by the simulated fleet's own /metrics texts (vLLM, Envoy-style gateway, app, DCGM)."""
from __future__ import annotations

import pytest

from monitor.capacity.enrich import CapacityEnricher, make_enricher
from monitor.config import Config, GatewaySource, PoolSettings, Target
from monitor.cycle import Pipeline
from monitor.export.samples import snapshot_samples
from monitor.sim.exposition import render_app, render_dcgm, render_gateway, render_vllm
from monitor.sim.fleet import Fleet, config_from_dict, theoretical_knee
from monitor.sources.vllm import readings_from_text

LEVELS = [4, 8, 12, 16, 18, 20, 22, 24, 26, 4, 4, 6, 10, 14, 18, 22, 26, 28, 4, 4]


def sim_config():
    return config_from_dict({
        "seed": 1,
        "pools": {"p": {"model_name": "m", "replicas": 2, "max_num_seqs": 16, "num_gpu_blocks": 4096,
                        "block_size": 16, "enable_prefix_caching": False, "max_model_len": 4096}},
        "gateway": {"session_label": False, "task_type_label": True},
        "mix": {"task_types": {
            "ask": {"pool": "p", "rate_per_s": 0.75, "steps": [
                {"calls": 1, "prompt": {"mean": 600, "cv": 0.3, "max": 2000}, "output": {"mean": 120, "cv": 0.5, "max": 1000}}]},
            "agent": {"pool": "p", "rate_per_s": 0.0625, "steps": [
                {"calls": 2, "prompt": {"mean": 600, "cv": 0.3, "max": 2000}, "output": {"mean": 120, "cv": 0.5, "max": 1000},
                 "tool_wait_s": 0.5},
                {"calls": 1, "prompt": {"mean": 600, "cv": 0.3, "max": 2000}, "output": {"mean": 120, "cv": 0.5, "max": 1000}}]},
        }},
    })


def test_enricher_in_the_pipeline_learns_the_knee_and_exports_catalogue_samples():
    sim = sim_config()
    fleet = Fleet(sim, "steady", seed=1, start_time=1_000_000.0)
    urls = {r.name: f"http://{r.name}:8000/metrics" for r in fleet.pools["p"]}
    gw, app = GatewaySource(kind="envoy", url="http://gateway:1064/metrics"), GatewaySource(kind="app", url="http://app/metrics")
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()], gateways=[gw, app],
                 pools={"m": PoolSettings(max_num_seqs=16, watts_per_replica=700.0)},
                 capacity={"knee_signal": "queue", "task_classes": {"agent": "batch"}},
                 slos={"task_types": {"ask": {"p95_seconds": 5}, "agent": {"p90_seconds": 30}},
                       "windows": ["1m", "5m"], "pools": {"m": {"ttft_p95_seconds": 0.5}}})
    pipeline = Pipeline(cfg, clock=lambda: fleet.t, enrichers=[make_enricher(cfg)])
    snaps = []
    for level in LEVELS:
        fleet.sp["level"] = level
        for _ in range(6):
            fleet.advance(5.0)
            t = fleet.t
            readings = [readings_from_text(render_vllm(r, t), urls[r.name], t)[0] for r in fleet.pools["p"]]
            pipeline.gateway_texts = [(gw, render_gateway(fleet, t)), (app, render_app(fleet, t))]
            pipeline.dcgm_texts = [("http://dcgm:9400/metrics", render_dcgm(fleet, t))]
            snaps.append(pipeline.build(readings, [], t))
    assert not [k for k in pipeline.errors if k[0] == "enricher"], pipeline.errors
    first, last = snaps[0].pools[0], snaps[-1].pools[0]
    truth = theoretical_knee(sim.pools[0], sim.mix)
    # the first cycle answers with the prior, labelled
    assert first.capacity["knee_info"] == {"source": "prior", "signal": "limits"}
    assert first.capacity["knee_requests"] == 32.0
    cap = last.capacity
    assert cap["knee_info"] == {"source": "learned", "signal": "queue"}
    assert cap["knee_requests"] == pytest.approx(truth["pool"], rel=0.10)
    assert cap["power_source"] == "dcgm" and cap["power_watts"] > 0
    tasks = last.tasks
    assert tasks["ask"]["calls_per_task"] == pytest.approx(1.0)
    assert tasks["agent"]["calls_per_task"] >= 3.0  # 3 calls, more with retries
    assert tasks["ask"]["calls_per_task_source"] == "app"
    assert set(tasks["ask"]["slo_burn_rate"]) == {"1m", "5m"}
    assert "pool:ttft" in tasks and tasks["pool:ttft"]["slo_burn_rate"]["5m"] is not None
    assert set(tasks["_call_latency_by_class"]) == {"interactive", "batch"}
    # every sample goes through the exporter's catalogue check (labels and names)
    samples = snapshot_samples(snaps[-1])
    for name in ("headroom_knee_requests", "headroom_ratio", "headroom_capacity_requests", "headroom_knee_info",
                 "headroom_task_calls_per_task", "headroom_task_latency_seconds", "headroom_call_latency_seconds",
                 "headroom_slo_burn_rate", "headroom_slo_violation_ratio", "headroom_power_watts"):
        assert name in samples, name
    assert {lab["scenario"] for lab, _ in samples["headroom_ratio"]} == {"current", "n_minus_1"}
    knee_sample = [v for lab, v in samples["headroom_knee_requests"] if lab["pool"] == "m"]
    assert knee_sample == [cap["knee_requests"]]


def test_bad_capacity_section_is_named():
    with pytest.raises(ValueError, match="unknown key"):
        CapacityEnricher(Config(capacity={"knee_signl": "ttft"}))
    with pytest.raises(ValueError, match="knee_signal"):
        CapacityEnricher(Config(capacity={"knee_signal": "latency"}))
