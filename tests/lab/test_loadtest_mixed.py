"""Unit tests of `headroom loadtest --pattern mixed`: the task classes and priorities of the mix, the
mixed schedule, the budget follower (exposition and PromQL answers, floor(budget x max), the gate),
and the four cases run in-process against a fake OpenAI-compatible session that records every
request body and how many calls of each class were in flight at once."""
from __future__ import annotations

import json
import threading
import time

import pytest

from headroom_lab.loadtest import runner as runner_mod
from headroom_lab.loadtest.client import CallRecord, CallSpec, stream_call
from headroom_lab.loadtest.follower import (
    Follower,
    Gate,
    Reading,
    allowed_calls,
    budget_from_exposition,
    budget_from_promql,
)
from headroom_lab.loadtest.mix import MixError, parse_mix
from headroom_lab.loadtest.mixed import CASES, Setup, case_plan, run_mixed, summary_lines
from headroom_lab.loadtest.schedule import build_plan, class_weights, task_plan
from monitor.commands.cli import main

INTER_TOKENS, DEFER_TOKENS = 4, 9  # the fake session tells the classes apart by max_tokens


def mixed_mix(**load):
    return parse_mix({
        "slo": {"ttft_seconds": 0.5},
        "request": {"timeout_seconds": 5},
        "load": {"mixed": {"deferrable_concurrency": 4, "budget_interval_seconds": 0.1, "pause_seconds": 0},
                 "drain_seconds": 2, **load},
        "task_types": {
            "ask": {"tasks_per_second": 20, "prompt_tokens": 5, "output_tokens": INTER_TOKENS},
            "draft": {"tasks_per_second": 5, "calls_per_task": 2, "prompt_tokens": 5,
                      "output_tokens": INTER_TOKENS, "priority": 1},
            "summarise": {"class": "deferrable", "prompt_tokens": 50, "output_tokens": DEFER_TOKENS},
        }})


# ---- the mix: classes and priorities ---------------------------------------------------------

def test_deferrable_is_read_as_batch_and_priorities_default_by_class():
    mix = mixed_mix()
    t = mix.task_types
    assert t["summarise"].klass == "batch" and t["ask"].klass == "interactive"
    assert (t["ask"].priority, t["draft"].priority, t["summarise"].priority) == (0, 1, 10)
    assert mix.load.mixed.deferrable_concurrency == 4
    with pytest.raises(MixError, match="task_types.ask.priority"):
        parse_mix({"task_types": {"ask": {"tasks_per_second": 1, "priority": "high"}}})
    with pytest.raises(MixError, match="load.mixed.deferrable_concurrency"):
        parse_mix({"task_types": {"ask": {"tasks_per_second": 1}}, "load": {"mixed": {"deferrable_concurrency": 0}}})


# ---- the schedule ------------------------------------------------------------------------------

def test_mixed_plan_interactive_arrivals_beside_looping_deferrable_sessions():
    mix = mixed_mix()
    plan = build_plan(mix, "mixed", 60.0, 3)
    batch = [s for s in plan.sessions if s.klass == "batch"]
    inter = [s for s in plan.sessions if s.klass == "interactive"]
    assert len(batch) == 4 and all(s.start == 0 and s.max_tasks is None for s in batch)
    assert all(s.max_tasks == 1 for s in inter) and len(plan.sessions) == len(batch) + len(inter)
    assert 25 * 60 * 0.8 < len(inter) < 25 * 60 * 1.2  # Poisson at the interactive rates only (20 + 5 /s)
    assert [s.start for s in plan.sessions] == sorted(s.start for s in plan.sessions)
    assert len({s.index for s in plan.sessions}) == len(plan.sessions)
    # each class's sessions draw task types of their class only
    for s in inter[:50]:
        tp = task_plan(mix, class_weights(mix, plan.weights, s.klass), 3, s.index, 0)
        assert tp.klass == "interactive" and tp.task_type in ("ask", "draft")
    tp = task_plan(mix, class_weights(mix, plan.weights, "batch"), 3, batch[0].index, 7)
    assert tp.task_type == "summarise" and tp.calls[0].output_tokens == DEFER_TOKENS
    # the same seed sends the same interactive work in every case; alone drops the deferrable sessions
    again = build_plan(mix, "mixed", 60.0, 3)
    assert again.sessions == plan.sessions
    alone = case_plan(plan, "alone")
    assert alone.sessions == tuple(inter) and case_plan(plan, "budget") is plan


def test_mixed_plan_needs_both_classes():
    only_inter = parse_mix({"task_types": {"ask": {"tasks_per_second": 1}}})
    with pytest.raises(ValueError, match="class deferrable"):
        build_plan(only_inter, "mixed", 10, 1)
    only_batch = parse_mix({"task_types": {"s": {"class": "deferrable"}}})
    with pytest.raises(ValueError, match="interactive task type"):
        build_plan(only_batch, "mixed", 10, 1)
    with pytest.raises(ValueError, match="--sessions"):
        build_plan(mixed_mix(), "mixed", 10, 1, sessions_override=3)


# ---- the follower ------------------------------------------------------------------------------

EXPOSITION = """# HELP headroom_deferrable_budget_ratio Share of the deferrable concurrency that fits now.
# TYPE headroom_deferrable_budget_ratio gauge
headroom_deferrable_budget_ratio{pool="chat"} 0.75
headroom_deferrable_budget_ratio{pool="batchy"} 0
headroom_spare_requests{pool="chat",horizon="now"} 12
"""


def test_budget_read_from_an_exposition():
    assert budget_from_exposition(EXPOSITION, "chat").budget == 0.75
    assert budget_from_exposition(EXPOSITION, "batchy").budget == 0.0
    missing = budget_from_exposition(EXPOSITION, "other")
    assert missing.budget is None and "pool 'other'" in missing.note
    two = budget_from_exposition(EXPOSITION, None)
    assert two.budget is None and "name the pool" in two.note
    one = 'headroom_deferrable_budget_ratio{pool="chat"} 0.4\n'
    assert budget_from_exposition(one, None).budget == 0.4
    assert budget_from_exposition("headroom_up 1\n", "chat").budget is None
    assert budget_from_exposition('headroom_deferrable_budget_ratio{pool="chat" 1\n', "chat").budget is None


def test_budget_read_from_a_promql_answer():
    ans = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "headroom_deferrable_budget_ratio", "pool": "chat"}, "value": [1.0, "0.5"]},
        {"metric": {"pool": "other"}, "value": [1.0, "1"]}]}}
    assert budget_from_promql(ans, "chat").budget == 0.5
    assert budget_from_promql(ans, None).budget is None  # two series, no pool named
    assert budget_from_promql({"status": "error", "error": "bad query"}, "chat").note.startswith("query failed")
    assert budget_from_promql({"status": "success", "data": {"result": []}}, "chat").budget is None


def test_allowed_calls_is_the_floor_of_budget_times_max():
    assert [allowed_calls(b, 4) for b in (1.0, 0.99, 0.75, 0.5, 0.26, 0.25, 0.0)] == [4, 3, 3, 2, 1, 1, 0]
    assert allowed_calls(0.3, 10) == 3 and allowed_calls(0.7, 10) == 7  # no float round-down below x/10
    assert allowed_calls(None, 4) == 0 and allowed_calls(float("nan"), 4) == 0
    assert allowed_calls(1.7, 4) == 4 and allowed_calls(-0.2, 4) == 0


def test_gate_holds_the_limit_and_a_raised_limit_lets_a_waiter_in():
    gate = Gate(1)
    stop = threading.Event()
    assert gate.acquire(stop, time.time() + 5)
    t = time.time()
    assert not gate.acquire(stop, time.time() + 0.3)  # full until the deadline
    assert time.time() - t >= 0.29
    got = threading.Event()
    th = threading.Thread(target=lambda: gate.acquire(stop, time.time() + 10) and got.set())
    th.start()
    assert not got.wait(0.2)
    gate.set_limit(2)
    assert got.wait(5), "a raised limit wakes a waiting call"
    th.join(5)
    assert gate.in_flight == 2 and gate.peak == 2
    gate.set_limit(0)  # a lower limit never takes a slot back
    gate.release()
    gate.release()
    assert gate.in_flight == 0
    stop.set()
    assert not gate.acquire(stop, time.time() + 5)  # stopped: no wait


def test_follower_sets_the_gate_from_each_reading_and_counts_unknown_as_zero():
    script = iter([Reading(1.0), Reading(0.5), Reading(None, "HTTP 503"), Reading(0.0), Reading(0.25)])
    f = Follower(lambda: next(script), max_concurrency=4, interval=60, label="scripted")
    assert [f.tick() for _ in range(5)] == [4, 2, 0, 0, 1]
    assert f.gate.limit == 1

    def boom():
        raise RuntimeError("down")
    g = Follower(boom, 4, 60)
    assert g.tick() == 0 and "RuntimeError" in g.log[-1][3]
    with pytest.raises(ValueError):
        Follower(lambda: Reading(1.0), 0)
    # the summary weighs each limit by how long it held
    f.log = [(100.0, 1.0, 4, ""), (102.0, 0.0, 0, ""), (103.0, None, 0, "HTTP 503"), (104.0, 0.5, 2, "")]
    s = f.summary(100.0, 106.0)
    assert s["allowed_mean"] == pytest.approx((4 * 2 + 0 + 0 + 2 * 2) / 6)
    assert s["shut_fraction"] == pytest.approx(2 / 6)
    assert (s["readings"], s["unknown_readings"], s["unknown_reasons"]) == (4, 1, ["HTTP 503"])


# ---- the request body ------------------------------------------------------------------------

class FakeResponse:
    def __init__(self, hold: float):
        self.status_code = 200
        self.text = ""
        self.hold = hold

    def iter_lines(self, chunk_size=None, decode_unicode=False):
        time.sleep(self.hold)
        yield b'data: {"choices":[{"text":"x","index":0}]}'
        yield b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}'
        yield b"data: [DONE]"

    def close(self):
        pass


class FakeEngine:
    """Records bodies; counts calls in flight per class (told by max_tokens)."""

    def __init__(self, hold: float = 0.02):
        self.bodies: list = []
        self.lock = threading.Lock()
        self.in_flight = {"interactive": 0, "batch": 0}
        self.peak = {"interactive": 0, "batch": 0}
        self.hold = hold

    def session(self):
        engine = self

        class Session:
            def post(self, url, json=None, headers=None, stream=False, timeout=None):
                klass = "batch" if json["max_tokens"] == DEFER_TOKENS else "interactive"
                with engine.lock:
                    engine.bodies.append(dict(json))
                    engine.in_flight[klass] += 1
                    engine.peak[klass] = max(engine.peak[klass], engine.in_flight[klass])
                try:
                    resp = FakeResponse(engine.hold * (5 if klass == "batch" else 1))
                    list(resp.iter_lines())  # hold the slot while "generating"
                finally:
                    with engine.lock:
                        engine.in_flight[klass] -= 1
                done = FakeResponse(0.0)
                return done

            def close(self):
                pass
        return Session


def test_the_priority_goes_in_the_body_only_when_given():
    eng = FakeEngine(0)
    for prio in (None, 0, 10):
        rec = CallRecord(0, "0-0", "t", "batch", 0, 0, 0, "completions", 5, 3)
        stream_call(eng.session()(), CallSpec("http://x/v1", "completions", "m", "hi", 3, 5.0, priority=prio), rec)
        assert rec.ok
    assert "priority" not in eng.bodies[0]
    assert [b.get("priority") for b in eng.bodies[1:]] == [0, 10]


def test_four_cases_against_a_fake_engine(monkeypatch):
    eng = FakeEngine()
    monkeypatch.setattr(runner_mod.requests, "Session", eng.session())
    mix = mixed_mix()
    marks: dict = {}
    state = {"budget": 0.5}
    seen = []

    def on_case(name, summary):
        with eng.lock:
            marks[name] = (len(eng.bodies), dict(eng.peak))
            eng.peak = {"interactive": 0, "batch": 0}
        seen.append(name)

    setup = Setup(["http://fake:1"], "m", seed=2, probes=2, budget_source=lambda: Reading(state["budget"]),
                  budget_label="scripted stand-in")
    rep = run_mixed(mix, setup, 1.0, CASES, on_case=on_case)  # 25 interactive tasks a second: ~25 a case
    assert seen == list(CASES) and rep["cases_run"] == list(CASES)
    bodies = eng.bodies
    spans = dict(zip(CASES, zip([0] + [marks[c][0] for c in CASES[:-1]], [marks[c][0] for c in CASES])))

    def of(case, klass):
        a, b = spans[case]
        want = DEFER_TOKENS if klass == "batch" else INTER_TOKENS
        return [x for x in bodies[a:b] if x["max_tokens"] == want]

    c = rep["cases"]
    # alone: no deferrable call at all; the others ran both classes
    assert of("alone", "batch") == [] and c["alone"]["deferrable"]["calls"] == 0
    for case in ("unmanaged", "priority", "budget"):
        assert of(case, "batch") and of(case, "interactive"), case
        assert c[case]["deferrable"]["succeeded"] > 0 and c[case]["deferrable"]["calls_per_second"] > 0
    # priorities only in the priority case, as the task types give them
    for case in ("alone", "unmanaged", "budget"):
        assert all("priority" not in x for x in of(case, "interactive") + of(case, "batch")), case
    assert {x["priority"] for x in of("priority", "batch")} == {10}
    assert {x["priority"] for x in of("priority", "interactive")} <= {0, 1}
    assert c["priority"]["priorities_sent"] == {"ask": 0, "draft": 1, "summarise": 10}
    # unmanaged: the 4 deferrable sessions fly together; budget 0.5 x 4: never more than 2
    assert marks["unmanaged"][1]["batch"] == 4
    assert 1 <= marks["budget"][1]["batch"] <= 2
    b = c["budget"]["budget"]
    assert b["source"] == "scripted stand-in" and b["allowed_mean"] == pytest.approx(2, abs=0.01)
    assert b["gate_peak_in_flight"] <= 2 and b["shut_fraction"] == 0
    for case in CASES:
        i = c[case]["interactive"]
        assert i["calls"] > 0 and i["succeeded"] == i["calls"]
        assert set(i["ttft_seconds"]) >= {"p50", "p95"} and set(i["e2e_seconds"]) >= {"p50", "p95"}
        assert i["over_target"] is not None and 0 <= i["over_target"] <= 1
    assert rep["target"] == {"ttft_seconds": 0.5, "source": "mix slo.ttft_seconds"}
    # the probe calls (2 output tokens) stand for the interactive calls: their prompts, not the deferrable 50
    probes = [x for x in bodies if x["max_tokens"] == 2]
    assert len(probes) == 2 * len(CASES) and {len(x["prompt"].split()) for x in probes} == {5}
    assert {len(x["prompt"].split()) for x in of("unmanaged", "batch")} == {50}
    assert set(rep["reports"]) == set(CASES)
    json.dumps({k: v for k, v in rep.items() if k != "reports"}, allow_nan=False)
    lines = summary_lines(rep)
    assert any(ln.startswith("budget ") for ln in lines) and "scripted stand-in" in "\n".join(lines)


def test_a_zero_budget_sends_no_deferrable_call(monkeypatch):
    eng = FakeEngine()
    monkeypatch.setattr(runner_mod.requests, "Session", eng.session())
    setup = Setup(["http://fake:1"], "m", probes=0, budget_source=lambda: Reading(None, "no such metric"))
    rep = run_mixed(mixed_mix(), setup, 1.0, ("budget",))
    assert all(x["max_tokens"] != DEFER_TOKENS for x in eng.bodies)
    c = rep["cases"]["budget"]
    assert c["deferrable"]["calls"] == 0 and c["interactive"]["calls"] > 0
    assert c["budget"]["shut_fraction"] == pytest.approx(1.0) and c["budget"]["unknown_reasons"] == ["no such metric"]


def test_cli_errors_of_the_mixed_pattern(tmp_path, capsys):
    mix = tmp_path / "mix.yaml"
    mix.write_text("task_types:\n  ask: {tasks_per_second: 1}\n  s: {class: deferrable}\n")
    base = ["loadtest", "--target", "http://127.0.0.1:9", "--mix", str(mix), "--pattern", "mixed",
            "--duration", "5s", "--model", "m", "--out", str(tmp_path / "o")]
    assert main(base + ["--cases", "alone,nightly"]) == 2
    assert "--cases must be" in capsys.readouterr().err
    assert main(base) == 2
    assert "--budget-url" in capsys.readouterr().err
    assert main(base + ["--cases", "alone,budget", "--budget-url", "ftp://x/metrics"]) == 2
    assert "--budget-url must be an http(s) URL" in capsys.readouterr().err
    sustained = [a if a != "mixed" else "sustained" for a in base]
    assert main(sustained + ["--budget-url", "http://127.0.0.1:9/metrics"]) == 2
    assert "apply to --pattern mixed only" in capsys.readouterr().err
