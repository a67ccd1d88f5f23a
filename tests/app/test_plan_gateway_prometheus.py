"""`headroom plan --from-prometheus --gateway litellm` on LiteLLM's series alone (no application task
counters), against a real Prometheus 2.42 backfilled with promtool from the real LiteLLM 1.108.7
capture in tests/fixtures/gateway (30 agent tasks; its .truth.csv is the client-side truth).

The capture is one scrape of a fresh proxy, so the backfill holds every series at 0 until the run and
at its captured value after it (samples every 15 s over a 10 min window that the query covers
exactly): increase over the window = the captured value. Expected numbers are computed here from the
capture and the truth file, never typed in.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import time
from collections import Counter, defaultdict

import pytest

from monitor.commands import cli
from monitor.kit.exposition import parse

pytestmark = [pytest.mark.live, pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                                   reason="needs the prometheus and promtool binaries")]

GATEWAY = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gateway")
CAPTURE = os.path.join(GATEWAY, "litellm-1.108.7-agent-tasks.prom")
TRUTH = os.path.join(GATEWAY, "litellm-1.108.7-agent-tasks.truth.csv")
STEP, HALF = 15, 300  # samples every 15 s from run - 300 s to run + 300 s
FAMILIES = ("litellm_proxy_total_requests_metric_total", "litellm_input_tokens_metric_total",
            "litellm_output_tokens_metric_total", "litellm_request_total_latency_metric_sum",
            "litellm_request_total_latency_metric_count", "litellm_request_total_latency_metric_bucket")


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _openmetrics(scrape, run_at: float) -> str:
    lines = []
    for name in FAMILIES:
        lines.append(f"# TYPE {name} unknown")
        for labels, value in scrape.get(name):
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            for t in range(int(run_at) - HALF, int(run_at) + HALF + 1, STEP):
                lines.append(f"{name}{{{text}}} {value if t >= run_at else 0.0} {t}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _by_task(scrape, name: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, value in scrape.get(name):
        out[labels["metadata_task_type"]] += value
    return out


@pytest.fixture(scope="module")
def litellm_prometheus(prometheus_on_history):
    with open(CAPTURE, encoding="utf-8") as f:
        scrape = parse(f.read())
    run_at = float(int(time.time()) // 60 * 60 - 3 * 3600)  # three hours back: inside retention, one block
    prom = prometheus_on_history(_openmetrics(scrape, run_at))
    return {"url": prom.url, "at": run_at + HALF, "scrape": scrape}


def _plan(capsys, url: str, at: float, *extra: str) -> dict:
    rc = cli.main(["plan", "--from-prometheus", url, "--gateway", "litellm", "--at", str(at),
                   "--window", "10m", "--json", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def _truth() -> tuple[Counter, dict[str, float]]:
    with open(TRUTH, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    tasks = Counter(r["task_type"] for r in rows)
    calls: dict[str, float] = defaultdict(float)
    for r in rows:
        calls[r["task_type"]] += int(r["model_calls"])
    return tasks, {tt: calls[tt] / n for tt, n in tasks.items()}


def test_gateway_only_plan_counts_tasks_by_session_and_matches_the_client_truth(litellm_prometheus, capsys):
    result = _plan(capsys, litellm_prometheus["url"], litellm_prometheus["at"],
                   "--task-id-label", "metadata_session_id")
    scrape = litellm_prometheus["scrape"]
    tasks, calls_per_task = _truth()
    rows = result["base"]["task_types"]
    assert set(rows) == set(tasks) == {"policy_question", "document_summary", "search_then_email"}
    lat_sum = _by_task(scrape, "litellm_request_total_latency_metric_sum")
    lat_count = _by_task(scrape, "litellm_request_total_latency_metric_count")
    tok_in = _by_task(scrape, "litellm_input_tokens_metric_total")
    tok_out = _by_task(scrape, "litellm_output_tokens_metric_total")
    calls = _by_task(scrape, "litellm_proxy_total_requests_metric_total")
    for tt, row in rows.items():
        assert row["calls_per_task"] == pytest.approx(calls_per_task[tt], rel=1e-9), tt
        assert row["tasks_per_second"] == pytest.approx(tasks[tt] / (2 * HALF), rel=1e-9), tt
        assert row["seconds_per_call"] == pytest.approx(lat_sum[tt] / lat_count[tt], rel=1e-9), tt
        assert row["kv_tokens_per_call"] == pytest.approx((tok_in[tt] + tok_out[tt] / 2) / calls[tt], rel=1e-9)
    assert any("distinct metadata_session_id" in n for n in result["measured"])
    assert result["base"]["average_active_calls"] > 0


def test_gateway_only_plan_without_task_ids_assumes_one_call_per_task_and_says_so(litellm_prometheus, capsys):
    result = _plan(capsys, litellm_prometheus["url"], litellm_prometheus["at"])
    calls = _by_task(litellm_prometheus["scrape"], "litellm_proxy_total_requests_metric_total")
    rows = result["base"]["task_types"]
    for tt, row in rows.items():
        assert row["calls_per_task"] == 1.0
        assert row["tasks_per_second"] == pytest.approx(calls[tt] / (2 * HALF), rel=1e-9)
    assert any("calls per task = 1 ASSUMED" in n and "search_then_email" in n for n in result["measured"])
    # the table says it too
    assert cli.main(["plan", "--from-prometheus", litellm_prometheus["url"], "--at", str(litellm_prometheus["at"]),
                     "--window", "10m", "--gateway", "litellm", "--pool", "tiny"]) == 0
    table = capsys.readouterr().out
    assert "Measured: calls per task = 1 ASSUMED" in table


def test_a_mix_file_supplies_the_calls_per_task_prometheus_cannot_measure(litellm_prometheus, capsys, tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text("task_types:\n  search_then_email: {tasks_per_second: 1, calls_per_task: 4, seconds_per_call: 1}\n")
    result = _plan(capsys, litellm_prometheus["url"], litellm_prometheus["at"], "--mix", str(mix))
    calls = _by_task(litellm_prometheus["scrape"], "litellm_proxy_total_requests_metric_total")
    rows = result["base"]["task_types"]
    assert rows["search_then_email"]["calls_per_task"] == 4.0
    assert rows["search_then_email"]["tasks_per_second"] == pytest.approx(calls["search_then_email"] / 4 / (2 * HALF))
    assert rows["policy_question"]["calls_per_task"] == 1.0
    assert any("ASSUMED for document_summary, policy_question" in n for n in result["measured"])


def test_without_the_task_label_task_types_are_the_models(litellm_prometheus, capsys):
    """A proxy with no custom metadata labels: --task-label absent from every series -> by model."""
    result = _plan(capsys, litellm_prometheus["url"], litellm_prometheus["at"], "--task-label", "metadata_nothing")
    calls = sum(_by_task(litellm_prometheus["scrape"], "litellm_proxy_total_requests_metric_total").values())
    rows = result["base"]["task_types"]
    assert list(rows) == ["tiny"]
    assert rows["tiny"]["tasks_per_second"] == pytest.approx(calls / (2 * HALF), rel=1e-9)
    assert any("label metadata_nothing" in n and "models (label requested_model)" in n for n in result["measured"])


ACCEPTED = ['job="vllm",namespace=~"a|b"', ' job!="x", team!~`a.*`, ', "{job='vllm'}", 'job="a\\"b"', ""]
REFUSED = ["job=vllm", 'job="x', "foo bar", 'job="x" team="y"', 'job="x",,team="y"']


def test_the_selector_check_agrees_with_prometheus_own_parser(litellm_prometheus):
    """What check-config accepts, Prometheus 2.42 parses inside headroom's query; what it refuses,
    Prometheus refuses too (HTTP 400)."""
    import requests

    from monitor.config import ConfigError, from_dict
    from monitor.sources.prometheus import vllm_selector

    def status(q: str) -> int:
        return requests.get(litellm_prometheus["url"] + "/api/v1/query", params={"query": q}, timeout=10).status_code

    src = {"url": "http://prom:9090"}
    for sel in ACCEPTED:
        read = from_dict({"sources": {"prometheus": {**src, "selector": sel}}}, "f.yml").prometheus.selector
        assert status(vllm_selector(read)) == 200, sel
    for sel in REFUSED:
        with pytest.raises(ConfigError):
            from_dict({"sources": {"prometheus": {**src, "selector": sel}}}, "f.yml")
        assert status(vllm_selector(sel)) == 400, sel
