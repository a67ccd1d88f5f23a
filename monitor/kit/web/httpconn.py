"""One connection's life on headroom's web server: TLS handshake, request head, response, linger.

Everything here runs on the server's selector thread and never blocks: each step does what the
socket allows now and waits for the next readiness event (httpd.WebServer owns the loop, the
deadlines, eviction and the workers). A peer that breaks off is counted, never a traceback.
"""
from __future__ import annotations

import logging
import queue
import selectors
import socket
import ssl
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, cast

from monitor.kit.web.http11 import BadRequest, Request, Response, encode, head_end, parse_request

log = logging.getLogger("monitor.kit.web.httpd")

HANDSHAKE, READ, WORK, WRITE, LINGER = "handshake", "read", "work", "write", "linger"
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE
NO_DEADLINE = float("inf")
_LINGER_RESET = struct.pack("ii", 1, 0)  # struct linger {on, 0 s}: close() sends a reset
_GONE = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError, TimeoutError)


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    addr: tuple[Any, ...]
    tls: bool
    state: str = READ
    deadline: float = NO_DEADLINE
    buf: bytearray = field(default_factory=bytearray)
    out: Optional[memoryview] = None
    sent: int = 0
    keep: bool = False
    linger: bool = False           # after an error: drain what the client still sends
    started: bool = False          # bytes of the current request have arrived
    served: int = 0
    events: int = 0
    closed: bool = False


@dataclass
class Limits:
    max_connections: int = 512     # open connections; past it a waiting one is evicted (or the new one refused)
    workers: int = 4               # threads rendering /, /api/v1/snapshot (and checking bcrypt)
    priority_workers: int = 1      # threads answering what `priority` picks (/metrics, credentials known) only
    queue: int = 64                # requests waiting for a worker beyond `workers`; past it: 503
    handshake_timeout: float = 5.0
    header_timeout: float = 10.0   # request line + headers
    idle_timeout: float = 65.0     # keep-alive: waiting for the next request (covers a 60 s scrape interval)
    write_timeout: float = 30.0    # the whole response
    max_header_bytes: int = 16384
    max_headers: int = 100
    accept_batch: int = 64         # accepts per wake-up, so reads of earlier connections are not starved


class WebStats:
    """Counters (only the selector thread writes them) and two gauges; see `as_dict()`."""

    COUNTERS = ("connections_accepted", "connections_refused", "connections_evicted", "client_disconnects",
                "header_timeouts", "idle_timeouts", "write_timeouts", "tls_handshake_timeouts",
                "tls_handshake_errors", "tls_client_cert_rejected", "bad_requests", "overloaded",
                "requests", "handler_errors", "auth_throttled")

    connections_accepted: int
    connections_refused: int
    connections_evicted: int
    client_disconnects: int
    header_timeouts: int
    idle_timeouts: int
    write_timeouts: int
    tls_handshake_timeouts: int
    tls_handshake_errors: int
    tls_client_cert_rejected: int
    bad_requests: int
    overloaded: int
    requests: int
    handler_errors: int
    auth_throttled: int

    def __init__(self) -> None:
        for name in self.COUNTERS:
            setattr(self, name, 0)
        self.open_connections = 0
        self.requests_in_progress = 0

    def as_dict(self) -> dict[str, int]:
        names = self.COUNTERS + ("open_connections", "requests_in_progress")
        return {name: getattr(self, name) for name in names}


class ConnectionSteps:
    """The per-connection half of WebServer (a mixin). It uses the server's attributes below."""

    limits: Limits
    stats: WebStats
    ssl_context: Optional[ssl.SSLContext]
    fast: Optional[Callable[[Request], Optional[Response]]]
    priority: Optional[Callable[[Request], bool]]
    _sel: selectors.BaseSelector
    _conns: set[_Conn]
    _waiting: OrderedDict[_Conn, None]  # evictable, longest waiting first
    _ready: list[_Conn]
    _lanes: tuple[queue.SimpleQueue[Optional[tuple[_Conn, Request]]], ...]  # the workers', the priority workers'
    _in_lane: list[int]

    def _on_event(self, c: _Conn) -> None:
        if c.closed:
            return
        if c.state == HANDSHAKE:
            self._handshake(c)
        elif c.state == READ:
            self._read(c)
        elif c.state == WRITE:
            self._write(c)
        elif c.state == LINGER:
            self._drain(c)

    def _handshake(self, c: _Conn) -> None:
        try:
            cast(ssl.SSLSocket, c.sock).do_handshake()  # a TLS connection's socket
        except ssl.SSLWantReadError:
            return self._set_events(c, _R)
        except ssl.SSLWantWriteError:
            return self._set_events(c, _W)
        except _GONE:
            return self._gone(c)
        except ssl.SSLError as exc:
            self.stats.tls_handshake_errors += 1
            log.debug("web: TLS handshake from %s failed: %s", c.addr[0], exc.reason or exc)
            return self._close(c, abort=True)
        except OSError:
            return self._gone(c)
        allowed = getattr(self.ssl_context, "peer_allowed", None)
        if allowed is not None and not allowed(c.sock):
            self.stats.tls_client_cert_rejected += 1
            log.debug("web: client certificate from %s names none of client_allowed_sans", c.addr[0])
            return self._close(c, abort=True)
        c.state, c.deadline = READ, time.monotonic() + self.limits.header_timeout
        self._waiting.move_to_end(c)
        self._set_events(c, _R)
        self._read(c)  # the client may have sent its request with the last handshake flight

    def _read(self, c: _Conn) -> None:
        for _ in range(16):
            try:
                data = c.sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                return self._set_events(c, _W)
            except ssl.SSLZeroReturnError:
                data = b""
            except OSError:  # ssl.SSLError included: a broken or reset peer
                return self._gone(c)
            if not data:
                if c.buf or c.served == 0:
                    self.stats.client_disconnects += 1  # gone before (or in the middle of) a request
                return self._close(c)
            if not c.started:
                c.started = True
                c.deadline = min(c.deadline, time.monotonic() + self.limits.header_timeout)
            c.buf += data
            if len(c.buf) > self.limits.max_header_bytes:
                break
            if len(data) < 65536 and not (c.tls and cast(ssl.SSLSocket, c.sock).pending()):
                break
        self._set_events(c, _R)
        self._parse(c)

    def _parse(self, c: _Conn) -> None:
        while c.buf[:2] == b"\r\n" or c.buf[:1] == b"\n":  # stray line ends between requests
            del c.buf[:2 if c.buf[:1] == b"\r" else 1]
        c.started = bool(c.buf)
        end = head_end(c.buf)
        if end < 0 and len(c.buf) <= self.limits.max_header_bytes:
            return  # more to come
        if end < 0 or end > self.limits.max_header_bytes:
            self.stats.bad_requests += 1
            return self._refuse(c, Response(431, b"Request header fields too large.\n"))
        head = bytes(c.buf[:end])
        del c.buf[:end]
        c.started = bool(c.buf)  # bytes of a pipelined request after this one
        try:
            req = parse_request(head, c.addr, self.limits.max_headers)
        except BadRequest as exc:
            self.stats.bad_requests += 1
            return self._refuse(c, exc.response())
        self._waiting.pop(c, None)
        self.stats.requests += 1
        resp = self.fast(req) if self.fast is not None else None
        if resp is not None:
            log.debug("web: %s %s %s -> %d", c.addr[0], req.method, req.path, resp.status)
            return self._respond(c, resp, req.keep_alive, req.method)
        lane = int(self.priority is not None and self.priority(req))
        threads = self.limits.priority_workers if lane else self.limits.workers
        if self._in_lane[lane] >= threads + self.limits.queue:
            self.stats.overloaded += 1
            busy = Response(503, b"Overloaded: try again shortly.\n", headers={"Retry-After": "1"})
            return self._refuse(c, busy, req.method)
        c.state, c.deadline = WORK, NO_DEADLINE
        self._set_events(c, 0)  # nothing to read or write until the worker answers
        self.stats.requests_in_progress += 1
        self._in_lane[lane] += 1
        self._lanes[lane].put((c, req))

    def _respond(self, c: _Conn, resp: Response, keep: bool, method: str) -> None:
        self._start_write(c, encode(resp, method, keep), keep)

    def _refuse(self, c: _Conn, resp: Response, method: str = "GET") -> None:
        """Answer and close, reading on for a moment: a reset would destroy the answer in flight."""
        c.linger = True
        self._respond(c, resp, False, method)

    def _start_write(self, c: _Conn, data: bytes, keep: bool) -> None:
        if c.served == 0 and keep:  # set here, not at accept: a flood's connections never get this far
            try:
                c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        c.state, c.deadline = WRITE, time.monotonic() + self.limits.write_timeout
        c.out, c.sent, c.keep = memoryview(data), 0, keep
        self._waiting.pop(c, None)
        self._write(c)

    def _write(self, c: _Conn) -> None:
        out = c.out
        assert out is not None, "a connection writes after _start_write"
        while c.sent < len(out):
            try:
                c.sent += c.sock.send(out[c.sent:c.sent + 262144])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                return self._set_events(c, _W)
            except ssl.SSLWantReadError:
                return self._set_events(c, _R)
            except OSError:
                return self._gone(c)
        c.out, c.served = None, c.served + 1
        if not c.keep:
            return self._linger(c) if c.linger else self._close(c)
        c.state = READ
        c.deadline = time.monotonic() + (self.limits.header_timeout if c.buf else self.limits.idle_timeout)
        self._waiting[c] = None
        self._set_events(c, _R)
        if c.buf or c.tls:  # a pipelined request, or TLS bytes decrypted and buffered already
            self._ready.append(c)

    def _linger(self, c: _Conn) -> None:
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return self._close(c)
        c.state, c.deadline = LINGER, time.monotonic() + 2.0
        c.buf.clear()
        self._waiting[c] = None
        self._set_events(c, _R)

    def _drain(self, c: _Conn) -> None:
        for _ in range(16):
            try:
                if not c.sock.recv(65536):
                    return self._close(c)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                return self._close(c)
        # still sending after 1 MB: enough
        self._close(c, abort=True)

    def _set_events(self, c: _Conn, events: int) -> None:
        if events == c.events or c.closed:
            return
        if not c.events:
            self._sel.register(c.sock, events, c)
        elif not events:
            self._sel.unregister(c.sock)
        else:
            self._sel.modify(c.sock, events, c)
        c.events = events

    def _gone(self, c: _Conn) -> None:
        self.stats.client_disconnects += 1
        self._close(c, abort=True)

    def _close(self, c: _Conn, abort: bool = False) -> None:
        if c.closed:
            return
        self._set_events(c, 0)
        c.closed = True
        self._conns.discard(c)
        self._waiting.pop(c, None)
        if abort:
            _abort(c.sock)
        else:
            try:
                c.sock.close()
            except OSError:
                pass
        self.stats.open_connections = len(self._conns)


def _abort(sock: socket.socket) -> None:
    """Close with a reset: no TIME_WAIT, and the peer learns at once."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
