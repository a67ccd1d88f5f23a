"""Replica churn cannot grow what a cycle keeps: everything held per replica, instance, pool or gateway
is forgotten once unseen for global.forget_after (the readings themselves after global.history_keep).

The fleet: every 15 s cycle a new replica appears, in a pool of its own, answers 4 cycles, is reported
down once and is never seen again. 200 cycles (50 min); forget_after 300 s = 20 cycles, history_keep
120 s = 8 cycles. Each count below is worked out by hand from those numbers."""
from __future__ import annotations

from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo_settings import read_slos
from monitor.config import Config, GatewaySource, Target
from monitor.config.inputs import capacity_inputs, step_settings
from monitor.derive.lead_time import LeadTimes
from monitor.export.landing import Trends
from monitor.model import Histogram, PoolSnapshot, ReplicaReading, Snapshot, SourceStatus
from monitor.sources.gateway import GatewayConfig, GatewayScrape
from monitor.sources.gateway_schema import GatewayReading
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

T0 = 1_790_000_000.0
STEP = 15.0
LIFE = 4  # cycles a replica answers
CYCLES = 200


def reading(i: int, t: float, age: int) -> ReplicaReading:
    done = 10.0 * age
    hist = Histogram((0.1, 1.0, float("inf")), (done / 2, done, done), sum=done * 0.3, count=done)
    return ReplicaReading(target=f"http://r{i}:8000/metrics", model=f"m{i}", timestamp=t, running=2.0, waiting=0.0,
                          kv_usage=0.25, counters={"request_success": done},
                          histograms={"e2e": hist, "queue": hist, "ttft": hist})


def inputs(n: int) -> CycleInputs:
    t = T0 + n * STEP
    alive = [i for i in range(max(0, n - LIFE + 1), n + 1)]
    readings = [reading(i, t, n - i) for i in alive]
    statuses = [SourceStatus("vllm", r.target, True) for r in readings]
    if n >= LIFE:  # the replica that just left is down once, then gone from the configuration
        statuses.append(SourceStatus("vllm", f"http://r{n - LIFE}:8000/metrics", False, "connect"))
    return CycleInputs(readings, statuses)


def churned_state() -> CycleState:
    cfg = Config(vllm_targets=[Target("http://r0:8000/metrics")], interval=STEP, latency_window=60.0,
                 history_keep=120.0, forget_after=300.0,
                 slos=read_slos({"windows": ["1m", "5m"],
                                 "pools": {f"m{i}": {"ttft_p95_seconds": 0.5} for i in range(2 * CYCLES)}}))
    state = CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg)))
    for n in range(CYCLES):
        state, _snap = step(state, inputs(n), T0 + n * STEP)
    return state


def test_every_holder_keeps_only_what_was_seen_within_forget_after():
    state = churned_state()
    n = CYCLES - 1
    # readings: replica i answered last at cycle i+3; kept while that is within 8 cycles -> i >= n-11
    assert sorted(state.history) == sorted(f"http://r{i}:8000/metrics|m{i}" for i in range(n - 11, n + 1))
    # replicas and pools seen within 20 cycles: last reading at cycle i+3 >= n-20 -> i >= n-23: 24
    assert len(state.lead_times.seen) == 24 and min(state.lead_times.seen) == f"http://r{n - 23}:8000/metrics|m{n - 23}"
    assert len(state.lead_times.pool_seen) == 24
    assert len(state.capacity.seen) == 23  # observed from its second reading on: not the newest replica
    # pools are derived (fresh or stale) until their readings go, cycle i+11; assessed then -> i >= n-31
    assert len(state.capacity.knees) == 32 and len(state.capacity.pool_seen) == 32
    assert len(state.capacity.tracker) == 32  # one pool SLO window per assessed pool
    # last fresh: cycle i+3, and kept for the pools still derived -> i >= n-23
    assert sorted(state.last_fresh) == sorted(f"m{i}" for i in range(n - 23, n + 1))
    # down once at cycle i+4 (<= n) and within 20 cycles -> n-24 <= i <= n-4: 21
    assert len(state.down) == 21 == len(state.down_seen)
    assert ("vllm", f"http://r{n - 24}:8000/metrics") in state.down
    assert ("vllm", f"http://r{n - 25}:8000/metrics") not in state.down


def test_a_long_run_holds_no_more_than_a_short_one():
    """The counts are the same after 200 cycles as after the first forget_after period has passed:
    nothing grows with the number of replicas ever seen."""
    state = churned_state()
    sizes = (len(state.history), len(state.lead_times.seen), len(state.capacity.knees), len(state.down),
             len(state.last_fresh), len(state.capacity.tracker))
    more = state
    for n in range(CYCLES, CYCLES + 40):
        more, _ = step(more, inputs(n), T0 + n * STEP)
    assert (len(more.history), len(more.lead_times.seen), len(more.capacity.knees), len(more.down),
            len(more.last_fresh), len(more.capacity.tracker)) == sizes


def test_a_pool_seen_again_keeps_its_state_and_a_forgotten_one_starts_over():
    lt = LeadTimes()
    r = ReplicaReading(target="a", model="m", timestamp=T0, counters={"request_success": 1.0})
    lt.observe([r], "model_name", first_cycle=True)
    lt.measured["m"] = 30.0
    lt.expire(T0 - 1)
    assert lt.measured == {"m": 30.0} and lt.seen == {"a|m": T0}
    lt.expire(T0 + 1)
    assert lt.measured == {} and lt.seen == {} and lt.pool_seen == {}


def test_gateway_readings_are_forgotten_with_their_pool():
    from monitor.capacity.tasks import TaskWindow
    cfg = Config(vllm_targets=[Target("http://a/metrics")], gateways=[GatewaySource(kind="app", url="http://g")])
    cap = CapacityState(capacity_inputs(cfg))
    for key, t in (((0, "old"), T0), ((0, "new"), T0 + 600)):
        cap.gateway_windows[key] = TaskWindow(300.0)
        cap.gateway_windows[key].add(GatewayReading("app", t))
    cap.gateway_windows[(0, "empty")] = TaskWindow(300.0)
    cap.expire(T0 + 1)
    assert list(cap.gateway_windows) == [(0, "new")]
    assert GatewayScrape(0, "http://g", None, GatewayConfig(kind="app"), T0).reading is None


def test_the_landing_chart_forgets_pools_gone_longer_than_it_shows():
    trends = Trends(keep_seconds=600.0)
    for n in range(100):  # a new pool every minute, each in one snapshot only
        t = T0 + 60.0 * n
        trends.add(Snapshot(timestamp=t, pools=[PoolSnapshot(pool=f"p{n}", model="m", replicas=1, active_requests=1.0)]))
    # pools whose one point is at most 600 s old: minutes 89..99
    assert sorted(trends.points) == sorted(f"p{n}" for n in range(89, 100))


class OneInstancePerCall:
    """A query API stub (a unit test of the reader's bookkeeping alone): each instant query of cycle
    n answers instance i{n}'s running-requests series, and `up` for it."""

    def __init__(self):
        self.n = 0

    def query(self, query, at=None, deadline=None, warnings=None, stamps=None, max_bytes=None):
        inst = f"i{self.n}"
        if query.startswith('{__name__="up"'):
            return [({"__name__": "up", "instance": inst}, 1.0)]
        return [({"__name__": "vllm:num_requests_running", "instance": inst, "model_name": "m"}, 1.0)]


def test_prometheus_mode_forgets_instances_unseen_for_forget_after():
    from monitor.config import PrometheusSource
    from monitor.sources.prometheus_reader import PrometheusSourceReader
    client = OneInstancePerCall()
    reader = PrometheusSourceReader(PrometheusSource(url="http://prom:9090"), client=client, forget_after=300.0)
    for n in range(100):
        client.n = n
        readings, statuses, _ = reader.read(now=T0 + n * STEP)
        assert [r.target for r in readings] == [f"i{n}"]
    # seen within 300 s (20 cycles of 15 s): i79..i99
    assert sorted(reader.known) == sorted(f"i{n}" for n in range(79, 100))


def test_a_forgotten_pool_takes_its_steady_prior_and_its_burn_window_pools_with_it():
    cfg = Config(vllm_targets=[Target("http://a/metrics")])
    cap = CapacityState(capacity_inputs(cfg))
    from monitor.capacity.knee import SteadyPrior
    cap.priors["gone"], cap.priors["here"] = SteadyPrior(None), SteadyPrior(None)
    cap.pool_seen.update({"gone": T0, "here": T0 + 600})
    cap.slo_task_pools = {"ask": {"gone": T0, "here": T0 + 600}, "old": {"gone": T0}}
    cap.expire(T0 + 1)
    assert list(cap.priors) == ["here"]
    assert cap.slo_task_pools == {"ask": {"here": T0 + 600}}
