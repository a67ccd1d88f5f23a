"""What running every fit in a worker process costs a refit: one pool's forecast (`forecast_pool`, the
daemon's call, default models and backtest) on the same history, run three ways, interleaved in the
same trials so the ratios hold on a loaded machine. Each mode runs in a fresh process (as a daemon
starts: statsmodels not yet imported by it) that makes two refits, the first (`cold`) and the
second (`warm`, the daemon's steady state):

    inline   no time box: every fit in the process itself (the floor; cold pays the statsmodels import)
    fork     the old runner: each fit in a child forked from the process (which holds threads, as
             the daemon does); the parent never fits, so every child imports statsmodels again
    pool     monitor/kit/timebox.py FitPool: workers from the fork server with the forecast modules
             preloaded, one worker reused fit after fit (cold includes starting the fork server)

The history: the seeded office generator of benchmarks/office_week.py, 14 days at 5 minutes, as the
`load` and `arrival_rate` series of one pool. Writes benchmarks/refit_results.json and prints medians
and ratios.

Usage: OPENBLAS_NUM_THREADS=1 nice python benchmarks/refit_bench.py [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from office_week import office_series  # noqa: E402

from monitor.forecast.pool import PoolSettings, forecast_pool  # noqa: E402
from monitor.forecast.rolling_origin import ForecastSettings  # noqa: E402
from monitor.kit.timebox import FitPool  # noqa: E402
from monitor.pipeline.forecaster import FIT_MODULES  # noqa: E402

BOX = 120.0


def _forked_child(conn, fn, args):
    try:
        conn.send_bytes(pickle.dumps(("ok", fn(*args))))
    except BaseException as exc:
        conn.send_bytes(pickle.dumps(("err", repr(exc))))
    finally:
        conn.close()


def fork_runner(fn, args):
    """The runner before the fork server: a child forked per fit, killed after its box."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_forked_child, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(BOX):
            raise TimeoutError(f"abandoned after {BOX:g} s")
        status, payload = pickle.loads(parent.recv_bytes())
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def history(days: int = 14):
    s = office_series(seed=7, weeks=3, step_seconds=300.0)
    s = s.iloc[-int(days * 288):]
    return {"load": s, "arrival_rate": s / 40.0}


def refit(series, runner) -> tuple[float, str]:
    now = float(series["load"].index[-1]) + 300.0
    t0 = time.perf_counter()
    fc = forecast_pool(series, 200.0, now, PoolSettings(forecast=ForecastSettings(runner=runner)))
    wall = time.perf_counter() - t0
    models = ",".join(f"{k}={o.model}" for k, o in sorted(fc.series.items()))
    errors = {k: o.errors for k, o in fc.series.items() if o.errors}
    assert not errors, errors  # every fit finished: the timings compare the same work
    return wall, models


MODES = ("inline", "fork", "pool")


def one_process(mode: str) -> dict:
    """Two refits in this (fresh) process with the mode's runner, beside idle threads as in the daemon."""
    stop = threading.Event()
    for i in range(4):  # the daemon's process has threads (web workers, scheduler, cycle)
        threading.Thread(target=stop.wait, name=f"idle-{i}", daemon=True).start()
    series = history()
    pool = FitPool(BOX, preload=FIT_MODULES) if mode == "pool" else None
    runner = {"inline": None, "fork": fork_runner, "pool": pool}[mode]
    try:
        cold, _ = refit(series, runner)
        warm, models = refit(series, runner)
    finally:
        if pool is not None:
            pool.close()
        stop.set()
    return {"cold": cold, "warm": warm, "models": models}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "refit_results.json"))
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one fresh process's two refits
    args = ap.parse_args(argv)
    if args.mode:
        print(json.dumps(one_process(args.mode)))
        return 0
    rows: dict[str, dict[str, list[float]]] = {m: {"cold": [], "warm": []} for m in MODES}
    chosen = {}
    for trial in range(args.trials):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--mode", mode], capture_output=True, text=True,
                                 check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for k in ("cold", "warm"):
                rows[mode][k].append(got[k])
            chosen[mode] = got["models"]
            print(f"trial {trial + 1} {mode}: cold {got['cold']:.2f} s, warm {got['warm']:.2f} s", flush=True)
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in rows.items()}
    result = {"trials": rows, "median_seconds": med,
              "ratio_pool_to_fork_warm": med["pool"]["warm"] / med["fork"]["warm"],
              "ratio_pool_to_inline_warm": med["pool"]["warm"] / med["inline"]["warm"],
              "ratio_fork_to_inline_warm": med["fork"]["warm"] / med["inline"]["warm"],
              "ratio_pool_to_fork_cold": med["pool"]["cold"] / med["fork"]["cold"], "models": chosen,
              "history": "office_week seed 7, 14 days at 5 min, series load + arrival_rate, one pool",
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS")}}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("trials", "models")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
