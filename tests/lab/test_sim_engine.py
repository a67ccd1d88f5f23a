"""The simulated vLLM replica: batching limits, KV accounting, preemption, timing, determinism."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom_lab.sim.engine import DECODE, Histo, PoolParams, Replica, Request, request_token_buckets
from headroom_lab.sim.exposition import render_vllm
from headroom_lab.sim.fleet import Fleet, config_from_dict, load_config, theoretical_knee

T0 = 1_790_000_000.0


def drive(replica: Replica, requests: list[tuple[float, int, int]], until: float,
          check=None) -> list[Request]:
    """Feed (arrival offset, prompt, output) requests to one replica; run to `until`."""
    import heapq
    events = []
    seq = 0
    for i, (off, p, o) in enumerate(sorted(requests)):
        seq += 1
        heapq.heappush(events, (T0 + off, seq, "A", Request(i + 1, T0 + off, p, o)))
    done: list[Request] = []
    while events and events[0][0] <= T0 + until:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "A":
            nt = replica.enqueue(payload, t)
        else:
            if payload != replica.version:
                continue
            nt, fin = replica.boundary(t)
            done.extend(fin)
            if check:
                check(replica)
        if nt is not None:
            seq += 1
            heapq.heappush(events, (nt, seq, "B", replica.version))
    return done


def tiny(**kw) -> PoolParams:
    """The calibration replica shape: max_num_seqs 8, 24 blocks of 128 tokens."""
    base = dict(max_num_seqs=8, num_gpu_blocks=24, block_size=128, max_model_len=1024,
                max_num_batched_tokens=2048, replicas=1, enable_prefix_caching=False,
                step_base_ms=10.0, step_per_seq_ms=1.0, step_per_1k_kv_ms=2.0,
                prefill_per_1k_ms=20.0)
    base.update(kw)
    return PoolParams.from_dict("tiny", base)


def test_single_request_timing_follows_the_step_model():
    p = tiny()
    r = Replica(p, 0, T0)
    done = drive(r, [(0.0, 300, 5)], until=10)
    assert len(done) == 1
    req = done[0]
    # prefill step: base + 1 seq + 300 prefill tokens; no KV yet
    prefill = (10.0 + 1.0 + 20.0 * 300 / 1000) / 1000
    assert req.first_token - req.arrival == pytest.approx(prefill, abs=1e-6)
    # 4 decode steps, KV grows from 300 tokens by one per step
    decode = sum((10.0 + 1.0 + 2.0 * (300 + s) / 1000) / 1000 for s in range(4))
    assert req.finished - req.first_token == pytest.approx(decode, abs=1e-6)
    assert req.generated == 5
    assert r.stats.generation_tokens == 5
    assert r.stats.prompt_tokens == 300
    assert r.used_blocks == 0 and r.num_running == 0


def test_running_never_exceeds_max_num_seqs_and_waiting_builds():
    p = tiny(num_gpu_blocks=400)  # plenty of KV: the seat limit binds
    r = Replica(p, 0, T0)
    seen = {"max_running": 0, "max_waiting": 0}

    def check(rep):
        rep.check_invariants()
        seen["max_running"] = max(seen["max_running"], rep.num_running)
        seen["max_waiting"] = max(seen["max_waiting"], rep.num_waiting)

    reqs = [(i * 0.01, 100, 200) for i in range(60)]  # 60 requests in 0.6 s
    done = drive(r, reqs, until=120, check=check)
    assert seen["max_running"] == 8
    assert seen["max_waiting"] >= 40
    assert len(done) == 60
    assert r.stats.h["request_queue_time_seconds"].sum > 0


def test_kv_usage_is_tokens_in_flight_at_block_granularity():
    p = tiny(num_gpu_blocks=200, max_num_seqs=16)
    r = Replica(p, 0, T0)
    samples = []

    def check(rep):
        rep.check_invariants()  # used blocks == sum of per-request ceil(tokens / block_size)
        blocks = sum(math.ceil(rep.tokens_held(q) / p.block_size) if q.state == DECODE else q.blocks
                     for q in rep.running.values())
        assert rep.kv_usage() == pytest.approx(blocks / (p.num_gpu_blocks - 1))
        samples.append(rep.kv_usage())

    rng = random.Random(3)
    reqs = [(rng.uniform(0, 5), rng.randint(20, 700), rng.randint(5, 300)) for _ in range(80)]
    drive(r, reqs, until=200, check=check)
    assert max(samples) > 0.3  # the check ran under real load
    assert samples[-1] == 0.0


def test_preemption_when_kv_is_too_small():
    p = tiny()  # 23 usable blocks x 128 = 2944 tokens for 8 seats
    r = Replica(p, 0, T0)
    reqs = [(0.0, 400, 600) for _ in range(8)]  # each grows to 1000 tokens = 8 blocks
    done = drive(r, reqs, until=600, check=lambda rep: rep.check_invariants())
    assert len(done) == 8
    assert r.stats.preemptions > 0
    assert sum(q.preemptions for q in done) == r.stats.preemptions
    # preempted requests are recomputed and still produce every token
    assert all(q.generated == 600 for q in done)
    assert r.stats.h["request_num_preemptions"].sum == r.stats.preemptions
    page = render_vllm(r, done[-1].finished)
    assert f'vllm:num_preemptions_total{{engine="0",model_name="{p.model_name}"}} ' \
           f'{float(r.stats.preemptions)}' in page


def test_no_preemption_when_kv_is_ample():
    p = tiny(num_gpu_blocks=200)
    r = Replica(p, 0, T0)
    done = drive(r, [(0.0, 400, 600) for _ in range(8)], until=600)
    assert len(done) == 8 and r.stats.preemptions == 0


def test_admission_waits_for_kv_blocks():
    p = tiny(max_num_seqs=8)
    r = Replica(p, 0, T0)
    # 3 prompts of 900 tokens need 8 blocks each: only two fit in 23 blocks
    r.enqueue(Request(1, T0, 900, 50), T0)
    r.enqueue(Request(2, T0, 900, 50), T0)
    r.enqueue(Request(3, T0, 900, 50), T0)
    r.boundary(T0)
    assert r.num_running == 2 and r.num_waiting == 1
    assert r.used_blocks == 16


def test_prefix_cache_hits_reduce_prefill_work():
    p = tiny(enable_prefix_caching=True, num_gpu_blocks=200)
    r = Replica(p, 0, T0)
    import heapq  # noqa: F401
    reqs = [Request(i, T0 + i, 600, 5, prefix_key="sys", prefix_tokens=512) for i in range(1, 4)]
    done = []
    for q in reqs:
        nt = r.enqueue(q, q.arrival)
        while nt is not None:
            nt, fin = r.boundary(nt)
            done.extend(fin)
    assert len(done) == 3
    assert r.stats.prefix_hits == 2 * 512
    assert r.stats.prompt_local_compute == 3 * 600 - 2 * 512
    assert done[1].first_token - done[1].arrival < done[0].first_token - done[0].arrival


def test_deterministic_under_a_seed():
    cfg = load_config()

    def run(seed):
        f = Fleet(cfg, "steady", seed=seed, start_time=T0)
        f.advance(90)
        return [render_vllm(r, f.t) for r in f.replicas], [(x.task_type, x.start, x.end,
                                                           x.model_calls) for x in f.truth]

    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c


def test_fast_forward_invariants_on_the_default_fleet():
    f = Fleet(load_config(), "burst", seed=3, start_time=T0)
    for _ in range(24):
        f.advance(5)
        for r in f.replicas:
            r.check_invariants()
            assert r.num_running <= r.p.max_num_seqs
    burst = f.pool_state("chat-8b")
    assert burst["running"] > 0


def test_saturated_pool_runs_at_the_theoretical_knee():
    """Overload one pool: the running set settles within 10% of theoretical_knee."""
    cfg = load_config()
    for tt in cfg.mix.task_types.values():
        if tt.pool == "chat-8b":
            tt.rate_per_s *= 4
    knee = theoretical_knee(cfg.pool("chat-8b"), cfg.mix)
    assert knee["bound"] == "kv_cache"
    f = Fleet(cfg, "steady", seed=5, start_time=T0)
    f.advance(120)
    running = []
    for _ in range(60):
        f.advance(2)
        s = f.pool_state("chat-8b")
        assert s["waiting"] > 0  # saturated: a queue all the time
        running.append(s["running"])
    mean = sum(running) / len(running)
    assert abs(mean - knee["pool"]) / knee["pool"] < 0.10


def test_theoretical_knee_seat_bound_and_mapping_input():
    p = PoolParams.from_dict("x", {"max_num_seqs": 8, "num_gpu_blocks": 24, "block_size": 128,
                                   "max_model_len": 1024, "max_num_batched_tokens": 2048,
                                   "replicas": 3})
    k = theoretical_knee(p, {"prompt": 100, "output": 100})
    assert k["bound"] == "max_num_seqs" and k["per_replica"] == 8 and k["pool"] == 24
    k = theoretical_knee(p, {"prompt": 900, "output": 200})
    assert k["bound"] == "kv_cache"
    assert k["per_replica"] == pytest.approx(23 * 128 / (900 + 100 + 64))
    with pytest.raises(ValueError, match="workload"):
        theoretical_knee(p, [1, 2])


@pytest.mark.parametrize("bad, msg", [
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"block_size": "16"}, "block_size must be an integer"),
    ({"num_gpu_blocks": 10, "block_size": 16, "max_model_len": 4096}, "exceeds the KV capacity"),
    ({"step_base_ms": -1.0}, "step_base_ms"),
    ({"max_num_seq": 4}, "unknown parameter"),
])
def test_bad_pool_parameters_are_named(bad, msg):
    with pytest.raises(ValueError, match=msg):
        PoolParams.from_dict("p", bad)


def test_bad_fleet_config_is_named():
    with pytest.raises(ValueError, match="unknown pool 'nope'"):
        config_from_dict({"pools": {"a": {}}, "mix": {"task_types": {
            "t": {"pool": "nope", "rate_per_s": 1, "steps": [{"prompt": 10, "output": 5}]}}}})
    with pytest.raises(ValueError, match="pools"):
        config_from_dict({"pools": {}})
    with pytest.raises(ValueError, match="unknown scenario"):
        Fleet(load_config(), "tsunami")


def test_request_token_buckets_follow_max_model_len():
    assert request_token_buckets(1024)[-1] == 1000.0
    assert request_token_buckets(8192) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


@settings(max_examples=60, deadline=None)
@given(first=st.floats(0.0, 3.0), step=st.one_of(st.just(0.0), st.floats(1e-6, 0.5)), k=st.integers(0, 300),
       weight=st.integers(1, 5))
def test_histogram_linear_observation_equals_one_by_one(first, step, k, weight):
    bounds = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0)
    a, b = Histo(bounds), Histo(bounds)
    a.observe_linear(first, step, k, weight)
    for s in range(k):
        b.observe(first + s * step, weight)
    assert a.count == b.count
    assert a.sum == pytest.approx(b.sum, rel=1e-9, abs=1e-9)
    # bucket edges may differ by float rounding only for values sitting exactly on a bound
    diff = sum(abs(x - y) for x, y in zip(a.cumulative(), b.cumulative()))
    assert diff <= 2 * weight * len(bounds)
    if step > 0 and all(abs((bd - first) / step - round((bd - first) / step)) > 1e-6
                        for bd in bounds):
        assert a.counts == b.counts


def _closed(n: int):
    return config_from_dict({
        "pools": {"p": {"replicas": 1, "enable_prefix_caching": False}},
        "mix": {"task_types": {"c": {"pool": "p", "sessions": n, "think_s": 0.5, "steps": [
            {"prompt": {"mean": 2000, "cv": 0.5, "max": 8000},
             "output": {"mean": 300, "cv": 0.5, "max": 2000}}]}}}})


def _window(n: int, warm: float = 60.0, samples: int = 60):
    f = Fleet(_closed(n), "steady", seed=2, start_time=T0)
    f.advance(warm)
    r = f.replicas[0]
    q0 = (r.stats.h["request_queue_time_seconds"].sum, r.stats.h["request_queue_time_seconds"].count)
    run = wait = 0
    for _ in range(samples):
        f.advance(0.5)
        run += r.num_running
        wait += r.num_waiting
    q = r.stats.h["request_queue_time_seconds"]
    return run / samples, wait / samples, (q.sum - q0[0]) / max(1, q.count - q0[1])


def test_closed_loop_sweep_turns_up_at_the_theoretical_knee():
    """Concurrency held fixed by N sessions: below the knee almost nothing waits; above it the
    running set stays at the knee (within 10%) and the excess waits, so queue time turns up."""
    cfg = _closed(1)
    knee = theoretical_knee(cfg.pools[0], cfg.mix)["per_replica"]
    below_run, below_wait, below_q = _window(int(0.8 * knee))
    above_run, above_wait, above_q = _window(int(1.5 * knee))
    assert below_wait < 2 and below_q < 0.5
    assert abs(above_run - knee) / knee < 0.10
    assert above_wait > 0.3 * knee
    assert above_q > 5 * max(below_q, 0.05)


def test_jumps_give_the_same_results_as_step_by_step(monkeypatch):
    """Taking runs of decode steps as one event is an optimisation only: the step-by-step
    reference (max_jump = 1) finishes the same requests at the same times."""
    def run():
        f = Fleet(load_config(), "burst", seed=12, start_time=T0, record_truth=True)
        f.advance(45)
        per_replica = []
        for r in f.replicas:
            gen = r.stats.generation_tokens + r.n_decode * r.steps_done_at(f.t)
            per_replica.append((sum(r.stats.success.values()), gen, r.stats.preemptions,
                                r.stats.h["time_to_first_token_seconds"].count,
                                r.stats.h["e2e_request_latency_seconds"].sum))
        return f.events_processed, per_replica, [(x.session_id, x.end) for x in f.truth]

    ev_jump, fast, truth_fast = run()
    monkeypatch.setattr(Replica, "max_jump", 1)
    ev_step, slow, truth_slow = run()
    # same requests, tokens, preemptions; times equal up to float rounding (closed-form sums)
    assert [x[:4] for x in fast] == [x[:4] for x in slow]
    for a, b in zip(fast, slow):
        assert a[4] == pytest.approx(b[4], rel=1e-5)
    assert [s for s, _ in truth_fast] == [s for s, _ in truth_slow]
    for (_, a), (_, b) in zip(truth_fast, truth_slow):
        assert a == pytest.approx(b, abs=1e-3)
    assert ev_step > 2 * ev_jump
