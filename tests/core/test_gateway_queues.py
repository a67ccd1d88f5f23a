"""monitor/sources/gateway_queue.py: requests waiting in front of the engines, from router bodies.

The fixtures are rendered from the components' own metric definitions (tests/fixtures/gateway/
render_queues.py, SOURCES.md); every expected number below is summed by hand from the values there.
"""
from __future__ import annotations

import importlib.util
import math
import os

import prometheus_client.metrics
import pytest

from monitor.derive.gateway_queues import pool_of_in_scope, queued_by_pool
from monitor.derive.gateway_scope import Scope
from monitor.model.readings import GatewayQueue
from monitor.sources.gateway_queue import queue_families_present, queues_from_samples, read_gateway_queues

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "gateway")
LLAMA, QWEN, SQL = "llama-3.1-8b", "qwen2.5-7b", "llama-sql-lora"
QW3, L8B = "Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct"


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def rows(result) -> dict:
    return {(q.pool_label, q.model): q for q in result}


def without(text: str, prefix: str) -> str:
    """The body without the sample / HELP / TYPE lines of the families starting with `prefix`."""
    keep = [line for line in text.splitlines()
            if not (line.startswith(prefix) or (line.startswith("#") and line.split()[2].startswith(prefix)))]
    return "\n".join(keep) + "\n"


# ---------------------------------------------------------------- llm-d router / GIE EPP

def test_llmd_router_sums_per_pool_and_model():
    result = read_gateway_queues(fixture("llm-d-router-flow-control.prom"), "llm-d")
    assert result.anomalies == {}
    by = rows(result)
    assert set(by) == {("pool-a", LLAMA), ("pool-b", QWEN)}
    a, b = by["pool-a", LLAMA], by["pool-b", QWEN]
    # pool-a: tenant-a 3 + tenant-b 2 + default-flow(-1) 4 + rewritten llama-alias 1 + drained tenant-c 0
    assert (a.queued, a.queued_bytes, a.saturation) == (10.0, 17148.0, 1.15)
    # pool-b: tenant-a 5 + tenant-b(priority 1) 1 + overflow fairness id "other" 2
    assert (b.queued, b.queued_bytes, b.saturation) == (8.0, 14300.0, 0.6)
    assert a.queued_source == b.queued_source == "llm_d_epp_flow_control_queue_size"
    assert (a.active, a.awaiting_first_token) == (None, None)
    assert result.queued_by_pool_label() == {"pool-a": 10.0, "pool-b": 8.0}
    assert result.queued_by_model() == {LLAMA: 10.0, QWEN: 8.0}


def test_llmd_dual_emitted_names_count_once_new_wins():
    text = fixture("llm-d-router-flow-control.prom")
    assert "inference_extension_flow_control_queue_size{" in text  # the router really emits both
    both = read_gateway_queues(text, "llm-d")
    new_only = read_gateway_queues(without(text, "inference_extension_"), "llm-d")
    legacy_only = read_gateway_queues(without(text, "llm_d_epp_"), "llm-d")
    assert both.queues == new_only.queues
    assert [(q.queued, q.queued_bytes, q.saturation) for q in legacy_only] == \
        [(q.queued, q.queued_bytes, q.saturation) for q in both]
    assert {q.queued_source for q in legacy_only} == {"inference_extension_flow_control_queue_size"}
    # the two spellings disagree: the new one is read, the legacy one ignored
    def bump(prefix: str) -> str:
        return "\n".join(line.replace("} 5.0", "} 50.0") if line.startswith(prefix) else line
                         for line in text.splitlines()) + "\n"
    assert rows(read_gateway_queues(bump("llm_d_epp_flow_control_queue_size{"), "llm-d"))["pool-b", QWEN].queued == 53.0
    assert rows(read_gateway_queues(bump("inference_extension_flow_control_queue_size{"), "llm-d"))[
        "pool-b", QWEN].queued == 8.0


def test_gie_v15_legacy_only():
    result = read_gateway_queues(fixture("gie-v1.5-flow-control.prom"), "llm-d")
    by = rows(result)
    assert set(by) == {("pool-a", LLAMA), ("pool-a", SQL)}
    assert (by["pool-a", LLAMA].queued, by["pool-a", LLAMA].queued_bytes) == (3.0, 4500.0)
    assert (by["pool-a", SQL].queued, by["pool-a", SQL].queued_bytes) == (3.0, 6000.0)
    assert {q.saturation for q in result} == {0.92}  # v1.5.0 saturation has no stage label
    assert {q.queued_source for q in result} == {"inference_extension_flow_control_queue_size"}
    assert result.queued_by_pool_label() == {"pool-a": 6.0}


def test_llmd_saturation_stages_and_saturation_only_pool():
    text = ('llm_d_epp_flow_control_pool_saturation{inference_pool="p",stage="prefill"} 0.4\n'
            'llm_d_epp_flow_control_pool_saturation{inference_pool="p",stage="decode"} 0.9\n'
            'llm_d_epp_flow_control_pool_saturation{inference_pool="q",stage="decode"} 1.3\n'
            'llm_d_epp_flow_control_pool_saturation{inference_pool="q",stage="prefill"} 0.2\n'
            'llm_d_epp_flow_control_pool_saturation{inference_pool="q",stage="effective"} 1.25\n')
    by = rows(read_gateway_queues(text, "llm-d"))
    assert by["p", None] == GatewayQueue("llm-d", "p", None, saturation=0.9)  # no effective: max
    assert by["q", None].saturation == 1.25  # the gating value when the body has it
    assert by["q", None].queued is None  # no queue series: unknown, not 0


# ---------------------------------------------------------------- Dynamo frontend

def test_dynamo_current_names():
    result = read_gateway_queues(fixture("dynamo-frontend.prom"), "dynamo")
    by = rows(result)
    assert set(by) == {(None, QW3), (None, L8B)}
    qw, ll = by[None, QW3], by[None, L8B]
    assert (qw.queued, qw.active, qw.awaiting_first_token) == (3.0, 12.0, 6.0)  # router queue 2+1
    assert (ll.queued, ll.active, ll.awaiting_first_token) == (2.0, 7.0, 3.0)
    assert qw.queued_source == "dynamo_frontend_router_queue_pending_requests"
    assert (qw.queued_bytes, qw.saturation) == (None, None)
    assert result.stages == {"preprocess": 1.0, "route": 5.0, "dispatch": 6.0}
    assert "dynamo_frontend_active_requests" in result.families


def test_dynamo_deprecated_names():
    result = read_gateway_queues(fixture("dynamo-frontend-legacy.prom"), "dynamo")
    by = rows(result)
    assert (by[None, QW3].active, by[None, QW3].awaiting_first_token) == (9.0, 5.0)  # inflight_requests
    assert (by[None, L8B].active, by[None, L8B].awaiting_first_token) == (4.0, 1.0)
    # queued_requests counts until the first token (prefill at the engine too): never `queued`
    assert [q.queued for q in result] == [None, None]
    assert result.stages == {}
    assert queued_by_pool(result, lambda label, model: "pool") == {}


def test_dynamo_active_preferred_over_inflight():
    text = ('dynamo_frontend_inflight_requests{model="m"} 9\n'
            'dynamo_frontend_active_requests{model="m"} 4\n')
    assert rows(read_gateway_queues(text, "dynamo"))[None, "m"].active == 4.0


def test_dynamo_stage_fallback_only_for_one_model():
    stages = ('dynamo_frontend_stage_requests{phase="",stage="preprocess"} 1\n'
              'dynamo_frontend_stage_requests{phase="aggregated",stage="route"} 2\n'
              'dynamo_frontend_stage_requests{phase="aggregated",stage="dispatch"} 3\n')
    one = rows(read_gateway_queues('dynamo_frontend_active_requests{model="m"} 6\n' + stages, "dynamo"))
    assert (one[None, "m"].queued, one[None, "m"].queued_source) == (3.0, "dynamo_frontend_stage_requests")
    two = read_gateway_queues('dynamo_frontend_active_requests{model="m"} 6\n'
                              'dynamo_frontend_active_requests{model="n"} 2\n' + stages, "dynamo")
    assert [q.queued for q in two] == [None, None]  # the stage gauge has no model label
    assert two.stages == {"preprocess": 1.0, "route": 2.0, "dispatch": 3.0}


def test_dynamo_router_queue_without_model_label():
    text = ('dynamo_frontend_router_queue_pending_requests{worker_type="prefill"} 4\n'
            'dynamo_frontend_router_queue_pending_requests{worker_type="decode"} 1\n')
    assert rows(read_gateway_queues(text, "dynamo"))[None, None].queued == 5.0


# ---------------------------------------------------------------- absent, bad, detection

def test_body_without_queue_families_gives_no_queues():
    text = ('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 7\n'
            'llm_d_epp_request_running{model_name="m",target_model_name="m",fairness_id="a",priority="0"} 3\n')
    for kind in ("llm-d", "dynamo"):
        result = read_gateway_queues(text, kind)
        assert (result.queues, result.anomalies, result.stages) == ((), {}, {})
        assert queued_by_pool(result, lambda label, model: "pool") == {}
    assert queue_families_present(text) == frozenset()
    assert read_gateway_queues("", "llm-d").queues == ()


def test_nan_and_negative_dropped_and_counted():
    labels = 'inference_pool="p",model_name="m",target_model_name="m",priority="0"'
    text = (f'llm_d_epp_flow_control_queue_size{{fairness_id="a",{labels}}} 4\n'
            f'llm_d_epp_flow_control_queue_size{{fairness_id="b",{labels}}} NaN\n'
            f'llm_d_epp_flow_control_queue_size{{fairness_id="c",{labels}}} -1\n'
            f'llm_d_epp_flow_control_queue_bytes{{fairness_id="a",{labels}}} -200\n'
            'llm_d_epp_flow_control_pool_saturation{inference_pool="p",stage="effective"} +Inf\n')
    result = read_gateway_queues(text, "llm-d")
    assert result.anomalies == {"nan:llm_d_epp_flow_control_queue_size": 1,
                                "negative:llm_d_epp_flow_control_queue_size": 1,
                                "negative:llm_d_epp_flow_control_queue_bytes": 1,
                                "infinite:llm_d_epp_flow_control_pool_saturation": 1}
    q = rows(result)["p", "m"]
    assert (q.queued, q.queued_bytes, q.saturation) == (4.0, None, None)
    dyn = read_gateway_queues('dynamo_frontend_active_requests{model="m"} NaN\n', "dynamo")
    assert (dyn.queues, dyn.anomalies) == ((), {"nan:dynamo_frontend_active_requests": 1})


def test_overflowed_model_label_is_counted():
    text = ('llm_d_epp_flow_control_queue_size{fairness_id="a",inference_pool="p",model_name="other",'
            'priority="0",target_model_name="other"} 2\n')
    result = read_gateway_queues(text, "llm-d")
    assert result.anomalies == {"label_overflow:llm_d_epp_flow_control_queue_size": 1}
    assert rows(result)["p", "other"].queued == 2.0


def test_detection_on_text_and_samples():
    assert queue_families_present(fixture("llm-d-router-flow-control.prom")) == {"llm-d"}
    assert queue_families_present(fixture("gie-v1.5-flow-control.prom")) == {"llm-d"}
    assert queue_families_present(fixture("dynamo-frontend-legacy.prom")) == {"dynamo"}
    samples = [("dynamo_frontend_stage_requests", {"stage": "route", "phase": ""}, 1.0),
               ("vllm:num_requests_waiting", {}, 3.0)]
    assert queue_families_present(samples) == {"dynamo"}
    assert rows(queues_from_samples(samples, "dynamo"))[None, None].queued == 1.0


def test_unknown_kind_and_bad_body():
    with pytest.raises(ValueError):
        read_gateway_queues("", "litellm")
    with pytest.raises(ValueError):
        read_gateway_queues('llm_d_epp_flow_control_queue_size{fairness_id="a" 1\n', "llm-d")


# ---------------------------------------------------------------- pool mapping

def test_queued_by_pool_default_mapping():
    def served(pools: dict, mapping=None):  # the pool_of of a gateway without labels, pool: or ... pools:
        return pool_of_in_scope(Scope(pools.items()), None, mapping or {})

    result = read_gateway_queues(fixture("llm-d-router-flow-control.prom"), "llm-d")
    assert queued_by_pool(result, served({"chat": LLAMA, "code": QWEN})) == \
        {"chat": 10.0, "code": 8.0}
    # the gateway pool label is checked first
    assert queued_by_pool(result, served({"chat": LLAMA, "batch": "batch-model"}, {"pool-b": "batch"})) == \
        {"chat": 10.0, "batch": 8.0}
    # a model served by two pools cannot be split: counted in neither
    assert queued_by_pool(result, served({"chat": LLAMA, "chat-2": LLAMA})) == {}
    dyn = read_gateway_queues(fixture("dynamo-frontend.prom"), "dynamo")
    assert queued_by_pool(dyn, served({"small": QW3, "big": L8B})) == {"small": 3.0, "big": 2.0}


def test_queued_by_pool_custom_mapping_and_unknown_rows():
    queues = [GatewayQueue("llm-d", "p", "a", queued=2.0), GatewayQueue("llm-d", "p", "b", queued=3.0),
              GatewayQueue("llm-d", "q", "c", queued=None, saturation=0.5),
              GatewayQueue("llm-d", "r", "d", queued=1.0)]
    seen = []

    def pool_of(label, model):
        seen.append((label, model))
        return {"p": "one", "q": "two"}.get(label)

    assert queued_by_pool(queues, pool_of) == {"one": 5.0}  # "two" unknown, "r" unmapped
    assert ("p", "a") in seen and ("r", "d") in seen


# ---------------------------------------------------------------- fixtures stay rendered

def _renderer():
    spec = importlib.util.spec_from_file_location("headroom_render_queues", os.path.join(FIXTURES, "render_queues.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixtures_up_to_date_with_renderer():
    before = prometheus_client.metrics._use_created
    rendered = _renderer().render_all()
    assert prometheus_client.metrics._use_created == before  # the process setting is restored
    assert set(rendered) == {"llm-d-router-flow-control.prom", "gie-v1.5-flow-control.prom",
                             "dynamo-frontend.prom", "dynamo-frontend-legacy.prom"}
    for name, text in rendered.items():
        assert fixture(name) == text, f"{name} is stale: run tests/fixtures/gateway/render_queues.py"
        assert "_created" not in text and not any(math.isnan(float(line.rsplit(" ", 1)[1]))
                                                  for line in text.splitlines() if line and line[0] != "#")
