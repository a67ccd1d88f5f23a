"""The capacity layer inside the cycle's pure step (derivation, capacity, exporter samples), fed
the simulated fleet's own /metrics texts (vLLM, Envoy-style gateway, app, DCGM) parsed as
`collect` parses them."""
from __future__ import annotations

import pytest

from monitor.capacity.enrich import CapacityState
from monitor.config import Capacity, Config, GatewaySource, PoolSettings, Target
from monitor.config.slo import read_slos
from monitor.cycle import CycleInputs, CycleState, step
from monitor.export.samples import snapshot_samples
from headroom_lab.sim.exposition import render_app, render_dcgm, render_gateway, render_vllm
from headroom_lab.sim.fleet import Fleet, config_from_dict, theoretical_knee
from monitor.sources.dcgm import read_dcgm
from monitor.sources.gateway import read_gateway_scrape
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


def test_capacity_in_the_cycle_step_learns_the_knee_and_exports_catalogue_samples():
    sim = sim_config()
    fleet = Fleet(sim, "steady", seed=1, start_time=1_000_000.0)
    urls = {r.name: f"http://{r.name}:8000/metrics" for r in fleet.pools["p"]}
    gw, app = GatewaySource(kind="envoy", url="http://gateway:1064/metrics"), GatewaySource(kind="app", url="http://app/metrics")
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()], gateways=[gw, app],
                 pools={"m": PoolSettings(max_num_seqs=16, watts_per_replica=700.0)},
                 capacity=Capacity(knee_signal="queue", task_classes={"agent": "batch"}),
                 slos=read_slos({"task_types": {"ask": {"p95_seconds": 5}, "agent": {"p90_seconds": 30}},
                                 "windows": ["1m", "5m"], "pools": {"m": {"ttft_p95_seconds": 0.5}}}))
    capacity = CapacityState(cfg)
    state = CycleState(cfg, capacity)
    gateways = [(i, src, capacity.gateway_config(src.kind, src.task_label, src.session_label))
                for i, src in enumerate(cfg.gateways)]
    snaps = []
    for level in LEVELS:
        fleet.sp["level"] = level
        for _ in range(6):
            fleet.advance(5.0)
            t = fleet.t
            readings = [readings_from_text(render_vllm(r, t), urls[r.name], t)[0] for r in fleet.pools["p"]]
            bodies = [render_gateway(fleet, t), render_app(fleet, t)]
            inputs = CycleInputs(readings, [], dcgm=[read_dcgm(render_dcgm(fleet, t), "http://dcgm:9400/metrics")],
                                 gateways=[read_gateway_scrape(body, gcfg, t, i, src.url, src.pool)
                                           for (i, src, gcfg), body in zip(gateways, bodies)])
            state, snap = step(state, inputs, t)
            snaps.append(snap)
    assert not [k for k in state.errors if k[0] == "enricher"], state.errors
    first, last = snaps[0].pools[0], snaps[-1].pools[0]
    truth = theoretical_knee(sim.pools[0], sim.mix)
    # the first cycle answers with the prior, labelled
    assert (first.capacity.knee_source, first.capacity.knee_signal) == ("prior", "limits")
    assert first.capacity.knee_requests == 32.0
    cap = last.capacity
    assert (cap.knee_source, cap.knee_signal) == ("learned", "queue")
    assert cap.knee_requests == pytest.approx(truth["pool"], rel=0.10)
    assert cap.power_source == "dcgm" and cap.power_watts > 0
    tasks = last.tasks.by_type
    assert tasks["ask"].calls_per_task == pytest.approx(1.0)
    assert tasks["agent"].calls_per_task >= 3.0  # 3 calls, more with retries
    assert tasks["ask"].calls_per_task_source == "app"
    assert set(tasks["ask"].slo_burn_rate) == {"1m", "5m"}
    assert "pool:ttft" in last.tasks.slos and last.tasks.slos["pool:ttft"].slo_burn_rate["5m"] is not None
    assert set(last.tasks.call_latency_by_class) == {"interactive", "batch"}
    # the JSON document keeps its shape: task types, pool SLOs and call classes side by side
    doc = last.tasks.as_dict()
    assert doc["ask"]["calls_per_task"] == tasks["ask"].calls_per_task and "pool:ttft" in doc
    assert set(doc["_call_latency_by_class"]) == {"interactive", "batch"}
    assert last.capacity.as_dict()["knee_info"] == {"source": "learned", "signal": "queue"}
    # every sample goes through the exporter's catalogue check (labels and names)
    samples = snapshot_samples(snaps[-1])
    for name in ("headroom_knee_requests", "headroom_ratio", "headroom_capacity_requests", "headroom_knee_info",
                 "headroom_task_calls_per_task", "headroom_task_latency_seconds", "headroom_call_latency_seconds",
                 "headroom_slo_burn_rate", "headroom_slo_violation_ratio", "headroom_power_watts"):
        assert name in samples, name
    assert {lab["scenario"] for lab, _ in samples["headroom_ratio"]} == {"current", "n_minus_1"}
    knee_sample = [v for lab, v in samples["headroom_knee_requests"] if lab["pool"] == "m"]
    assert knee_sample == [cap.knee_requests]
    burn = {(lab["task_type"], lab["window"]): v for lab, v in samples["headroom_slo_burn_rate"]}
    assert burn[("pool:ttft", "5m")] == last.tasks.slos["pool:ttft"].slo_burn_rate["5m"]


