"""headroom's own HTTP/1.1 server: one selector thread owns every socket, a few workers render.

http.server gave each connection a thread with no read deadline, and the TLS handshake ran inside
accept(): one silent client stalled every endpoint, probes included. Here:

- the selector thread accepts, runs TLS handshakes non-blocking (deadline `handshake_timeout`), reads
  request heads (deadline `header_timeout`, from the connection or from the first byte of a
  keep-alive request) and writes responses (deadline `write_timeout`). A peer that sends nothing
  costs a file descriptor until its deadline, never a thread, and never delays anyone else;
- probes (`fast(request)`, no auth, nothing rendered) are answered on the selector thread; the rest
  goes to `workers` threads through a bounded queue (full: 503 at once), except what `priority(request)`
  picks (/metrics): it has its own lane (`priority_workers` threads, its own bound), so renders of the
  landing page or the JSON on every worker never hold a scrape;
- at `max_connections`, a new connection evicts the one that has waited longest without sending a
  whole request, so a probe still gets in during a flood (and the flood's connections are shed fast);
- a peer that goes away is counted in `stats`, never logged with a traceback.
"""
from __future__ import annotations

import errno
import logging
import os
import queue
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Optional

from monitor.kit.web.http11 import Request, Response, encode
from monitor.kit.web.httpconn import HANDSHAKE, LINGER, READ, WRITE, ConnectionSteps, _abort, _Conn
from monitor.kit.web.httpconn import Limits as Limits  # re-exported: the server's names
from monitor.kit.web.httpconn import WebStats as WebStats

log = logging.getLogger(__name__)

_ACCEPT, _WAKE = object(), object()
_R = selectors.EVENT_READ


class WebServer(ConnectionSteps):
    """`serve_forever()` in one thread; `shutdown()` stops it and waits; `server_close()` frees everything.

    app(request) -> Response runs on a worker; fast(request) -> Response or None runs on the selector
    thread and must not block (probes). `stats`: where it counts (given by a caller that shows the
    counters before the server exists; default: its own)."""

    def __init__(self, address: tuple[str, int], app: Callable[[Request], Response],
                 fast: Optional[Callable[[Request], Optional[Response]]] = None,
                 ssl_context: Optional[ssl.SSLContext] = None, limits: Optional[Limits] = None,
                 priority: Optional[Callable[[Request], bool]] = None, stats: Optional[WebStats] = None):
        self.limits = limits or Limits()
        self.app, self.fast, self.ssl_context, self.priority = app, fast, ssl_context, priority
        self.stats = stats if stats is not None else WebStats()
        self.socket = _listen(*address)
        self.server_address = self.socket.getsockname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._sel.register(self.socket, _R, _ACCEPT)
        self._sel.register(self._wake_r, _R, _WAKE)
        self._conns: set[_Conn] = set()
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()  # evictable, longest waiting first
        self._ready: list[_Conn] = []   # to read again: bytes may already be buffered
        # two lanes, each its queue, its threads and its count of requests in it (the selector thread's)
        self._lanes = (queue.SimpleQueue(), queue.SimpleQueue())  # (the workers', the priority workers')
        self._in_lane = [0, 0]
        self._done: deque[tuple[_Conn, bytes, bool, bool, int]] = deque()  # (conn, bytes, keep, failed, lane)
        self._reserve_fd: Optional[int] = os.open(os.devnull, os.O_RDONLY)  # freed to shed a connection at EMFILE
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._closed = False
        self._workers = [threading.Thread(target=self._work_loop, args=(0,), name=f"web-worker-{i}", daemon=True)
                         for i in range(self.limits.workers)]
        self._workers += [threading.Thread(target=self._work_loop, args=(1,), name=f"web-priority-{i}", daemon=True)
                          for i in range(self.limits.priority_workers if priority is not None else 0)]
        for t in self._workers:
            t.start()

    # ---- lifecycle ------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._stopped.clear()
        try:
            next_sweep = time.monotonic() + 0.1
            while not self._stop.is_set():
                try:
                    next_sweep = self._turn(next_sweep)
                except Exception:  # a bug: log it, keep the loop (and the probes) alive
                    log.exception("web: unexpected error in the server loop")
                    time.sleep(0.01)
        finally:
            self._stopped.set()

    def _turn(self, next_sweep: float) -> float:
        """One wait for readiness and what follows it; returns when the next deadline sweep is due."""
        timeout = 0.0 if self._ready else max(0.0, next_sweep - time.monotonic())
        for key, _mask in self._sel.select(timeout):
            if key.data is _ACCEPT:
                self._accept()
            elif key.data is _WAKE:
                self._drain_wake()
            else:
                self._guarded(self._on_event, key.data)
        self._finish_jobs()
        ready, self._ready = self._ready, []
        for c in ready:
            if not c.closed and c.state == READ:
                self._guarded(self._read, c)
        now = time.monotonic()
        if now < next_sweep:
            return next_sweep
        self._sweep(now)
        return now + 0.1

    def shutdown(self) -> None:
        with self._lock:
            self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        self.shutdown()
        if self._closed:
            return
        self._closed = True
        for c in list(self._conns):
            self._close(c)
        for t in self._workers:
            self._lanes[t.name.startswith("web-priority")].put(None)
        for s in (self.socket, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()
        if self._reserve_fd is not None:
            os.close(self._reserve_fd)
            self._reserve_fd = None

    # ---- the selector thread ----------------------------------------------------------------------

    def _guarded(self, fn: Callable[[_Conn], None], c: _Conn) -> None:
        try:
            fn(c)
        except Exception:  # a bug, not a client: keep serving everyone else
            log.exception("web: unexpected error on a connection from %s", c.addr[0] if c.addr else "?")
            self._close(c, abort=True)

    def _accept(self) -> None:
        for _ in range(self.limits.accept_batch):
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._shed_one()
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                log.warning("web: accept failed: %s", exc)
                return
            self.stats.connections_accepted += 1
            if len(self._conns) >= self.limits.max_connections and not self._evict():
                self.stats.connections_refused += 1
                _abort(sock)
                continue
            self._open(sock, addr)

    def _shed_one(self) -> None:
        """Out of file descriptors: free the reserve, accept and drop one, so accept() stops spinning."""
        if self._reserve_fd is not None:
            os.close(self._reserve_fd)
            self._reserve_fd = None
        try:
            sock, _ = self.socket.accept()
            _abort(sock)
            self.stats.connections_refused += 1
        except OSError:
            pass
        try:
            self._reserve_fd = os.open(os.devnull, os.O_RDONLY)
        except OSError:
            self._reserve_fd = None

    def _open(self, sock: socket.socket, addr: tuple[Any, ...]) -> None:
        sock.setblocking(False)
        now = time.monotonic()
        ctx = self.ssl_context
        if ctx is not None:
            reload = getattr(ctx, "maybe_reload", None)
            if reload is not None:
                reload()
            try:
                sock = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                self.stats.client_disconnects += 1
                _abort(sock)
                return
            c = _Conn(sock, addr, tls=True, state=HANDSHAKE, deadline=now + self.limits.handshake_timeout)
        else:
            c = _Conn(sock, addr, tls=False, state=READ, deadline=now + self.limits.header_timeout)
        self._conns.add(c)
        self._waiting[c] = None
        self._set_events(c, _R)
        self.stats.open_connections = len(self._conns)

    def _finish_jobs(self) -> None:
        while self._done:
            c, data, keep, failed, lane = self._done.popleft()
            self.stats.requests_in_progress -= 1
            self._in_lane[lane] -= 1
            if failed:
                self.stats.handler_errors += 1
            if not c.closed:
                self._guarded(lambda conn: self._start_write(conn, data, keep), c)

    def _sweep(self, now: float) -> None:
        for c in [c for c in self._conns if c.deadline <= now]:
            if c.state == LINGER:
                pass
            elif c.state == HANDSHAKE:
                self.stats.tls_handshake_timeouts += 1
            elif c.state == WRITE:
                self.stats.write_timeouts += 1
            elif c.started or c.served == 0:
                self.stats.header_timeouts += 1
            else:
                self.stats.idle_timeouts += 1
            self._close(c, abort=True)

    def _evict(self) -> bool:
        if self._waiting:
            victim, _ = self._waiting.popitem(last=False)
        else:  # every connection is busy: the writer stalled longest goes
            writers = [c for c in self._conns if c.state == WRITE]
            if not writers:
                return False
            victim = min(writers, key=lambda c: c.deadline)
        self.stats.connections_evicted += 1
        self._close(victim, abort=True)
        return True

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    # ---- workers ------------------------------------------------------------------------------

    def _work_loop(self, lane: int) -> None:
        while True:
            job = self._lanes[lane].get()
            if job is None:
                return
            c, req = job
            failed = False
            try:
                resp = self.app(req)
                data = encode(resp, req.method, req.keep_alive)
            except Exception:  # a bug in a page: a 500 for this request, the server carries on
                failed = True
                log.exception("web: %s %s failed", req.method, req.path)
                resp = Response(500, b"Internal error.\n")
                data = encode(resp, req.method, req.keep_alive)
            log.debug("web: %s %s %s -> %d", req.client[0] if req.client else "?", req.method, req.path, resp.status)
            self._done.append((c, data, req.keep_alive, failed, lane))
            self._wake()


def _listen(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    # a name (localhost) binds IPv4 first, as http.server did; an IPv6 literal binds IPv6
    infos.sort(key=lambda info: info[0] != (socket.AF_INET6 if ":" in host else socket.AF_INET))
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
