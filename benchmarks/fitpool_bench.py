"""monitor/kit/timebox.py `FitPool` against the well-kept `pebble` library's `ProcessPool` (issue 41),
on the same work, interleaved in the same trials so the ratios hold on a loaded machine. Each mode
runs in a fresh process (as a daemon starts) and measures:

    cold, warm    the seconds of one pool's refit (`forecast_pool`, the daemon's call, as
                  benchmarks/refit_bench.py makes it), the first and the second in the process
    call_ms       the median cost of one trivial call (math.sqrt) through the runner, 200 calls
    box_s         from a call that overruns a 0.5 s time box to its TimeBoxExceeded
    after_box_ms  the next call after it (a new worker from the fork server)
    died_s        a worker that exits during its call (os._exit): seconds to the error, and its type
    threads       threads the runner adds to the process once it has run a fit

Both runners use the same fork server with the same preloaded modules (FIT_MODULES) and one worker
reused fit after fit. The pebble runner is the adapter headroom would need (`PebbleRunner` below:
the daemon's errors, TimeBoxExceeded and ChildError, from pebble's). Needs `pip install pebble`
(not a headroom dependency). Writes benchmarks/fitpool_results.json.

Usage: OPENBLAS_NUM_THREADS=1 nice python benchmarks/fitpool_bench.py [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from refit_bench import BOX, history, refit  # noqa: E402

from monitor.kit.timebox import ChildError, FitPool, TimeBoxExceeded  # noqa: E402
from monitor.pipeline.forecaster import FIT_MODULES  # noqa: E402

MODES = ("fitpool", "pebble")
SMALL_BOX = 0.5


class PebbleRunner:
    """What headroom's fit runner would be on pebble: `runner(fn, args)` with the same errors."""

    def __init__(self, seconds: float, preload=(), max_fits: int = 500):
        import pebble
        ctx = mp.get_context("forkserver")
        if preload:
            ctx.set_forkserver_preload(list(preload))
        self.seconds, self._expired = seconds, pebble.ProcessExpired
        self.pool = pebble.ProcessPool(max_workers=1, max_tasks=max_fits, context=ctx)

    def __call__(self, fn, args):
        future = self.pool.schedule(fn, args=args, timeout=self.seconds)
        try:
            return future.result()
        except FutureTimeout:
            raise TimeBoxExceeded(f"abandoned after {self.seconds:g} s") from None
        except self._expired as exc:
            raise ChildError("ChildDied", f"fit process exited with code {exc.exitcode}", "") from None
        except Exception as exc:
            raise ChildError(type(exc).__name__, str(exc), getattr(exc, "traceback", "")) from None

    def close(self) -> None:
        self.pool.close()
        self.pool.join(5)


def make(mode: str, seconds: float):
    return FitPool(seconds, preload=FIT_MODULES) if mode == "fitpool" else PebbleRunner(seconds, FIT_MODULES)


def one_process(mode: str) -> dict:
    stop = threading.Event()
    for i in range(4):  # the daemon's process has threads (web workers, scheduler, cycle)
        threading.Thread(target=stop.wait, name=f"idle-{i}", daemon=True).start()
    base_threads = threading.active_count()
    series = history()
    runner = make(mode, BOX)
    out: dict = {}
    try:
        out["cold"], _ = refit(series, runner)
        out["warm"], out["models"] = refit(series, runner)
        out["threads"] = threading.active_count() - base_threads
        times = []
        for i in range(200):
            t0 = time.perf_counter()
            assert runner(math.sqrt, (float(i),)) == math.sqrt(i)
            times.append(time.perf_counter() - t0)
        out["call_ms"] = statistics.median(times) * 1e3
        try:
            runner(int, ("not a number",))
        except ChildError as exc:
            out["error_kind"] = exc.kind
    finally:
        runner.close()
    boxed = make(mode, SMALL_BOX)
    try:
        assert boxed(math.sqrt, (4.0,)) == 2.0  # a worker up before the overrun
        t0 = time.perf_counter()
        try:
            boxed(time.sleep, (30.0,))
            out["box"] = "not abandoned"
        except TimeBoxExceeded:
            out["box_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert boxed(math.sqrt, (9.0,)) == 3.0
        out["after_box_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        try:
            boxed(os._exit, (3,))
            out["died"] = "no error"
        except ChildError as exc:
            out["died_s"], out["died_kind"] = time.perf_counter() - t0, exc.kind
        except TimeBoxExceeded:
            out["died_s"], out["died_kind"] = time.perf_counter() - t0, "TimeBoxExceeded"
        assert boxed(math.sqrt, (16.0,)) == 4.0  # and the runner goes on
    finally:
        boxed.close()
        stop.set()
    return out


NUMBERS = ("cold", "warm", "call_ms", "box_s", "after_box_ms", "died_s", "threads")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "fitpool_results.json"))
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one fresh process
    args = ap.parse_args(argv)
    if args.mode:
        print(json.dumps(one_process(args.mode)))
        return 0
    rows: dict = {m: {k: [] for k in NUMBERS} for m in MODES}
    kinds: dict = {}
    for trial in range(args.trials):
        for mode in MODES if trial % 2 == 0 else MODES[::-1]:
            out = subprocess.run([sys.executable, __file__, "--mode", mode], capture_output=True, text=True,
                                 check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for k in NUMBERS:
                rows[mode][k].append(got.get(k))
            kinds[mode] = {"error": got.get("error_kind"), "died": got.get("died_kind"), "box": got.get("box", "ok"),
                           "models": got["models"]}
            print(f"trial {trial + 1} {mode}: " + ", ".join(f"{k} {got.get(k)!s:.6}" for k in NUMBERS), flush=True)
    med = {m: {k: statistics.median(v) for k, v in r.items() if None not in v} for m, r in rows.items()}
    result = {"trials": rows, "median": med,
              "ratio_pebble_to_fitpool": {k: med["pebble"][k] / med["fitpool"][k] for k in NUMBERS
                                          if k in med["pebble"] and med["fitpool"].get(k)},
              "behaviour": kinds,
              "history": "office_week seed 7, 14 days at 5 min, series load + arrival_rate, one pool",
              "load_average_at_end": os.getloadavg(),
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "pebble": _pebble_version(), "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS")}}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "trials"}, indent=1))
    return 0


def _pebble_version() -> str:
    from importlib.metadata import version
    return version("pebble")


if __name__ == "__main__":
    sys.exit(main())
