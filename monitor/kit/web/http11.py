"""HTTP/1.1 request heads in, responses out: the parsing and framing half of headroom's web server (pure).

Only what headroom's endpoints need: GET and HEAD, no request bodies, keep-alive per RFC 9112.
Anything else gets a precise 4xx/5xx and the connection is closed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Optional
from urllib.parse import urlsplit

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
METHODS = ("GET", "HEAD")


@dataclass
class Request:
    method: str
    target: str
    path: str
    version: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    client: Optional[tuple[Any, ...]] = None  # the socket's peer address

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


class BadRequest(Exception):
    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def response(self) -> Response:
        return Response(self.status, (self.message + "\n").encode(), headers=self.headers)


def head_end(buf: bytearray) -> int:
    """Index just past the blank line ending the request head, or -1 while it is incomplete."""
    crlf, lf = buf.find(b"\r\n\r\n"), buf.find(b"\n\n")
    ends = [i + 4 for i in (crlf,) if i >= 0] + [i + 2 for i in (lf,) if i >= 0]
    return min(ends) if ends else -1


def parse_request(head: bytes, client: Optional[tuple[Any, ...]] = None, max_headers: int = 100) -> Request:
    """A Request from the bytes of a request line and headers, or BadRequest (status, reason)."""
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].rstrip("\r").split(" ")
    if len(parts) != 3 or not all(parts):
        raise BadRequest(400, "Bad request: malformed request line.")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise BadRequest(400, "Bad request: malformed method.")
    if not re.match(r"^HTTP/\d\.\d$", version):
        raise BadRequest(400, "Bad request: malformed HTTP version.")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(505, "HTTP version not supported: use HTTP/1.1.")
    headers: dict[str, str] = {}
    count = 0
    for raw in lines[1:]:
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line:
            continue
        if line[0] in " \t":
            raise BadRequest(400, "Bad request: folded header lines are not accepted.")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest(400, "Bad request: malformed header line.")
        count += 1
        if count > max_headers:
            raise BadRequest(431, "Request header fields too large: too many headers.")
        name, value = name.lower(), value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if method not in METHODS:
        raise BadRequest(405, "Method not allowed: use GET or HEAD.", {"Allow": ", ".join(METHODS)})
    if "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0"):
        raise BadRequest(413, "Request bodies are not accepted.")
    return Request(method, target, _path(target), version, headers, client)


def _path(target: str) -> str:
    if target.startswith("/"):
        return target.split("?", 1)[0]
    if target.lower().startswith(("http://", "https://")):
        return urlsplit(target).path or "/"
    raise BadRequest(400, "Bad request: the request target must be a path.")


def encode(resp: Response, method: str, keep_alive: bool) -> bytes:
    """The response's bytes (status line, headers, body; no body for HEAD)."""
    try:
        reason = HTTPStatus(resp.status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {resp.status} {reason}", "Server: headroom", f"Date: {formatdate(usegmt=True)}",
             f"Content-Type: {resp.content_type}", f"Content-Length: {len(resp.body)}",
             "X-Content-Type-Options: nosniff"]
    lines.extend(f"{k}: {v}" for k, v in resp.headers.items())
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if method == "HEAD" else head + resp.body
