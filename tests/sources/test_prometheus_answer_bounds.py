"""One huge Prometheus answer never takes the daemon's memory, its cycle or its probes (issue 38).

Before: one 60 MB answer (under the client's 64 MiB cap) to the per-replica query took 1.26 GB RSS,
the first cycle 17.6 s against a 10.5 s deadline and `/-/healthy` up to 8.5 s (the chart's probe
times out at 5 s). Here a query layer counts three replicas' series (120) and then answers the
replica query with 60 MB: the answer is refused (too_large) against the cap sized from the fleet
before it is parsed, the cycles keep their cadence, every health probe answers within the chart's
timeout, and the daemon's peak memory stays far from the old figure.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
import requests
from servers import free_port, wait_for
from servers import metric as _metric

from monitor.kit.process import stop_process

pytestmark = pytest.mark.live

HUGE = 60 * 1000 * 1000


def _vector(rows) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [time.time(), value]} for labels, value in rows]}}).encode()


class HugeAnswers(BaseHTTPRequestHandler):
    """count(...) answers 120 series; the replica query 60 MB of series padded with one long label;
    every other query an empty vector."""
    queries: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        query = form.get("query", [""])[0]
        self.queries.append(query[:40])
        if query.startswith("count("):
            body = _vector([({}, "120")])
        elif query.startswith('{__name__=~"vllm'):
            pad = "x" * 1000
            rows, size, i = [], 0, 0
            while size < HUGE:
                rows.append(({"__name__": "vllm:num_requests_running", "instance": f"r{i % 3}:8000", "model_name": "m",
                              "engine": str(i), "pad": pad}, "1"))
                size += 1100
                i += 1
            body = _vector(rows)
        else:
            body = _vector([])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # refused part way: the client closed


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def test_a_60_mb_answer_is_refused_against_the_fleet_s_cap_and_probes_stay_fast(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), HugeAnswers)
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, name="huge-prometheus", daemon=True)
    serving.start()
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(f"global:\n  interval: 5s\nsources:\n  prometheus:\n    url: http://127.0.0.1:{server.server_port}\n"
                   "    timeout: 4s\n    retries: 0\n")
    port = free_port()
    log = open(tmp_path / "daemon.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", str(cfg),
                             "--web.listen-address", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    probes: list[float] = []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = requests.get(base + "/-/healthy", timeout=10).status_code == 200
            except requests.ConnectionError:
                ok = None  # not listening yet
            if ok is not None:
                probes.append(time.monotonic() - t0 if ok else 99.0)
            stop.wait(0.05)
    prober = threading.Thread(target=probe, name="health-prober")
    prober.start()
    try:
        metrics = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text,
                           lambda m: (_metric(m, "headroom_cycles_total") or 0) >= 3, timeout=90,
                           what="three cycles against the huge answers")
        snapshot = requests.get(base + "/api/v1/snapshot", timeout=5).json()
        peak = peak_rss_mb(proc.pid)
    finally:
        stop.set()
        prober.join(15)
        stop_process(proc)
        server.shutdown()
        server.server_close()
        log.seek(0)
        text = log.read()
        log.close()
    [status] = [s for s in snapshot["sources"] if s["source"] == "prometheus"]
    assert not status["up"] and status["error"] == "too_large", status
    assert "sized from the fleet (120 series" in status["detail"]
    assert _metric(metrics, "headroom_cycle_duration_seconds") < 5.0  # within the interval, never the parse
    assert probes and max(probes) < 5.0, sorted(probes)[-5:]  # the chart's probe timeout
    assert peak < 400, peak  # before: 1.26 GB
    assert sum(q.startswith("count(") for q in HugeAnswers.queries) >= 2  # counted again after each refusal
    assert "Traceback" not in text, text[-3000:]
