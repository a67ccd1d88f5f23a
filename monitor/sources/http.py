"""HTTP plumbing shared by the sources: sessions with credentials, error reasons, retries.

Credentials are attached to the session, never formatted into messages or logs.
"""
from __future__ import annotations

import base64
import http.client
import random
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional
from urllib.parse import urlsplit

import requests

from ..config import HttpAuth

ACCEPT_TEXT = "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
MAX_BODY_BYTES = 64 * 1024 * 1024


class FetchError(Exception):
    """A target could not be read. `reason` is a short label (timeout, connect, http, truncated, ...)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def make_session(auth: Optional[HttpAuth] = None, pool_size: int = 32) -> requests.Session:
    s = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    s.trust_env = False  # no proxies from the environment for loopback / in-cluster targets
    if auth is not None:
        token = auth.bearer_token()
        if token:
            s.headers["Authorization"] = "Bearer " + token
        elif auth.username:
            s.auth = (auth.username, auth.password() or "")
        if auth.ca_file:
            s.verify = auth.ca_file
        if auth.insecure_skip_verify:
            s.verify = False
        if auth.cert_file:
            s.cert = (auth.cert_file, auth.key_file) if auth.key_file else auth.cert_file
    return s


def redact(url: str) -> str:
    """URL without user:password@ (never log credentials embedded in a URL)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        host = rest.split("@", 1)[1] if "@" in rest.split("/", 1)[0] else rest
        return f"{scheme}://{host}"
    return url


def get_text(session: requests.Session, url: str, timeout: float) -> str:
    """GET a metrics body. Raises FetchError with a reason on any failure or a short body."""
    try:
        resp = session.get(url, timeout=timeout, headers={"Accept": ACCEPT_TEXT}, stream=True)
    except requests.exceptions.Timeout:
        raise FetchError("timeout", f"no answer within {timeout:g}s") from None
    except requests.exceptions.SSLError as exc:
        raise FetchError("tls", type(exc).__name__) from None
    except requests.exceptions.ConnectionError as exc:
        raise FetchError("connect", _short(exc)) from None
    except requests.exceptions.RequestException as exc:
        raise FetchError("request", type(exc).__name__) from None
    try:
        if resp.status_code >= 400:
            raise FetchError("http", f"HTTP {resp.status_code}")
        chunks = []
        size = 0
        deadline = time.monotonic() + timeout
        for chunk in resp.iter_content(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise FetchError("too_large", f"body over {MAX_BODY_BYTES} bytes")
            if time.monotonic() > deadline:
                raise FetchError("timeout", f"body not complete within {timeout:g}s")
        expected = resp.headers.get("Content-Length")
        if expected is not None and expected.isdigit() and int(expected) != size:
            raise FetchError("truncated", f"got {size} of {expected} bytes")
    except requests.exceptions.Timeout:
        raise FetchError("timeout", f"body not complete within {timeout:g}s") from None
    except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError) as exc:
        raise FetchError("truncated", _short(exc)) from None
    finally:
        resp.close()
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FetchError("parse", f"body is not UTF-8 (byte {exc.start})") from None


def _short(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "Connection reset",
                   "IncompleteRead", "Connection broken", "Remote end closed"):
        if marker in text:
            return marker
    return type(exc).__name__


@dataclass
class Backoff:
    """Exponential backoff with full jitter."""

    base: float = 0.2
    cap: float = 5.0
    rng: Callable[[], float] = random.random

    def delay(self, attempt: int) -> float:
        return self.rng() * min(self.cap, self.base * (2 ** attempt))


class Fetcher:
    """Lean keep-alive GET for scraping many /metrics targets (the hot path of every cycle).

    http.client with one persistent connection per (thread, host), instead of requests, whose
    per-call overhead is larger than parsing the body. Credentials are sent as headers and never
    appear in errors.
    """

    def __init__(self, auth: Optional[HttpAuth] = None):
        self.headers = {"Accept": ACCEPT_TEXT, "User-Agent": "headroom", "Accept-Encoding": "identity"}
        self.ssl_context: Optional[ssl.SSLContext] = None
        if auth is not None:
            token = auth.bearer_token()
            if token:
                self.headers["Authorization"] = "Bearer " + token
            elif auth.username:
                raw = f"{auth.username}:{auth.password() or ''}".encode()
                self.headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
            ctx = ssl.create_default_context(cafile=auth.ca_file) if auth.ca_file else ssl.create_default_context()
            if auth.insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if auth.cert_file:
                ctx.load_cert_chain(auth.cert_file, auth.key_file)
            self.ssl_context = ctx
        self._local = threading.local()
        self._all: list[dict] = []  # every thread's connection map, for close()
        self._all_lock = threading.Lock()

    def _conn(self, scheme: str, host: str, port: Optional[int], timeout: float) -> http.client.HTTPConnection:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
            with self._all_lock:
                self._all.append(conns)
        key = (scheme, host, port)
        conn = conns.get(key)
        if conn is None:
            if scheme == "https":
                conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                                   context=self.ssl_context or ssl.create_default_context())
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            conns[key] = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self, scheme: str, host: str, port: Optional[int]) -> None:
        conn = self._local.conns.pop((scheme, host, port), None)
        if conn is not None:
            conn.close()

    def get(self, url: str, timeout: float) -> str:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme, parts.hostname or "", parts.port
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        headers = dict(self.headers)
        if parts.username:  # credentials in the URL: use them, never echo them
            raw = f"{parts.username}:{parts.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        deadline = time.monotonic() + timeout
        for attempt in (0, 1):  # a kept-alive connection the server closed gets one fresh retry
            conn = self._conn(scheme, host, port, timeout)
            reused = conn.sock is not None
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                if resp.status >= 400:
                    resp.read(MAX_BODY_BYTES)
                    raise FetchError("http", f"HTTP {resp.status}")
                length = resp.getheader("Content-Length")
                body = resp.read(MAX_BODY_BYTES + 1)
                if len(body) > MAX_BODY_BYTES:
                    self._drop(scheme, host, port)
                    raise FetchError("too_large", f"body over {MAX_BODY_BYTES} bytes")
                if length is not None and length.isdigit() and int(length) != len(body):
                    self._drop(scheme, host, port)
                    raise FetchError("truncated", f"got {len(body)} of {length} bytes")
                if resp.will_close:
                    self._drop(scheme, host, port)
                break
            except FetchError:
                raise
            except http.client.IncompleteRead as exc:
                self._drop(scheme, host, port)
                raise FetchError("truncated", f"got {len(exc.partial)} bytes, connection closed") from None
            except (socket.timeout, TimeoutError):
                self._drop(scheme, host, port)
                raise FetchError("timeout", f"no complete answer within {timeout:g}s") from None
            except ssl.SSLError as exc:
                self._drop(scheme, host, port)
                raise FetchError("tls", type(exc).__name__) from None
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, OSError) as exc:
                self._drop(scheme, host, port)
                if attempt == 0 and reused and time.monotonic() < deadline:
                    continue
                raise FetchError("connect", _short(exc)) from None
            except http.client.HTTPException as exc:
                self._drop(scheme, host, port)
                raise FetchError("protocol", type(exc).__name__) from None
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FetchError("parse", f"body is not UTF-8 (byte {exc.start})") from None

    def close(self) -> None:
        with self._all_lock:
            for conns in self._all:
                for conn in list(conns.values()):
                    conn.close()
                conns.clear()
