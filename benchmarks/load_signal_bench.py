"""Which load should headroom judge with agent tool waits (issue 37, item 3)?

A closed population of agent sessions (headroom-lab's simulated engine, in this process on a driven
clock: 1 replica of 8 slots, 20 sessions of 3-call tasks with tool waits between the calls, as the
issue's run) watched by the real cycle (`step`) every 15 s for 40 simulated minutes. Per cycle, three
candidates for the pool's load:
  instant   this cycle's active + queued (what headroom_ratio judged before)
  window    its time-weighted mean over the latency window (5 m; monitor/capacity/load_window.py)
  littles   completion rate x mean e2e over the rate window (Little's law from e2e seconds finished)
  judged    what headroom judges now (capacity.load_requests; load_source says which it took)
against the truth: the engines' running + waiting sampled every 0.5 s, averaged over the trailing 5 m.
After the first window: each candidate's spread (standard deviation over the cycles: steadiness) and
its mean absolute error against the truth (honesty), and the range of headroom_ratio it gives.
Repeated over seeds; numbers to benchmarks/load_signal_results.json.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from headroom_lab.sim.exposition import render_vllm  # noqa: E402
from headroom_lab.sim.fleet import Fleet, config_from_dict  # noqa: E402
from monitor.capacity.enrich import CapacityState  # noqa: E402
from monitor.capacity.load_window import LoadWindows  # noqa: E402
from monitor.capacity.slo import SloSettings  # noqa: E402
from monitor.config import Capacity, Config, PoolSettings, Target  # noqa: E402
from monitor.config.inputs import capacity_inputs, step_settings  # noqa: E402
from monitor.sources.vllm import readings_from_text  # noqa: E402
from monitor.step.cycle_state import CycleInputs, CycleState  # noqa: E402
from monitor.step.cycle_step import step  # noqa: E402

INTERVAL, WINDOW, MINUTES = 15.0, 300.0, 40
SESSIONS = int(os.environ.get("HEADROOM_SESSIONS", "20"))


def fleet(seed: int) -> Fleet:
    step_ = {"prompt": {"mean": 600, "cv": 0.3, "max": 2000}, "output": {"mean": 120, "cv": 0.5, "max": 1000}}
    doc = {"seed": seed,
           "pools": {"p": {"model_name": "m", "replicas": 1, "max_num_seqs": 8, "num_gpu_blocks": 2048,
                           "block_size": 16, "enable_prefix_caching": False, "max_model_len": 4096}},
           "mix": {"task_types": {"chat": {"pool": "p", "sessions": SESSIONS, "think_s": 2.0, "steps": [
               {**step_, "calls": 1, "tool_wait_s": 4.0}, {**step_, "calls": 1, "tool_wait_s": 4.0},
               {**step_, "calls": 1}]}}}}
    return Fleet(config_from_dict(doc), start_time=1_790_000_000.0, record_truth=False)


def trial(seed: int) -> dict:
    f = fleet(seed)
    (rep,) = f.pools["p"]
    url = "http://r0:8000/metrics"
    cfg = Config(vllm_targets=[Target(url)], pools={"m": PoolSettings(max_num_seqs=8)},
                 capacity=Capacity(), slos=SloSettings(), latency_window=WINDOW)
    state = CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg)))
    window = LoadWindows(WINDOW)
    samples: list[tuple[float, float]] = []
    rows = []
    for _ in range(int(MINUTES * 60 / INTERVAL)):
        for _ in range(int(INTERVAL / 0.5)):
            f.advance(0.5)
            samples.append((f.t, float(len(rep.running) + len(rep.waiting))))
        readings = readings_from_text(render_vllm(rep, f.t), url, f.t)
        state, snap = step(state, CycleInputs(readings, []), f.t)
        (p,) = snap.pools
        c = p.capacity
        e2e = p.latency.get("e2e")
        littles = p.completion_rate * e2e.mean if (p.completion_rate is not None and e2e and e2e.mean) else None
        truth = statistics.fmean(v for t, v in samples if t > f.t - WINDOW)
        eff = c.capacity_requests.effective
        mean = window.mean("p", f.t, c.load_requests_instant)
        rows.append({"t": f.t, "instant": c.load_requests_instant, "window": mean[0] if mean else None,
                     "littles": littles, "judged": c.load_requests, "source": c.load_source,
                     "truth": truth, "effective": eff})
    steady = [r for r in rows if r["t"] >= rows[0]["t"] + WINDOW]
    out = {}
    for name in ("instant", "window", "littles", "judged"):
        vals = [(r[name], r["truth"], r["effective"]) for r in steady if r[name] is not None]
        ratios = [1 - v / e for v, _, e in vals if e]
        out[name] = {"stdev": statistics.pstdev(v for v, _, _ in vals),
                     "mean_abs_error": statistics.fmean(abs(v - t) for v, t, _ in vals),
                     "ratio_min": min(ratios), "ratio_max": max(ratios), "cycles": len(vals)}
    out["truth_mean"] = statistics.fmean(r["truth"] for r in steady)
    out["judged_sources"] = sorted({r["source"] for r in steady})
    return out


def main() -> int:
    seeds = [int(s) for s in os.environ.get("HEADROOM_SEEDS", "1,2,3").split(",")]
    trials = {seed: trial(seed) for seed in seeds}
    summary = {name: {k: statistics.fmean(t[name][k] for t in trials.values())
                      for k in ("stdev", "mean_abs_error", "ratio_min", "ratio_max")}
               for name in ("instant", "window", "littles", "judged")}
    doc = {"command": "benchmarks/load_signal_bench.py (HEADROOM_SEEDS, HEADROOM_SESSIONS)", "setup": {"interval_s": INTERVAL, "window_s": WINDOW, "minutes": MINUTES, "sessions": SESSIONS,
                     "slots": 8, "seeds": seeds}, "trials": trials, "mean_over_trials": summary}
    with open(os.path.join(ROOT, "benchmarks", "load_signal_results.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
