"""The capacity layer inside the cycle's pure step (derivation, capacity, exporter samples), fed
the simulated fleet's own /metrics texts (vLLM, Envoy-style gateway, app, DCGM) parsed as
`collect` parses them."""
from __future__ import annotations

import pytest
from simfleet import TASK_LABELS, calls, cycle_inputs, one_pool, task, watched

from headroom_lab.sim.fleet import Fleet, theoretical_knee
from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo_settings import read_slos
from monitor.config import Capacity
from monitor.config.inputs import capacity_inputs, step_settings
from monitor.export.samples import snapshot_samples
from monitor.step.cycle_state import CycleState
from monitor.step.cycle_step import step

LEVELS = [4, 8, 12, 16, 18, 20, 22, 24, 26, 4, 4, 6, 10, 14, 18, 22, 26, 28, 4, 4]


def sim_config():
    return one_pool(1, {"ask": task(0.75), "agent": task(0.0625, calls(2, tool_wait_s=0.5), calls(1))},
                    gateway=TASK_LABELS)


def test_capacity_in_the_cycle_step_learns_the_knee_and_exports_catalogue_samples():
    sim = sim_config()
    fleet = Fleet(sim, "steady", seed=1, start_time=1_000_000.0)
    urls, cfg = watched(fleet, Capacity(knee_signal="queue", task_classes={"agent": "batch"}),
                        read_slos({"task_types": {"ask": {"p95_seconds": 5}, "agent": {"p90_seconds": 30}},
                                   "windows": ["1m", "5m"], "pools": {"m": {"ttft_p95_seconds": 0.5}}}))
    capacity = CapacityState(capacity_inputs(cfg))
    state = CycleState(step_settings(cfg), capacity)
    snaps = []
    for level in LEVELS:
        fleet.sp["level"] = level
        for _ in range(6):
            fleet.advance(5.0)
            t = fleet.t
            inputs = cycle_inputs(fleet, urls, cfg, capacity)
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
    assert {lab["scenario"] for lab, _ in samples["headroom_ratio"]} == {"current", "n_minus_1", "instant"}
    knee_sample = [v for lab, v in samples["headroom_knee_requests"] if lab["pool"] == "m"]
    assert knee_sample == [cap.knee_requests]
    burn = {(lab["task_type"], lab["window"]): v for lab, v in samples["headroom_slo_burn_rate"]}
    assert burn[("pool:ttft", "5m")] == last.tasks.slos["pool:ttft"].slo_burn_rate["5m"]
    # the objective beside each violation ratio (HeadroomLatencyOverTarget compares the two)
    objective = {lab["task_type"]: v for lab, v in samples["headroom_slo_objective_ratio"]}
    violated = {lab["task_type"] for lab, _ in samples["headroom_slo_violation_ratio"]}
    assert set(objective) == violated and objective["pool:ttft"] == last.tasks.slos["pool:ttft"].slo_objective


