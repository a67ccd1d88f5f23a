"""/metrics under load: ~200 requests/s for 60 s from wrk on loopback against the headroom daemon
watching the simulated demo fleet, beside the same load against a plain static server of the same
bytes (the baseline, measured in the same run). Reports errors, achieved rate and p50/p99 latency.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DURATION = int(os.environ.get("HEADROOM_LOAD_SECONDS", "60"))
PACE_LUA = "function delay()\n  return 19\nend\n"  # each of 4 connections: one request per ~20 ms

FLEET = r"""
import json, sys, time
from headroom_lab.sim.fleet import load_config
from headroom_lab.sim.server import start_fleet
h = start_fleet(load_config(None), scenario="steady", seed=1, warmup_s=60.0)
print(json.dumps({"replica_urls": h.replica_urls, "replica_by_url": h.replica_by_url, "gateway_url": h.gateway_url, "app_url": h.app_url,
                  "dcgm_url": h.dcgm_url}), flush=True)
sys.stdin.read()
"""


class _Urls:
    def __init__(self, d):
        self.__dict__.update(d)

from static_server import STATIC_SERVER as STATIC  # noqa: E402


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    v, unit = float(m.group(1)), m.group(2)
    return v / 1000 if unit == "us" else v if unit == "ms" else v * 1000


def wrk(url: str, seconds: int, workdir: str) -> dict:
    lua = os.path.join(workdir, "pace.lua")
    with open(lua, "w") as f:
        f.write(PACE_LUA)
    out = subprocess.run(["wrk", "-t2", "-c4", f"-d{seconds}s", "--latency", "-s", lua, url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    res = {"requests": int(re.search(r"(\d+) requests in", out).group(1))}
    res["requests_per_second"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    for q in ("50", "99"):
        res[f"p{q}_ms"] = round(_ms(re.search(rf"\s{q}(?:\.000)?%\s+(\S+)", out).group(1)), 2)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["errors"] = (sum(int(x) for x in errors.groups()) if errors else 0) + (int(non2xx.group(1)) if non2xx else 0)
    return res


def main() -> dict:
    if not shutil.which("wrk"):
        return {"skipped": "wrk not installed (Debian package wrk)"}
    from headroom_lab.commands.demo import headroom_config
    from headroom_lab.sim.fleet import load_config
    from monitor.app import build
    from monitor.config import Override, from_dict

    workdir = tempfile.mkdtemp(prefix="headroom-load-")
    fleet_cfg = load_config(None)
    # the simulated fleet runs in its own process: the daemon's process is measured alone
    fleet = subprocess.Popen([sys.executable, "-c", FLEET], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
    import json
    handle = _Urls(json.loads(fleet.stdout.readline()))
    cfg = from_dict(headroom_config(handle, fleet_cfg, None), "load.yml",
                    [Override("global.interval", 2.0, "load_bench: a cycle every 2 s")])
    daemon = build(cfg, "127.0.0.1:0")
    daemon.start()
    static = None
    try:
        url = f"http://127.0.0.1:{daemon.port}/metrics"
        end = time.monotonic() + 60
        while daemon.pipeline.latest is None and time.monotonic() < end:
            time.sleep(0.2)
        body = requests.get(url, timeout=5).content
        path = os.path.join(workdir, "metrics.txt")
        with open(path, "wb") as f:
            f.write(body)
        static = subprocess.Popen([sys.executable, "-c", STATIC, path], stdout=subprocess.PIPE, text=True)
        static_port = int(static.stdout.readline())
        cycles_before = daemon.pipeline.cycles
        headroom = wrk(url, DURATION, workdir)
        headroom["cycles_during_load"] = daemon.pipeline.cycles - cycles_before
        baseline = wrk(f"http://127.0.0.1:{static_port}/metrics", DURATION, workdir)
        return {
            "duration_seconds": DURATION,
            "body_bytes": len(body),
            "headroom": headroom,
            "baseline_static_server": baseline,
            "p99_ratio_vs_baseline": round(headroom["p99_ms"] / max(baseline["p99_ms"], 1e-6), 2),
            "target": "~200 req/s for 60 s, no errors; p99 reported",
        }
    finally:
        if static is not None:
            static.terminate()
        daemon.stop()
        fleet.stdin.close()
        fleet.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    import json
    print(json.dumps(main(), indent=2))
