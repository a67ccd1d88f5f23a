"""HTTP plumbing shared by the sources: sessions with credentials, error reasons, retries.

Credentials are attached to the session, never formatted into messages or logs.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

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
