"""What `headroom backtest --horizon 1d` costs on a 21-day, 5-minute series (wall and CPU).

The series is the seeded office generator of benchmarks/office_week.py (three weeks at a 5-minute
step: 6048 points; working-day peaks, lunch dip, nightly batch, growth, lognormal noise), written to
a CSV in a temporary directory. Each trial runs the real command in a fresh process,

    headroom backtest --csv office_21d_5min.csv --horizon 1d --json

(`python -m monitor`, so the checkout under test is what runs), and measures its wall time and
its CPU time (user + system of the child, from getrusage). Imports are included: that is what a user
waits for. Writes benchmarks/backtest_cost.json (trials, medians, the selected model, the machine)
and prints a summary.

Usage: python benchmarks/backtest_cost.py [--trials 3] [--out benchmarks/backtest_cost.json]
       [-- extra headroom backtest arguments, e.g. --models ets,snaive_day]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from office_week import office_series  # noqa: E402

DAYS = 21
STEP = 300.0
TARGET_WALL_SECONDS = 15.0


def write_series(path: str, seed: int = 7) -> int:
    s = office_series(seed=seed, weeks=DAYS / 7, step_seconds=STEP)
    with open(path, "w") as f:
        f.write("timestamp,value\n")
        for t, v in zip(s.index, s.to_numpy()):
            f.write(f"{t:.0f},{v:.6g}\n")
    return len(s)


def one_trial(cmd: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"headroom backtest failed ({proc.returncode}):\n{proc.stderr}")
    res = json.loads(proc.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": wall, "cpu_seconds": cpu, "selected": res["selected"],
            "mase": {m: (v.get("mase") if isinstance(v, dict) else None) for m, v in res["models"].items()},
            "origins": len(res["origins"]), "points": res["points"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "backtest_cost.json"))
    ap.add_argument("extra", nargs="*", help="extra `headroom backtest` arguments (after --)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headroom-btcost-") as tmp:
        csv = os.path.join(tmp, "office_21d_5min.csv")
        n = write_series(csv)
        cmd = [sys.executable, "-m", "monitor", "backtest", "--csv", csv, "--horizon", "1d", "--json",
               *args.extra]
        trials = []
        for k in range(args.trials):
            r = one_trial(cmd)
            trials.append(r)
            print(f"trial {k + 1}: wall {r['wall_seconds']:.1f} s, cpu {r['cpu_seconds']:.1f} s, "
                  f"selected {r['selected']}", file=sys.stderr, flush=True)
    wall = statistics.median(t["wall_seconds"] for t in trials)
    cpu = statistics.median(t["cpu_seconds"] for t in trials)
    out = {
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["headroom backtest --csv office_21d_5min.csv --horizon 1d --json", *args.extra]),
        "series": {"generator": "benchmarks/office_week.py office_series(seed=7)", "days": DAYS,
                   "step_seconds": STEP, "points": n},
        "trials": trials,
        "median_wall_seconds": wall, "median_cpu_seconds": cpu,
        "target_wall_seconds": TARGET_WALL_SECONDS, "met": wall <= TARGET_WALL_SECONDS,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "machine": platform.machine(),
                    "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS")},
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"headroom backtest --horizon 1d, {DAYS} days at {STEP / 60:g} min ({n} points), "
          f"{len(trials)} trials: median wall {wall:.1f} s, median CPU {cpu:.1f} s "
          f"(target wall <= {TARGET_WALL_SECONDS:g} s: {'met' if out['met'] else 'NOT met'}); "
          f"selected {trials[-1]['selected']}; {os.cpu_count()} cores, Python {platform.python_version()}")
    return out


if __name__ == "__main__":
    main()
