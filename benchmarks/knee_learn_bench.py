"""How fast, and how right, the knee is learned from a closed-loop agent overload at the default 15 s.

Issue 37's SRE trial, replayed through the simulator (lab/headroom_lab/sim): one replica with the
real CPU engine's limits (8 slots, 24 usable KV blocks of 128 tokens = 3,072 tokens; calls of ~350
prompt and ~100 output tokens, so the KV limit is 6.46 requests by construction, `theoretical_knee`)
and 20 closed-loop agent sessions running 3-call tasks with tool waits between the calls. Every 15
simulated seconds the replica's /metrics text is rendered and read exactly as direct mode reads it
(monitor/sources/vllm.py), each observation is made exactly as the cycle makes it
(monitor/capacity/enrich.py `interval_observation` over the newest reading at least 30 s older) and
fed to the knee estimator with the pool's steady prior (`SteadyPrior`, KV tokens per running
request measured), for `--minutes` (25, the trial's overload).

Two estimators see the same observations in the same run:
- `current`: monitor/capacity/knee.py as shipped (equal-count bins, bootstrap confidence,
  min_observations 30, plausibility);
- `baseline`: the fit before issue 37 (24 equal-width bins of >= 3 observations, confidence = share
  of the straight line's error the hinge removes x rise / 5 residual spreads x coverage), with its
  min_observations of 60, kept below as it was so the ratio is measured, not remembered.
Per trial and estimator: minutes until a learned knee is first published, the knee then and at the
end against the true knee, the confidence at the end, and the range of the fits' confidence once 30
observations are in. `--wait` sets the mean tool wait (8 s: the engine's 30 s load averages at 3-8,
mostly under the knee, as in the trial; 3 s: the engine overloaded throughout).

    python benchmarks/knee_learn_bench.py [--trials 8] [--minutes 25] [--wait 8] [--out FILE]

Results: benchmarks/knee_learn_results.json (both load shapes, `--wait 8` and `--wait 3`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import deque

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from headroom_lab.sim.exposition import render_vllm  # noqa: E402
from headroom_lab.sim.fleet import Fleet, config_from_dict, theoretical_knee  # noqa: E402
from monitor.capacity.enrich import interval_observation, older_reading  # noqa: E402
from monitor.capacity.knee import KneeEstimator, SteadyPrior  # noqa: E402
from monitor.sources.vllm import readings_from_text  # noqa: E402

INTERVAL, SPAN, SIGNAL = 15.0, 30.0, "queue"  # the defaults: global.interval, knee_min_span_seconds, knee_signal


def fleet_config(seed: int, sessions: int, wait: float):
    step = {"calls": 1, "prompt": {"mean": 350, "cv": 0.3, "max": 1200},
            "output": {"mean": 100, "cv": 0.5, "max": 400}, "tool_wait_s": wait}
    return config_from_dict({
        "seed": seed,
        "pools": {"p": {"model_name": "m", "replicas": 1, "max_num_seqs": 8, "num_gpu_blocks": 25,
                        "block_size": 128, "enable_prefix_caching": False, "max_model_len": 2048,
                        # a CPU engine: slow steps, slow prefill (e2e about 1-2 s a call)
                        "step_base_ms": 8.0, "step_per_seq_ms": 1.0, "step_per_1k_kv_ms": 0.5,
                        "prefill_per_1k_ms": 150.0}},
        "mix": {"task_types": {"chat": {"pool": "p", "sessions": sessions, "think_s": 1.0,
                                        "steps": [step, step, step]}}}})


# ---------------------------------------------------------------- the baseline: the fit before issue 37

def _wls(X, y, w):
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    return coef, float(np.sum(w * (y - X @ coef) ** 2))


def baseline_fit(load, latency, n_bins=24, min_bin=3):
    """(knee, confidence) of the fit before issue 37, or None."""
    if load.size < 4 * min_bin:
        return None
    lo, hi = np.percentile(load, 2), np.percentile(load, 98)
    if not hi > lo:
        return None
    edges = np.linspace(lo, hi, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, load, side="right") - 1, 0, n_bins - 1)
    xs, ys, ws = [], [], []
    for b in range(n_bins):
        sel = idx == b
        if sel.sum() >= min_bin:
            xs.append(np.median(load[sel]))
            ys.append(np.median(latency[sel]))
            ws.append(sel.sum())
    x, y, w = np.array(xs, float), np.array(ys, float), np.sqrt(np.array(ws, float))
    if x.size < 6:
        return None
    ones = np.ones_like(x)
    _, sse_lin = _wls(np.column_stack([ones, x]), y, w)
    trials = [(_wls(np.column_stack([ones, x, np.maximum(0.0, x - k)]), y, w), k) for k in x[1:-2]]
    (coef, sse), k = min(trials, key=lambda t: t[0][1])
    step = (x[-1] - x[0]) / (x.size - 1)
    for k2 in np.linspace(k - step, k + step, 41):
        if x[1] <= k2 <= x[-3]:
            c2, s2 = _wls(np.column_stack([ones, x, np.maximum(0.0, x - k2)]), y, w)
            if s2 < sse:
                coef, sse, k = c2, s2, k2
    _, b1, b2 = coef
    coverage = min(1.0, np.sum(x <= k) / 3.0, np.sum(x > k) / 2.0)
    r_gain = 0.0 if sse_lin <= 0 else max(0.0, 1.0 - sse / sse_lin)
    rise = b2 * (x[-1] - k)
    snr = rise / (math.sqrt(sse / max(1.0, float(np.sum(w)))) + 1e-12) if rise > 0 else 0.0
    steeper = b2 > 0 and (b1 + b2) >= 2.0 * max(b1, 0.0) and (b1 + b2) > 0
    return float(k), float(r_gain * min(1.0, snr / 5.0) * coverage) if steeper else 0.0


class Baseline:
    """The estimator before issue 37: 60 observations, 3 agreeing confident fits, then hysteresis."""

    def __init__(self, prior, min_observations=60, min_confidence=0.6, confirmations=3, min_change=0.10):
        self.prior, self.n_min, self.bar = prior, min_observations, min_confidence
        self.confirmations, self.min_change = confirmations, min_change
        self.obs: deque = deque(maxlen=5000)
        self.pending: deque = deque(maxlen=confirmations)
        self.published = None  # (knee, confidence)
        self.last = None

    def step(self, load, latency):
        self.obs.append((load, latency))
        if len(self.obs) < self.n_min:
            return self.published
        arr = np.array(self.obs)
        arr = arr[arr[:, 0] <= 4.0 * self.prior]
        self.last = baseline_fit(arr[:, 0], arr[:, 1]) if len(arr) >= self.n_min else None
        if self.last is None or self.last[1] < self.bar:
            self.pending.clear()
            return self.published
        k, conf = self.last
        if self.published and abs(k - self.published[0]) < self.min_change * self.published[0]:
            self.pending.clear()
            self.published = (self.published[0], conf)
            return self.published
        self.pending.append(k)
        if len(self.pending) == self.confirmations:
            centre = float(np.median(self.pending))
            if max(abs(v - centre) for v in self.pending) <= self.min_change * centre:
                self.published = (self.pending[-1], conf)
                self.pending.clear()
        return self.published


# ---------------------------------------------------------------- one trial

def trial(seed: int, minutes: float, wait: float, sessions: int) -> dict:
    cfg = fleet_config(seed, sessions, wait)
    truth = theoretical_knee(cfg.pools[0], cfg.mix)["per_replica"]
    fleet = Fleet(cfg, "steady", seed=seed, start_time=0.0)
    fleet.advance(60.0)  # the sessions are running when headroom starts watching
    replica = fleet.pools["p"][0]
    steady = SteadyPrior(None)
    cur, base = None, None
    readings, loads = [], []
    out = {"current": {"first": None, "confs": []}, "baseline": {"first": None, "confs": []}}
    cycles = int(minutes * 60 / INTERVAL)
    fit_seconds = 0.0
    for cycle in range(1, cycles + 1):
        fleet.advance(INTERVAL)
        rd = readings_from_text(render_vllm(replica, fleet.t), "http://replica/metrics", fleet.t)[0]
        readings.append(rd)
        per_req = rd.kv_live_tokens / rd.running if rd.running and rd.kv_live_tokens else None
        prior = steady.update(8, rd.kv_capacity_tokens, per_req)
        if cur is None:
            cur = KneeEstimator(SIGNAL, prior)
        cur.set_prior(prior)
        obs = interval_observation(rd, older_reading(readings, SPAN), SIGNAL) if len(readings) >= 2 else None
        if obs is None:
            continue
        loads.append(obs[0])
        if base is None:
            base = Baseline(prior.requests)
        cur.observe(*obs)
        t0 = time.perf_counter()
        knee = cur.estimate()
        fit_seconds += time.perf_counter() - t0
        b = base.step(obs[0], obs[2])
        minute = cycle * INTERVAL / 60.0
        if cur.last_fit is not None:
            out["current"]["confs"].append(cur.last_fit.confidence)
        if base.last is not None:
            out["baseline"]["confs"].append(base.last[1])
        if knee.source == "learned" and out["current"]["first"] is None:
            out["current"]["first"] = (minute, knee.requests)
        if b is not None and out["baseline"]["first"] is None:
            out["baseline"]["first"] = (minute, b[0])
        out["current"]["end"] = (knee.source, knee.requests, knee.confidence, knee.implausible)
        out["baseline"]["end"] = ("learned", b[0], b[1], "") if b else ("prior", prior.requests, 0.0, "")
    loads_arr = np.array(loads)
    result = {"seed": seed, "true_knee": round(truth, 3), "observations": len(loads),
              "load_p10_p50_p90": [round(float(v), 2) for v in np.percentile(loads_arr, [10, 50, 90])],
              "share_of_windows_past_true_knee": round(float(np.mean(loads_arr > truth)), 3),
              "fit_ms_mean": round(1000 * fit_seconds / max(1, len(loads)), 2)}
    for name, r in out.items():
        first = r["first"]
        source, k_end, conf_end, why = r["end"]
        result[name] = {
            "minutes_to_learn": round(first[0], 2) if first else None,
            "knee_when_learned": round(first[1], 3) if first else None,
            "knee_end": round(k_end, 3), "source_end": source, "confidence_end": round(conf_end, 3),
            "knee_end_over_true": round(k_end / truth, 3),
            "fit_confidence_min_max": [round(min(r["confs"]), 3), round(max(r["confs"]), 3)] if r["confs"] else None,
            **({"implausible": why} if why else {}),
        }
    return result


def summary(trials: list[dict], minutes: float) -> dict:
    out = {}
    for name in ("current", "baseline"):
        learned = [t[name]["minutes_to_learn"] for t in trials if t[name]["minutes_to_learn"] is not None]
        ratios = [t[name]["knee_end_over_true"] for t in trials if t[name]["source_end"] == "learned"]
        out[name] = {
            "learned_trials": f"{len(learned)} of {len(trials)}",
            "learned_within_10_min": sum(1 for m in learned if m <= 10.0),
            "minutes_to_learn_median": round(statistics.median(learned), 2) if learned else None,
            "minutes_to_learn_max": max(learned) if learned else None,
            "knee_end_over_true_median": round(statistics.median(ratios), 3) if ratios else None,
            "knee_end_over_true_range": [min(ratios), max(ratios)] if ratios else None,
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--wait", type=float, action="append", help="mean tool wait, s (repeatable; default 8 and 3)")
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(HERE, "knee_learn_results.json"))
    args = ap.parse_args(argv)
    results = {"interval_s": INTERVAL, "span_s": SPAN, "signal": SIGNAL, "minutes": args.minutes,
               "sessions": args.sessions, "shapes": {}}
    for wait in args.wait or [8.0, 3.0]:
        trials = []
        for seed in range(1, args.trials + 1):
            t = trial(seed, args.minutes, wait, args.sessions)
            trials.append(t)
            print(json.dumps({"wait": wait, **{k: t[k] for k in ("seed", "load_p10_p50_p90")},
                              "current": t["current"], "baseline": t["baseline"]}), flush=True)
        results["shapes"][f"tool_wait_{wait:g}s"] = {"summary": summary(trials, args.minutes), "trials": trials}
        print(json.dumps({"wait": wait, "summary": results["shapes"][f"tool_wait_{wait:g}s"]["summary"]}), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
