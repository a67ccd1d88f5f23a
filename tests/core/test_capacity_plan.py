"""`headroom plan`: a hand-computed mix gives the hand-computed numbers; the mix measured in a real
Prometheus (backfilled with promtool) gives the same plan."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from monitor.capacity.mix import parse_mix
from monitor.capacity.task_plan import evaluate, plan, poisson_quantile
from monitor.commands import cli
from monitor.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]

# Hand-computed mix:
#   email_triage:    1 task/s x 4 calls = 4 calls/s x 2.5 s = 10 active calls x 3 000 KV = 30 000 KV
#   policy_question: 0.5 task/s x 1    = 0.5 calls/s x 2 s = 1 active call   x 1 000 KV =  1 000 KV
#   average 11 active calls, 31 000 KV tokens (2 818.18 per call)
#   busy period 1.5 x 11 = 16.5; knee 6 x (1 - 0.25) = 4.5 usable per replica -> ceil(3.67) = 4
#   KV 16.5 x 2 818.18 = 46 500 / (20 000 x 0.75 = 15 000) = 3.1 -> 4; needed 4, N-1 5
#   4 replicas today: capacity 24, headroom 1 - 16.5 / 24 = 0.3125, fits
#   burst x2: busy 33 -> knee ceil(7.33) = 8, KV 93 000 / 15 000 -> 7; needed 8, headroom -0.375
#   1 replica lost: 3 replicas, capacity 18, headroom 1 - 16.5 / 18 = 0.0833, does not fit (4 needed)
#   policy_question x3: average 13, busy 19.5 -> knee ceil(4.33) = 5; KV 49 500 / 15 000 -> 4; needed 5
HAND = {
    "pool": "chat",
    "replicas": 4,
    "knee_requests_per_replica": 6,
    "kv_capacity_tokens_per_replica": 20000,
    "margin": 0.25,
    "busy_period": {"method": "peak_to_mean", "peak_to_mean": 1.5},
    "task_types": {
        "email_triage": {"tasks_per_hour": 3600, "calls_per_task": 4, "seconds_per_call": 2.5,
                         "kv_tokens_per_call": 3000},
        "policy_question": {"tasks_per_second": 0.5, "calls_per_task": 1, "seconds_per_call": 2.0,
                            "kv_tokens_per_call": 1000},
    },
    "what_if": {"burst": [2], "replicas_lost": [1], "growth": {"policy_question": 3}},
}

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def check_hand_numbers(result: dict) -> None:
    base = result["base"]
    assert base["task_types"]["email_triage"]["calls_per_second"] == pytest.approx(4.0)
    assert base["task_types"]["email_triage"]["average_active_calls"] == pytest.approx(10.0)
    assert base["task_types"]["email_triage"]["average_kv_tokens"] == pytest.approx(30000)
    assert base["task_types"]["policy_question"]["average_active_calls"] == pytest.approx(1.0)
    assert base["average_active_calls"] == pytest.approx(11.0)
    assert base["average_kv_tokens"] == pytest.approx(31000)
    assert base["busy_period_active_calls"] == pytest.approx(16.5)
    assert base["busy_period_kv_tokens"] == pytest.approx(46500)
    assert base["usable_requests_per_replica"] == pytest.approx(4.5)
    assert base["replicas_needed_for_knee"] == 4 and base["replicas_needed_for_kv"] == 4
    assert base["replicas_needed"] == 4 and base["replicas_needed_n_minus_1"] == 5
    assert base["headroom_ratio"] == pytest.approx(0.3125) and base["fits"] is True
    by = {s["name"]: s for s in result["what_if"]}
    assert set(by) == {"burst x2", "1 replica lost", "policy_question x3"}
    assert by["burst x2"]["replicas_needed_for_knee"] == 8 and by["burst x2"]["replicas_needed_for_kv"] == 7
    assert by["burst x2"]["replicas_needed"] == 8
    assert by["burst x2"]["headroom_ratio"] == pytest.approx(-0.375) and by["burst x2"]["fits"] is False
    assert by["1 replica lost"]["replicas"] == 3
    assert by["1 replica lost"]["headroom_ratio"] == pytest.approx(1 - 16.5 / 18)
    assert by["1 replica lost"]["fits"] is False
    assert by["policy_question x3"]["average_active_calls"] == pytest.approx(13.0)
    assert by["policy_question x3"]["replicas_needed"] == 5
    assert by["policy_question x3"]["replicas_needed_for_kv"] == 4


def test_plan_on_hand_computed_mix():
    check_hand_numbers(plan(parse_mix(HAND)))


def test_cli_json_and_table(tmp_path, capsys):
    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump(HAND))
    assert cli.main(["plan", "--mix", str(mix), "--json"]) == 0
    check_hand_numbers(json.loads(capsys.readouterr().out))
    assert cli.main(["plan", "--mix", str(mix)]) == 0
    table = capsys.readouterr().out
    assert "Replicas needed: 4 (knee 4, KV 4); with one spare for N-1: 5" in table
    assert "averages, not peak limits" in table
    assert "burst x2" in table and "-0.38" in table


def test_poisson_busy_period():
    # Poisson(11): P(X <= 18) = 0.9823, P(X <= 19) = 0.9907 -> the 0.99 quantile is 19
    assert poisson_quantile(11, 0.99) == 19
    assert poisson_quantile(11, 0.98) == 18
    assert poisson_quantile(0, 0.99) == 0
    big = poisson_quantile(10_000, 0.99)  # ~ mean + 2.326 sd = 10 232.6
    assert 10_230 <= big <= 10_236
    mix = parse_mix({**HAND, "busy_period": {"method": "poisson", "quantile": 0.99}})
    r = evaluate(mix, replicas=4)
    assert r["busy_period_active_calls"] == 19
    assert r["replicas_needed_for_knee"] == math.ceil(19 / 4.5)


def test_example_mix_runs_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "monitor", "plan", "--mix", str(ROOT / "examples" / "mix.yaml"),
                          "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["base"]["average_active_calls"] == pytest.approx(2.5 * 3.2 + 2 * 5.5 + 1 * 2.8)
    assert r["base"]["replicas_needed"] >= 1


@pytest.mark.parametrize("bad, where, message", [
    ({**HAND, "task_types": {}}, "task_types", "must map at least one task type"),
    ({**HAND, "margin": 1.2}, "margin", "must be < 1"),
    ({**HAND, "extra": 1}, "extra", "unknown key"),
    ({**HAND, "task_types": {"x": {"tasks_per_hour": 5, "calls_per_task": 1}}}, "task_types.x.seconds_per_call",
     "required"),
    ({**HAND, "task_types": {"x": {"tasks_per_hour": 5, "tasks_per_second": 1, "calls_per_task": 1,
                                   "seconds_per_call": 1}}}, "task_types.x", "exactly one of"),
    ({**HAND, "task_types": {"x": {"tasks_per_hour": "many", "calls_per_task": 1, "seconds_per_call": 1}}},
     "task_types.x.tasks_per_hour", "expected a number"),
    ({**HAND, "busy_period": {"method": "erlang"}}, "busy_period.method", "expected one of poisson, peak_to_mean"),
    ({**HAND, "busy_period": {"quantile": 1}}, "busy_period.quantile", "must be < 1"),
    ({**HAND, "what_if": {"growth": {"nope": 2}}}, "what_if.growth.nope", "'nope' is not in task_types"),
    ({**HAND, "what_if": {"burst": [0]}}, "what_if.burst[0]", "must be > 0"),
    ({k: v for k, v in HAND.items() if k != "replicas"} | {"what_if": {"replicas_lost": [1]}},
     "what_if.replicas_lost", "needs replicas"),
])
def test_bad_mix_is_named(bad, where, message):
    with pytest.raises(ConfigError) as e:
        parse_mix(bad, "mix.yaml")
    assert (e.value.file, e.value.key) == ("mix.yaml", where)
    assert message in e.value.problem


def test_cli_errors(tmp_path, capsys):
    assert cli.main(["plan"]) == 2
    assert "--mix FILE or --from-prometheus" in capsys.readouterr().err
    assert cli.main(["plan", "--mix", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**HAND, "margin": -1}))
    assert cli.main(["plan", "--mix", str(bad)]) == 2
    assert f"{bad}: margin: must be >= 0" in capsys.readouterr().err
    from servers import free_port  # a port nobody listens on
    assert cli.main(["plan", "--from-prometheus", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "cannot measure the mix" in capsys.readouterr().err


# --- the mix measured in a real Prometheus (backfilled with promtool, queried at a fixed time)

def _openmetrics(end: float) -> str:
    step, n = 15, 241  # one hour of samples every 15 s, ending at `end`
    series = {
        # name, type, labels, increase per second
        "agent_tasks_started": ("counter", [('task_type="email_triage"', 1.0), ('task_type="policy_question"', 0.5)]),
        "agent_task_model_calls": ("counter", [('task_type="email_triage"', 4.0), ('task_type="policy_question"', 0.5)]),
        "litellm_proxy_total_requests_metric": ("counter", [('metadata_task_type="email_triage"', 4.0),
                                                            ('metadata_task_type="policy_question"', 0.5)]),
        "litellm_input_tokens_metric": ("counter", [('metadata_task_type="email_triage"', 4.0 * 2800),
                                                    ('metadata_task_type="policy_question"', 0.5 * 900)]),
        "litellm_output_tokens_metric": ("counter", [('metadata_task_type="email_triage"', 4.0 * 400),
                                                     ('metadata_task_type="policy_question"', 0.5 * 200)]),
        "litellm_request_total_latency_metric_sum": ("unknown", [('metadata_task_type="email_triage"', 4.0 * 2.5),
                                                                 ('metadata_task_type="policy_question"', 0.5 * 2.0)]),
        "litellm_request_total_latency_metric_count": ("unknown", [('metadata_task_type="email_triage"', 4.0),
                                                                   ('metadata_task_type="policy_question"', 0.5)]),
        "headroom_knee_requests": ("gauge", [('pool="chat"', None)]),
        "headroom_replicas": ("gauge", [('pool="chat"', None)]),
    }
    gauges = {"headroom_knee_requests": 24.0, "headroom_replicas": 4.0}
    lines = []
    start = end - step * (n - 1)
    for name, (typ, items) in series.items():
        lines.append(f"# TYPE {name} {typ}")
        sample = name + ("_total" if typ == "counter" else "")
        for labels, per_s in items:
            for i in range(n):
                t = start + i * step
                v = gauges[name] if per_s is None else 1000.0 + per_s * (t - start)
                lines.append(f"{sample}{{{labels}}} {v} {t:.0f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def test_from_prometheus_measures_the_mix(prometheus_on_history, tmp_path, capsys):
    end = float(int(time.time()) // 60 * 60 - 3 * 3600)  # three hours back, inside retention
    prom = prometheus_on_history(_openmetrics(end))
    try:
        rest = {k: v for k, v in HAND.items() if k not in ("task_types", "knee_requests_per_replica", "replicas")}
        rest["task_types"] = {"placeholder": {"tasks_per_second": 1, "calls_per_task": 1, "seconds_per_call": 1}}
        mix = tmp_path / "rest.yaml"
        mix.write_text(yaml.safe_dump(rest))
        rc = cli.main(["plan", "--mix", str(mix), "--from-prometheus", prom.url, "--at", str(end),
                       "--window", "30m", "--pool", "chat", "--json"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        result = json.loads(out.out)
    finally:
        prom.stop()
    assert set(result["base"]["task_types"]) == {"email_triage", "policy_question"}
    et = result["base"]["task_types"]["email_triage"]
    assert et["tasks_per_second"] == pytest.approx(1.0, rel=1e-6)
    assert et["calls_per_task"] == pytest.approx(4.0, rel=1e-6)
    assert et["seconds_per_call"] == pytest.approx(2.5, rel=1e-6)
    assert et["kv_tokens_per_call"] == pytest.approx(2800 + 400 / 2, rel=1e-6)
    assert result["inputs"]["knee_requests_per_replica"] == pytest.approx(6.0)
    assert result["inputs"]["replicas"] == 4
    check_hand_numbers(result)


def test_the_table_escapes_control_characters_in_names(tmp_path, capsys):
    # issue 38: a task type named with an escape sequence cleared the terminal that printed the plan
    hostile = dict(HAND)
    types = dict(HAND["task_types"])
    first = next(iter(types))
    types["\x1b[2J\x1b[Hwipe\u202e\r"] = types.pop(first)
    hostile["task_types"] = types
    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump(hostile, allow_unicode=True))
    assert cli.main(["plan", "--mix", str(mix)]) == 0
    table = capsys.readouterr().out
    assert "\x1b" not in table and "\r" not in table and "\u202e" not in table
    assert "\\x1b[2J\\x1b[Hwipe\\u202e\\r" in table
    assert "Replicas needed: 4 (knee 4, KV 4)" in table  # the numbers are the same


def test_once_fit_escapes_control_characters_in_pool_labels():
    import io

    from monitor.commands.once import print_fit
    from monitor.model import Capacity, PoolSnapshot, Scenarios, Snapshot
    from monitor.model.poolkey import make_key
    p = PoolSnapshot(pool=make_key("m\x1b[2J", {"cluster": "a\r\x07"}), model="m", replicas=1)
    p.capacity = Capacity(headroom_requests=Scenarios(10.0, 4.0), active_requests_per_session=2.0)
    out = io.StringIO()
    print_fit(Snapshot(timestamp=1.0, pools=[p]), 1, out)
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue() and "\x07" not in out.getvalue()
    assert "cluster=a\\r\\x07 pool=m\\x1b[2J" in out.getvalue()
# --- which series the measured mix names, and what is not a task type (a recorded query answer)

class _Answers:
    """PromQL -> result, by the metric name and grouping label in the query (one function's input)."""

    def __init__(self, rows: dict):
        self.rows, self.asked = rows, []

    def __call__(self, q: str) -> list:
        self.asked.append(q)
        for (metric, label), result in self.rows.items():
            if f"({label})" in q and metric in q:
                return result
        return []


def _gateway_rows(label: str, per_type: dict) -> dict:
    def rows(f):
        return [({label: tt}, f(v)) for tt, v in per_type.items()]
    return {("litellm_proxy_total_requests_metric_total", label): rows(lambda v: v),
            ("litellm_request_total_latency_metric_sum", label): rows(lambda v: v * 2.0),
            ("litellm_request_total_latency_metric_count", label): rows(lambda v: v)}


def test_plan_names_the_series_it_read_and_no_untagged_task_types():
    """The application counts tasks but not model calls (agent_task_model_calls_total absent): the
    notes name the gateway's counter as the calls' source, never the absent series; the gateway's
    untagged calls ("None") and a probe's calls with no application tasks are not task types."""
    from monitor.commands.plan import measure_mix
    query = _Answers({("agent_tasks_started_total", "task_type"): [({"task_type": "draft"}, 1.0),
                                                                     ({"task_type": "None"}, 0.25)],
                      **_gateway_rows("metadata_task_type", {"draft": 3.0, "None": 0.5, "probe": 0.1})})
    tasks, notes = measure_mix(query, "1h", "litellm")
    assert list(tasks) == ["draft"]
    assert tasks["draft"]["calls_per_task"] == pytest.approx(3.0)
    assert notes[0] == ("tasks/s from agent_tasks_started_total; calls per task from the litellm gateway's "
                        "litellm_proxy_total_requests_metric_total (label metadata_task_type) for draft")
    assert "agent_task_model_calls_total" not in " ".join(notes)
    assert notes[1] == ("gateway calls without application tasks, not planned: probe 0.1 calls/s, "
                        "unattributed 0.5 calls/s")
    assert notes[2] == "agent_tasks_started_total without a task type (0.25 tasks/s): not planned"


def test_plan_names_the_application_counter_when_it_is_there():
    from monitor.commands.plan import measure_mix
    query = _Answers({("agent_tasks_started_total", "task_type"): [({"task_type": "draft"}, 1.0)],
                      ("agent_task_model_calls_total", "task_type"): [({"task_type": "draft"}, 2.5)],
                      **_gateway_rows("metadata_task_type", {"draft": 3.0})})
    tasks, notes = measure_mix(query, "1h", "litellm")
    assert tasks["draft"]["calls_per_task"] == pytest.approx(2.5)
    assert notes == ["tasks/s from agent_tasks_started_total; calls per task from agent_task_model_calls_total "
                     "for draft"]


def test_plan_from_the_gateway_alone_lists_untagged_calls_as_unattributed():
    """Without application counters every gateway call is planned; "None" and "null" are one
    `unattributed` entry, not task types called None."""
    from monitor.commands.plan import measure_mix
    query = _Answers(_gateway_rows("metadata_task_type", {"draft": 3.0, "None": 0.5, "null": 0.25}))
    tasks, _ = measure_mix(query, "1h", "litellm")
    assert sorted(tasks) == ["draft", "unattributed"]
    assert tasks["unattributed"]["tasks_per_second"] == pytest.approx(0.75)
