"""One gateway (no `pool:`) in front of two pools: each pool gets the task numbers of its own model.

`collect` reads the gateway body once and, because the cycle's replicas fall in two pools, also per
model (`GatewayScrape.by_model`, monitor/model/readings.py); the pure step hands each pool the reading of
its model, and never parses anything. The models come from this cycle's replica readings and the
replicas the state keeps (a replica that did not answer still makes its pool).
"""
from __future__ import annotations

import pytest
from bodies import vllm_body
from servers import MetricsServer
from tiers import starts_servers

from monitor.capacity.enrich import CapacityState
from monitor.config import Capacity, Config, GatewaySource, Target
from monitor.config.inputs import capacity_inputs, pipeline_settings, step_settings
from monitor.pipeline.cycle import Pipeline
from monitor.sources.gateway import read_gateway_scrape
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

A, B = "a-8b", "b-70b"
T0, WINDOW = 1_790_000_000.0, 10.0
# chat calls per model at the two cycles: over the window pool A made 10, pool B 2 (the whole gateway 12)
CALLS = [{A: 7, B: 3}, {A: 17, B: 5}]


def litellm_body(calls: dict[str, int]) -> str:
    lines = ["# TYPE litellm_proxy_total_requests_metric_total counter"]
    lines += [f'litellm_proxy_total_requests_metric_total{{metadata_task_type="chat",requested_model="{m}"}} {n}'
              for m, n in calls.items()]
    return "\n".join(lines) + "\n"


def config(urls: list[str], gateway: str) -> Config:
    return Config(vllm_targets=[Target(u) for u in urls], gateways=[GatewaySource(kind="litellm", url=gateway)],
                  capacity=Capacity(task_window=WINDOW))


def chat_calls(snapshot) -> dict[str, float]:
    return {p.pool: p.tasks.by_type["chat"].calls for p in snapshot.pools if "chat" in p.tasks.by_type}


def test_step_gives_each_pool_the_reading_of_its_model():
    cfg = config(["http://a:8000/metrics", "http://b:8000/metrics"], "http://gw/metrics")
    capacity = CapacityState(capacity_inputs(cfg))
    gcfg = capacity.gateway_config("litellm", None, None)
    state = CycleState(step_settings(cfg), capacity)
    for i, t in enumerate((T0, T0 + WINDOW)):
        readings = [r for url, m in (("http://a:8000/metrics", A), ("http://b:8000/metrics", B))
                    for r in readings_from_text(vllm_body(m), url, t)]
        scrape = read_gateway_scrape(litellm_body(CALLS[i]), gcfg, t, 0, "http://gw/metrics", None, models=(A, B))
        assert scrape.reading.tasks["chat"].calls == sum(CALLS[i].values())
        assert {m: r.tasks["chat"].calls for m, r in scrape.by_model.items()} == CALLS[i]
        state, snap = step(state, CycleInputs(readings, [], gateways=[scrape]), t)
    assert chat_calls(snap) == {A: 10.0, B: 2.0}
    # a model the cycle did not read per model: that pool gets nothing from this gateway, never the whole reading
    t = T0 + 2 * WINDOW
    readings = [r for url, m in (("http://a:8000/metrics", A), ("http://b:8000/metrics", B))
                for r in readings_from_text(vllm_body(m), url, t)]
    scrape = read_gateway_scrape(litellm_body({A: 20, B: 6}), gcfg, t, 0, "http://gw/metrics", None, models=(A,))
    state, snap = step(state, CycleInputs(readings, [], gateways=[scrape]), t)
    assert chat_calls(snap) == {A: 3.0}


@pytest.fixture
@starts_servers
def two_pool_servers():
    servers = {A: MetricsServer(), B: MetricsServer()}
    for model, server in servers.items():
        server.bodies["/metrics"] = vllm_body(model)
    gateway = MetricsServer()
    yield servers, gateway
    for server in (*servers.values(), gateway):
        server.stop()


def test_collect_reads_the_gateway_per_model_of_the_cycles_pools(two_pool_servers):
    servers, gateway = two_pool_servers
    cfg = config([s.url("/metrics") for s in servers.values()], gateway.url("/metrics"))
    now = [T0]
    pipeline = Pipeline(pipeline_settings(cfg), clock=lambda: now[0], capacity=CapacityState(capacity_inputs(cfg)))
    try:
        gateway.bodies["/metrics"] = litellm_body(CALLS[0])
        inputs = pipeline.collect(now[0])
        [scrape] = inputs.gateways
        assert {m: r.tasks["chat"].calls for m, r in scrape.by_model.items()} == CALLS[0]
        pipeline.advance(inputs, now[0])
        # the next cycle B's replica does not answer: its pool is stale, still known from the state,
        # and still given its model's series
        servers[B].mode["/metrics"] = "down"
        gateway.bodies["/metrics"] = litellm_body(CALLS[1])
        now[0] = T0 + WINDOW
        snap = pipeline.run_cycle()
    finally:
        pipeline.close()
    assert [s.up for s in snap.sources if s.source == "vllm"].count(False) == 1
    assert {p.pool: p.stale for p in snap.pools} == {A: False, B: True}
    assert chat_calls(snap) == {A: 10.0, B: 2.0}


def test_one_pool_takes_the_whole_reading_and_nothing_is_read_per_model(two_pool_servers):
    servers, gateway = two_pool_servers
    cfg = config([servers[A].url("/metrics")], gateway.url("/metrics"))
    pipeline = Pipeline(pipeline_settings(cfg), clock=lambda: T0, capacity=CapacityState(capacity_inputs(cfg)))
    try:
        gateway.bodies["/metrics"] = litellm_body(CALLS[0])
        [scrape] = pipeline.collect(T0).gateways
    finally:
        pipeline.close()
    assert scrape.by_model == {} and scrape.reading.tasks["chat"].calls == 10.0
