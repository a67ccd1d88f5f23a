"""One HTTP/1.1 exchange read straight off the socket, for the sources' client (monitor/kit/http.py).

http.client builds a buffered reader, an email-parser message and a response object for every
answer: about four times the CPU of the bytes' own recv for a 50 KB metrics body, which, times a
thousand targets a cycle, was a large part of direct mode's cost. Here the status line and headers
are split from one receive buffer and the body is framed by Content-Length, chunked encoding or the
connection's end, within the same limits: every receive waits at most the time left before the
request's deadline, a header line is at most MAX_LINE bytes and a head at most MAX_HEADERS lines,
the head (every interim answer's included) and the body are held within the caller's caps and
shared budget together (`BodySink`: the head's bytes are counted as they arrive, and only the
framing fields are kept from it), and nothing is inflated (the request asks for identity).

Framing is strict (RFC 9112): Content-Length is plain ASCII digits, a chunk size plain hex digits
(not `0x10`, `+a`, `a_b` or blanks, which int(x, 16) takes), and an answer with both Content-Length
and Transfer-Encoding is refused (section 6.3 lets a client treat it as an error or prefer chunked:
a message framed two ways is how responses are smuggled, and no metrics server sends one). Broken
answers raise http.client's own exceptions (RemoteDisconnected, BadStatusLine, IncompleteRead,
LineTooLong, HTTPException), so the caller classifies them.
"""
from __future__ import annotations

import errno
import http.client
import os
import re
import select
import socket
import ssl
import time
from typing import Callable, Optional, Protocol

MAX_LINE = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
MAX_HEAD_BYTES = 1024 * 1024  # every head of one answer (interim ones included): metrics servers send < 1 KB
HEAD_STEP = 16 * 1024  # a head's bytes are told to the sink at its end and each time this many more came
_FRAMING = frozenset({"connection", "content-length", "transfer-encoding"})  # the fields kept from a head
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
RECV_BYTES = 64 * 1024
_NO_BODY = (204, 304)
_BAD_TARGET = frozenset(range(0x21)) | {0x7F}  # what http.client refuses in a request target


class BodySink(Protocol):
    """Where a body goes as it arrives (the client's `_Held`: cap and budget); any may raise."""

    def head(self, size: int) -> None: ...  # the answer's head bytes received so far (it grows)

    def expect(self, length: int) -> None: ...

    def __call__(self, chunk: bytes) -> None: ...


def time_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("request deadline passed")
    return left


class Wire:
    """One persistent connection to (host, port): its socket (None until used), its receive buffer,
    the deadline of the request it is carrying (set before each request), the bytes received since
    that request was sent (`received`: none means no byte of an answer came) and when it went idle."""

    def __init__(self, host: str, port: Optional[int], context: Optional[ssl.SSLContext] = None):
        self.host = host
        self.port = port or (443 if context is not None else 80)
        self.context = context
        self.sock: Optional[socket.socket] = None
        self.deadline = float("inf")
        self.buf = bytearray()
        self.received = 0
        self.idle_since = 0.0
        self.error: Optional[OSError] = None  # a receive error `take_ready` met, for `_recv` to raise
        self.need = 0  # `whole`: the bytes the answer in the buffer has in all (0: not known yet; -1: chunked)
        self.chunk_at = self.chunked = 0  # `whole` of a chunked body: where its next chunk starts, its bytes so far
        self.unsent = b""  # a request `connect_nowait` holds until the connection is made (`send_ready`)
        default = 443 if context is not None else 80
        name = f"[{host}]" if ":" in host else host
        self.host_header = name if self.port == default else f"{name}:{self.port}"

    def connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), time_left(self.deadline))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(time_left(self.deadline))  # the handshake gets only the time left
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.buf.clear()
        return sock

    def connect_nowait(self) -> None:
        """Start connecting to the host (an IP address: nothing to look up, so nothing waits) and
        return; the socket turns writable once it is made or failed (`connected` tells which).
        OSError when it cannot even start."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex((self.host, self.port))
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.buf.clear()
        self.received = self.need = 0
        self.error = None

    def connected(self) -> bool:
        """Whether the connection `connect_nowait` began is made (its socket turned writable); if it
        failed, its error is kept for the read (`_recv`) to raise, as a blocking connect would."""
        sock = self.sock
        if sock is None:
            return False
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.error = OSError(err, os.strerror(err))
            self.unsent = b""
        return not err

    def send_ready(self) -> bool:
        """Send the request `unsent` holds on the connection just made, without waiting: whether it all
        went (what did not stays in `unsent`: the blocking read sends it first)."""
        sock = self.sock
        if sock is None or not self.unsent:
            return not self.unsent
        try:
            sent = sock.send(self.unsent)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self.error = exc
            self.unsent = b""
            return False
        self.unsent = self.unsent[sent:]
        return not self.unsent

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self.buf.clear()
        if sock is not None:
            sock.close()

    def _recv(self) -> int:
        """Receive what has arrived into the buffer (at most RECV_BYTES); 0 at the connection's end."""
        sock = self.sock
        if sock is None:  # closed under us (Fetcher.close from another thread)
            return 0
        if self.error is not None:  # what `take_ready` met, raised where the reading is
            error, self.error = self.error, None
            raise error
        sock.settimeout(time_left(self.deadline))
        chunk = sock.recv(RECV_BYTES)
        self.buf += chunk
        self.received += len(chunk)
        return len(chunk)

    def take_ready(self) -> bool:
        """One receive that does not wait (its socket said it is readable): whether the connection
        may still bring more. Its end (or an error, kept for `_recv` to raise) says False: the
        blocking read then meets it as it would have."""
        sock = self.sock
        if sock is None or self.error is not None:
            return False
        try:
            if sock.gettimeout() != 0:  # a blocking read set a timeout: back to not waiting (one ioctl)
                sock.settimeout(0)
            chunk = sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            self.error = exc
            return False
        self.buf += chunk
        self.received += len(chunk)
        return bool(chunk)

    def whole(self, max_body: int) -> Optional[bool]:
        """Whether the buffer holds a whole answer to a GET, framed by its Content-Length or chunked
        (a usual head, status 2xx-5xx but 408, a body of at most `max_body` bytes): True (`read_response`
        then reads it without waiting), False (not yet), None (anything else: read it the blocking
        way; a 408 too, as the client's fresh try connects)."""
        if not self.need:
            end = self.buf.find(b"\r\n\r\n", 0, HEAD_STEP)
            if end == -1:
                head = self.buf[:HEAD_STEP]
                return None if len(self.buf) >= HEAD_STEP or b"\n\n" in head or b"\n\r\n" in head else False
            try:
                got = _whole_head(self.buf, _NO_SINK, 0)
            except (http.client.HTTPException, ValueError):
                return None
            if got is None:
                return None
            status, _, fields, at = got
            raw = fields.get("content-length")
            coding = fields.get("transfer-encoding")
            if status < 200 or status in _NO_BODY or status == 408 or (raw is None) == (coding is None):
                return None
            if coding is not None:
                if coding.lower() != "chunked":
                    return None
                self.need, self.chunk_at, self.chunked = -1, at, 0
            else:
                length = _content_length(raw or "")  # present: exactly one of the two is
                if length is None or length > max_body:
                    return None
                self.need = at + length
        if self.need < 0:
            return self._chunks_whole(max_body)
        return len(self.buf) >= self.need

    def _chunks_whole(self, max_body: int) -> Optional[bool]:
        """`whole` of a chunked body: its chunks walked from where the last call stopped, each size
        line plain hex (an extension allowed) and CRLF-ended, then the last chunk and the blank line
        after any trailers; None for anything `_read_chunked` would name or read another way."""
        buf, at = self.buf, self.chunk_at
        while True:
            nl = buf.find(b"\r\n", at, at + 1024)
            if nl == -1:
                return None if len(buf) - at >= 1024 or b"\n" in buf[at:] else False
            line = bytes(buf[at:nl])
            if b"\n" in line:  # a bare LF ends the line for `_line`: read the blocking way
                return None
            size = _chunk_size(line)
            if size is None:
                return None
            if size == 0:  # `_read_chunked` ends at the first empty line after it, CRLF or bare LF
                tail = buf[nl + 1:nl + 1 + HEAD_STEP]
                if b"\n\n" in tail or b"\n\r\n" in tail:
                    return True
                return None if len(buf) - nl >= HEAD_STEP else False
            if self.chunked + size > max_body:
                return None
            nxt = nl + 2 + size + 2
            if len(buf) < nxt:
                return False
            if buf[nxt - 2:nxt] != b"\r\n":
                return None
            self.chunked += size
            at = self.chunk_at = nxt

    def reusable(self) -> bool:
        """Whether this idle connection may carry another request: open, and nothing waiting on it.
        A readable idle connection is one the server closed (EOF, a reset) or one holding bytes no
        request asked for (an extra answer, an idle-timeout 408): either way never read, closed."""
        sock = self.sock
        if sock is None or self.buf or sock.fileno() < 0:
            return False
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return False
        poller = select.poll()  # not select.select: it cannot watch a descriptor over 1023
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)

    def _line(self, start: int, status_line: bool = False) -> tuple[int, int]:
        """(end of the line at `start` without its CRLF/LF, start of the next line), receiving as
        needed. The end of the connection before any byte of the status line: RemoteDisconnected
        (a kept-alive connection the server closed: worth one retry); anywhere else IncompleteRead."""
        scan = start  # bytes before it were searched already: a trickled line costs one pass, not n
        while True:
            nl = self.buf.find(b"\n", scan, start + MAX_LINE + 1)
            if nl != -1:
                end = nl - 1 if nl > start and self.buf[nl - 1] == 13 else nl
                return end, nl + 1
            if len(self.buf) - start > MAX_LINE:
                raise http.client.LineTooLong("header line")
            scan = len(self.buf)
            if not self._recv():
                if status_line and not self.buf:
                    raise http.client.RemoteDisconnected("Remote end closed connection without response")
                raise http.client.IncompleteRead(bytes(self.buf[start:]))

    def send(self, data: bytes) -> None:
        sock = self.sock if self.sock is not None else self.connect()
        self.received = self.need = 0
        self.error = None
        self.unsent = b""
        sock.settimeout(time_left(self.deadline))
        sock.sendall(data)


class _NoSink:
    """A sink for a head read to learn its framing only (`Wire.whole`): nothing is held."""

    def head(self, size: int) -> None:
        pass

    def expect(self, length: int) -> None:
        pass

    def __call__(self, chunk: bytes) -> None:
        pass


_NO_SINK = _NoSink()


def request_bytes(method: str, path: str, host_header: str, headers: dict[str, str],
                  body: Optional[bytes]) -> bytes:
    """The request's head (and body); a target or header with a line break or control byte is refused."""
    if any(b in _BAD_TARGET for b in path.encode("ascii", "strict")) or not method.isalpha():
        raise http.client.InvalidURL("the request target holds a control character or blank")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_header}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} holds a line break")  # the name only: values may be secrets
        lines.append(f"{name}: {value}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def read_response(wire: Wire, head_only: bool, sink: "BodySink") -> tuple[int, bool, Optional[int]]:
    """Read one response off `wire`: (status, whether the connection must close, Content-Length
    or None), the body handed to `sink` piece by piece (`sink.expect` hears a Content-Length
    first, so it can refuse the body before it is read; `sink.head` hears the head's bytes as
    they arrive). Interim 1xx answers before it are skipped (their heads count in the same bytes)."""
    before = 0  # head bytes of the interim answers already read
    while True:
        status, version, fields, at = _read_head(wire, sink, before)
        if status == 101:  # never asked for: the connection is no longer HTTP
            raise http.client.HTTPException("101 Switching Protocols without an Upgrade request")
        if not 100 <= status < 200:
            break
        del wire.buf[:at]  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        before += at
    del wire.buf[:at]
    conn = fields.get("connection", "").lower()
    will_close = "close" in conn or (version == 10 and "keep-alive" not in conn)
    length = None
    raw = fields.get("content-length")
    chunked = fields.get("transfer-encoding", "").lower().rsplit(",", 1)[-1].strip() == "chunked"
    if raw is not None:
        if "transfer-encoding" in fields:
            raise http.client.HTTPException("Content-Length together with Transfer-Encoding (RFC 9112 6.3): "
                                            "a message framed two ways is refused")
        length = _content_length(raw)
        if length is None:
            raise http.client.HTTPException("bad Content-Length: not 1 to 18 ASCII digits")
    if head_only or status in _NO_BODY:
        # bytes already past the head of a bodiless answer (a server that sent a body anyway) would be
        # read as the next answer on this connection: it is not reused
        return status, will_close or bool(wire.buf), None
    if chunked:
        _read_chunked(wire, sink)
        return status, will_close or bool(wire.buf), None
    if length is None:  # the body runs to the connection's end
        while True:
            if wire.buf:
                sink(bytes(wire.buf))
                wire.buf.clear()
            if not wire._recv():
                return status, True, None
    sink.expect(length)
    _read_length(wire, length, sink)
    return status, will_close or bool(wire.buf), length


def _read_head(wire: Wire, sink: "BodySink", before: int = 0) -> tuple[int, int, dict[str, str], int]:
    """(status, 10 or 11, the framing fields by lower-case name, where the body starts in the
    buffer); `sink.head` hears `before` + the head's bytes read: at its end, and on the way each
    time HEAD_STEP more were read (one call for an ordinary head: a call per line cost 4 us)."""
    if not wire.buf:
        wire._recv()  # what the loop's first `_line` does first (the end of the connection: the loop says so)
    got = _whole_head(wire.buf, sink, before)
    if got is not None:
        return got
    end, at = wire._line(0, status_line=True)
    told = 0
    status, version = _status(bytes(wire.buf[:end]).decode("latin-1"))
    fields: dict[str, str] = {}
    last = None
    for _ in range(MAX_HEADERS + 1):
        end, nxt = wire._line(at)
        if end == at:
            sink.head(before + nxt)
            return status, version, fields, nxt
        if nxt - told > HEAD_STEP:
            sink.head(before + nxt)
            told = nxt
        buf, start, at = wire.buf, at, nxt
        if buf[start] in (32, 9):  # an obsolete folded line continues the last field
            if last is not None:
                fields[last] += " " + bytes(buf[start:end]).decode("latin-1").strip()
            continue
        colon = buf.find(b":", start, min(end, start + 40))  # no framing field's name is longer
        if colon == -1:
            last = None
            continue  # not a field (http.client's parser skips such lines too), or one never read
        last = bytes(buf[start:colon]).decode("latin-1").strip().lower()
        if last not in _FRAMING:  # the others are never read: not copied either
            last = None
            continue
        value = bytes(buf[colon + 1:end]).decode("latin-1").strip()
        fields[last] = value if last not in fields else fields[last] + ", " + value
    raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


def _status(line: str) -> tuple[int, int]:
    """(status, 10 or 11) of a status line; BadStatusLine when it is not one."""
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not (len(parts[1]) == 3 and parts[1].isascii() and parts[1].isdigit()):
        raise http.client.BadStatusLine(line[:60])
    return int(parts[1]), 10 if parts[0] == "HTTP/1.0" else 11


def _whole_head(buf: bytearray, sink: "BodySink", before: int) -> Optional[tuple[int, int, dict[str, str], int]]:
    """`_read_head` of the usual head, already whole in the buffer: under HEAD_STEP bytes, every
    line ended by CRLF, none folded, at most MAX_HEADERS fields. Read from one split, it gives what
    the line-by-line loop gives (the same fields, one `sink.head` call, the same errors); None,
    having done nothing, for any other head (the loop reads it)."""
    end = buf.find(b"\r\n\r\n", 0, HEAD_STEP)
    if end == -1:
        return None
    head = bytes(buf[:end])
    if head.count(b"\n") != head.count(b"\r\n"):  # a bare LF ends a line too: the loop's case
        return None
    lines = head.split(b"\r\n")
    if len(lines) > MAX_HEADERS + 1:
        return None
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line[0] in (32, 9):  # a folded line (never empty here: the first blank line ends the head)
            return None
        colon = line.find(b":", 0, 40)  # no framing field's name is longer
        if colon == -1:
            continue
        name = line[:colon].decode("latin-1").strip().lower()
        if name in _FRAMING:
            value = line[colon + 1:].decode("latin-1").strip()
            fields[name] = value if name not in fields else fields[name] + ", " + value
    status, version = _status(lines[0].decode("latin-1"))
    sink.head(before + end + 4)
    return status, version, fields, end + 4


def _read_length(wire: Wire, length: int, sink: Callable[[bytes], None]) -> None:
    got = 0
    buf = wire.buf
    while True:
        take = min(len(buf), length - got)
        if take == len(buf) and take:
            sink(bytes(buf))
            buf.clear()
        elif take:
            sink(bytes(buf[:take]))
            del buf[:take]
        got += take
        if got >= length:
            return
        if not wire._recv():
            raise _incomplete(got, length - got)


def _content_length(raw: str) -> Optional[int]:
    """A Content-Length field's value: 1 to 18 ASCII digits (not str.isdigit alone: it takes ²), or None."""
    return int(raw) if 0 < len(raw) <= 18 and raw.isascii() and raw.isdigit() else None


def _chunk_size(line: bytes) -> Optional[int]:
    """A chunk-size line's size (an extension after `;` and the blanks before it allowed), or None when
    it is not 1*HEXDIG of at most 16 digits (int(x, 16) would also take 0x, a sign, _ and blanks)."""
    size_text = line.split(b";", 1)[0].rstrip(b" \t")
    return int(size_text, 16) if _HEX.fullmatch(size_text) else None


def _read_chunked(wire: Wire, sink: Callable[[bytes], None]) -> None:
    got = 0
    while True:
        try:
            end, at = wire._line(0)
        except http.client.IncompleteRead:
            raise _incomplete(got) from None
        size = _chunk_size(bytes(wire.buf[:min(end, 64)]))
        if size is None:
            raise http.client.HTTPException("bad chunk size: not 1 to 16 hex digits")
        del wire.buf[:at]
        if size == 0:
            break
        try:
            _read_length(wire, size, sink)
            end, at = wire._line(0)  # the CRLF after the chunk's data
        except http.client.IncompleteRead as exc:
            raise _incomplete(got + len(exc.partial)) from None
        got += size
        del wire.buf[:at]
    while True:  # trailer fields up to the blank line
        try:
            end, at = wire._line(0)
        except http.client.IncompleteRead:
            raise _incomplete(got) from None
        del wire.buf[:at]
        if end == 0:
            return


class _Partial:
    """A received-byte count standing in for IncompleteRead's `partial` (only its length is read)."""

    def __init__(self, n: int):
        self.n = n  # passed where the standard library keeps the partial bytes: only len() is read

    def __len__(self) -> int:
        return self.n


def _incomplete(got: int, expected: Optional[int] = None) -> http.client.IncompleteRead:
    """IncompleteRead for `got` bytes without holding them (its `partial` is only ever measured)."""
    return http.client.IncompleteRead(_Partial(got), expected)  # type: ignore[arg-type]  # a length, not bytes

    def __repr__(self) -> str:
        return f"{self.n} bytes"
