"""A gateway slow under load is slow, not down (monitor/sources/gateway_pace.py), through the real
cycle against real HTTP servers on loopback: an engine (the vLLM capture) and an application gateway
whose /metrics answers fast, then slowly, then after the cycle deadline, then not at all.

What must hold: an answer after global.scrape_timeout is up and counted slow; a request still
running at the deadline is not asked again and its answer is the next cycle's reading; a cycle
without an answer keeps the last reading (calls per task stays known, never null) and reports the
gateway up and slow, at most SLOW_MISSES cycles in a row, then down; a refused or failing gateway
is down at once, as before."""
from __future__ import annotations

import threading

import pytest
from bodies import vllm_body
from servers import MetricsServer, wait_for

from monitor.capacity.enrich import CapacityState
from monitor.config import Capacity, Config, GatewaySource, Target
from monitor.config.inputs import capacity_inputs, pipeline_settings
from monitor.export.collector import Exposition
from monitor.pipeline.cycle import Pipeline, cycle_deadline_seconds
from monitor.sources.gateway_pace import SLOW_MISSES, gateway_timeout

pytestmark = pytest.mark.live


class App:
    """An application's task counters that grow by 10 tasks (30 model calls) a request."""

    def __init__(self):
        self.n, self.lock = 0, threading.Lock()

    def __call__(self) -> str:
        with self.lock:
            self.n += 1
            tasks = 10 * self.n
        lab = 'task_type="draft"'
        return (f"# TYPE agent_tasks_started_total counter\nagent_tasks_started_total{{{lab}}} {tasks}\n"
                f"# TYPE agent_task_model_calls_total counter\nagent_task_model_calls_total{{{lab}}} {3 * tasks}\n"
                f"# TYPE agent_task_duration_seconds histogram\n"
                f'agent_task_duration_seconds_bucket{{{lab},le="+Inf"}} {tasks}\n'
                f"agent_task_duration_seconds_sum{{{lab}}} {2.0 * tasks}\n"
                f"agent_task_duration_seconds_count{{{lab}}} {tasks}\n")


@pytest.fixture
def servers():
    engine, gateway = MetricsServer(), MetricsServer()
    engine.bodies["/metrics"] = vllm_body("tiny")
    gateway.bodies["/metrics"] = App()
    try:
        yield engine, gateway
    finally:
        engine.stop()
        gateway.stop()


def test_the_default_gateway_timeout_fits_a_slow_gateway_within_the_cycle():
    cfg = Config(gateways=[GatewaySource(kind="litellm", url="http://gw:4000/metrics")])
    assert gateway_timeout(cfg.gateways[0], cfg.scrape_timeout, cfg.interval) == 9.0  # 60 % of the 15 s interval, over the 5 s scrape timeout
    assert cycle_deadline_seconds(pipeline_settings(cfg)) == 9.5  # the cycle waits for it, under 90 % of the interval
    own = GatewaySource(kind="litellm", url="http://gw:4000/metrics", timeout=4.0)
    assert gateway_timeout(own, cfg.scrape_timeout, cfg.interval) == 4.0
    fast = Config(interval=5.0, gateways=[GatewaySource(kind="app", url="http://gw:4000/metrics")])
    assert gateway_timeout(fast.gateways[0], fast.scrape_timeout, fast.interval) == 5.0  # never under global.scrape_timeout


def test_a_slow_gateway_is_slow_not_down_and_its_reading_is_kept(servers):
    engine, gateway = servers
    url = gateway.url("/metrics")
    # wide margins for a loaded machine: a fast answer well under scrape_timeout (1 s), a slow one well
    # between it and the cycle deadline (4.5 s), a late one well past it
    cfg = Config(vllm_targets=[Target(engine.url("/metrics"))], interval=5.0, scrape_timeout=1.0,
                 gateways=[GatewaySource(kind="app", url=url, timeout=15.0)],
                 capacity=Capacity(task_window=10.0))
    clock = [1_790_000_000.0]
    p = Pipeline(pipeline_settings(cfg), clock=lambda: clock[0], capacity=CapacityState(capacity_inputs(cfg)))

    def cycle():
        clock[0] += 5.0
        snap = p.run_cycle()
        [st] = [s for s in snap.sources if s.source == "gateway"]
        [pool] = snap.pools
        return snap, st, pool.tasks.by_type.get("draft")

    try:
        for _ in range(4):  # fast answers: the task window fills
            snap, st, draft = cycle()
            assert st.up and not st.slow and st.detail is None
        assert draft.calls_per_task == pytest.approx(3.0)
        # slower than scrape_timeout, within the gateway's own timeout: up, slow
        gateway.mode["/metrics"], gateway.slow_seconds = "slow", 2.0
        snap, st, draft = cycle()
        assert st.up and st.slow and st.detail.startswith("slow: answered in ") and "over scrape_timeout 1 s" in st.detail
        assert draft.calls_per_task == pytest.approx(3.0)
        # past the cycle deadline (4.5 s): the last reading is kept, the request goes on
        gateway.slow_seconds = 7.0
        hits = gateway.hits["/metrics"]
        snap, st, draft = cycle()
        assert st.up and st.slow and "no answer within the cycle deadline" in st.detail and "is kept" in st.detail
        assert draft is not None and draft.calls_per_task == pytest.approx(3.0)  # not null
        gateway.mode["/metrics"] = "ok"
        wait_for(lambda: p.aux.pace.running.get(0) and p.aux.pace.running[0][0].done(), timeout=30,
                 what="the late request's answer")
        snap, st, draft = cycle()  # its answer is this cycle's reading: no second request
        assert gateway.hits["/metrics"] == hits + 1
        assert st.up and st.slow and "after the cycle deadline (read this cycle)" in st.detail
        assert draft.calls_per_task == pytest.approx(3.0)
        body = Exposition()
        body.update(snap)
        text = body.body().decode()
        assert f'headroom_source_slow_total{{source="gateway",target="{url}"}} 3.0' in text
        assert f'headroom_source_up{{source="gateway",target="{url}"}} 1.0' in text
        assert f'headroom_source_duration_seconds{{source="gateway",target="{url}"}}' in text
        # a gateway that stops answering: slow while its reading is kept, then down
        gateway.mode["/metrics"], gateway.slow_seconds = "slow", 60.0
        for miss in range(1, SLOW_MISSES + 1):
            snap, st, draft = cycle()
            assert st.up and st.slow and f"missed {miss} of at most {SLOW_MISSES}" in st.detail
        snap, st, draft = cycle()
        # down: the request still running at this deadline, or (a slow cycle) ended by its own timeout
        assert not st.up and st.error in ("deadline", "timeout") and draft is None
    finally:
        p.close()


def test_a_failing_gateway_is_down_at_once(servers):
    engine, gateway = servers
    cfg = Config(vllm_targets=[Target(engine.url("/metrics"))], interval=1.0, scrape_timeout=0.5,
                 gateways=[GatewaySource(kind="app", url=gateway.url("/metrics"))], capacity=Capacity(task_window=2.0))
    p = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
    try:
        snap = p.run_cycle()
        assert [s.up for s in snap.sources if s.source == "gateway"] == [True]
        gateway.mode["/metrics"] = "down"  # 503: broken, not slow
        snap = p.run_cycle()
        [st] = [s for s in snap.sources if s.source == "gateway"]
        assert not st.up and not st.slow and st.error.startswith("http")
    finally:
        p.close()
