"""Gateway parsing: the real LiteLLM capture against its client-side truth, Envoy and llm-d text."""
from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from monitor.capacity.slo_settings import read_slos
from monitor.capacity.tasks import call_latency_by_class, derive_tasks
from monitor.derive import histogram as histo
from monitor.sources.gateway import UNATTRIBUTED, GatewayConfig, read_gateway, read_gateway_scrape

FIX = Path(__file__).parents[1] / "fixtures" / "gateway"
CAPTURE = FIX / "litellm-1.108.7-agent-tasks.prom"
TRUTH = FIX / "litellm-1.108.7-agent-tasks.truth.csv"
# tool waits between calls in that run (SOURCES.md): document_summary 0.1 s, search_then_email 0.3 s
TOOL_WAIT = {"policy_question": 0.0, "document_summary": 0.1, "search_then_email": 0.3}
# the capture was taken with metadata.session_id as a label (SOURCES.md); no default reads it any more
CAPTURED = GatewayConfig(kind="litellm", session_label="metadata_session_id")
ENVOY_SESSIONS = GatewayConfig(kind="envoy", session_label="session_id")


@pytest.fixture(scope="module")
def truth():
    with TRUTH.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def capture():
    return read_gateway(CAPTURE.read_text(), CAPTURED, timestamp=1000.0)


def test_litellm_tasks_and_calls_per_task_exact(capture, truth):
    tasks = Counter(r["task_type"] for r in truth)
    calls = Counter()
    for r in truth:
        calls[r["task_type"]] += int(r["model_calls"])
    assert set(capture.tasks) == set(tasks)
    derived = derive_tasks(capture, None, CAPTURED)
    for tt in tasks:
        assert capture.tasks[tt].tasks == tasks[tt]
        assert capture.tasks[tt].calls == calls[tt]
        assert derived[tt].tasks == tasks[tt]
        assert derived[tt].calls_per_task == calls[tt] / tasks[tt]
        assert derived[tt].calls_per_task_source == "gateway/session_label"
    # hand-known from the run: 1, 2 and 4 calls per task
    assert derived["policy_question"].calls_per_task == 1
    assert derived["document_summary"].calls_per_task == 2
    assert derived["search_then_email"].calls_per_task == 4
    assert capture.in_flight == 1.0
    assert capture.dropped_sessions == 0


def test_litellm_sessions_counted_per_task_type(capture, truth):
    for tt in TOOL_WAIT:
        sids = {r["session_id"] for r in truth if r["task_type"] == tt}
        assert set(capture.tasks[tt].session_calls) == sids
        for r in truth:
            if r["task_type"] == tt:
                assert capture.tasks[tt].session_calls[r["session_id"]] == int(r["model_calls"])


def test_litellm_single_call_quantiles_within_one_bucket_of_client(capture, truth):
    # policy_question is one call and no tool wait: the client time is the per-call time
    client = np.array([float(r["client_seconds"]) for r in truth if r["task_type"] == "policy_question"])
    h = capture.tasks["policy_question"].call_latency
    assert histo.total(h) == len(client)
    for q in (0.5, 0.9, 0.95):
        est = histo.quantile(h, q)
        exact = float(np.quantile(client, q))
        assert abs(histo.bucket_index(h.bounds, est) - histo.bucket_index(h.bounds, exact)) <= 1, (q, est, exact)


def test_litellm_mean_call_latency_matches_client(capture, truth):
    for tt, wait in TOOL_WAIT.items():
        rows = [r for r in truth if r["task_type"] == tt]
        n_calls = sum(int(r["model_calls"]) for r in rows)
        busy = sum(float(r["client_seconds"]) - (int(r["model_calls"]) - 1) * wait for r in rows)
        client_mean = busy / n_calls
        h = capture.tasks[tt].call_latency
        assert h.count == n_calls
        gateway_mean = h.sum / h.count
        # the client adds its own HTTP time; the gateway's mean must be just under it
        assert gateway_mean <= client_mean
        assert gateway_mean == pytest.approx(client_mean, rel=0.10), tt
        # upstream (vLLM) time is a part of the gateway time
        up = capture.tasks[tt].upstream_latency
        assert up.count == n_calls and up.sum < h.sum


def test_litellm_tokens_per_call(capture):
    d = derive_tasks(capture, None, CAPTURED)
    # output tokens per call fixed by the run: 24, 96 / 2 calls, 64 / 4 calls -> at most those
    assert d["policy_question"].output_tokens_per_call == pytest.approx(24.0)
    assert 0 < d["document_summary"].output_tokens_per_call <= 96
    assert 0 < d["search_then_email"].output_tokens_per_call <= 64


def test_litellm_end_user_as_session_label(truth):
    cfg = GatewayConfig(kind="litellm", session_label="end_user")
    r = read_gateway(CAPTURE.read_text(), cfg, 0.0)
    users = {s for t in r.tasks.values() for s in t.session_calls}
    assert users and all(u.startswith("emp-") for u in users)
    # end users run many tasks, so tasks counted by distinct end user are fewer than the truth
    assert sum(t.tasks for t in r.tasks.values()) < len(truth)


def test_session_cap_counts_dropped():
    cfg = GatewayConfig(kind="litellm", session_label="metadata_session_id", max_sessions=2)
    r = read_gateway(CAPTURE.read_text(), cfg, 0.0)
    assert all(len(t.session_calls) <= 2 for t in r.tasks.values())
    assert r.dropped_sessions > 0


def test_model_filter_drops_other_models():
    r = read_gateway(CAPTURE.read_text(), GatewayConfig(kind="litellm", models=("other",)), 0.0)
    assert all(t.calls == 0 and t.call_latency is None for t in r.tasks.values())
    r = read_gateway(CAPTURE.read_text(), GatewayConfig(kind="litellm", models=("tiny",)), 0.0)
    assert sum(t.calls for t in r.tasks.values()) == 62


def test_classes_from_config(capture):
    cfg = GatewayConfig(kind="litellm", task_classes={"document_summary": "batch"})
    r = read_gateway(CAPTURE.read_text(), cfg, 0.0)
    by_class = call_latency_by_class(r, None)
    assert set(by_class) == {"interactive", "batch"}
    assert by_class["batch"].count == 22
    assert by_class["interactive"].count == 12 + 28


# --- Envoy AI Gateway (OTel Prometheus exporter), header-mapped task_type and session_id

ENVOY_BOUNDS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]


def _envoy_hist(name, labels, values):
    lines = []
    for b in ENVOY_BOUNDS + [math.inf]:
        le = "+Inf" if math.isinf(b) else repr(b)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {sum(1 for v in values if v <= b)}')
    lines.append(f"{name}_sum{{{labels}}} {sum(values)}")
    lines.append(f"{name}_count{{{labels}}} {len(values)}")
    return lines


def _envoy_text(sessions):
    base = ('gen_ai_operation_name="chat",gen_ai_original_model="llama-3-8b",gen_ai_provider_name="openai",'
            'gen_ai_request_model="llama-3-8b",gen_ai_response_model="llama-3-8b",'
            'otel_scope_name="envoyproxy/ai-gateway",otel_scope_schema_url="",otel_scope_version=""')
    lines = ["# HELP target_info Target metadata", "# TYPE target_info gauge",
             'target_info{service_name="ai-gateway-extproc"} 1',
             "# HELP gen_ai_server_request_duration_seconds Time to last byte",
             "# TYPE gen_ai_server_request_duration_seconds histogram"]
    for sid, task, durations in sessions:
        lines += _envoy_hist("gen_ai_server_request_duration_seconds",
                             f'{base},session_id="{sid}",task_type="{task}"', durations)
    lines += ["# HELP gen_ai_client_token_usage Number of tokens", "# TYPE gen_ai_client_token_usage histogram"]
    for sid, task, durations in sessions:
        for kind, per_call in (("input", 500), ("output", 50)):
            lines += _envoy_hist("gen_ai_client_token_usage",
                                 f'{base},gen_ai_token_type="{kind}",session_id="{sid}",task_type="{task}"',
                                 [per_call] * len(durations))
    return "\n".join(lines) + "\n"


def test_envoy_header_labels():
    sessions = [("a", "triage", [0.3, 0.5, 0.7]), ("b", "triage", [0.2, 0.4, 0.6]), ("c", "draft", [1.5, 2.5])]
    r = read_gateway(_envoy_text(sessions), ENVOY_SESSIONS, 10.0)
    assert set(r.tasks) == {"triage", "draft"}
    assert r.tasks["triage"].calls == 6 and r.tasks["triage"].tasks == 2
    assert r.tasks["draft"].calls == 2 and r.tasks["draft"].tasks == 1
    assert r.tasks["triage"].input_tokens == 6 * 500 and r.tasks["draft"].output_tokens == 2 * 50
    h = r.tasks["triage"].call_latency
    assert h.count == 6 and h.sum == pytest.approx(2.7)
    assert 0.32 < histo.quantile(h, 0.5) <= 0.64  # true median 0.45
    d = derive_tasks(r, None, ENVOY_SESSIONS)
    assert d["triage"].calls_per_task == 3 and d["draft"].calls_per_task == 2


def test_envoy_two_readings_give_rates_and_window_sessions():
    cfg = ENVOY_SESSIONS
    s1 = [("a", "triage", [0.3]), ("b", "triage", [0.2])]
    s2 = [("a", "triage", [0.3, 0.5]), ("b", "triage", [0.2]), ("c", "triage", [0.4, 0.4, 0.4])]
    r1 = read_gateway(_envoy_text(s1), cfg, 100.0)
    r2 = read_gateway(_envoy_text(s2), cfg, 110.0)
    d = derive_tasks(r2, r1, cfg)["triage"]
    assert d.calls == 4 and d.call_rate == pytest.approx(0.4)
    assert d.tasks == 1 and d.arrival_rate == pytest.approx(0.1)
    assert d.sessions == 2  # a and c moved, b did not
    with pytest.raises(ValueError, match="out of order"):
        derive_tasks(r1, r2, cfg)


# --- llm-d router: fairness_id carries the task type

LLMD = """# HELP llm_d_epp_request_total [ALPHA] Counter of inference requests.
# TYPE llm_d_epp_request_total counter
llm_d_epp_request_total{fairness_id="summarise",model_name="qwen",priority="0",target_model_name="qwen"} 40
llm_d_epp_request_total{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen"} 60
llm_d_epp_request_total{fairness_id="chat",model_name="other",priority="0",target_model_name="other"} 7
# HELP llm_d_epp_request_error_total [ALPHA] Errors.
# TYPE llm_d_epp_request_error_total counter
llm_d_epp_request_error_total{error_code="Internal",fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen"} 3
# HELP llm_d_epp_request_duration_seconds [ALPHA] Duration.
# TYPE llm_d_epp_request_duration_seconds histogram
llm_d_epp_request_duration_seconds_bucket{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen",le="0.5"} 30
llm_d_epp_request_duration_seconds_bucket{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen",le="1"} 54
llm_d_epp_request_duration_seconds_bucket{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen",le="+Inf"} 60
llm_d_epp_request_duration_seconds_sum{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen"} 40
llm_d_epp_request_duration_seconds_count{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen"} 60
llm_d_epp_request_duration_seconds_bucket{model_name="qwen",priority="0",target_model_name="qwen",le="0.5"} 1
llm_d_epp_request_duration_seconds_bucket{model_name="qwen",priority="0",target_model_name="qwen",le="1"} 1
llm_d_epp_request_duration_seconds_bucket{model_name="qwen",priority="0",target_model_name="qwen",le="+Inf"} 1
llm_d_epp_request_duration_seconds_sum{model_name="qwen",priority="0",target_model_name="qwen"} 0.2
llm_d_epp_request_duration_seconds_count{model_name="qwen",priority="0",target_model_name="qwen"} 1
# HELP llm_d_epp_request_running [ALPHA] Running.
# TYPE llm_d_epp_request_running gauge
llm_d_epp_request_running{fairness_id="chat",model_name="qwen",priority="0",target_model_name="qwen"} 5
# HELP agent_tasks_started_total Tasks started.
# TYPE agent_tasks_started_total counter
agent_tasks_started_total{task_type="chat"} 20
agent_tasks_started_total{task_type="summarise"} 10
"""


def test_llmd_fairness_id_and_app_task_counter():
    cfg = GatewayConfig(kind="llm-d", models=("qwen",))
    r = read_gateway(LLMD, cfg, 0.0)
    assert r.tasks["chat"].calls == 60 and r.tasks["chat"].failed_calls == 3
    assert r.tasks["summarise"].calls == 40
    assert r.in_flight == 5
    assert UNATTRIBUTED in r.tasks and histo.total(r.tasks[UNATTRIBUTED].call_latency) == 1
    # the chat p90 falls in the (0.5, 1] bucket: rank 54 is its top
    assert histo.quantile(r.tasks["chat"].call_latency, 0.9) == pytest.approx(1.0)
    d = derive_tasks(r, None, cfg)
    assert d["chat"].calls_per_task == 3 and d["chat"].calls_per_task_source == "gateway_calls/app_tasks"
    assert d["summarise"].calls_per_task == 4


# --- the application-side convention

def _app_text(started, calls, durations, sessions, bounds=(1, 2, 5, 10, 30, 60)):
    lines = ["# TYPE agent_tasks_started_total counter", "# TYPE agent_task_model_calls_total counter",
             "# TYPE agent_sessions_active gauge", "# TYPE agent_task_duration_seconds histogram"]
    for tt in started:
        lines.append(f'agent_tasks_started_total{{task_type="{tt}"}} {started[tt]}')
        lines.append(f'agent_task_model_calls_total{{task_type="{tt}"}} {calls[tt]}')
        lines.append(f'agent_sessions_active{{task_type="{tt}"}} {sessions[tt]}')
        for b in list(bounds) + ["+Inf"]:
            n = sum(1 for v in durations[tt] if b == "+Inf" or v <= b)
            lines.append(f'agent_task_duration_seconds_bucket{{task_type="{tt}",le="{b}"}} {n}')
        lines.append(f'agent_task_duration_seconds_sum{{task_type="{tt}"}} {sum(durations[tt])}')
        lines.append(f'agent_task_duration_seconds_count{{task_type="{tt}"}} {len(durations[tt])}')
    return "\n".join(lines) + "\n"


def test_app_convention_slo_and_rates():
    cfg = GatewayConfig(kind="app")
    slo = read_slos({"task_types": {"email": {"p95_seconds": 5}}})
    old = read_gateway(_app_text({"email": 10}, {"email": 30}, {"email": [1.5] * 10}, {"email": 3}), cfg, 0.0)
    new_d = [1.5] * 10 + [0.5] * 16 + [7.0] * 4  # 20 more tasks, 4 of them over 5 s
    new = read_gateway(_app_text({"email": 30}, {"email": 90}, {"email": new_d}, {"email": 4}), cfg, 60.0)
    d = derive_tasks(new, old, cfg, slo)["email"]
    assert d.tasks == 20 and d.arrival_rate == pytest.approx(20 / 60)
    assert d.calls_per_task == 3 and d.calls_per_task_source == "app"
    assert d.sessions == 4 and d.sessions_source == "app"
    assert d.slo_violation_ratio == pytest.approx(4 / 20)
    assert d.task_latency.count == 20
    assert 5 < d.task_latency.p95 <= 10


def test_tasks_completed_are_the_duration_histograms_count_not_the_tasks_started():
    # an overload: 44 tasks started in the minute, 27 completed (the task-duration histogram's count)
    cfg = GatewayConfig(kind="app")
    old = read_gateway(_app_text({"draft": 10}, {"draft": 30}, {"draft": [1.5] * 10}, {"draft": 20}), cfg, 0.0)
    new = read_gateway(_app_text({"draft": 54}, {"draft": 111}, {"draft": [1.5] * 10 + [9.0] * 27},
                                 {"draft": 20}), cfg, 60.0)
    d = derive_tasks(new, old, cfg)["draft"]
    assert d.tasks == 44 and d.arrival_rate == pytest.approx(44 / 60)
    assert d.completed_tasks == 27 and d.completion_rate == pytest.approx(27 / 60)
    assert derive_tasks(new, None, cfg)["draft"].completion_rate is None  # one reading: no window


def test_app_counters_reset_count_the_new_values_as_promql_increase_does():
    # the application restarted between the readings: every counter and the histogram went down;
    # the window's tasks, calls and latencies are those since the restart (monitor/derive/counters.py)
    cfg = GatewayConfig(kind="app")
    old = read_gateway(_app_text({"email": 50}, {"email": 150}, {"email": [1.5] * 50}, {"email": 3}), cfg, 0.0)
    new = read_gateway(_app_text({"email": 6}, {"email": 18}, {"email": [0.5] * 6}, {"email": 2}), cfg, 60.0)
    d = derive_tasks(new, old, cfg)["email"]
    assert d.tasks == 6 and d.arrival_rate == pytest.approx(6 / 60)
    assert d.calls == 18 and d.calls_per_task == 3 and d.completed_tasks == 6
    assert d.task_latency.count == 6 and d.task_latency.p95 <= 1


def test_scrape_parses_once_and_reads_per_model():
    text = LITELLM_TWO_MODELS
    cfg = GatewayConfig(kind="litellm")
    scrape = read_gateway_scrape(text, cfg, 5.0, index=2, url="http://gw/metrics", models=("a-8b", "b-70b"))
    assert scrape.reading is not None and scrape.error is None and scrape.index == 2
    whole = read_gateway(text, cfg, 5.0)
    assert {tt: t.calls for tt, t in scrape.reading.tasks.items()} == {tt: t.calls for tt, t in whole.tasks.items()}
    for model, calls in (("a-8b", 7.0), ("b-70b", 3.0)):
        per_model = scrape.for_model(model)
        assert per_model.tasks["chat"].calls == calls
        assert per_model.tasks["chat"].calls == read_gateway(text, scrape.model_config(model), 5.0).tasks["chat"].calls
    broken = read_gateway_scrape("litellm_proxy_total_requests_metric_total{", cfg, 5.0)
    assert broken.reading is None and "does not parse" in broken.error
    assert read_gateway_scrape(None, cfg, 5.0).reading is None  # no body this cycle
    assert read_gateway_scrape(text, cfg, 5.0).for_model("a-8b") is None  # a model the cycle did not read


LITELLM_TWO_MODELS = """# TYPE litellm_proxy_total_requests_metric_total counter
litellm_proxy_total_requests_metric_total{metadata_task_type="chat",requested_model="a-8b"} 7
litellm_proxy_total_requests_metric_total{metadata_task_type="chat",requested_model="b-70b"} 3
"""


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="kind 'kong'"):
        GatewayConfig(kind="kong")
    with pytest.raises(ValueError, match="does not parse"):
        read_gateway('litellm_proxy_total_requests_metric_total{a="b" 1\n', GatewayConfig(), 0.0)
