"""Measurements against a real vLLM engine, shared by the engine tests and `make bench-engine`.

Each function drives one load against a running engine and returns what both sides saw, as plain
data. The tests (tests/engine/test_knee_vllm.py, tests/engine/test_vllm_pipeline.py) assert what is exact or
structural on one run; benchmarks/engine_bench.py repeats each measurement and reports the accuracy
figures (learned knee vs the client-side latency curve, Little's-law closure), which on 2 shared
cores are noisy from run to run and so are no pass/fail check of a single CI run.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import numpy as np

from engine.load import ClosedLoop, token_prompt
from engine.reference import engine_gauges
from engine.servers import fetch_metrics
from monitor.capacity.enrich import interval_observation, older_reading
from monitor.capacity.knee import KneeEstimator, fit_hinge, prior_knee
from monitor.derive.core import derive_pools
from monitor.sources.vllm import readings_from_text

MODEL = "tiny"  # the served model name of both model shapes (tests/engine/tiny_model.py)

# clients per step: up past the knee and back down the same way, one client apart from 6 to 12, so
# every level near the knee is measured twice (each step starts from an idle engine); the history of
# this choice is in docs/capacity.md, section 6
KNEE_STEPS = (2, 4, 6, 7, 8, 9, 10, 11, 12, 14, 16, 14, 12, 11, 10, 9, 8, 7, 6, 4)
KNEE_STEP_SECONDS = 16.0
KNEE_LENGTHS = [24, 40, 56, 72]  # mixed lengths so the batch does not finish in lockstep
KNEE_WINDOW_SECONDS = 6.0


def knee_sweep(url: str, max_num_seqs: int, steps=KNEE_STEPS, step_seconds: float = KNEE_STEP_SECONDS,
               window_seconds: float = KNEE_WINDOW_SECONDS, seed: int = 0, enough=None,
               warmup_seconds: float = 6.0) -> dict:
    """A stepped closed-loop sweep. headroom's KneeEstimator is fed from the engine's /metrics alone
    (queue-time signal, Little's-law load, one scrape a second, windows within one step, as a stepped
    load test measures each level once it holds); the reference is the client-side curve (clients vs
    the mean client TTFT at that count) fitted with the same segmented regression. `enough(knee)`,
    when given, ends the sweep after the first step at whose end it holds (a test's condition; the
    benchmark runs every step). `warmup_seconds` of unrecorded load first (0: none, for an engine that
    has served before)."""
    target = url + "/metrics"
    est = KneeEstimator("queue", prior_knee(max_num_seqs=max_num_seqs), min_observations=30)
    points: list[tuple[int, float]] = []
    scrapes = []
    steady = []  # per step: (clients, client in-flight, engine Little's-law load)
    errors: list[str] = []
    # warm-up, not recorded: the first requests after start-up are slow (lazy initialisation)
    if warmup_seconds > 0:
        ClosedLoop(url, clients=max_num_seqs, duration=warmup_seconds, max_tokens=KNEE_LENGTHS,
                   seed=99 + seed).start().join(timeout=300)
    knee = est.estimate()
    for step, clients in enumerate(steps):
        loop = ClosedLoop(url, clients=clients, duration=step_seconds, max_tokens=KNEE_LENGTHS,
                          seed=1000 * seed + step).start()
        first = len(scrapes)
        while not loop.done():
            time.sleep(1.0)  # the scrape period (pacing, not a wait before an assertion)
            text, ts = fetch_metrics(url)
            scrapes.append(readings_from_text(text, target, ts)[0])
            older = older_reading(scrapes[first:], window_seconds)
            if scrapes[-1].timestamp - older.timestamp >= window_seconds:
                obs = interval_observation(scrapes[-1], older, "queue")
                if obs is not None:
                    est.observe(*obs)
            knee = est.estimate()  # every scrape, as the daemon: a new fit must be confirmed
        records = loop.join(timeout=300)
        errors += [str(e) for e in loop.errors()]
        points += [(clients, r.ttft) for r in records if r.ttft is not None]
        done = enough is not None and enough(knee)
        t0, t1 = min(r.start for r in records), max(r.end for r in records)
        whole = interval_observation(scrapes[-1], scrapes[first], "queue")
        steady.append((clients, sum(r.end - r.start for r in records) / (t1 - t0),
                       whole[0] if whole else None))
        if done:
            break
    levels = sorted({p[0] for p in points})
    x = np.array(levels, dtype=float)
    y = np.array([np.mean([p[1] for p in points if p[0] == c]) for c in levels])
    client_fit = fit_hinge(x, y, n_bins=64, min_bin=1)  # narrow bins: one per level
    last = est.last_fit
    return {
        "learned": knee.requests, "source": knee.source, "confidence": knee.confidence,
        "detail": knee.detail, "observations": knee.observations,
        "latest_fit": last.knee if last else None,
        "reference": client_fit.knee if client_fit else None,
        "reference_confidence": client_fit.confidence if client_fit else None,
        "client_mean_ttft": [[int(a), round(float(b), 4)] for a, b in zip(x, y)],
        "steps": [[c, round(a, 2), None if e is None else round(e, 2)] for c, a, e in steady],
        "scrapes": len(scrapes), "errors": errors[:5], "max_num_seqs": max_num_seqs,
    }


class Sampler:
    """Scrapes /metrics every `period` seconds in a thread; keeps (text, timestamp)."""

    def __init__(self, url: str, period: float = 0.25) -> None:
        self.url, self.period = url, period
        self.samples: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(fetch_metrics(self.url))
            self._stop.wait(self.period)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


def _steady_window(loop: ClosedLoop, sampler: Sampler, clients: int, want_completions: int,
                   want_samples: int, max_window: float) -> tuple[Optional[float], float]:
    """(lo, hi): opens once every client has finished two requests (a steady closed loop whose
    requests in flight have the ages of a steady state), closes once it holds `want_completions`
    completions and `want_samples` scrapes, or after `max_window` s."""
    lo = None
    give_up = time.time() + 200
    while time.time() < give_up:
        time.sleep(0.2)  # polling period of the condition below
        done = [r for r in loop.snapshot() if r.end is not None]
        if lo is None and min(sum(r.client == c for r in done) for c in range(clients)) >= 2:
            lo = time.time()
        if lo is None:
            continue
        scraped = sum(ts >= lo for _, ts in list(sampler.samples))
        if ((sum(r.end >= lo for r in done) >= want_completions and scraped >= want_samples)
                or time.time() - lo >= max_window):
            break
    return lo, time.time()


def littles_law_window(url: str, vocab: int, clients: int = 16, want_completions: int = 100,
                       want_samples: int = 40, max_window: float = 60.0, seed: int = 7) -> dict:
    """`clients` closed-loop clients (constant concurrency) and a scrape every 0.25 s. Over the steady
    window: headroom's own Little's-law ratio (from its pool), the same from the engine's counters and
    gauges read independently (prometheus_client's parser; gauges time-weighted, as scrapes under load
    are unevenly spaced), and the client-side one; with what each side computed, so a test can hold
    headroom's numbers against the independent ones exactly."""
    target = url + "/metrics"
    loop = ClosedLoop(url, clients=clients, duration=240.0, max_tokens=[60, 120, 180],
                      prompt=lambda rng: token_prompt(rng, rng.randint(16, 128), vocab), seed=seed,
                      random_lengths=True, stagger=1.0)
    with Sampler(url) as sampler:
        loop.start()
        try:
            lo, hi = _steady_window(loop, sampler, clients, want_completions, want_samples, max_window)
        finally:
            loop.stop()
        records = loop.join(timeout=300)
    out = {"clients": clients, "requests": len(records),
           "errors": [r.error for r in records if not r.ok][:5], "window_open": lo is not None}
    if lo is None:
        return out
    window = [(text, ts) for text, ts in sampler.samples if lo <= ts <= hi]
    history = [readings_from_text(text, target, ts)[0] for text, ts in window]
    span = window[-1][1] - window[0][1]
    pools = derive_pools({target: history}, now=window[-1][1], window_seconds=span + 1)
    pool = pools[0]
    ref = [engine_gauges(text)[MODEL] for text, _ in window]
    completed = ref[-1]["request_success"] - ref[0]["request_success"]
    e2e_mean = (ref[-1]["e2e_sum"] - ref[0]["e2e_sum"]) / (ref[-1]["e2e_count"] - ref[0]["e2e_count"])
    levels = [(ts, r["running"] + r["waiting"]) for (_, ts), r in zip(window, ref)]
    mean_l = sum((l0 + l1) / 2 * (t1 - t0) for (t0, l0), (t1, l1) in zip(levels, levels[1:])) / span
    client_l = sum(sum(1 for r in records if r.in_flight(ts)) for _, ts in window) / len(window)
    done = [r for r in records if lo <= r.end <= hi]
    out.update({
        "pools": [p.pool for p in pools], "samples": len(window), "span_seconds": span,
        "completed": completed, "completion_rate_engine": completed / span, "e2e_mean": e2e_mean,
        "mean_concurrency_engine": mean_l, "client_in_flight": client_l,
        "headroom_completion_rate": pool.completion_rate, "headroom_mean_concurrency": pool.mean_concurrency,
        "ratio_headroom": pool.littles_law_ratio,
        "ratio_engine": (completed / span) * e2e_mean / mean_l if mean_l else None,
        "ratio_client": ((len(done) / (hi - lo)) * (sum(r.e2e for r in done) / len(done)) / client_l
                         if done and client_l else None),
        "queue_mean": pool.latency["queue"].mean if "queue" in pool.latency else None,
    })
    return out


def write_ramp_mix(path: str, vocab: int) -> str:
    """The loadtest mix of the engine ramp (2, 4, ..., 20 sessions, 3 s each; tests/engine/test_loadtest_vllm.py
    and the benchmark's queue-agreement trials)."""
    with open(path, "w") as f:
        f.write(f"""
margin: 0.2
slo: {{quantile: 0.5, ttft_seconds: 0.5, max_error_ratio: 0.0}}
request: {{api: completions, prompt_mode: token_ids, token_id_range: [4, {vocab}], ignore_eos: true,
          timeout_seconds: 60}}
load:
  ramp: {{start: 2, step: 2, max: 20, step_seconds: 3}}
task_types:
  ask:
    class: interactive
    weight: 3
    calls_per_task: 2
    prompt_tokens: {{mean: 48, cv: 0.3, min: 16, max: 100}}
    output_tokens: {{mean: 80, cv: 0.25, min: 40, max: 120}}
  classify:
    class: batch
    weight: 1
    calls_per_task: 1
    prompt_tokens: {{mean: 64, cv: 0.3, min: 16, max: 100}}
    output_tokens: {{mean: 80, cv: 0.25, min: 40, max: 120}}
""")
    return path


def write_mixed_mix(path: str, vocab: int, deferrable_concurrency: int = 8, interactive_per_second: float = 1.0,
                    ttft_seconds: float = None, budget_interval: float = 2.0, pause: float = 3.0,
                    deferrable_output: int = 128) -> str:
    """The loadtest mix of `--pattern mixed` on the engine (tests/engine/test_loadtest_mixed_vllm.py and
    benchmarks/priority_protection.py): short interactive questions arriving at
    `interactive_per_second`, beside a backlog of long deferrable summaries worked by
    `deferrable_concurrency` sessions. Exact lengths (token ids, ignore_eos), so every case does the same work."""
    slo = f"slo: {{ttft_seconds: {ttft_seconds}}}\n" if ttft_seconds else ""
    with open(path, "w") as f:
        f.write(f"""{slo}request: {{api: completions, prompt_mode: token_ids, token_id_range: [4, {vocab}],
          ignore_eos: true, timeout_seconds: 120}}
load:
  drain_seconds: 60
  mixed: {{deferrable_concurrency: {deferrable_concurrency}, budget_interval_seconds: {budget_interval},
          pause_seconds: {pause}}}
task_types:
  ask:
    class: interactive
    tasks_per_second: {interactive_per_second}
    prompt_tokens: {{mean: 64, cv: 0.3, min: 16, max: 128}}
    output_tokens: {{mean: 16, cv: 0.25, min: 8, max: 24}}
  summarise:
    class: deferrable
    prompt_tokens: {{mean: 256, cv: 0.2, min: 128, max: 384}}
    output_tokens: {deferrable_output}
""")
    return path
