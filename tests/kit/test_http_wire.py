"""The HTTP/1.1 response reader of the sources' client (monitor/kit/http_wire.py), fed by a scripted
socket: each framing (Content-Length, chunked, to the connection's end), what ends a connection,
and the broken answers, which raise the http.client exceptions the client classifies. Pure: the
real-socket behaviour (deadlines, TLS, budgets, hostile servers) is held by test_deadlines,
test_hostile_sources and test_capped_bodies."""
from __future__ import annotations

import http.client

import pytest

from monitor.kit.http import FetchError, _Held
from monitor.kit.http_wire import MAX_HEADERS, Wire, read_response, request_bytes


class Scripted:
    """A socket whose receives return the given pieces, then the end of the connection."""

    def __init__(self, *pieces: bytes):
        self.pieces = list(pieces)
        self.timeouts: list[float] = []

    def settimeout(self, t: float) -> None:
        self.timeouts.append(t)

    def recv(self, n: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > n:
            self.pieces.insert(0, piece[n:])
        return piece[:n]


def read(*pieces: bytes, cap: int = 1 << 20, method: str = "GET"):
    wire = Wire("example.test", None)
    wire.sock = Scripted(*pieces)
    wire.deadline = float("inf")
    held = _Held(cap, None)
    status, will_close, length = read_response(wire, method == "HEAD", held)
    return status, will_close, held.data(), wire


def test_content_length_body_split_anywhere_reads_whole_and_keeps_the_connection():
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world"
    for cut in range(1, len(answer)):
        status, will_close, body, wire = read(answer[:cut], answer[cut:])
        assert (status, will_close, body) == (200, False, b"hello world"), cut
        assert wire.buf == b""


def test_chunked_body_with_extensions_and_trailers():
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
    assert read(answer)[:3] == (200, False, b"hello world")
    assert read(*[answer[i:i + 3] for i in range(0, len(answer), 3)])[:3] == (200, False, b"hello world")


def test_a_body_without_length_runs_to_the_end_and_closes():
    assert read(b"HTTP/1.0 200 OK\r\n\r\nab", b"cd")[:3] == (200, True, b"abcd")


@pytest.mark.parametrize("head, closes", [
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nextra", True),  # bytes after the answer: not reused
])
def test_what_ends_a_connection(head, closes):
    assert read(head)[1] is closes


def test_continue_is_skipped_and_folded_and_repeated_fields_are_read():
    answer = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nX-A: 1\r\n  2\r\n"
              b"content-length: 3\r\n\r\nnah")
    assert read(answer)[:3] == (404, False, b"nah")


def test_every_interim_answer_is_skipped_and_a_switch_of_protocols_refused():
    # 103 Early Hints, then the answer: the answer is read, nothing of it is left for the next request
    status, will_close, body, wire = read(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                                          b"HTTP/1.1 102 Processing\r\n\r\n"
                                          b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    assert (status, will_close, body, wire.buf) == (200, False, b"hello", b"")
    with pytest.raises(http.client.HTTPException, match="101"):
        read(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")


def test_a_head_answer_and_204_have_no_body():
    assert read(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", method="HEAD")[:3] == (200, False, b"")
    assert read(b"HTTP/1.1 204 No Content\r\n\r\n")[:3] == (204, False, b"")
    # a body sent anyway would be read as the next answer: the connection is not reused
    assert read(b"HTTP/1.1 204 No Content\r\n\r\nstray")[:3] == (204, True, b"")


def test_a_body_in_one_byte_chunks_is_held_in_about_its_own_size():
    """The memory held is what the cap and the budget count, not ~50 bytes of objects per chunk (a
    target sending `1\\r\\nX\\r\\n` for ever would hold 50x what its budget sees)."""
    import tracemalloc

    # 1.03 bytes held per byte of body here; ~50 per chunk would be 1 MB, far past the bound below
    # (under tracemalloc 100 000 chunks took 20 s on loaded cores, 20 000 take 4)
    n = 20_000
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\nX\r\n" * n + b"0\r\n\r\n"
    wire = Wire("example.test", None)
    wire.sock = Scripted(answer)
    wire.deadline = float("inf")
    held = _Held(1 << 20, None)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        read_response(wire, False, held)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held.held == n and held.data() == b"X" * n
    assert grown < 3 * n, f"{grown} bytes held for a {n}-byte body"


@pytest.mark.parametrize("pieces, error", [
    ((), http.client.RemoteDisconnected),  # nothing at all: a kept-alive connection the server closed
    ((b"SSH-2.0-OpenSSH\r\n\r\n",), http.client.BadStatusLine),
    ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",), http.client.IncompleteRead),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",), http.client.IncompleteRead),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",), http.client.IncompleteRead),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",), http.client.HTTPException),
    ((b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",), http.client.HTTPException),
    ((b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * (MAX_HEADERS + 1) + b"\r\n",), http.client.HTTPException),
    ((b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000,), http.client.LineTooLong),
])
def test_broken_answers_raise_what_the_client_classifies(pieces, error):
    with pytest.raises(error):
        read(*pieces)


def test_a_truncated_body_says_how_much_came():
    with pytest.raises(http.client.IncompleteRead) as err:
        read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nab")
    assert len(err.value.partial) == 7


def test_the_cap_refuses_a_content_length_before_reading_and_a_long_body_as_it_comes():
    with pytest.raises(FetchError) as err:
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", cap=10)
    assert err.value.reason == "too_large" and "Content-Length" in err.value.detail
    with pytest.raises(FetchError) as err:
        read(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 11, cap=10)
    assert (err.value.reason, err.value.detail) == ("too_large", "body over 10 bytes")


def test_the_request_bytes_and_what_they_refuse():
    got = request_bytes("GET", "/metrics?a=1", "h:8000", {"Accept": "text/plain"}, None)
    assert got == b"GET /metrics?a=1 HTTP/1.1\r\nHost: h:8000\r\nAccept: text/plain\r\n\r\n"
    got = request_bytes("POST", "/q", "h", {}, b"x=1")
    assert got == b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nx=1"
    with pytest.raises(http.client.InvalidURL):
        request_bytes("GET", "/a b", "h", {}, None)
    with pytest.raises(ValueError) as err:
        request_bytes("GET", "/", "h", {"Authorization": "Bearer s3cret\r\nX: y"}, None)
    assert "s3cret" not in str(err.value) and "Authorization" in str(err.value)
    assert Wire("::1", 8443, object()).host_header == "[::1]:8443"
    assert Wire("h", 80).host_header == "h" and Wire("h", 443, object()).host_header == "h"
    assert Wire("h", 8080).host_header == "h:8080" and Wire("h", 80, object()).host_header == "h:80"


def test_a_header_trickled_a_byte_at_a_time_reads_the_same():
    answer = b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 5000 + b"\r\nContent-Length: 2\r\n\r\nok"
    assert read(*[answer[i:i + 1] for i in range(len(answer))])[:3] == (200, False, b"ok")


# ---- strictness (issue #38 items 5-6) ------------------------------------------------------------

@pytest.mark.parametrize("size", [b"0x10", b"+a_bc", b"a_bc", b" a", b"-1", b"1" * 17])
def test_a_chunk_size_that_is_not_plain_hex_digits_is_refused(size):
    """RFC 9112 7.1: chunk-size = 1*HEXDIG. int(x, 16) also takes `0x`, a sign, underscores and
    blanks: a server (or a proxy in between) reading them differently is a request-smuggling seam."""
    with pytest.raises(http.client.HTTPException, match="chunk size"):
        read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n")


def test_a_chunk_size_with_an_extension_and_blanks_before_it_is_read():
    assert read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA \t;ext=1\r\n0123456789\r\n0\r\n\r\n")[:3] \
        == (200, False, b"0123456789")


def test_content_length_with_chunked_is_refused():
    """RFC 9112 6.3: a message with both may be an attempt at smuggling; the client may treat it as
    an error, or prefer chunked. headroom refuses it (a protocol error naming both headers)."""
    with pytest.raises(http.client.HTTPException, match="Content-Length.*Transfer-Encoding"):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")


@pytest.mark.parametrize("value", ["\u00b2".encode("latin-1"), b"1" * 30, b"5, 6", b"+5"])
def test_a_content_length_that_is_not_plain_ascii_digits_is_refused(value):
    with pytest.raises(http.client.HTTPException, match="Content-Length"):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\nhello")


def test_the_head_is_held_within_the_budget_together_with_the_body():
    """A response head counts in the memory budget with its body: 900 KB of headers and a 900 KB body
    are 1.8 MB held, past the free MiB, refused by an empty budget (the headers alone used to be
    outside it: 32 targets with big duplicated headers held 856 MB)."""
    from monitor.kit.http import BodyBudget
    answer = b"HTTP/1.1 200 OK\r\n" + (b"X-Dup: " + b"a" * 9000 + b"\r\n") * 99 \
        + b"Content-Length: 900000\r\n\r\n" + b"b" * 900_000
    for budget, ok in ((BodyBudget(0), False), (BodyBudget(2 << 20), True)):
        wire = Wire("example.test", None)
        wire.sock = Scripted(answer)
        wire.deadline = float("inf")
        held = _Held(1 << 30, budget)
        try:
            if ok:
                assert read_response(wire, False, held)[0] == 200 and len(held.data()) == 900_000
                assert budget.peak >= 99 * 9000 + 900_000 - (1 << 20)
            else:
                with pytest.raises(FetchError) as err:
                    read_response(wire, False, held)
                assert err.value.reason == "too_large"
        finally:
            held.release()
        assert budget.used == 0


def test_a_head_over_its_cap_is_refused_whatever_the_budget():
    """A head is at most MAX_HEAD_BYTES (every interim answer's head included): duplicated header
    lines or an endless run of 103 Early Hints cannot hold more."""
    from monitor.kit.http_wire import MAX_HEAD_BYTES
    big = b"HTTP/1.1 200 OK\r\n" + (b"X-Dup: " + b"a" * 60_000 + b"\r\n") * 99 + b"Content-Length: 0\r\n\r\n"
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </" + b"a" * 50_000 + b">\r\n\r\n"
    for answer in (big, hints * (MAX_HEAD_BYTES // len(hints) + 2)):
        with pytest.raises(FetchError) as err:
            read(answer)
        assert err.value.reason == "too_large" and "head" in err.value.detail


def test_only_the_framing_fields_of_a_head_are_kept():
    """99 duplicated 9 KB header lines were joined into one ~900 KB string beside the buffer holding
    them: only Connection, Content-Length and Transfer-Encoding are read, so nothing else is copied."""
    import tracemalloc
    answer = b"HTTP/1.1 200 OK\r\n" + (b"X-Dup: " + b"a" * 9000 + b"\r\n") * 99 + b"Content-Length: 2\r\n\r\nok"
    wire = Wire("example.test", None)
    wire.sock = Scripted(answer)
    wire.deadline = float("inf")
    tracemalloc.start()
    try:
        read_response(wire, False, _Held(1 << 20, None))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * len(answer), f"{peak} bytes at the peak for a {len(answer)}-byte answer"


# ---- a whole head read from one split (http_wire._whole_head) --------------------------------------

class Told:
    """A sink that records what it hears of the head."""

    def __init__(self):
        self.heads: list[int] = []

    def head(self, size: int) -> None:
        self.heads.append(size)


def _head_outcome(answer: bytes, whole: bool, monkeypatch):
    from monitor.kit import http_wire
    with monkeypatch.context() as m:
        if not whole:
            m.setattr(http_wire, "_whole_head", lambda *a: None)
        wire = Wire("example.test", None)
        wire.sock = Scripted(answer)
        wire.deadline = float("inf")
        wire._recv()  # the head (or its first part) in the buffer, as a receive leaves it
        told = Told()
        try:
            got = http_wire._read_head(wire, told, 7)
        except (http.client.HTTPException, ValueError) as exc:
            got = (type(exc).__name__, str(exc))
        return got, told.heads


HEADS = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\nCONTENT-LENGTH: 2\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n  Content-Length : 3 \r\nConnection:close\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\n\x1cContent-Length\x1c: 3\xa0\r\n\r\nabc",  # blanks str.strip knows, bytes' not
    b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 1\r\n\r\nx",  # folded: the loop reads it
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\tclose\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",  # bare LF line ends
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\n\r\nx",
    b"HTTP/1.1 200 OK\r\nA: b\r\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 1\r\n\r\nx",
    b"HTTP/1.1 200 OK\r\n" + b"X" * 45 + b": y\r\nContent-Length: 1\r\n\r\nx",  # colon past 40: not a field
    b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * MAX_HEADERS + b"\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * (MAX_HEADERS + 1) + b"\r\n",
    b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 20000 + b"\r\nContent-Length: 1\r\n\r\nx",  # over HEAD_STEP
    b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 16330 + b"\r\n\r\n",  # about HEAD_STEP
    b"\r\n\r\n",
    b"\r\nHTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 200\r\nContent-Length: \xff\xfe\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
]


@pytest.mark.parametrize("answer", HEADS + [h + b"\r\n\r\nmore" for h in HEADS[:3]])
def test_a_whole_head_reads_as_the_line_by_line_loop_reads_it(answer, monkeypatch):
    """Fields, status, version, where the body starts, what the sink hears and the errors are the
    loop's, whichever way the head goes; the usual heads take the one-split way."""
    assert _head_outcome(answer, True, monkeypatch) == _head_outcome(answer, False, monkeypatch)


def test_the_usual_head_is_read_from_one_split():
    from monitor.kit import http_wire
    buf = bytearray(HEADS[0])
    told = Told()
    assert http_wire._whole_head(buf, told, 0) == (200, 11, {"content-length": "5"}, len(HEADS[0]) - 5)
    assert told.heads == [len(HEADS[0]) - 5] and buf == bytearray(HEADS[0])  # the buffer left as it was
    assert http_wire._whole_head(bytearray(HEADS[7]), told, 0) is None  # folded: the loop's
