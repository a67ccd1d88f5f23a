"""/metrics latency while the landing page of a 2,000-pool snapshot is viewed concurrently.

A real WebServer on loopback serves a 2,000-pool snapshot; VIEWERS threads fetch `/` in a loop while
this process scrapes /metrics SCRAPES times (10 s timeout each, a new snapshot published before each
scrape so the page is rendered again). Two arms, each TRIALS times: `lane` (headroom's server: /metrics
on its own worker), `shared` (priority=None: /metrics queued behind the page renders; the page still
rendered once per snapshot) and `before` (no lane, every view renders the page: the code before).
Reports per arm: scrape latency median / worst, scrapes timed out, views answered, and the page's
render time. Writes benchmarks/metrics_lane_results.json.

    .venv/bin/python benchmarks/metrics_lane_bench.py [--pools 2000] [--viewers 8] [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "export"))

from test_metrics_lane import NOW, fleet  # noqa: E402

from monitor.export import server as web  # noqa: E402
from monitor.export.collector import Exposition  # noqa: E402
from monitor.export.landing import render  # noqa: E402
from monitor.model import Snapshot  # noqa: E402


def trial(pools: int, viewers: int, scrapes: int, lane: bool, cache: bool = True) -> dict:
    snap, trends = fleet(pools, NOW)
    state = web.WebState(Exposition(), trends)
    state.publish(snap)
    if not cache:  # as before: every view renders the page itself
        state.rendered = lambda page, render_fn: render_fn(state.snapshot)
    host, port = "127.0.0.1", 0
    server = web.WebServer((host, port), app=lambda req: web.handle(state, req),
                           fast=lambda req: web.probe(state, req),
                           priority=(lambda req: req.path == "/metrics") if lane else None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    stop, views = threading.Event(), []

    def viewer():
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    views.append(s.get(base + "/", timeout=300).status_code)
                except requests.RequestException:
                    views.append(None)
    threads = [threading.Thread(target=viewer, daemon=True) for _ in range(viewers)]
    for t in threads:
        t.start()
    latencies, timeouts = [], 0
    try:
        for k in range(scrapes):
            state.publish(Snapshot(timestamp=NOW + 15 * (k + 1), pools=snap.pools))
            deadline = time.monotonic() + 60
            while server.stats.requests_in_progress < server.limits.workers and time.monotonic() < deadline:
                time.sleep(0.01)
            t0 = time.perf_counter()
            try:
                requests.get(base + "/metrics", timeout=10).raise_for_status()
                latencies.append(time.perf_counter() - t0)
            except requests.RequestException:
                timeouts += 1
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        for t in threads:
            t.join(120)
    t0 = time.perf_counter()
    render(snap, trends)
    render_s = time.perf_counter() - t0
    return {"scrape_seconds": latencies, "timeouts": timeouts, "views": len([v for v in views if v == 200]),
            "render_seconds": render_s}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pools", type=int, default=2000)
    ap.add_argument("--viewers", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    doc = {"pools": args.pools, "viewers": args.viewers, "scrapes": args.scrapes, "trials": args.trials,
           "python": platform.python_version(), "cpus": os.cpu_count(), "arms": {}}
    for arm in ("lane", "shared", "before"):
        runs = [trial(args.pools, args.viewers, args.scrapes, arm == "lane", arm != "before")
                for _ in range(args.trials)]
        lat = [x for r in runs for x in r["scrape_seconds"]]
        doc["arms"][arm] = {"runs": runs, "scrape_median_s": statistics.median(lat) if lat else None,
                            "scrape_worst_s": max(lat) if lat else None,
                            "timeouts": sum(r["timeouts"] for r in runs),
                            "render_median_s": statistics.median(r["render_seconds"] for r in runs)}
        print(arm, {k: v for k, v in doc["arms"][arm].items() if k != "runs"}, flush=True)
    with open(os.path.join(HERE, "metrics_lane_results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
