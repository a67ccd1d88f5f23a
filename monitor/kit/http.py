"""HTTP plumbing shared by the sources: one deadline per request, credentials, error reasons, retries.

Every request has one total deadline (connect, TLS handshake, headers and body): each socket read
waits at most the time left, so a target that trickles bytes cannot hold a request longer than its
timeout. Credentials are attached as headers, never formatted into messages or logs.
"""
from __future__ import annotations

import base64
import http.client
import ipaddress
import random
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol
from urllib.parse import urlsplit

from monitor.kit.http_held import BodyBudget as BodyBudget  # re-exported: the kit's HTTP names
from monitor.kit.http_held import FetchError as FetchError
from monitor.kit.http_held import Held as _Held
from monitor.kit.http_wire import Wire, read_response, request_bytes


class Credentials(Protocol):
    """What a request is sent with (the sources' `HttpAuth` section is one): secrets read on each use."""

    username: Optional[str]
    ca_file: Optional[str]
    cert_file: Optional[str]
    key_file: Optional[str]
    insecure_skip_verify: bool

    def bearer_token(self) -> Optional[str]: ...

    def password(self) -> Optional[str]: ...


ACCEPT_TEXT = "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
MAX_BODY_BYTES = 64 * 1024 * 1024


def redact(url: str) -> str:
    """URL without user:password@ (never log credentials embedded in a URL)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        host = rest.split("@", 1)[1] if "@" in rest.split("/", 1)[0] else rest
        return f"{scheme}://{host}"
    return url


def _short(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "Connection reset",
                   "IncompleteRead", "Connection broken", "Remote end closed"):
        if marker in text:
            return marker
    return type(exc).__name__


_UrlParts = tuple[str, str, Optional[int], str, Optional[str]]  # scheme, host, port, path, Authorization
_ConnKey = tuple[str, str, Optional[int]]  # scheme, host, port


@dataclass
class Backoff:
    """Exponential backoff with full jitter."""

    base: float = 0.2
    cap: float = 5.0
    rng: Callable[[], float] = random.random

    def delay(self, attempt: int) -> float:
        return self.rng() * min(self.cap, self.base * (2.0 ** attempt))


@dataclass(frozen=True)
class _Ask:
    """One request as the client sends it, and the monotonic time it must end by."""

    method: str
    path: str
    body: Optional[bytes]
    headers: dict[str, str]
    timeout: float
    deadline: float
    key: _ConnKey


@dataclass(frozen=True)
class Exchange:
    """A GET `Fetcher.begin` sent on a kept connection: `conn` receives its answer (`Wire.take_ready`
    reads what has come without waiting, `Wire.whole` says when it is all there)."""

    ask: _Ask
    conn: Wire
    reused: bool  # on a kept connection (one that gives no byte of an answer is worth a fresh try)


class Fetcher:
    """Lean keep-alive HTTP client for the sources (the hot path of every cycle), one deadline per request.

    Kept connections are shared by every thread, per host: a request takes an idle connection to
    its host (or opens one when every one is busy) and gives it back when its answer allows, so a
    host has at most as many connections as requests ever ran to it at once (one per target when
    each host serves one target and a target is asked once at a time, as the scrape pool does),
    never one per thread and host. An idle connection is checked before it is reused: one the server
    closed, or with bytes waiting that no request asked for, is closed and replaced, never read
    (`prune` also closes them between cycles). A request that got no byte of an answer on a reused
    connection (the server closed it as the request went) or an idle-timeout 408 there goes once
    more on a fresh connection. Each answer is read straight off the socket (`http_wire`: neither
    requests, whose per-call overhead is larger than parsing the body and whose timeout bounds each
    socket read, not the request, nor http.client's response object, four times the CPU of the bytes'
    own receive). Credentials are sent as headers and never appear in errors. `close()` (from any
    thread) also breaks the requests still in flight, so a stopping process never waits on a source.
    """

    MAX_IDLE_SECONDS = 300.0  # `prune` closes a connection idle longer (a target no longer asked)

    def __init__(self, auth: Optional[Credentials] = None, budget: Optional[BodyBudget] = None,
                 max_body: int = MAX_BODY_BYTES):
        self.headers = {"Accept": ACCEPT_TEXT, "User-Agent": "headroom", "Accept-Encoding": "identity"}
        self.budget = budget  # shared with the other fetchers of the cycle; None: max_body only
        if not 0 < max_body <= MAX_BODY_BYTES:
            raise ValueError(f"max_body must be in 1..{MAX_BODY_BYTES} bytes, got {max_body}")
        self.max_body = max_body  # one body's cap (gateways, DCGM: sources.gateway.AUX_MAX_BODY_BYTES)
        self.ssl_context: Optional[ssl.SSLContext] = None
        if auth is not None:
            token = auth.bearer_token()
            if token:
                self.headers["Authorization"] = "Bearer " + token
            elif auth.username:
                self.headers["Authorization"] = _basic(auth.username, auth.password() or "")
            ctx = ssl.create_default_context(cafile=auth.ca_file) if auth.ca_file else ssl.create_default_context()
            if auth.insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if auth.cert_file:
                ctx.load_cert_chain(auth.cert_file, auth.key_file)
            self.ssl_context = ctx
        self._urls: dict[str, _UrlParts] = {}  # url -> its parts (`_split`)
        self._asks: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], bytes] = {}  # (method, path, host, headers) -> a GET's request bytes
        self._idle: dict[_ConnKey, list[Wire]] = {}  # (scheme, host, port) -> its idle connections
        self._busy: set[Wire] = set()  # connections carrying a request now (close() breaks them)
        self._lock = threading.Lock()
        self.closed = False

    def _take(self, key: _ConnKey) -> tuple[Wire, bool]:
        """(a connection to `key`'s host, whether it carried a request before): the idle one used
        last that passes its check (the others found closed or dirty on the way are closed), or a
        new one (connected by its first send)."""
        conn = self._take_idle(key)
        return (conn, True) if conn is not None else (self._new(key), False)

    def _new(self, key: _ConnKey) -> Wire:
        """A new connection to `key`'s host, not made yet, counted busy (closed by `close`)."""
        scheme, host, port = key
        tls = (self.ssl_context or ssl.create_default_context()) if scheme == "https" else None
        conn = Wire(host, port, tls)
        with self._lock:
            self._busy.add(conn)
        return conn

    def _take_idle(self, key: _ConnKey) -> Optional[Wire]:
        """The idle connection to `key`'s host used last that passes its check (the others found
        closed or dirty on the way are closed), or None."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                conn = idle.pop()
                self._busy.add(conn)
            if conn.reusable():
                return conn
            self._give(key, conn, False)

    def _give(self, key: _ConnKey, conn: Wire, keep: bool) -> None:
        """Back to the idle connections of `key` (`keep`: its answer left it clean and open), or closed."""
        with self._lock:
            self._busy.discard(conn)
            if keep and not self.closed and conn.sock is not None:
                conn.idle_since = time.monotonic()
                self._idle.setdefault(key, []).append(conn)
                return
        conn.close()

    def prune(self, max_idle: Optional[float] = None) -> int:
        """Close the idle connections the server closed or wrote to unasked, and those idle over
        `max_idle` seconds (MAX_IDLE_SECONDS); how many were closed. The scrape calls it each cycle,
        so a connection the server closed leaves CLOSE_WAIT within a cycle, not at its next use."""
        limit = time.monotonic() - (self.MAX_IDLE_SECONDS if max_idle is None else max_idle)
        with self._lock:
            conns = [(key, conn) for key, idle in self._idle.items() for conn in idle]
            self._idle.clear()
            self._busy.update(conn for _, conn in conns)
        poller = select.poll()  # one poll over every idle connection: one call, however many targets
        for _, conn in conns:
            if conn.sock is not None and conn.sock.fileno() >= 0:
                poller.register(conn.sock, select.POLLIN | select.POLLPRI)
        waiting = {fd for fd, _ in poller.poll(0)}
        closed = 0
        for key, conn in conns:
            sock = conn.sock
            keep = (conn.idle_since >= limit and sock is not None and sock.fileno() not in waiting
                    and not conn.buf and not (isinstance(sock, ssl.SSLSocket) and sock.pending()))
            closed += not keep
            self._give(key, conn, keep)
        return closed

    def connections(self) -> int:
        """Open connections, idle and busy (the bound the tests and the soak hold)."""
        with self._lock:
            return sum(len(idle) for idle in self._idle.values()) + sum(1 for c in self._busy if c.sock is not None)

    def get(self, url: str, timeout: float) -> str:
        """GET a metrics body within `timeout` seconds in all; FetchError with a reason otherwise."""
        return self._text(*self.request("GET", url, timeout))

    @staticmethod
    def _text(status: int, body: bytes) -> str:
        """A metrics answer's text; FetchError for a redirect, an error status or a body not UTF-8."""
        if 300 <= status < 400:
            raise FetchError("http", f"HTTP {status}: redirects are not followed (scrape the final URL)")
        if status >= 400 or status < 200:
            raise FetchError("http", f"HTTP {status}")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FetchError("parse", f"body is not UTF-8 (byte {exc.start})") from None

    def request(self, method: str, url: str, timeout: float, body: Optional[bytes] = None,
                headers: Optional[dict[str, str]] = None) -> tuple[int, bytes]:
        """(status, body) of one request that ends within `timeout` seconds, whatever the server does.

        Raises FetchError: timeout, connect, tls, truncated, too_large, protocol, closed.
        """
        ask = self._ask(method, url, timeout, body, headers)
        for attempt in (0, 1):  # on a reused connection, an answer not for this request: one fresh try
            conn, reused = self._take(ask.key)
            conn.deadline = ask.deadline
            got = self._attempt(ask, conn, attempt == 0 and reused, sent=False)
            if got is not None:
                return got
        raise AssertionError("unreachable")

    def begin(self, url: str, timeout: float, connect: bool = False) -> Optional[Exchange]:
        """A GET on a kept connection to `url`'s host that passes its check, sent, its answer left to
        arrive (`finish` reads it; `Exchange.conn` shows what has come); plain HTTP only. With no such
        connection and `connect`, a host given by its IP address gets a new one, begun without waiting
        (`Wire.connect_nowait`; the GET waits in `Wire.unsent` until it is made). None otherwise, or
        when the send or the connect could not start: the caller then asks with `get`. No name is
        looked up and nothing is waited for here."""
        ask = self._ask("GET", url, timeout, None, None)
        scheme, host, _port = ask.key
        if scheme != "http":  # TLS records are not read without waiting here
            return None
        conn = self._take_idle(ask.key)
        reused = conn is not None
        if conn is None:
            if not connect or not _ip_literal(host):
                return None
            conn = self._new(ask.key)
        conn.deadline = ask.deadline
        try:
            if reused:
                conn.send(self._get_bytes(conn, ask))
            else:
                conn.connect_nowait()
                conn.unsent = self._get_bytes(conn, ask)
        except (OSError, ValueError, http.client.HTTPException):
            self._give(ask.key, conn, False)  # as `request` would: a fresh connection gets the GET
            return None
        return Exchange(ask, conn, reused)

    def finish(self, exchange: Exchange) -> str:
        """`get`'s answer to a `begin`: the rest of it read off the socket within its deadline (none
        of it when `Exchange.conn` holds it whole), the connection given back; on a kept connection
        that gave no byte of an answer, the one fresh try `request` makes."""
        ask, conn = exchange.ask, exchange.conn
        got = self._attempt(ask, conn, exchange.reused, sent=True)
        if got is None:
            if self.closed:
                raise FetchError("closed", "the client is shut down")
            conn, _ = self._take(ask.key)
            conn.deadline = ask.deadline
            got = self._attempt(ask, conn, False, sent=False)
            if got is None:  # no retry asked of that try: an answer or an error
                raise AssertionError("a fresh try asked for another")
        return self._text(*got)

    def discard(self, exchange: Exchange) -> None:
        """Close a begun exchange's connection unread (nothing will read its answer)."""
        self._give(exchange.ask.key, exchange.conn, False)

    def _ask(self, method: str, url: str, timeout: float, body: Optional[bytes],
             headers: Optional[dict[str, str]]) -> _Ask:
        if self.closed:
            raise FetchError("closed", "the client is shut down")
        scheme, host, port, path, url_auth = self._split(url)
        hdrs = self.headers
        if url_auth or headers:
            hdrs = dict(hdrs)
            if url_auth:  # credentials in the URL: use them, never echo them
                hdrs["Authorization"] = url_auth
            hdrs.update(headers or {})
        return _Ask(method, path, body, hdrs, timeout, time.monotonic() + timeout, (scheme, host, port))

    def _attempt(self, ask: _Ask, conn: Wire, retry: bool, sent: bool) -> Optional[tuple[int, bytes]]:
        """One try of `ask` on `conn` (`sent`: its request went already), the connection given back
        or closed; None when it is worth the one fresh try (`retry`: a reused connection closed as
        the request went, no byte of an answer came, or an idle-timeout 408)."""
        try:
            status, data, keep = self._exchange(conn, ask, sent)
        except FetchError:
            self._give(ask.key, conn, False)
            raise
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._give(ask.key, conn, False)
            if self.closed:  # close() broke the connection under us
                raise FetchError("closed", "the client was shut down during the request") from None
            error = _classify(exc, ask.timeout)
            if error is None and retry and conn.received == 0 and time.monotonic() < ask.deadline:
                return None  # closed as the request went: no byte of an answer came
            raise (error or FetchError("connect", _short(exc))) from None
        if status == 408 and retry and time.monotonic() < ask.deadline:
            self._give(ask.key, conn, False)  # the server timed the idle connection out: not our answer
            return None
        self._give(ask.key, conn, keep)
        return status, data

    def _split(self, url: str) -> _UrlParts:
        """(scheme, host, port, path with query, Authorization from the URL's credentials or None),
        kept per URL: the same targets are asked every cycle (a bad port raises ValueError, uncached)."""
        got = self._urls.get(url)
        if got is None:
            parts = urlsplit(url)
            got = (parts.scheme, parts.hostname or "", parts.port,
                   (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                   _basic(parts.username, parts.password or "") if parts.username else None)
            if len(self._urls) >= 100_000:
                self._urls.clear()
            self._urls[url] = got
        return got

    def _get_bytes(self, conn: Wire, ask: _Ask) -> bytes:
        """A GET's request bytes, kept: the same GETs go every cycle."""
        key = (ask.method, ask.path, conn.host_header, tuple(ask.headers.items()))
        wire = self._asks.get(key)
        if wire is None:
            wire = request_bytes(ask.method, ask.path, conn.host_header, ask.headers, None)
            if len(self._asks) >= 100_000:
                self._asks.clear()
            self._asks[key] = wire
        return wire

    def _exchange(self, conn: Wire, ask: _Ask, sent: bool) -> tuple[int, bytes, bool]:
        """(status, body, whether `conn` may be kept) of one request on `conn` (sent first unless
        `sent`), read off the socket (http_wire), head and body held within their caps and the
        shared budget (never inflated: the request asked for identity)."""
        if not sent:
            conn.send(self._get_bytes(conn, ask) if ask.body is None else
                      request_bytes(ask.method, ask.path, conn.host_header, ask.headers, ask.body))
        elif conn.unsent and conn.error is None:  # begun on a new connection: what did not go yet
            if conn.sock is None:  # closed under us: never connected again
                raise FetchError("closed", "the client was shut down during the request")
            conn.send(conn.unsent)
        held = _Held(self.max_body, self.budget)
        try:
            status, will_close, _ = read_response(conn, ask.method == "HEAD", held)
            data = held.data()
        finally:
            held.release()
        return status, data, not will_close

    def close(self) -> None:
        """Close every connection; a request in flight on one ends at once (its read sees the end)."""
        with self._lock:
            self.closed = True
            conns = [c for idle in self._idle.values() for c in idle] + list(self._busy)
            self._idle.clear()
            self._busy.clear()
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:  # wakes a read blocked in another thread; the plain-socket call leaves TLS state be
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass
            conn.close()


def _ip_literal(host: str) -> bool:
    """Whether `host` is an IP address (a connection to it needs no name looked up)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _classify(exc: Exception, timeout: float) -> Optional[FetchError]:
    """The FetchError for a failed exchange; None for a broken connection (worth one retry when reused)."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return FetchError("timeout", f"no complete answer within {timeout:g}s")
    if isinstance(exc, http.client.IncompleteRead):
        return FetchError("truncated", f"got {len(exc.partial)} bytes, connection closed")
    if isinstance(exc, ssl.SSLError):
        return FetchError("tls", type(exc).__name__)
    if isinstance(exc, (OSError, http.client.RemoteDisconnected)):  # RemoteDisconnected: no byte at all
        return None
    if isinstance(exc, http.client.BadStatusLine):  # bytes that are not an answer (not echoed: any text)
        return FetchError("protocol", "the answer does not start with an HTTP/1.x status line")
    if isinstance(exc, http.client.HTTPException) and str(exc):  # the reader's own words (no upstream bytes)
        return FetchError("protocol", str(exc)[:160])
    return FetchError("protocol", type(exc).__name__)


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
