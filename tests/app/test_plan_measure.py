"""plan's measure_mix against a stand-in query function (unit): the PromQL it sends per gateway kind
and the arithmetic from the answers. The proof on real series is tests/app/test_plan_gateway_prometheus.py."""
from __future__ import annotations

import pytest

from monitor.commands.plan import measure_mix


def _answers(table: dict[str, list]):
    sent = []

    def query(q: str) -> list:
        sent.append(q)
        return table.get(q, [])
    return query, sent


def test_envoy_counts_calls_from_the_latency_histogram_and_reads_tokens_by_type():
    lab = "task_type"
    table = {
        "sum by (task_type) (rate(gen_ai_server_request_duration_seconds_sum[1h]))": [({lab: "ask"}, 6.0)],
        "sum by (task_type) (rate(gen_ai_server_request_duration_seconds_count[1h]))": [({lab: "ask"}, 2.0)],
        'sum by (task_type) (rate(gen_ai_client_token_usage_sum{gen_ai_token_type="input"}[1h]))': [({lab: "ask"}, 2000.0)],
        'sum by (task_type) (rate(gen_ai_client_token_usage_sum{gen_ai_token_type="output"}[1h]))': [({lab: "ask"}, 400.0)],
    }
    query, sent = _answers(table)
    tasks, notes = measure_mix(query, "1h", "envoy")
    assert tasks == {"ask": {"tasks_per_second": 2.0, "calls_per_task": 1.0, "seconds_per_call": 3.0,
                             "kv_tokens_per_call": (2000 + 200) / 2.0}}
    assert any("calls per task = 1 ASSUMED for ask" in n for n in notes)
    assert "sum by (task_type) (rate(agent_tasks_started_total[1h]))" in sent


def test_llm_d_task_ids_count_tasks_and_the_window_divides_them():
    lab, idl = "fairness_id", "x_task"
    table = {
        "sum by (fairness_id) (rate(llm_d_epp_request_total[30m]))": [({lab: "triage"}, 0.4)],
        "sum by (fairness_id) (rate(llm_d_epp_request_duration_seconds_sum[30m]))": [({lab: "triage"}, 0.8)],
        "sum by (fairness_id) (rate(llm_d_epp_request_duration_seconds_count[30m]))": [({lab: "triage"}, 0.4)],
        f"count by (fairness_id) (count by (fairness_id, {idl}) (increase(llm_d_epp_request_total[30m]) > 0))":
            [({lab: "triage"}, 180.0)],
    }
    query, _ = _answers(table)
    tasks, notes = measure_mix(query, "30m", "llm-d", task_id_label=idl)
    # 180 tasks in 1800 s = 0.1 tasks/s; 0.4 calls/s / 0.1 = 4 calls per task; 0.8 / 0.4 = 2 s per call
    assert tasks["triage"]["tasks_per_second"] == pytest.approx(0.1)
    assert tasks["triage"]["calls_per_task"] == pytest.approx(4.0)
    assert tasks["triage"]["seconds_per_call"] == pytest.approx(2.0)
    assert "kv_tokens_per_call" not in tasks["triage"]
    assert any("distinct x_task values in the 30m window" in n for n in notes)


def test_application_counters_win_and_nothing_found_is_a_clear_error():
    table = {
        "sum by (task_type) (rate(agent_tasks_started_total[1h]))": [({"task_type": "a"}, 0.5)],
        "sum by (task_type) (rate(agent_task_model_calls_total[1h]))": [({"task_type": "a"}, 1.5)],
        "sum by (metadata_task_type) (rate(litellm_request_total_latency_metric_sum[1h]))": [({"metadata_task_type": "a"}, 3.0)],
        "sum by (metadata_task_type) (rate(litellm_request_total_latency_metric_count[1h]))": [({"metadata_task_type": "a"}, 1.5)],
    }
    tasks, notes = measure_mix(_answers(table)[0], "1h", "litellm")
    assert tasks["a"]["calls_per_task"] == pytest.approx(3.0) and tasks["a"]["seconds_per_call"] == pytest.approx(2.0)
    assert notes == ["tasks/s from agent_tasks_started_total; calls per task from agent_task_model_calls_total for a"]
    with pytest.raises(ValueError, match="neither agent_tasks_started_total nor litellm gateway call series"):
        measure_mix(_answers({})[0], "1h", "litellm")
    with pytest.raises(ValueError, match="--window '1x'"):
        measure_mix(_answers({"sum by (metadata_task_type) (rate(litellm_proxy_total_requests_metric_total[1x]))":
                              [({"metadata_task_type": "a"}, 1.0)],
                              "count by (metadata_task_type) (count by (metadata_task_type, s) (increase("
                              "litellm_proxy_total_requests_metric_total[1x]) > 0))": [({"metadata_task_type": "a"}, 1.0)]
                              })[0], "1x", "litellm", task_id_label="s")
