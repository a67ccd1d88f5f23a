"""headroom's own HTTP server: /metrics, /, /-/healthy, /-/ready, /api/v1/snapshot."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..model import Snapshot
from .collector import Exposition
from .landing import Trends, render
from .snapshot_json import snapshot_to_dict

log = logging.getLogger(__name__)


def parse_listen_address(addr: str) -> tuple[str, int]:
    """':9880' -> ('0.0.0.0', 9880); '127.0.0.1:0' -> ('127.0.0.1', 0); '[::1]:9880' -> ('::1', 9880)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address must be HOST:PORT or :PORT, got {addr!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class WebState:
    def __init__(self, exposition: Exposition, trends: Trends, title: str = "headroom"):
        self.exposition = exposition
        self.trends = trends
        self.title = title
        self.snapshot: Optional[Snapshot] = None
        self.ready = False
        self.authorize: Callable[[Optional[str]], bool] = lambda header: True

    def publish(self, snapshot: Snapshot) -> None:
        self.trends.add(snapshot)
        self.exposition.update(snapshot)
        self.snapshot = snapshot
        self.ready = True


class Handler(BaseHTTPRequestHandler):
    server_version = "headroom"
    state: WebState  # set on the subclass made per server

    def log_message(self, fmt, *args):  # quiet: access logs at debug level only
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8", extra=None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        # probes stay open (kubelet has no credentials); they reveal nothing but up/ready
        if path == "/-/healthy":
            return self._send(200, b"Healthy.\n")
        if path == "/-/ready":
            if self.state.ready:
                return self._send(200, b"Ready.\n")
            return self._send(503, b"Not ready: the first cycle has not finished.\n")
        if not self.state.authorize(self.headers.get("Authorization")):
            return self._send(401, b"Unauthorized\n", extra={"WWW-Authenticate": 'Basic realm="headroom"'})
        if path == "/metrics":
            return self._send(200, self.state.exposition.body(), CONTENT_TYPE_LATEST)
        if path in ("/", "/index.html"):
            page = render(self.state.snapshot, self.state.trends, self.state.title)
            return self._send(200, page.encode("utf-8"), "text/html; charset=utf-8")
        if path == "/api/v1/snapshot":
            snap = self.state.snapshot
            body = json.dumps(snapshot_to_dict(snap) if snap else {"pools": [], "sources": []}, allow_nan=False)
            return self._send(200, body.encode(), "application/json")
        return self._send(404, b"Not found. Try /metrics or /.\n")


def serve(state: WebState, address: str, ssl_context=None) -> tuple[ThreadingHTTPServer, threading.Thread]:
    host, port = parse_listen_address(address)
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="web", daemon=True)
    thread.start()
    return server, thread
