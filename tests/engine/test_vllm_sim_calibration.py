"""Issue 3: the simulated replica behaves like the real engine it stands for.

The same small workload (24 requests at once, prompts of exact token lengths, `ignore_eos`) goes to
the real vLLM CPU engine (max-num-seqs 8, 24 KV blocks of 128 tokens, the `small` model, where the
engine, not its HTTP frontend, is the bottleneck: on `tiny` two scrapes in one run showed KV usage
0.43 and 0.48 where the requests the client had in flight gave 0.61) and to a simulated replica
configured the same way. Both are read through headroom's parser (`readings_from_text` on the real
/metrics and on the simulator's exposition), and in both:
- running is capped by max_num_seqs and reaches it;
- requests wait when arrivals exceed service (24 arrivals on 8 slots);
- KV usage tracks the tokens in flight over the capacity, block granular, within 0.10 (absolute,
  i.e. 2.3 of the 23 usable blocks): for the real engine the tokens in flight come from the
  requests we sent (prompt tokens + tokens streamed back so far, per request in flight); for the
  simulator from its requests' own progress.

The workload keeps prompt + output <= 256 tokens (<= 2 blocks a request, <= 16 of 23 blocks for 8
running requests), so no request is preempted - the client cannot see a preemption, and the test
asserts none happened.
"""
from __future__ import annotations

import heapq
import random
import statistics
import sys
import time

import pytest

from engine.load import start_batch, token_prompt
from engine.reference import engine_gauges
from engine.servers import fetch_metrics
from headroom_lab.sim.engine import DECODE, PREFILL, PoolParams, Replica, Request
from headroom_lab.sim.exposition import render_vllm
from monitor.sources.vllm import readings_from_text

pytestmark = pytest.mark.vllm

MAX_NUM_SEQS, NUM_BLOCKS, BLOCK = 8, 24, 128
USABLE_BLOCKS = NUM_BLOCKS - 1  # vLLM keeps one null block: usage = used / (blocks - 1)
N = 24  # 3 waves on 8 slots: every claim below holds for any N > 8 (48 took 15 s more)
TOLERANCE = 0.10
LAG = 0.10  # seconds of client-side observation lag allowed around a scrape (streaming, threads)


def workload(seed: int = 3) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) per request: totals <= 256, many cross a block boundary."""
    rng = random.Random(seed)
    out = []
    for _ in range(N):
        prompt = rng.randint(20, 150)
        out.append((prompt, rng.randint(40, 256 - prompt)))
    return out


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK)


def check_behaviour(samples: list[dict], who: str) -> dict:
    """The three properties over samples {t, running, waiting, kv_usage, expected_usage, steps}."""
    running = [s["running"] for s in samples]
    waiting = [s["waiting"] for s in samples]
    errors = [abs(s["kv_usage"] - s["expected_usage"]) for s in samples]
    assert max(running) <= MAX_NUM_SEQS, f"{who}: running above max_num_seqs"
    assert max(running) == MAX_NUM_SEQS, f"{who}: the batch never filled"
    assert max(waiting) > 0, f"{who}: nothing ever waited with {N} arrivals on {MAX_NUM_SEQS} slots"
    # a slot freed while requests wait is refilled within a couple of engine steps: after a sample
    # with a free slot and a queue, the first sample taken two or more steps later shows at least
    # one admission (finished since + running now - running then >= 1). vLLM may report a step
    # between a finish and the admission that follows it; arrivals may still grow the queue.
    for i, s in enumerate(samples):
        if s["running"] < MAX_NUM_SEQS and s["waiting"] > 0:
            later = next((n for n in samples[i + 1:] if n["steps"] >= s["steps"] + 2), None)
            if later is not None:
                # a request that left the queue was admitted too (no aborts; a preemption would grow the
                # queue): vLLM's API server counts a success after the engine freed its slot, and on
                # loaded cores that count lagged (a tier run at load 15 read 7 running, 3 -> 2 waiting,
                # no success between)
                admitted = max(later["finished"] - s["finished"] + later["running"] - s["running"],
                               s["waiting"] - later["waiting"])
                assert admitted >= 1, (who, s, later)
    assert sum(s["running"] == MAX_NUM_SEQS for s in samples if s["waiting"] > 0) > 0
    within = sum(e <= TOLERANCE for e in errors) / len(errors)
    return {"max_running": max(running), "max_waiting": max(waiting), "within": within,
            "median_error": statistics.median(errors), "max_error": max(errors),
            "peak_kv": max(s["kv_usage"] for s in samples), "samples": len(samples)}


# ---------------------------------------------------------------------------- the simulator

def simulate(reqs: list[tuple[int, int]], period: float = 0.02) -> list[dict]:
    """Run the workload on a simulated replica configured like the engine; sample headroom's view of
    its /metrics (and the requests' own progress) at every step boundary and every `period` seconds
    of simulated time in between (mid-jump, where the exposition interpolates)."""
    params = PoolParams.from_dict("tiny", dict(
        model_name="tiny", replicas=1, max_num_seqs=MAX_NUM_SEQS, num_gpu_blocks=NUM_BLOCKS,
        block_size=BLOCK, max_model_len=1024, max_num_batched_tokens=2048,
        enable_prefix_caching=False))
    t0 = 1_800_000_000.0
    replica = Replica(params, 0, t0)
    events: list = []
    seq = 0
    for i, (prompt, output) in enumerate(reqs):
        seq += 1
        heapq.heappush(events, (t0, seq, "A", Request(i + 1, t0, prompt, output)))
    samples = []

    def sample(t: float) -> None:
        text = render_vllm(replica, t)
        reading = readings_from_text(text, "sim", t)[0]
        # tokens in flight from the requests themselves: a request being prefilled holds blocks for
        # its whole prompt (allocated at admission, as vLLM does), a decoding one for prompt +
        # tokens generated so far (decode steps done in the current jump included)
        steps = replica.steps_done_at(t)
        blocks = 0
        for r in replica.running.values():
            if r.state == PREFILL:
                blocks += blocks_for(r.target)
            elif r.state == DECODE:
                blocks += blocks_for(replica.tokens_held(r) + steps)
        samples.append({"t": t, "running": reading.running, "waiting": reading.waiting,
                        "kv_usage": reading.kv_usage, "expected_usage": blocks / USABLE_BLOCKS,
                        "kv_capacity_tokens": reading.kv_capacity_tokens,
                        "finished": reading.counters["request_success"],
                        "steps": replica.stats.h["iteration_tokens_total"].count + steps})

    grid = t0 + period
    while events:
        t, _, kind, payload = heapq.heappop(events)
        while grid < t and replica.op is not None:
            sample(grid)
            grid += period
        grid = max(grid, t)
        if kind == "A":
            nt = replica.enqueue(payload, t)
        else:
            if payload != replica.version:
                continue
            nt, _done = replica.boundary(t)
            sample(t)
        if nt is not None:
            seq += 1
            heapq.heappush(events, (nt, seq, "B", replica.version))
    assert replica.stats.success["length"] == N
    assert replica.stats.preemptions == 0
    return samples


# ---------------------------------------------------------------------------- the real engine

def drive_engine(engine, reqs: list[tuple[int, int]]):
    url, vocab = engine.url, engine.info["vocab_size"]
    rng = random.Random(5)
    prompts = [token_prompt(rng, p, vocab) for p, _ in reqs]
    before_text = fetch_metrics(url)[0]
    scrapes: list[tuple[str, float, float]] = []  # (text, sent, answered)
    run = start_batch(url, [o for _, o in reqs], prompts)
    deadline = time.monotonic() + 600
    while not run.done() and time.monotonic() < deadline:
        sent = time.time()
        text, answered = fetch_metrics(url)
        scrapes.append((text, sent, answered))
        run.wait(0.02)  # a scrape every ~30 ms until the batch ends: hundreds per run, each parsed twice afterwards
    records = run.join(timeout=max(0.0, deadline - time.monotonic()))
    after_text = fetch_metrics(url)[0]
    return before_text, records, scrapes, after_text


def engine_samples(records, scrapes, target: str) -> list[dict]:
    """Per scrape: headroom's reading, the client-side point estimate of blocks in use at the scrape's
    midpoint, and client-side bounds over [sent - LAG, answered + LAG] (a request may be admitted
    but not streaming yet, or finished in the engine before its last chunk arrived)."""
    samples = []
    for text, sent, answered in scrapes:
        t = (sent + answered) / 2  # the gauges were read somewhere in between
        a, b = sent - LAG, answered + LAG
        reading = readings_from_text(text, target, answered)[0]
        blocks = lo = 0
        certain, maybe = 0, []
        for r in records:
            if r.end < a or r.start > b:
                continue
            g = r.generated_at(t)
            if r.in_flight(t) and g > 0:  # streaming: the request was admitted and is running
                blocks += blocks_for(r.prompt_tokens + g)
            ga, gb = r.generated_at(a), r.generated_at(b)
            if ga > 0 and r.end > b:  # streamed before and after: running over the whole window
                lo += blocks_for(r.prompt_tokens + ga)
                certain += blocks_for(r.prompt_tokens + gb + 1)  # +1: the slot of the next token
            else:  # waiting, being admitted, or finishing: running or not, at most this many blocks
                maybe.append(blocks_for(r.prompt_tokens + gb + 1))
        n_certain = sum(1 for r in records if not (r.end < a or r.start > b)) - len(maybe)
        hi = certain + sum(sorted(maybe, reverse=True)[:max(0, MAX_NUM_SEQS - n_certain)])
        samples.append({"t": t, "running": reading.running, "waiting": reading.waiting,
                        "kv_usage": reading.kv_usage, "expected_usage": blocks / USABLE_BLOCKS,
                        "kv_lo": lo / USABLE_BLOCKS, "kv_hi": hi / USABLE_BLOCKS,
                        "kv_capacity_tokens": reading.kv_capacity_tokens,
                        "finished": reading.counters["request_success"],
                        "steps": engine_gauges(text)["tiny"]["steps"]})
    return samples


def test_simulated_replica_matches_the_real_engine(vllm_small_engine):
    reqs = workload()
    before_text, records, scrapes, after_text = drive_engine(vllm_small_engine, reqs)
    # the simulator gets the same requests in the order the client sent them (FCFS in both)
    sim = simulate([reqs[r.index] for r in sorted(records, key=lambda r: r.start)])

    assert [r.error for r in records if not r.ok] == []
    assert [(r.prompt_tokens, r.completion_tokens) for r in sorted(records, key=lambda r: r.index)] \
        == reqs, "the engine saw exactly the prompt and output lengths sent"
    before, after = engine_gauges(before_text)["tiny"], engine_gauges(after_text)["tiny"]
    assert after["request_success"] - before["request_success"] == N
    counters = [readings_from_text(text, "x", 0)[0].counters for text in (before_text, after_text)]
    assert counters[1]["preemptions"] - counters[0]["preemptions"] == 0, "the workload preempted"
    assert len(scrapes) >= 10, f"only {len(scrapes)} scrapes while the workload ran"

    real = engine_samples(records, scrapes, vllm_small_engine.url + "/metrics")
    assert {s["kv_capacity_tokens"] for s in real} == {NUM_BLOCKS * BLOCK}
    assert {s["kv_capacity_tokens"] for s in sim} == {NUM_BLOCKS * BLOCK}

    sim_stats = check_behaviour(sim, "simulator")
    real_stats = check_behaviour(real, "vLLM")
    # the simulator's KV accounting is exact at its own step boundaries
    assert sim_stats["max_error"] <= 1e-9, sim_stats
    # the real engine's, seen from the client (streaming lag, scrape timing): every scrape is within
    # 0.10 of the client-side bounds (below). How close the client's point estimate comes is an
    # accuracy figure, not a test's: it moves with the load (share within 0.10: 0.81 in a clean-clone
    # run of 2026-12-04, 0.73 with the cores loaded to 14, median error 0.09 then);
    # benchmarks/kv_band_bench.py measures it over repeated trials
    sys.stderr.write(f"\n[calibration] real engine: {real_stats}\n")
    outside = [(s["kv_lo"], s["kv_usage"], s["kv_hi"]) for s in real
               if not s["kv_lo"] - TOLERANCE <= s["kv_usage"] <= s["kv_hi"] + TOLERANCE]
    assert outside == []
    # same FCFS admission, same request sizes: the KV peaks agree
    assert abs(sim_stats["peak_kv"] - real_stats["peak_kv"]) <= TOLERANCE, (sim_stats, real_stats)
    assert sim_stats["max_waiting"] == N - MAX_NUM_SEQS
    # 24 arrivals on 8 slots: requests wait. How far the queue grows is the client's timing, not the
    # engine's: its burst reaches the engine over a few hundred ms while it already serves (16 in
    # most runs; a clean-clone run of 2026-12-05 read 8 while every scrape was inside the bounds)
    assert real_stats["max_waiting"] > 0, real_stats
    wall = max(r.end for r in records) - min(r.start for r in records)
    print(f"\n[calibration] sim {sim_stats}\n[calibration] vLLM {real_stats}; {N} requests in "
          f"{wall:.1f} s, {len(scrapes)} scrapes")
