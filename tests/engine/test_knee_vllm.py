"""The knee estimator fed from a real vLLM engine's /metrics (the session's `vllm_small_engine`:
max-num-seqs 8, 24 KV blocks, the `small` model): structure only.

A short stepped closed-loop sweep (tests/engine/measure.py `knee_sweep`: 2 and 16 clients, 9 s each,
no warm-up: the tier's engine has served before, and a slow first request moves no structural
claim) while headroom's KneeEstimator reads the engine's /metrics alone (queue-time signal,
Little's-law load, scraped every second). Checked on one run, as CI can on 2 shared cores:
- the sweep ran without a failed call and the estimator took observations from the engine's own
  families in every step (at least one a step);
- the engine's Little's-law load follows the clients: at 16 clients on 8 slots (8 running, 8
  queued) well above its value at 2 (below and far above the slots: the step between added 10 s and
  no claim);
- whatever the estimator publishes (its prior from the slots, or a learned knee) lies inside the
  sweep: more than one request in flight, at most twice the slots.
Whether the estimator learns a confident knee, and how close it comes to the client curve's, is an
accuracy figure of full sweeps (20 steps of 16 s) over repeated trials: `make bench-engine`
(benchmarks/engine_bench.py `knee`: `learned_in`, the ratio to the client-curve knee;
benchmarks/engine_results.json, docs/capacity.md section 6). A single full sweep on 2 shared cores
took up to 6 minutes and its learned knee moved with the load on the cores (quiet: 7.5-8.7 on 8
slots; cores loaded to 14: 2.4-5.4), which a pass/fail test cannot hold.
"""
from __future__ import annotations

import json
import sys

import pytest

from engine.measure import knee_sweep

pytestmark = pytest.mark.vllm

STEPS = (2, 16)
STEP_SECONDS = 9.0  # past the 6-s observation window: an observation or more per step


def test_a_short_sweep_feeds_the_estimator_from_the_engines_families(vllm_small_engine):
    seqs = vllm_small_engine.info["max_num_seqs"]
    sweep = knee_sweep(vllm_small_engine.url, seqs, steps=STEPS, step_seconds=STEP_SECONDS,
                       warmup_seconds=0.0)
    sys.stderr.write(f"\n[knee] {json.dumps(sweep)}\n")
    assert sweep["errors"] == []
    assert [s[0] for s in sweep["steps"]] == list(STEPS)
    assert sweep["observations"] >= len(STEPS), sweep["observations"]
    load = {clients: engine for clients, _client, engine in sweep["steps"]}
    assert None not in load.values(), load
    # a closed loop keeps every client's call in the engine (running or waiting): 16 clients hold
    # about eight times the load of 2; twice is the structural floor, far from either figure
    assert load[16] > 2 * load[2], load
    assert sweep["source"] in ("prior", "learned")
    assert 1.0 < sweep["learned"] <= 2 * seqs, sweep
