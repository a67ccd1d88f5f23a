"""headroom_replica_lead_time_seconds measured: a replica first seen after start-up is timed from its
first successful scrape to the first cycle its completed-request counter moved; a configured lead
time wins; replicas present at start-up, or without the counter, are not measured."""
from monitor.config import Config, PoolSettings, Target
from monitor.config.inputs import step_settings
from monitor.model import ReplicaReading, SourceStatus
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

T0 = 1_790_000_000.0


def reading(target: str, t: float, done, model: str = "m") -> ReplicaReading:
    counters = {"request_success": done} if done is not None else {}
    return ReplicaReading(target=target, model=model, timestamp=t, running=2.0, waiting=0.0, counters=counters)


def run(cycles, cfg):
    state = CycleState(step_settings(cfg))
    snap = None
    for t, readings in cycles:
        state, snap = step(state, CycleInputs(readings=readings, statuses=[SourceStatus("vllm", r.target, True)
                                                                            for r in readings]), t)
    return snap


def test_a_new_replica_is_timed_to_its_first_completion():
    cfg = Config(vllm_targets=[Target("http://a/metrics"), Target("http://b/metrics")])
    cycles = [(T0, [reading("a", T0, 5.0)]),  # a: present at start-up, never measured
              (T0 + 15, [reading("a", T0 + 15, 9.0), reading("b", T0 + 15, 0.0)]),  # b appears
              (T0 + 30, [reading("a", T0 + 30, 12.0), reading("b", T0 + 30, 0.0)]),
              (T0 + 45, [reading("a", T0 + 45, 15.0), reading("b", T0 + 45, 3.0)])]  # b completes
    (pool,) = run(cycles[:3], cfg).pools
    assert pool.replica_lead_time_seconds is None and pool.replica_lead_time_source is None
    (pool,) = run(cycles, cfg).pools
    assert (pool.replica_lead_time_seconds, pool.replica_lead_time_source) == (30.0, "measured")


def test_configured_wins_and_no_counter_is_not_measured():
    cycles = [(T0, [reading("a", T0, 5.0)]),
              (T0 + 15, [reading("a", T0 + 15, 9.0), reading("b", T0 + 15, None)]),
              (T0 + 30, [reading("a", T0 + 30, 12.0), reading("b", T0 + 30, None)])]
    (pool,) = run(cycles, Config(vllm_targets=[Target("http://a/metrics")])).pools
    assert pool.replica_lead_time_seconds is None
    cfg = Config(vllm_targets=[Target("http://a/metrics")], pools={"m": PoolSettings(replica_lead_time=600.0)})
    (pool,) = run(cycles, cfg).pools
    assert (pool.replica_lead_time_seconds, pool.replica_lead_time_source) == (600.0, "configured")
