"""How fast the command line answers: `headroom --help`, `headroom check-config FILE`,
`headroom once --help` and `headroom backtest --help` against `python -c pass` in the same run (the interpreter's own start-up).

    python benchmarks/cli_start_bench.py [--trials 15]   -> benchmarks/cli_start_results.json

Each command runs `trials` times, interleaved with the baseline so a busy machine weighs on both
alike; the figures are wall-time medians and each command's median minus the baseline's (what
headroom itself costs). Target: <= 0.3 s wall median for --help and check-config.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("HEADROOM_BENCH_ROOT") or os.path.dirname(HERE)  # another checkout: a before/after
CONFIG = "sources:\n  vllm:\n    targets: [\"http://127.0.0.1:9/metrics\"]\nstore:\n  path: /tmp/h.sqlite\n"


def _wall(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": ROOT}
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr.decode()[-400:]}")
    return took


def main(trials: int = 15) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "headroom.yml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(CONFIG)
        py = [sys.executable]
        cases = {"python -c pass": py + ["-c", "pass"],
                 "headroom --help": py + ["-m", "monitor", "--help"],
                 "headroom check-config FILE": py + ["-m", "monitor", "check-config", path],
                 "headroom once --help": py + ["-m", "monitor", "once", "--help"],
                 "headroom backtest --help": py + ["-m", "monitor", "backtest", "--help"]}
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(trials):
            for name, argv in cases.items():
                times[name].append(_wall(argv))
    base = statistics.median(times["python -c pass"])
    out = {"trials": trials, "load_average": os.getloadavg()[0], "commands": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        out["commands"][name] = {"median_s": round(med, 3), "worst_s": round(max(ts), 3),
                                 "over_baseline_s": round(med - base, 3)}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=15)
    res = main(ap.parse_args().trials)
    with open(os.path.join(HERE, "cli_start_results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))
