"""Replica churn soak: RSS of the real Pipeline over one simulated hour of replica and pool churn.

A simulated vLLM fleet (lab/headroom_lab/sim: one pool of 8 replicas, its engines' /metrics rendered by
lab/headroom_lab/sim/exposition.py) is served on loopback by one HTTP server, each replica under a path that
names it: `/<replica>-g<generation>/metrics`. Every cycle one replica gets a new generation (a new
target, so a new replica name to headroom), and every minute the model name the fleet serves gets
a new suffix (a new pool). The real `Pipeline` (monitor/pipeline/cycle.py, with the capacity layer) scrapes
the current targets each cycle; its clock is injected and advanced one interval (5 s) per cycle, and
the fleet is advanced to the same time, so one simulated hour (720 cycles) runs in about a minute of
wall time. Every snapshot is also rendered to /metrics (export/collector.py) and added to the
landing page's chart (export/landing.py Trends), as the daemon does.

RSS (VmRSS, not the peak) is sampled every simulated minute. Two runs in fresh processes:
`forget_after` 10 min (history_keep 10 min) and `forget_after` 7 d (nothing forgotten within the
hour but the readings). Target: with expiry, RSS after the first expiry period (10 min) stays within
10 % of its value then. Results: benchmarks/churn_soak.json.

    python benchmarks/churn_soak.py            # both runs, writes the JSON
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INTERVAL = 5.0
HOUR_CYCLES = 720
REPLICAS = 8
START = 1_790_000_000.0


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


class ChurningFleet:
    """The simulated fleet's pages, each replica under its current name, the model renamed per minute.
    It runs in the measured process (one clock for both), without the simulator's per-task truth log,
    which would grow with the hour and is not headroom's."""

    def __init__(self):
        from headroom_lab.sim.fleet import Fleet
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from simfleet import one_pool, task  # the tests' one-pool fleet (tests/simfleet.py)
        sim = one_pool(5, {"ask": task(3.0)}, replicas=REPLICAS)
        self.fleet = Fleet(sim, "steady", seed=5, start_time=START, record_truth=False)  # no growing truth log
        self.replicas = list(self.fleet.pools["p"])
        self.generation = [0] * len(self.replicas)
        self.model = "m-0"
        self.lock = threading.Lock()

    def advance(self, cycle: int, t: float) -> None:
        with self.lock:
            self.fleet.advance_to(t)
            self.generation[cycle % len(self.replicas)] = cycle  # one new replica name per cycle
            self.model = f"m-{int((t - START) // 60)}"  # one new pool per simulated minute

    def paths(self) -> list[str]:
        return [f"/{r.name}-g{g}/metrics" for r, g in zip(self.replicas, self.generation)]

    def page(self, path: str):
        from headroom_lab.sim.exposition import render_vllm
        with self.lock:
            for r, g in zip(self.replicas, self.generation):
                if path == f"/{r.name}-g{g}/metrics":
                    return render_vllm(r, self.fleet.t).replace('model_name="m"', f'model_name="{self.model}"')
        return None


def serve(fleet: ChurningFleet) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            text = fleet.page(self.path)
            body = (text or "gone\n").encode()
            self.send_response(200 if text is not None else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass  # a scrape given up at its timeout: the cycle counts it

    srv = Quiet(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def child(forget_after: float, cycles: int) -> dict:
    import logging
    import time
    from dataclasses import replace

    from monitor.capacity.enrich import CapacityState
    from monitor.config import Config, Target
    from monitor.config.inputs import capacity_inputs, pipeline_settings
    from monitor.export.collector import Exposition
    from monitor.export.landing import Trends
    from monitor.kit.exposition import _LABEL_CACHE  # the parser's label-set cache (bounded: 200,000)
    from monitor.pipeline.cycle import Pipeline
    logging.disable(logging.WARNING)  # every churned replica is a 404 once: not the point here
    fleet = ChurningFleet()
    srv = serve(fleet)
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    now = [START]
    cfg = Config(vllm_targets=[Target(base + p) for p in fleet.paths()], interval=INTERVAL, latency_window=300.0,
                 history_keep=600.0, forget_after=forget_after, scrape_timeout=2.0)
    pipe = Pipeline(pipeline_settings(cfg), clock=lambda: now[0], capacity=CapacityState(capacity_inputs(cfg)))
    exposition, trends = Exposition(), Trends()
    samples, wall0 = [], time.monotonic()
    for cycle in range(cycles):
        now[0] = START + (cycle + 1) * INTERVAL
        fleet.advance(cycle, now[0])
        cfg = replace(cfg, vllm_targets=[Target(base + p) for p in fleet.paths()])
        pipe.settings = pipeline_settings(cfg)
        pipe.state.settings = pipe.settings.step
        snap = pipe.run_cycle(wait_seconds=10.0)
        exposition.update(snap)
        trends.add(snap)
        if (cycle + 1) % 12 == 0:  # every simulated minute
            st, cap = pipe.state, pipe.state.capacity
            samples.append({"minute": (cycle + 1) // 12, "rss_mb": round(rss_mb(), 2),
                            "history": len(st.history), "knees": len(cap.knees), "seen": len(cap.seen),
                            "lead_times": len(st.lead_times.seen), "down": len(st.down),
                            "last_fresh": len(st.last_fresh), "trend_pools": len(trends.points),
                            "pools": len(snap.pools), "metrics_bytes": len(exposition.body()),
                            "parser_label_cache": len(_LABEL_CACHE)})
    wall = time.monotonic() - wall0
    pipe.close()
    srv.shutdown()
    return {"forget_after_s": forget_after, "cycles": cycles, "simulated_s": cycles * INTERVAL,
            "wall_s": round(wall, 1), "samples": samples}


def summary(run: dict, expiry_minute: int) -> dict:
    after = [s["rss_mb"] for s in run["samples"] if s["minute"] >= expiry_minute]
    at = after[0]
    last = run["samples"][-31:]  # the last half hour
    return {"rss_at_first_expiry_mb": at, "rss_end_mb": after[-1], "rss_max_after_mb": max(after),
            "rss_min_after_mb": min(after), "max_drift_ratio": round(max(abs(v - at) for v in after) / at, 4),
            "last_30min_mb_per_min": round((last[-1]["rss_mb"] - last[0]["rss_mb"]) / 30.0, 4),
            "end": {k: v for k, v in run["samples"][-1].items() if k not in ("minute", "rss_mb")}}


def main() -> dict:
    runs = {}
    for name, forget in (("expiry_10m", 600.0), ("no_expiry_7d", 7 * 86400.0)):
        env = dict(os.environ, PYTHONPATH=ROOT)
        out = subprocess.run([sys.executable, __file__, "--child", str(forget), str(HOUR_CYCLES)],
                             capture_output=True, text=True, env=env, check=True)
        runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
        runs[name]["summary"] = summary(runs[name], expiry_minute=10)
    result = {"what": __doc__.split("\n\n")[0], "interval_s": INTERVAL, "replicas": REPLICAS,
              "clock": "injected: advanced one interval per cycle (an hour of churn runs in about a minute)",
              "runs": runs, "target": "with expiry: RSS after the first expiry period within 10 % of its value then",
              "met": runs["expiry_10m"]["summary"]["max_drift_ratio"] <= 0.10}
    with open(os.path.join(HERE, "churn_soak.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, ROOT)
        print(json.dumps(child(float(sys.argv[2]), int(sys.argv[3]))))
    else:
        res = main()
        for name, run in res["runs"].items():
            print(name, json.dumps(run["summary"]))
        print("met:", res["met"])
