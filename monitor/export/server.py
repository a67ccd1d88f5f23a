"""headroom's endpoints: /metrics, /, /-/healthy, /-/ready, /api/v1/snapshot, /api/v1/spare, /digest, on its own web server.

The probes are answered on the server's selector thread (no auth, nothing rendered), so they answer
while a flood holds connections or the workers are busy; /metrics has its own worker (a body rendered
once per snapshot), so renders of pages never hold a scrape; the rest runs on the server's workers.
The landing page and the JSON are rendered once per snapshot too, however many view them.
The server itself (timeouts, connection cap, TLS handshakes off the accept path) is in httpd.py.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Callable, Optional
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from monitor.kit.text import valid_text
from monitor.kit.web.auth import CheckThrottle
from monitor.kit.web.http11 import Request, Response
from monitor.kit.web.httpd import Limits, WebServer, WebStats

from ..model import Snapshot
from .collector import Exposition
from .landing import Trends, render
from .landing_pages import page_number
from .samples import Cadence
from .snapshot_json import snapshot_to_dict
from .spare_api import spare_answer

log = logging.getLogger(__name__)

__all__ = ["Limits", "WebServer", "WebState", "WebStats", "parse_listen_address", "serve"]


def parse_listen_address(addr: str) -> tuple[str, int]:
    """':9880' -> ('0.0.0.0', 9880); '127.0.0.1:0' -> ('127.0.0.1', 0); '[::1]:9880' -> ('::1', 9880)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port):
        raise ValueError(f"listen address must be HOST:PORT or :PORT, got {addr!r}")
    if int(port) > 65535:  # the kernel would not refuse it: getaddrinfo wraps it into another port
        raise ValueError(f"listen address port must be 0 to 65535, got {addr!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class WebState:
    def __init__(self, exposition: Exposition, trends: Trends, title: str = "headroom",
                 links: tuple[tuple[str, str], ...] = (), has_alerts_source: bool = False,
                 digest_dir: Optional[str] = None, authorize: Optional[Callable[[Optional[str]], bool]] = None,
                 stats: Optional[WebStats] = None):
        self.exposition = exposition
        self.trends = trends
        self.title = title
        self.digest_dir = digest_dir  # the digest's directory destination: /digest serves its newest week
        self.links = links + ((("latest digest", "/digest"),) if digest_dir else ())  # shown on the landing page
        self.has_alerts_source = has_alerts_source
        self.snapshot: Optional[Snapshot] = None
        self.ready = False
        # the web config's basic auth (monitor/kit/web/webconfig.py web_security); None: every request
        self.authorize: Callable[[Optional[str]], bool] = authorize if authorize is not None else lambda header: True
        self.throttle = CheckThrottle()  # bcrypt checks per client address (monitor/kit/web/auth.py)
        # the web server's counters: serve() hands them to the server it builds (`stats`: made by a caller
        # that reads them, e.g. for /metrics, before the server exists)
        self.web_stats: WebStats = stats if stats is not None else WebStats()
        # the cycle's, as the body served shows it (its age while renders fail), read at each probe
        self.cadence: Callable[[], Optional[Cadence]] = exposition.served_cadence
        self._rendered: dict[str, tuple[object, bytes]] = {}  # page -> (the snapshot it shows, its body)
        self._render_locks: dict[str, threading.Lock] = {}  # one a page: the JSON does not wait for the page

    def publish(self, snapshot: Snapshot) -> None:
        """The snapshot to every endpoint: /metrics' body rendered once (a render that fails altogether
        keeps the previous body and turns /-/ready 503: `Exposition.failure`), the JSON and the page
        from it on their first view, the landing chart's trend."""
        rendered = self.exposition.update(snapshot)
        self.snapshot = snapshot
        self.ready = self.ready or rendered
        try:
            self.trends.add(snapshot)
        except Exception:  # the chart is one part of one page
            log.exception("the landing page's trend could not take this snapshot")

    def rendered(self, page: str, render_fn: Callable[[Optional[Snapshot]], bytes]) -> bytes:
        """`page`'s body for the current snapshot: rendered by the first viewer after a publish, the
        others meanwhile wait for it (one render per snapshot, one copy in memory, however many view it)."""
        snap = self.snapshot
        with self._render_locks.setdefault(page, threading.Lock()):
            held = self._rendered.get(page)
            if held is None or held[0] is not snap:
                held = (snap, render_fn(snap))
                self._rendered[page] = held
            return held[1]


def probe(state: WebState, req: Request) -> Optional[Response]:
    """The probes stay open (kubelet has no credentials) and reveal nothing but up / ready."""
    if req.path == "/-/healthy":
        return Response(200, b"Healthy.\n")
    if req.path == "/-/ready":
        if state.exposition.failure is not None:
            return Response(503, f"Not ready: {state.exposition.failure}; /metrics serves the previous body.\n"
                            .encode())
        if not state.ready:
            return Response(503, b"Not ready: the first cycle has not finished.\n")
        stopped = cycles_stopped(state.cadence())
        if stopped:
            return Response(503, stopped.encode())
        return Response(200, b"Ready.\n")
    return None


READY_MISSED_INTERVALS = 3  # /-/ready turns 503 when no cycle has finished for this many intervals


def cycles_stopped(cadence: Optional[Cadence]) -> Optional[str]:
    """Why the daemon is not ready although it has published: no cycle finished for
    READY_MISSED_INTERVALS intervals (monotonic, whatever the wall clock did); None when cycling."""
    if cadence is None or cadence.last_cycle_age_seconds is None:
        return None
    if cadence.last_cycle_age_seconds <= READY_MISSED_INTERVALS * cadence.interval_seconds:
        return None
    return (f"Not ready: no cycle has finished for {cadence.last_cycle_age_seconds:.0f} s "
            f"(interval {cadence.interval_seconds:g} s).\n")


def _unauthorized() -> Response:
    return Response(401, b"Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="headroom"'})


def known(state: WebState, req: Request) -> bool:
    """The request's credentials are known good without a bcrypt check (or no auth is configured)."""
    check = getattr(state.authorize, "known", None)
    return check is None or check(req.headers.get("authorization"))


def admit(state: WebState, req: Request) -> Optional[Response]:
    """On the selector thread, before any worker: with basic auth on, credentials not known good
    need a bcrypt check. None missing or not Basic: 401 at once; else the check takes one of its
    client address's tokens (monitor/kit/web/auth.py CheckThrottle), none left: 429 at once, no check.
    None: on to a worker."""
    if known(state, req):
        return None
    header = req.headers.get("authorization")
    if not header or not header.startswith("Basic "):
        return _unauthorized()
    if state.throttle.take(req.client[0] if req.client else ""):
        return None
    state.web_stats.auth_throttled += 1
    return Response(429, b"Too many failed logins from this address: try again shortly.\n",
                    headers={"Retry-After": "2"})


def handle(state: WebState, req: Request) -> Response:
    if not state.authorize(req.headers.get("authorization")):
        return _unauthorized()
    if hasattr(state.authorize, "known"):
        state.throttle.give_back(req.client[0] if req.client else "")  # a check passed: its token back
    path = req.path
    if path == "/metrics":
        return Response(200, state.exposition.body(), CONTENT_TYPE_LATEST)
    if path in ("/", "/index.html"):
        return landing(state, req)
    if path in ("/digest", "/digest/"):
        return latest_digest(state.digest_dir)
    if path == "/api/v1/snapshot":
        body = state.rendered(path, lambda snap: json.dumps(snapshot_to_dict(snap) if snap else
                                                            {"pools": [], "sources": []}, allow_nan=False).encode())
        return Response(200, body, "application/json")
    if path == "/api/v1/spare":
        status, answer = spare_answer(state.snapshot, urlsplit(req.target).query)
        return Response(status, json.dumps(answer, allow_nan=False).encode(), "application/json")
    return probe(state, req) or Response(404, b"Not found. Try /metrics or /.\n")


def landing(state: WebState, req: Request) -> Response:
    """The landing page, `?page=N` of a large fleet's (monitor/export/landing.py `paged`): each page
    rendered once per snapshot; the number kept within the fleet's pages, so the pages held are too."""
    snap = state.snapshot
    n = page_number(urlsplit(req.target).query, len(snap.pools) if snap is not None else 0)
    key = "/" if n == 1 else f"/?page={n}"
    page = state.rendered(key, lambda s: valid_text(render(s, state.trends, state.title, state.links,
                                                           state.has_alerts_source, page=n)).encode("utf-8"))
    return Response(200, page, "text/html; charset=utf-8")


WEEK_DIR = re.compile(r"\d{4}-W\d{2}(-shard-\d+-of-\d+)?\Z")  # monitor/digest/deliver.py writes PATH/<edition>/ (the ISO week, -shard-I-of-N when sharded)
MAX_DIGEST_BYTES = 32 * 1024 * 1024


def latest_digest(directory: Optional[str]) -> Response:
    """The newest week's digest.html of the digest's directory destination (only names of the
    form YYYY-Www under it, only that file)."""
    if not directory:
        return Response(404, b"No digest: configure a digest with a directory destination (docs/digest.md).\n")
    try:
        weeks = sorted((w for w in os.listdir(directory) if WEEK_DIR.match(w)
                        and os.path.isfile(os.path.join(directory, w, "digest.html"))), reverse=True)
    except OSError:
        weeks = []
    if not weeks:
        return Response(404, b"No digest has been written yet.\n")
    path = os.path.join(directory, weeks[0], "digest.html")
    try:
        if os.path.getsize(path) > MAX_DIGEST_BYTES:
            return Response(500, b"The digest file is too large to serve.\n")
        with open(path, "rb") as f:
            return Response(200, f.read(), "text/html; charset=utf-8")
    except OSError as exc:
        log.warning("cannot read the digest %s: %s", path, exc.strerror)
        return Response(500, b"The digest could not be read.\n")


def serve(state: WebState, address: str, ssl_context=None,
          limits: Optional[Limits] = None) -> tuple[WebServer, threading.Thread]:
    """Listen on `address` and serve in a daemon thread; stop with server.shutdown(), server.server_close()."""
    host, port = parse_listen_address(address)
    # probes first (open); then credentials that need a bcrypt check are throttled per client; /metrics
    # with known-good credentials has its own lane, so a password flood's checks never hold a scrape
    server = WebServer((host, port), app=lambda req: handle(state, req),
                       fast=lambda req: probe(state, req) or admit(state, req), ssl_context=ssl_context,
                       limits=limits, priority=lambda req: req.path == "/metrics" and known(state, req),
                       stats=state.web_stats)
    thread = threading.Thread(target=server.serve_forever, name="web", daemon=True)
    thread.start()
    return server, thread
