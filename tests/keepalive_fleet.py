"""Many keep-alive metrics targets in one process (one thread, selectors), each on its own loopback
port, for the connection tests and the soak (benchmarks/conn_soak.py). Each target behaves as its
mode says (modes are given as a list and cycled over the targets):

  keep        answers every request, keeps every connection open
  idle_close  closes a connection idle for `idle` seconds (as a Go or uvicorn server does)
  idle_408    answers 408 (then closes) a request that arrives on a connection idle over `idle`
              seconds: the server timed it out just as the request went
  push_408    sends an unasked 408 on a connection idle for `idle` seconds, then closes it
  reuse_408   answers 408 (then closes) every request but the first on a connection
  extra       after each answer, 0.2 s later, sends a second answer nobody asked for (model
              `poisoned`, running 999) and keeps the connection
  garbage     answers with a status line that is not HTTP

Run as a script: `python tests/keepalive_fleet.py BODY_FILE --targets 200 --modes keep,idle_close
--idle 1.0`; the first line of its output is JSON {"ports": [...], "stats_port": N}; GET / on the
stats port answers its counts as JSON. `KeepAliveFleet` starts it as a subprocess (its descriptors
are its own, never the measured process's).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional

MODES = ("keep", "idle_close", "idle_408", "push_408", "reuse_408", "extra", "garbage")
POISON = (b'vllm:num_requests_running{engine="0",model_name="poisoned"} 999\n'
          b'vllm:kv_cache_usage_perc{engine="0",model_name="poisoned"} 0.5\n')
R408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def _ok(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Conn:
    def __init__(self, index: int, mode: str, now: float):
        self.index, self.mode = index, mode
        self.buf = b""
        self.last = now  # the end of the last answer, or the accept
        self.answered = 0
        self.extra_at: Optional[float] = None


def serve(body: bytes, targets: int, modes: list[str], idle: float) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 8 * targets + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    sel = selectors.DefaultSelector()
    ports = []
    for i in range(targets):
        s = socket.create_server(("127.0.0.1", 0), backlog=64)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, ("listen", i))
        ports.append(s.getsockname()[1])
    ctl = socket.create_server(("127.0.0.1", 0))
    ctl.setblocking(False)
    sel.register(ctl, selectors.EVENT_READ, ("listen", -1))
    print(json.dumps({"ports": ports, "stats_port": ctl.getsockname()[1]}), flush=True)
    stats = {k: 0 for k in ("accepted", "requests", "closed_idle", "sent_408", "pushed_408", "extras",
                            "closed_by_client")}
    conns: dict[socket.socket, _Conn] = {}
    ok, poison = _ok(body), _ok(POISON)

    def close(sock: socket.socket) -> None:
        sel.unregister(sock)
        conns.pop(sock, None)
        sock.close()

    def send(sock: socket.socket, data: bytes) -> bool:
        try:
            sock.settimeout(2.0)
            sock.sendall(data)
            sock.setblocking(False)
            return True
        except OSError:
            close(sock)
            return False

    def answer(sock: socket.socket, c: _Conn, now: float) -> None:
        stats["requests"] += 1
        if c.index == -1:
            send(sock, _ok(json.dumps({**stats, "open": len(conns) - 1}).encode()))
            close(sock)
            return
        if c.mode == "garbage":
            send(sock, b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            close(sock)
            return
        if (c.mode == "idle_408" and c.answered and now - c.last > idle) or (c.mode == "reuse_408" and c.answered):
            stats["sent_408"] += 1
            send(sock, R408)
            close(sock)
            return
        if send(sock, ok):
            c.answered += 1
            c.last = time.monotonic()
            if c.mode == "extra":
                c.extra_at = c.last + 0.2

    last_sweep = 0.0
    while True:
        for key, _ in sel.select(0.05):
            kind, index = key.data
            now = time.monotonic()
            if kind == "listen":
                try:
                    sock, _ = key.fileobj.accept()
                except OSError:
                    continue
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                mode = modes[index % len(modes)] if index >= 0 else "stats"
                conns[sock] = _Conn(index, mode, now)
                sel.register(sock, selectors.EVENT_READ, ("conn", index))
                stats["accepted"] += 1
                continue
            sock = key.fileobj
            c = conns.get(sock)
            if c is None:
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                stats["closed_by_client"] += 1
                close(sock)
                continue
            c.buf += data
            while sock in conns and b"\r\n\r\n" in c.buf:
                _, _, c.buf = c.buf.partition(b"\r\n\r\n")
                answer(sock, c, now)
        now = time.monotonic()
        if now - last_sweep < 0.05:
            continue
        last_sweep = now
        for sock, c in list(conns.items()):
            if c.extra_at is not None and now >= c.extra_at:
                c.extra_at = None
                if send(sock, poison):
                    stats["extras"] += 1
            elif c.mode in ("idle_close", "push_408") and now - c.last > idle and not c.buf:
                if c.mode == "push_408":
                    stats["pushed_408"] += 1
                    try:
                        sock.send(R408)
                    except OSError:
                        pass
                else:
                    stats["closed_idle"] += 1
                close(sock)


class KeepAliveFleet:
    """The fleet above in a subprocess: `urls`, `modes` (per target) and `stats()`."""

    def __init__(self, body_file: str, targets: int, modes: list[str], idle: float = 1.0,
                 preexec=None):
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown modes {bad}")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), body_file, "--targets", str(targets),
                                      "--modes", ",".join(modes), "--idle", str(idle)],
                                     stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"keep-alive fleet did not start (exit {self.proc.returncode})")
        info = json.loads(line)
        self.ports = info["ports"]
        self.stats_port = info["stats_port"]
        self.modes = [modes[i % len(modes)] for i in range(targets)]
        self.urls = [f"http://127.0.0.1:{p}/metrics" for p in self.ports]

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/", timeout=5) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()


def main() -> None:
    ap = argparse.ArgumentParser(description="keep-alive metrics targets on loopback")
    ap.add_argument("body")
    ap.add_argument("--targets", type=int, default=10)
    ap.add_argument("--modes", default="keep")
    ap.add_argument("--idle", type=float, default=1.0)
    args = ap.parse_args()
    with open(args.body, "rb") as f:
        body = f.read()
    serve(body, args.targets, args.modes.split(","), args.idle)


if __name__ == "__main__":
    main()
