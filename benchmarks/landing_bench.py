"""Landing page render time for 50 pools (issue: the demo's landing page stays fast), and for a large
fleet (issue 38: 2,000 pools made a 2.3 MB page that took Chromium 15.5 s; it is paged since).

Each pool carries what the page shows: capacity with a knee, a forecast with both bands, task types,
firing and pending alerts, and a full chart (6 h at one point per minute). Times `render` over
repeated trials against the JSON of the same snapshot (`snapshot_to_dict` + `json.dumps`) in the
same run; with --chromium also headless Chromium loading the page (--dump-dom of the file) against
Chromium loading a one-pool page in the same run (its start-up). Writes the run under its pool count
into benchmarks/landing_results.json (the other counts' runs are kept).

    .venv/bin/python benchmarks/landing_bench.py [--pools 50] [--trials 30] [--chromium]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from monitor.export.landing import Trends, render  # noqa: E402
from monitor.export.landing_pages import LANDING_PAGE_POOLS  # noqa: E402
from monitor.export.snapshot_json import snapshot_to_dict  # noqa: E402
from monitor.forecast.pool import Horizon, PoolForecast  # noqa: E402
from monitor.model import Alert, Capacity, Limits, PoolSnapshot, PoolTasks, Quantiles, Scenarios, Snapshot, TaskStats  # noqa: E402

NOW = 1_796_300_000.0


def snapshot(n_pools: int) -> tuple[Snapshot, Trends]:
    pools, alerts = [], []
    trends = Trends()
    for i in range(n_pools):
        name = f"pool-{i:02d}/meta-llama/Llama-3.1-8B-Instruct"
        cap = Capacity(knee_requests=300.0, knee_source="learned", knee_signal="queue", knee_confidence_ratio=0.9,
                       ratio=Scenarios(0.1, -0.2), capacity_requests=Limits(1024.0, 340.0, 300.0, 300.0),
                       sessions=400.0, session_capacity=440.0, sessions_per_megawatt=150_000.0, utilisation_ratio=0.9)
        day = Horizon(mean=250.0, upper=300.0, peak=320.0, peak_upper=380.0, peak_upper_80=350.0,
                      peak_timestamp=NOW + 3600, end_timestamp=NOW + 86400)
        tasks = PoolTasks(by_type={t: TaskStats(t, arrival_rate=2.0, calls_per_task=3.0, sessions=50.0,
                                                task_latency=Quantiles(p95=20.0), slo_target_seconds=30.0,
                                                slo_violation_ratio=0.01) for t in ("ask", "summarise", "email")})
        pools.append(PoolSnapshot(pool=name, model=name, replicas=4, replicas_configured=4, active_requests=270.0,
                                  queued_requests=12.0, kv_tokens_live=9e5, kv_tokens_capacity=1.2e6, kv_usage_ratio=0.75,
                                  capacity=cap, tasks=tasks,
                                  forecast=PoolForecast(NOW, {}, {"1d": day}, exhaustion_seconds=5400.0,
                                                        capacity_requests=300.0),
                                  recommended_replicas={"1d": 6}))
        alerts += [Alert("HeadroomLow", "firing", "warning", name, "Capacity headroom is low.", NOW - 300),
                   Alert("HeadroomQueueBuilding", "pending", "warning", name, "Requests are queueing.", NOW - 30)]
        trends.seed(name, [(NOW - 6 * 3600 + 60 * k, 200.0 + k % 50, float(k % 7), 0.7) for k in range(360)])
    return Snapshot(timestamp=NOW, pools=pools, alerts=alerts, alerts_ui="http://prom:9090/alerts"), trends


def timed(fn, trials: int) -> list[float]:
    fn()  # warm
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-quic", "--no-first-run"]


def chromium_ms(page: str, trials: int) -> list[float]:
    """Headless Chromium loading `page` from a file (--dump-dom: parsed, styled, laid out), per trial."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise SystemExit("chromium is not installed")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "page.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        for k in range(trials):
            t0 = time.perf_counter()
            subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile-{k}", "--dump-dom",
                            "file://" + path], capture_output=True, timeout=600, check=True)
            out.append((time.perf_counter() - t0) * 1000)
    return out


def stats(ms: list[float]) -> dict:
    return {"trials": ms, "median": statistics.median(ms), "worst": max(ms)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pools", type=int, default=50)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--chromium", action="store_true", help="also time headless Chromium loading the page")
    args = ap.parse_args()
    snap, trends = snapshot(args.pools)
    page = render(snap, trends, links=(("Prometheus", "http://prom:9090/"),), has_alerts_source=True)
    assert page.count('<section class="card') == min(args.pools, LANDING_PAGE_POOLS)
    page_ms = timed(lambda: render(snap, trends, has_alerts_source=True), args.trials)
    json_ms = timed(lambda: json.dumps(snapshot_to_dict(snap), allow_nan=False), args.trials)
    doc = {"pools": args.pools, "pools_on_the_page": min(args.pools, LANDING_PAGE_POOLS), "page_bytes": len(page.encode()),
           "render_ms": stats(page_ms), "json_ms": stats(json_ms),
           "ratio_median": statistics.median(page_ms) / statistics.median(json_ms),
           "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                       "load_1m": os.getloadavg()[0]}}
    line = (f"{args.pools} pools, page {doc['page_bytes'] / 1024:.0f} KiB: render median {doc['render_ms']['median']:.1f} ms "
            f"(worst {doc['render_ms']['worst']:.1f}); JSON of the same snapshot {doc['json_ms']['median']:.1f} ms "
            f"(ratio {doc['ratio_median']:.2f})")
    if args.chromium:
        one = render(*snapshot(1), has_alerts_source=True)
        trials = max(1, min(args.trials, 5))
        doc["chromium_ms"], doc["chromium_one_pool_ms"] = stats(chromium_ms(page, trials)), stats(chromium_ms(one, trials))
        line += (f"; Chromium {doc['chromium_ms']['median']:.0f} ms against {doc['chromium_one_pool_ms']['median']:.0f} ms "
                 f"for a one-pool page")
    path = os.path.join(HERE, "landing_results.json")
    try:
        with open(path) as f:
            runs = json.load(f)
    except (OSError, ValueError):
        runs = {}
    if "pools" in runs:  # the file of one run, before runs were kept per pool count
        runs = {f"{runs['pools']} pools": runs}
    runs[f"{args.pools} pools"] = doc
    with open(path, "w") as f:
        json.dump(runs, f, indent=1)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
