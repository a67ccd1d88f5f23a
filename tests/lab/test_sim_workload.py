"""Agent workload: profiles, task structure, retries, trace replay; gateway and app metrics
against the recorded ground truth."""
from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headroom_lab.sim.exposition import render_app, render_gateway
from headroom_lab.sim.fleet import Fleet, config_from_dict, load_config
from headroom_lab.sim.workload import DEFAULT_TRACE, Profile, TokenDist, load_trace, parse_mix, profile_clock

T0 = 1_790_000_000.0
MONDAY_9AM = 1_789_981_200.0  # 2026-09-21 09:00 UTC, a Monday


LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, family: str, suffix: str) -> dict[tuple, float]:
    """Samples named family+suffix -> value (a small regex reader: gateway pages with session
    labels are large). Cross-checked against prometheus_client's parser below."""
    out = {}
    name = family + suffix
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        head, value = line.rsplit(" ", 1)
        labels = tuple(sorted(LABEL.findall(head[len(name):])))
        out[labels] = float(value)
    return out


def test_sample_reader_agrees_with_prometheus_client():
    f = Fleet(no_error_config(), "steady", seed=20, start_time=T0)
    f.advance(20)
    page = render_gateway(f, f.t)
    ref = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == "gen_ai_server_request_duration_seconds_count":
                ref[tuple(sorted(s.labels.items()))] = s.value
    assert ref and samples(page, "gen_ai_server_request_duration_seconds", "_count") == ref


def no_error_config(session_label=False):
    cfg = load_config()
    for tt in cfg.mix.task_types.values():
        tt.error_rate = 0.0
    cfg.gateway.session_label = session_label
    return cfg


def test_profile_clock_and_shape():
    wd, hr = profile_clock(MONDAY_9AM, MONDAY_9AM, 86400)
    assert wd == 0 and hr == pytest.approx(9.0)
    wd, hr = profile_clock(MONDAY_9AM + 5 * 86400 + 3600, MONDAY_9AM, 86400)
    assert wd == 5 and hr == pytest.approx(10.0)
    # compressed days: 600 s of sim = one day of profile
    wd, hr = profile_clock(MONDAY_9AM + 300, MONDAY_9AM, 600)
    assert wd == 0 and hr == pytest.approx(21.0)
    office = load_config().mix.profiles["office"]
    assert office.value(0, 10.5) > 5 * office.value(0, 3.0)  # day vs night
    assert office.value(5, 10.5) == pytest.approx(0.25 * office.value(0, 10.5), rel=0.01)
    assert office.value(0, 9.1) > office.value(0, 9.5)  # 09:00-09:20 start-of-day burst


def test_task_structure_calls_per_task_and_tool_waits():
    cfg = no_error_config()
    f = Fleet(cfg, "steady", seed=21, start_time=T0)
    f.advance(240)
    by_type = defaultdict(list)
    for rec in f.truth:
        by_type[rec.task_type].append(rec)
    for name, tt in cfg.mix.task_types.items():
        recs = by_type[name]
        if name == "nightly_batch" and not recs:
            continue
        assert recs, name
        assert {r.model_calls for r in recs} == {tt.calls_per_task}, name
        assert {r.task_class for r in recs} == {tt.klass}
        assert not any(r.failed for r in recs)
    assert cfg.mix.task_types["search_then_email"].calls_per_task == 4
    assert cfg.mix.task_types["document_summary"].calls_per_task == 2
    # tool waits are part of the task time: search_then_email waits ~3.5 s on average
    mean = sum(r.duration for r in by_type["search_then_email"]) / len(by_type["search_then_email"])
    assert mean > 3.5


def test_app_metrics_match_truth():
    cfg = no_error_config()
    f = Fleet(cfg, "steady", seed=22, start_time=T0)
    f.advance(180)
    page = render_app(f, f.t)
    count = samples(page, "agent_task_duration_seconds", "_count")
    total = samples(page, "agent_task_duration_seconds", "_sum")
    calls = samples(page, "agent_task_model_calls", "_total")
    started = samples(page, "agent_tasks_started", "_total")
    done = defaultdict(list)
    for r in f.truth:
        done[r.task_type].append(r)
    assert done
    summary = f.truth_summary()
    for name, recs in done.items():
        assert summary[name]["tasks"] == len(recs)
        assert summary[name]["mean_duration_s"] == pytest.approx(
            sum(r.duration for r in recs) / len(recs))
        assert summary[name]["p50_duration_s"] <= summary[name]["p95_duration_s"]
        key = (("task_type", name),)
        assert count[key] == len(recs)
        assert total[key] == pytest.approx(sum(r.duration for r in recs))
        assert calls[key] == sum(r.model_calls for r in recs)
        assert started[key] >= len(recs)


def test_gateway_metrics_match_truth_per_task_type_and_session():
    cfg = no_error_config(session_label=True)
    f = Fleet(cfg, "steady", seed=23, start_time=T0)
    f.advance(45)
    page = render_gateway(f, f.t)
    counts = samples(page, "gen_ai_server_request_duration_seconds", "_count")
    per_session = Counter()
    per_type = Counter()
    for labels, v in counts.items():
        d = dict(labels)
        per_session[d["session_id"]] += v
        per_type[d["task_type"]] += v
    # every call of every finished task went through the gateway, with its session id
    for rec in f.truth:
        assert per_session[rec.session_id] == rec.model_calls, rec
    finished_calls = Counter()
    for rec in f.truth:
        finished_calls[rec.task_type] += rec.model_calls
    for name, n in finished_calls.items():
        assert per_type[name] >= n  # plus calls of tasks still running
    assert sum(per_type.values()) == sum(f.gateway.requests_by_task_type.values())
    # token usage: one input and one output observation per successful call
    tok = samples(page, "gen_ai_client_token_usage", "_count")
    inputs = sum(v for k, v in tok.items() if dict(k)["gen_ai_token_type"] == "input")
    assert inputs == sum(counts.values())


def test_session_label_cardinality_limit():
    cfg = no_error_config(session_label=True)
    cfg.gateway.session_series_limit = 5
    f = Fleet(cfg, "steady", seed=24, start_time=T0)
    f.advance(30)
    page = render_gateway(f, f.t)
    sessions = {dict(k).get("session_id") for k in
                samples(page, "gen_ai_server_request_duration_seconds", "_count")}
    sessions.discard(None)
    assert len(sessions) == 5
    assert 'otel_metric_overflow="true"' in page


def test_retries_are_counted_as_calls_and_errors_labelled():
    cfg = load_config()
    tt = cfg.mix.task_types["policy_question"]
    tt.error_rate = 0.3
    tt.max_retries = 5
    f = Fleet(cfg, "steady", seed=25, start_time=T0)
    f.advance(90)
    recs = [r for r in f.truth if r.task_type == "policy_question"]
    assert any(r.model_calls > 1 for r in recs)
    retried = sum(r.model_calls - 1 for r in recs)
    page = render_gateway(f, f.t)
    errors = sum(v for k, v in samples(page, "gen_ai_server_request_duration_seconds",
                                       "_count").items()
                 if dict(k).get("error_type") == "_OTHER" and
                 dict(k)["task_type"] == "policy_question")
    assert errors >= retried > 0


def test_replica_loss_fails_over_and_in_flight_calls_retry():
    f = Fleet(no_error_config(), "replica-loss", seed=26, start_time=T0,
              scenario_overrides={"at_s": 40.0, "pool": "chat-8b", "replica": 1})
    f.advance(39)
    victim = f.replica("chat-8b-1")
    assert victim.alive and victim.num_running > 0
    in_flight = victim.num_running + victim.num_waiting
    f.advance(60)
    assert not victim.alive and victim.num_running == 0
    assert f.pool_state("chat-8b")["replicas_alive"] == 3
    # in-flight calls on the lost replica were retried elsewhere: the tasks still finished
    retried = [r for r in f.truth if r.model_calls > f.config.mix.task_types[r.task_type]
               .calls_per_task]
    assert len(retried) >= min(in_flight, 1)
    assert not any(r.failed for r in f.truth)


def test_burst_scenario_shows_queueing():
    f = Fleet(load_config(), "burst", seed=27, start_time=T0)
    before, during = [], []
    for i in range(50):
        f.advance(1)
        w = f.pool_state("chat-8b")["waiting"]
        (before if i < 9 else during).append(w)
    assert max(during) > 20
    assert max(during) > 3 * max(before + [1])


def test_diurnal_scenario_follows_the_profile():
    f = Fleet(load_config(), "diurnal", seed=28, start_time=MONDAY_9AM - 6 * 3600,
              scenario_overrides={"day_seconds": 1200.0})  # one day = 20 min
    started = []
    last = 0
    for _ in range(20):  # one simulated profile-hour per minute of sim
        f.advance(50)
        s = sum(f.app.started.values())
        started.append(s - last)
        last = s
    night = sum(started[:3])  # 03:00-05:30 profile time
    day = sum(started[6:9])  # 09:00-11:30
    assert day > 4 * max(night, 1)


def test_trace_replay_follows_the_trace():
    rows = load_trace(DEFAULT_TRACE)
    assert len(rows) == 3000 and rows[0].offset_s == 0.0
    cfg = load_config(overrides={"replay": {"pool": "chat-8b", "speed": 1.0}})
    for tt in cfg.mix.task_types.values():
        tt.rate_per_s = 0.0
    f = Fleet(cfg, "steady", seed=29, start_time=T0)
    f.advance(60)
    sent = f.app.started["trace_replay"]
    expected = sum(1 for r in rows if r.offset_s <= 60)
    assert sent == expected
    assert all(r.task_type == "trace_replay" and r.model_calls == 1 for r in f.truth)


def test_token_dist_and_mix_validation():
    d = TokenDist(1000, 0.5, 1, 4000)
    rng = random.Random(1)
    xs = [d.sample(rng) for _ in range(5000)]
    assert 900 < sum(xs) / len(xs) < 1100 and max(xs) <= 4000
    with pytest.raises(ValueError, match="mean"):
        TokenDist.parse("x", {"cv": 1})
    with pytest.raises(ValueError, match="unknown profile"):
        parse_mix({"task_types": {"a": {"pool": "p", "rate_per_s": 1, "profile": "nope",
                                        "steps": [{"prompt": 5, "output": 5}]}}})
    with pytest.raises(ValueError, match="calls must be an integer"):
        parse_mix({"task_types": {"a": {"pool": "p", "rate_per_s": 1,
                                        "steps": [{"calls": 0, "prompt": 5, "output": 5}]}}})
    with pytest.raises(ValueError, match="missing required key .steps."):
        parse_mix({"task_types": {"a": {"pool": "p", "rate_per_s": 1}}})
    with pytest.raises(ValueError, match="hourly"):
        Profile.parse("p", {"hourly": [1, 2]})
    with pytest.raises(ValueError, match="trace file not found"):
        load_trace("/nonexistent.csv")


def test_tiny_calibration_pool_is_configurable():
    cfg = config_from_dict({
        "pools": {"tiny": {"model_name": "tiny", "replicas": 1, "max_num_seqs": 8,
                           "num_gpu_blocks": 24, "block_size": 128, "max_model_len": 1024,
                           "max_num_batched_tokens": 2048}},
        "mix": {"task_types": {"q": {"pool": "tiny", "rate_per_s": 8.0,
                                     "steps": [{"prompt": {"mean": 200, "cv": 0.5},
                                                "output": {"mean": 150, "cv": 0.4}}]}}},
    })
    f = Fleet(cfg, "steady", seed=30, start_time=T0)
    peak = 0
    for _ in range(40):
        f.advance(0.5)
        r = f.replicas[0]
        r.check_invariants()
        peak = max(peak, r.num_running)
    assert peak == 8
    assert f.replicas[0].num_waiting > 0


def test_closed_population_reproduces_the_real_24_client_run():
    """The vLLM 0.32 CPU capture: 24 concurrent clients on max_num_seqs 8 / 24 blocks of 128
    showed running 8 (the seat limit), waiting 13-16 and KV usage 0.61-0.78 under load."""
    cfg = config_from_dict({
        "pools": {"tiny": {"model_name": "tiny", "replicas": 1, "max_num_seqs": 8,
                           "num_gpu_blocks": 24, "block_size": 128, "max_model_len": 1024,
                           "max_num_batched_tokens": 2048, "enable_prefix_caching": False}},
        "mix": {"task_types": {"client": {
            "pool": "tiny", "sessions": 24, "think_s": 0.0,
            # 5-60 repetitions of a 5-word phrase; 50-300 generated tokens
            "steps": [{"prompt": {"mean": 150, "cv": 0.6, "min": 30, "max": 400},
                       "output": {"mean": 175, "cv": 0.4, "min": 50, "max": 300}}]}}},
    })
    f = Fleet(cfg, "steady", seed=31, start_time=T0)
    f.advance(5)
    run, wait, kv = [], [], []
    for _ in range(40):
        f.advance(0.25)
        r = f.replicas[0]
        r.check_invariants()
        run.append(r.num_running)
        wait.append(r.num_waiting)
        kv.append(r.kv_usage())
        assert r.num_running + r.num_waiting <= 24
    assert max(run) == 8 and sum(run) / len(run) > 7
    assert 13 <= sum(wait) / len(wait) <= 17
    assert 0.4 < sum(kv) / len(kv) < 0.95
    started = f.app.started["client"]
    assert started == 24 + sum(1 for x in f.truth)  # every finish starts a new task


def test_sessions_and_rate_are_exclusive():
    with pytest.raises(ValueError, match="either rate_per_s"):
        parse_mix({"task_types": {"a": {"pool": "p", "rate_per_s": 1, "sessions": 3,
                                        "steps": [{"prompt": 5, "output": 5}]}}})
    with pytest.raises(ValueError, match="sessions must be an integer"):
        parse_mix({"task_types": {"a": {"pool": "p", "sessions": -1,
                                        "steps": [{"prompt": 5, "output": 5}]}}})


def test_diurnal_start_hour_pins_the_profile_clock():
    cfg = load_config()
    night = Fleet(cfg, "diurnal", seed=32, start_time=MONDAY_9AM - 6 * 3600,
                  scenario_overrides={"start_hour": 3.0})
    day = Fleet(cfg, "diurnal", seed=32, start_time=MONDAY_9AM - 6 * 3600,
                scenario_overrides={"start_hour": 10.0})
    assert day.profile_time(day.start) == (0, 10.0)
    assert night.profile_time(night.start + 1800) == (0, 3.5)
    night.advance(120)
    day.advance(120)
    assert sum(day.app.started.values()) > 5 * max(1, sum(night.app.started.values()))
