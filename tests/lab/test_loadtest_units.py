"""Unit tests of the load test: mix parser (errors name the key), pattern schedules, analysis,
report JSON schema, compare ranking, URL and input errors."""
from __future__ import annotations

import json
import os
import random

import jsonschema
import pytest

from headroom_lab.commands.compare import compare, load_report
from headroom_lab.loadtest.analyze import SCHEMA, analyze, mean_in_flight, quantiles
from headroom_lab.loadtest.client import CallRecord, TargetError, api_base, make_prompt
from headroom_lab.loadtest.mix import MixError, load_mix, parse_mix
from headroom_lab.loadtest.report import charts, render_html
from headroom_lab.loadtest.runner import RunResult, ServerSample, TaskRecord
from headroom_lab.loadtest.schedule import build_plan, ramp_levels, task_plan
from headroom_lab.loadtest.schema import REPORT_SCHEMA
from monitor.model import Histogram, ReplicaReading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "loadtest", "mix.yaml")


def base_mix(**over):
    d = {"task_types": {"q": {"tasks_per_second": 2.0, "calls_per_task": 2,
                              "prompt_tokens": {"mean": 100, "cv": 0.3, "max": 400},
                              "output_tokens": {"mean": 20}, "tool_wait_seconds": 1.0},
                        "b": {"class": "batch", "tasks_per_second": 1.0, "calls_per_task": 1}},
         "load": {"ramp": {"start": 2, "step": 2, "max": 8, "step_seconds": 5}, "burst": {"sessions": 6}}}
    d.update(over)
    return d


# ---- mix parser -----------------------------------------------------------------------------

def test_example_mix_parses_with_plan_keys_and_extensions():
    mix = load_mix(EXAMPLE)
    assert set(mix.task_types) == {"policy_question", "search_then_email", "nightly_classify"}
    s = mix.task_types["search_then_email"]
    assert (s.calls_per_task, s.klass, s.tool_wait.mean, s.max_retries) == (3, "interactive", 1.5, 2)
    assert s.prompt.mean == 400 and s.prompt.max == 800 and s.output.cv == 0.4
    assert mix.task_types["nightly_classify"].klass == "batch"
    assert mix.slo.ttft_seconds == 1.0 and mix.slo.quantile == 0.95 and mix.margin == 0.2
    assert mix.request.ignore_eos is True and mix.load.ramp.max == 24


def test_plan_mix_loads_too():
    """A `headroom plan` mix (examples/mix.yaml) is a valid load-test mix: defaults fill the rest."""
    mix = load_mix(os.path.join(REPO, "examples", "mix.yaml"))
    assert mix.task_types["search_then_email"].calls_per_task == 4
    assert mix.task_types["policy_question"].tasks_per_second == pytest.approx(2.5)
    assert mix.margin == 0.2


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["task_types"]["q"].update(colour="red"), "task_types.q.colour"),
    (lambda d: d["task_types"]["q"].update(prompt_tokens={"mean": 0}), "task_types.q.prompt_tokens.mean"),
    (lambda d: d["task_types"]["q"].update(prompt_tokens={"cv": 0.3}), "task_types.q.prompt_tokens.mean"),
    (lambda d: d["task_types"]["q"].update(output_tokens={"mean": 10, "min": 20, "max": 5}),
     "task_types.q.output_tokens.max"),
    (lambda d: d["task_types"]["q"].update(output_tokens={"mean": 10, "spread": 2}), "task_types.q.output_tokens.spread"),
    (lambda d: d["task_types"]["q"].update({"class": "urgent"}), "task_types.q.class"),
    (lambda d: d["task_types"]["q"].update(calls_per_task=0), "task_types.q.calls_per_task"),
    (lambda d: d["task_types"]["q"].update(calls_per_task=1.5), "task_types.q.calls_per_task"),
    (lambda d: d["task_types"]["q"].update(retries={"max": -1}), "task_types.q.retries.max"),
    (lambda d: d["task_types"]["q"].update(retries={"tries": 2}), "task_types.q.retries.tries"),
    (lambda d: d["task_types"]["q"].update(tool_wait_seconds="soon"), "task_types.q.tool_wait_seconds"),
    (lambda d: d["task_types"]["q"].update(api="grpc"), "task_types.q.api"),
    (lambda d: d["task_types"]["q"].update(tasks_per_hour=5), "task_types.q"),
    (lambda d: d.update(slo={"quantile": 1.5}), "slo.quantile"),
    (lambda d: d.update(slo={"ttft_seconds": -1}), "slo.ttft_seconds"),
    (lambda d: d.update(slo={"ttft": 1}), "slo.ttft"),
    (lambda d: d.update(request={"api": "soap"}), "request.api"),
    (lambda d: d.update(request={"token_id_range": [9, 3]}), "request.token_id_range"),
    (lambda d: d.update(request={"prompt_mode": "token_ids", "api": "chat"}), "request.prompt_mode"),
    (lambda d: d.update(load={"ramp": {"start": 8, "max": 4}}), "load.ramp.max"),
    (lambda d: d.update(load={"ramp": {"start": 0}}), "load.ramp.start"),
    (lambda d: d.update(load={"burst": {"every_seconds": "often"}}), "load.burst.every_seconds"),
    (lambda d: d.update(load={"max_calls": 0}), "load.max_calls"),
    (lambda d: d.update(margin=1.0), "margin"),
    (lambda d: d.update(bogus=1), "bogus"),
    (lambda d: d.update(task_types={}), "task_types"),
])
def test_mix_errors_name_the_key(mutate, key):
    d = base_mix()
    d["task_types"] = {k: dict(v) for k, v in d["task_types"].items()}
    mutate(d)
    with pytest.raises(MixError) as ei:
        parse_mix(d, where="m.yaml")
    assert ei.value.key == key
    assert str(ei.value).startswith(f"m.yaml: {key}: ")


def test_mix_file_errors(tmp_path):
    with pytest.raises(MixError, match="not found"):
        load_mix(str(tmp_path / "absent.yaml"))
    p = tmp_path / "bad.yaml"
    p.write_text("task_types: [unclosed\n")
    with pytest.raises(MixError, match="not valid YAML"):
        load_mix(str(p))


def test_digest_follows_content():
    assert parse_mix(base_mix()).digest == parse_mix(base_mix()).digest
    other = base_mix()
    other["margin"] = 0.3
    assert parse_mix(other).digest != parse_mix(base_mix()).digest


# ---- schedules -------------------------------------------------------------------------------

def test_burst_is_simultaneous_starts():
    mix = parse_mix(base_mix())
    plan = build_plan(mix, "burst", 20, seed=1)
    assert len(plan.sessions) == 6
    assert {s.start for s in plan.sessions} == {0.0}
    assert all(s.max_tasks == 1 for s in plan.sessions)
    waves = build_plan(parse_mix(base_mix(load={"burst": {"sessions": 4, "every_seconds": 5,
                                                          "tasks_per_session": 2}})), "burst", 20, seed=1)
    starts = sorted({s.start for s in waves.sessions})
    assert starts == [0.0, 5.0, 10.0, 15.0]
    assert all(sum(1 for s in waves.sessions if s.start == t) == 4 for t in starts)
    assert build_plan(mix, "burst", 20, seed=1, sessions_override=9).sessions[-1].index == 8


def test_ramp_steps_up_concurrency():
    mix = parse_mix(base_mix())
    plan = build_plan(mix, "ramp", 20, seed=1)
    assert [(w.start, w.end, w.sessions) for w in plan.windows] == [(0, 5, 2), (5, 10, 4), (10, 15, 6), (15, 20, 8)]
    # sessions join at the start of their step and loop until the end
    assert [s.start for s in plan.sessions] == [0, 0, 5, 5, 10, 10, 15, 15]
    assert all(s.max_tasks is None for s in plan.sessions)
    # a short duration cuts the ramp; no step_seconds: the duration is split over the steps
    assert len(build_plan(mix, "ramp", 12, seed=1).windows) == 2
    m2 = parse_mix(base_mix(load={"ramp": {"start": 1, "step": 3, "max": 8}}))
    assert [lv for _, _, lv in ramp_levels(m2, 40)] == [1, 4, 7, 8]
    assert [round(a, 6) for a, _, _ in ramp_levels(m2, 40)] == [0, 10, 20, 30]


def test_sustained_arrivals_follow_the_mix_rates_and_the_seed():
    mix = parse_mix(base_mix())
    plan = build_plan(mix, "sustained", 200, seed=3)
    n = len(plan.sessions)
    assert abs(n - 3.0 * 200) < 4 * (600 ** 0.5), n  # Poisson(600)
    starts = [s.start for s in plan.sessions]
    assert starts == sorted(starts) and starts[-1] < 200
    again = build_plan(mix, "sustained", 200, seed=3)
    assert [s.start for s in again.sessions] == starts
    assert [s.start for s in build_plan(mix, "sustained", 200, seed=4).sessions] != starts
    # reduced-capacity sends exactly the sustained arrivals
    assert [s.start for s in build_plan(mix, "reduced-capacity", 200, seed=3).sessions] == starts
    kinds = [task_plan(mix, plan.weights, 3, s.index, 0).task_type for s in plan.sessions]
    assert 0.55 < kinds.count("q") / len(kinds) < 0.78  # weights 2:1
    with pytest.raises(ValueError, match="--sessions"):
        build_plan(mix, "sustained", 10, seed=1, sessions_override=3)
    with pytest.raises(ValueError, match="tasks_per_second"):
        build_plan(parse_mix({"task_types": {"q": {"weight": 1}}}), "sustained", 10, seed=1)


def test_task_plan_is_a_function_of_the_seed():
    mix = parse_mix(base_mix())
    w = {"q": 1.0, "b": 0.0}
    a = task_plan(mix, w, 5, 2, 3)
    assert a == task_plan(mix, w, 5, 2, 3)
    assert a.task_type == "q" and len(a.calls) == 2
    assert a.calls[-1].wait_after == 0.0
    assert all(1 <= c.prompt_tokens <= 400 for c in a.calls)
    assert any(task_plan(mix, w, 6, 2, 3).calls[0] != a.calls[0] for _ in range(1))
    assert make_prompt("text", 7, 1, (4, 9)) == make_prompt("text", 7, 1, (4, 9))
    ids = make_prompt("token_ids", 50, 1, (4, 9))
    assert len(ids) == 50 and set(ids) <= set(range(4, 9))
    assert len(make_prompt("text", 30, 2, (0, 1)).split()) == 30


def test_api_base_and_bad_urls():
    assert api_base("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_base("http://h:1/v1/") == "http://h:1/v1"
    assert api_base("https://gw/openai/v1/chat/completions") == "https://gw/openai/v1"
    for bad in ("127.0.0.1:8000", "ftp://x", "http://", "http://u:secret@h:1", "http://h:1/?k=v"):
        with pytest.raises(TargetError) as ei:
            api_base(bad)
        assert "secret" not in str(ei.value)


# ---- analysis and report schema --------------------------------------------------------------

def hist(bounds, values):
    counts = tuple(float(sum(1 for v in values if v <= b)) for b in bounds)
    return Histogram(tuple(bounds), counts, float(sum(values)), float(len(values)))


def synthetic_run(knee: int = 6, seed: int = 0):
    """A ramp of closed-loop calls whose TTFT turns up past `knee` calls in flight (numbers made here)."""
    mix = parse_mix(base_mix(slo={"ttft_seconds": 0.3}, load={"ramp": {"start": 2, "step": 1, "max": 12,
                                                                       "step_seconds": 4}}))
    plan = build_plan(mix, "ramp", 44, seed=1)
    rng = random.Random(seed)
    t0 = 1000.0
    calls, tasks, qs = [], [], []
    for w in plan.windows:
        n = w.sessions
        t = t0 + w.start
        while t < t0 + w.end - 0.5:
            for s in range(n):
                wait = max(0, n - knee) * 0.1
                ttft = 0.05 + 0.002 * n + wait + rng.uniform(0, 0.01)
                qs.append(wait)
                klass = "batch" if s == 0 else "interactive"
                c = CallRecord(s, f"{s}-{len(calls)}", "b" if s == 0 else "q", klass, 0, 0, 0, "completions",
                               100, 20, start=t, first_token=t + ttft, end=t + ttft + 0.2, status=200,
                               prompt_tokens=100, completion_tokens=20, in_flight=n, batch_active=s != 0)
                calls.append(c)
                tasks.append(TaskRecord(c.task, s, c.task_type, klass, t, t + ttft + 0.2, 1, True))
            t += 0.5
    probes = [CallRecord(-1, f"probe-{i}", "_probe", "probe", 0, 0, 0, "completions", 100, 2, start=t0 - 2 + i * 0.2,
                         first_token=t0 - 2 + i * 0.2 + 0.05, end=t0 - 2 + i * 0.2 + 0.06, status=200,
                         phase="probe") for i in range(3)]
    bounds = (0.1, 0.5, 1.0, float("inf"))
    r0 = ReplicaReading("u", "m", t0 - 3, counters={"request_success": 10.0}, histograms={"queue": hist(bounds, [])})
    r1 = ReplicaReading("u", "m", t0 + 50, counters={"request_success": 10.0 + len(calls) + 3},
                        histograms={"queue": hist(bounds, qs + [0.0] * 3)})
    server = [ServerSample(t0 + i, min(knee, 12), 1.0 if i > 20 else 0.0, 0.3, 1, 1, 0) for i in range(44)]
    res = RunResult(t0 - 3, t0, t0 + 44, t0 + 50, probes + calls, tasks, server, {"u": [r0, r1]}, 0, False, "m")
    return mix, plan, res


def test_analysis_finds_the_knee_and_matches_the_schema():
    mix, plan, res = synthetic_run(knee=6)
    rep = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "from file"})
    jsonschema.validate(rep, REPORT_SCHEMA)
    json.dumps(rep, allow_nan=False)
    assert rep["schema"] == SCHEMA
    assert rep["knee"]["concurrency"] == pytest.approx(6, rel=0.1)
    assert rep["operating_point"]["concurrency"] == pytest.approx(rep["knee"]["concurrency"] * 0.8)
    # TTFT p95 <= 0.3 s holds up to 7 in flight (0.05 + 0.014 + 0.1 + ...), not at 8 (0.266+...)
    assert rep["usable_capacity"]["sessions"] in (7, 8)
    assert rep["usable_capacity"]["first_violation"]
    assert rep["agreement"]["succeeded"]["equal"] is True
    assert rep["agreement"]["succeeded"]["server"] == len(res.calls)
    q = rep["agreement"]["queue_mean_seconds"]
    assert q["client_estimate"] == pytest.approx(q["server"], rel=0.2)
    assert rep["interactive_protection"]["interactive_calls_with_batch_active"] > 0
    html = render_html(rep, charts(rep))
    assert html.count("data:image/png;base64,") == 3


def test_engine_view_of_load_added_ttft_and_the_ttft_bracket():
    """server_load_added = (e2e - prefill - decode) mean + run prefill mean - the probes' prefill mean,
    the probes' window closed by the reading at probes_ended; the two mean TTFTs side by side."""
    mix, plan, res = synthetic_run(knee=6)
    probes = [c for c in res.calls if c.phase == "probe"]
    load = [c for c in res.calls if c.phase == "load"]
    bounds = (0.05, 0.1, 0.5, 1.0, float("inf"))
    r0 = res.readings["u"][0]
    # the engine's per-request times: probes prefill 0.04 s, no wait; load calls wait (TTFT - 0.06) and
    # prefill 0.05 s; decode 0.15 s for everyone; the engine's TTFT is 10 ms shorter than the client's
    p_pre, p_wait = [0.04] * len(probes), [0.0] * len(probes)
    l_wait = [max(0.0, c.ttft - 0.06) for c in load]
    l_pre = [0.05] * len(load)

    def reading(ts, pre, wait, ttft, n):
        dec = [0.15] * len(pre)
        return ReplicaReading("u", "m", ts, counters={"request_success": 10.0 + n}, histograms={
            "queue": hist(bounds, wait), "prefill": hist(bounds, pre), "decode": hist(bounds, dec),
            "e2e": hist(bounds, [w + p + d for w, p, d in zip(wait, pre, dec)]), "ttft": hist(bounds, ttft)})
    empty = {k: hist(bounds, []) for k in ("queue", "prefill", "decode", "e2e", "ttft")}
    r0 = ReplicaReading("u", "m", r0.timestamp, counters={"request_success": 10.0}, histograms=empty)
    probes_ended = probes[-1].end + 0.5
    rp = reading(probes_ended + 0.01, p_pre, p_wait, [c.ttft - 0.01 for c in probes], len(probes))
    r1 = reading(res.ended, p_pre + l_pre, p_wait + l_wait, [c.ttft - 0.01 for c in probes + load],
                 len(probes) + len(load))
    res.readings = {"u": [r0, rp, r1]}
    res.probes_ended = probes_ended
    rep = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})
    jsonschema.validate(rep, REPORT_SCHEMA)
    q = rep["agreement"]["queue_mean_seconds"]
    n = len(probes) + len(load)
    wait_mean = sum(p_wait + l_wait) / n
    pre_mean = sum(p_pre + l_pre) / n
    assert q["server_including_intake"] == pytest.approx(wait_mean)
    assert q["server_prefill_mean"] == pytest.approx(pre_mean)
    assert q["server_unloaded_prefill_mean"] == pytest.approx(0.04)
    assert q["server_load_added"] == pytest.approx(wait_mean + pre_mean - 0.04)
    assert q["relative_difference_load_added"] == pytest.approx(
        abs(q["client_estimate"] - q["server_load_added"]) / q["server_load_added"])
    t = rep["agreement"]["ttft_mean_seconds"]
    assert t["client"] - t["server"] == pytest.approx(0.01)
    assert "TTFT added by load" in render_html(rep, {})
    # a request the probes did not make (another client) in the probe window: no unloaded prefill
    rp.histograms["prefill"] = hist(bounds, p_pre + [0.3])
    q2 = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})["agreement"]
    assert q2["queue_mean_seconds"]["server_unloaded_prefill_mean"] is None
    assert q2["queue_mean_seconds"]["server_load_added"] is None
    # no scrape closed the probe phase (an older run): the fields are there, empty
    res.probes_ended = None
    q3 = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})["agreement"]
    assert q3["queue_mean_seconds"]["server_load_added"] is None
    assert q3["queue_mean_seconds"]["server_including_intake"] == pytest.approx(wait_mean)


def test_failed_and_timed_out_calls_are_counted():
    mix, plan, res = synthetic_run()
    res.calls[10].error, res.calls[10].status = "timeout", 200
    res.calls[11].error, res.calls[11].status = "http_5xx", 503
    rep = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})
    assert rep["counts"]["failed"] == 2 and rep["counts"]["timed_out"] == 1
    assert rep["errors"] == {"timeout": 1, "http_5xx": 1}
    assert rep["agreement"]["succeeded"]["equal"] is False
    jsonschema.validate(rep, REPORT_SCHEMA)


def test_mean_in_flight_and_quantiles():
    cs = [CallRecord(0, "t", "q", "interactive", 0, 0, 0, "completions", 1, 1, start=s, end=e)
          for s, e in ((0, 10), (5, 10), (9, 20))]
    assert mean_in_flight(cs, 0, 10) == pytest.approx((10 + 5 + 1) / 10)
    q = quantiles([1, 2, 3, 4, None])
    assert q["count"] == 4 and q["p50"] == 2.5 and q["max"] == 4
    assert quantiles([])["p95"] is None


def test_compare_ranks_by_usable_capacity_not_completed_calls(tmp_path):
    mix, plan, res = synthetic_run(knee=8)
    good = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})
    mix, plan, res = synthetic_run(knee=4)
    bad = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})
    # the worse configuration completes MORE calls here; it must still lose
    bad["counts"]["succeeded"] = good["counts"]["succeeded"] + 100
    c = compare(bad, good)
    assert c["better"] == "B" and c["basis"] == "usable_concurrency_at_slo"
    assert c["same"]["seed"] and c["same"]["mix"]
    assert compare(good, bad)["better"] == "A"
    assert compare(good, good)["better"] == "tie"
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="schema"):
        load_report(str(p))


def test_interactive_protection_rule():
    """Interactive TTFT while batch calls are in flight vs without: protected only when within the SLO
    (0.3 s here) and within 1.5 x (+50 ms) of the batch-free TTFT."""
    def rep_with(slow_when_batch: float):
        mix, plan, res = synthetic_run(knee=100)  # no queueing from the ramp itself
        for i, c in enumerate(c for c in res.calls if c.klass == "interactive"):
            c.batch_active = i % 2 == 0
            if c.batch_active:
                c.first_token = c.start + slow_when_batch
        return analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none"})

    calm = rep_with(0.08)["interactive_protection"]
    assert calm["protected"] is True
    assert calm["interactive_calls_with_batch_active"] == pytest.approx(calm["interactive_calls_without_batch"], abs=12)
    hurt = rep_with(0.25)["interactive_protection"]  # within the SLO, but 0.25 > 1.5 x ~0.09 + 0.05
    assert hurt["protected"] is False
    assert hurt["ttft_with_batch"] == pytest.approx(0.25)
