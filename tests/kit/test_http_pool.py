"""The sources' client keeps its connections (monitor/kit/http.py, issue #38 item 2): one kept
connection per host whatever the number of threads, checked before it is reused (a connection the
server closed, or with bytes waiting that nobody asked for, is closed and replaced, never read), an
idle-connection 408 on a reused connection retried once on a fresh one, a garbage status line a
protocol error. Pure: each connection is a socketpair (no INET socket) whose far end is scripted
by the test; the loopback cases with real servers are in test_connections_live."""
from __future__ import annotations

import socket
import threading

import pytest

import monitor.kit.http as http_mod
from monitor.kit.http import Fetcher, FetchError
from monitor.kit.http_wire import Wire


def ok(text: str, extra: str = "") -> bytes:
    body = text.encode()
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


class Fleet:
    """Every connection the client made, and what each one's far end answers to each request."""

    def __init__(self):
        self.conns: list["PairWire"] = []
        self.lock = threading.Lock()
        self.answer = lambda conn, n: ok(f"conn{conn.index} req{n}")

    def open_peers(self) -> int:
        return sum(1 for c in self.conns if c.sock is not None and c.sock.fileno() != -1)


FLEET: Fleet


class PairWire(Wire):
    """A Wire whose connection is one end of a socketpair; the far end answers on each send."""

    def connect(self) -> None:
        self.sock, self.peer = socket.socketpair()
        self.buf.clear()
        self.attempts = 0
        with FLEET.lock:
            self.index = len(FLEET.conns)
            FLEET.conns.append(self)

    def send(self, data: bytes) -> None:
        if self.sock is None:
            self.connect()
        self.attempts += 1  # counted before the send: an attempt on a dead connection counts too
        super().send(data)
        got = 0
        while got < len(data):  # the far end reads the request (unread, they would fill its buffer)
            got += len(self.peer.recv(len(data) - got))
        answer = FLEET.answer(self, self.attempts - 1)
        if answer:
            self.peer.sendall(answer)


@pytest.fixture(autouse=True)
def fleet(monkeypatch):
    global FLEET
    FLEET = Fleet()
    monkeypatch.setattr(http_mod, "Wire", PairWire)
    yield FLEET
    for c in FLEET.conns:
        c.peer.close()


def test_one_connection_per_host_whatever_the_thread():
    """Eight threads in turn read twenty hosts: twenty connections, each reused (it was one per
    thread and host: 200 targets at scrape_concurrency 32 held 4,617 sockets)."""
    fetcher = Fetcher()
    hosts = [f"http://h{i}:8000/metrics" for i in range(20)]
    for _ in range(8):
        t = threading.Thread(target=lambda: [fetcher.get(u, 5.0) for u in hosts])
        t.start()
        t.join()
    assert len(FLEET.conns) == 20
    assert sorted(c.attempts for c in FLEET.conns) == [8] * 20
    fetcher.close()
    assert FLEET.open_peers() == 0


def test_concurrent_requests_to_one_host_open_no_more_connections_than_run_at_once():
    fetcher = Fetcher()
    gate = threading.Barrier(4)

    def answer(conn, n):
        return ok(f"conn{conn.index} req{n}")
    FLEET.answer = answer

    def work():
        gate.wait()
        for _ in range(25):
            fetcher.get("http://h:8000/metrics", 5.0)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= len(FLEET.conns) <= 4 and sum(c.attempts for c in FLEET.conns) == 100
    fetcher.close()


def test_a_connection_the_server_closed_is_replaced_before_anything_is_sent_on_it():
    fetcher = Fetcher()
    assert fetcher.get("http://h:8000/metrics", 5.0) == "conn0 req0"
    FLEET.conns[0].peer.close()  # the server closed the idle connection (its FIN is waiting)
    assert fetcher.get("http://h:8000/metrics", 5.0) == "conn1 req0"
    assert FLEET.conns[0].attempts == 1, "a request was written to a connection the server had closed"
    assert FLEET.conns[0].sock is None  # closed by the client, not left in CLOSE_WAIT
    fetcher.close()


def test_an_unsolicited_answer_waiting_on_a_kept_connection_is_never_read_as_the_next():
    """A target answers once more after its answer: that extra answer (model poisoned, running 999)
    sits on the kept connection until the next cycle, where it was read as that cycle's answer."""
    fetcher = Fetcher()
    assert fetcher.get("http://h:8000/metrics", 5.0) == "conn0 req0"
    FLEET.conns[0].peer.sendall(ok('vllm:num_requests_running{model_name="poisoned"} 999\n'))
    assert fetcher.get("http://h:8000/metrics", 5.0) == "conn1 req0"
    assert FLEET.conns[0].attempts == 1 and FLEET.conns[0].sock is None
    fetcher.close()


def test_an_idle_connection_408_on_a_reused_connection_is_retried_once_on_a_fresh_one():
    """The server timed the idle connection out just as the request went (its 408 arrives after
    the check): the answer was not for this request, which goes once more on a fresh connection."""
    FLEET.answer = lambda conn, n: (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
                                    if n >= 1 else ok(f"conn{conn.index} req{n}"))
    fetcher = Fetcher()
    assert fetcher.get("http://h:8000/metrics", 5.0) == "conn0 req0"
    assert fetcher.get("http://h:8000/metrics", 5.0) == "conn1 req0"
    assert [c.attempts for c in FLEET.conns] == [2, 1]
    fetcher.close()


def test_a_408_on_a_fresh_connection_or_twice_is_the_answer():
    FLEET.answer = lambda conn, n: b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n" if n >= 1 or \
        conn.index >= 1 else ok("first")
    fetcher = Fetcher()
    assert fetcher.get("http://h:8000/metrics", 5.0) == "first"
    with pytest.raises(FetchError) as err:  # reused: 408, retried fresh: 408 again; no third try
        fetcher.get("http://h:8000/metrics", 5.0)
    assert (err.value.reason, err.value.detail) == ("http", "HTTP 408")
    assert [c.attempts for c in FLEET.conns] == [2, 1]
    fresh = Fetcher()
    with pytest.raises(FetchError) as err:
        fresh.get("http://other:8000/metrics", 5.0)
    assert err.value.detail == "HTTP 408" and FLEET.conns[-1].attempts == 1
    fetcher.close()
    fresh.close()


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", b"HTTP/1.1 2OO OK\r\n\r\n", b"\x16\x03\x01\x00\x02\r\n"])
def test_a_garbage_status_line_is_a_protocol_error_not_connect(answer):
    FLEET.answer = lambda conn, n: answer
    with pytest.raises(FetchError) as err:
        Fetcher().get("http://h:8000/metrics", 5.0)
    assert err.value.reason == "protocol", err.value
    assert "SSH" not in err.value.detail  # the upstream's bytes are not echoed


def test_a_reset_after_part_of_the_answer_is_not_retried():
    """Only a reused connection that gave no byte of an answer is worth a second try: one that broke
    in the middle of the answer is that answer's failure (truncated), not sent again."""
    FLEET.answer = lambda conn, n: ok("x") if n == 0 else b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"

    fetcher = Fetcher()
    fetcher.get("http://h:8000/metrics", 5.0)
    orig = FLEET.answer

    def half(conn, n):
        out = orig(conn, n)
        if n == 1:
            conn.peer.sendall(out)
            conn.peer.shutdown(socket.SHUT_WR)
            return b""
        return out
    FLEET.answer = half
    with pytest.raises(FetchError) as err:
        fetcher.get("http://h:8000/metrics", 5.0)
    assert err.value.reason == "truncated" and len(FLEET.conns) == 1


def test_prune_closes_idle_connections_the_server_closed_and_keeps_the_others():
    fetcher = Fetcher()
    for i in range(5):
        fetcher.get(f"http://h{i}:8000/metrics", 5.0)
    FLEET.conns[1].peer.close()
    FLEET.conns[3].peer.sendall(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
    assert fetcher.prune() == 2
    assert [c.sock is None for c in FLEET.conns] == [False, True, False, True, False]
    assert fetcher.get("http://h0:8000/metrics", 5.0) == "conn0 req1"
    fetcher.close()
    assert FLEET.open_peers() == 0


@pytest.mark.parametrize("answer, words", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     "Content-Length together with Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: s3cret-token\r\n\r\n", "bad Content-Length"),
])
def test_a_framing_error_is_a_protocol_error_that_names_it_without_the_upstream_bytes(answer, words):
    FLEET.answer = lambda conn, n: answer
    with pytest.raises(FetchError) as err:
        Fetcher().get("http://h:8000/metrics", 5.0)
    assert err.value.reason == "protocol" and words in err.value.detail, err.value
    assert "s3cret" not in err.value.detail and "0x5" not in err.value.detail


# ---- a GET begun on a kept connection, its answer taken as it comes (direct mode's scrape loop) ----

URL = "http://h:8000/metrics"


def _take(exchange, max_body=1 << 20):
    """What the scrape loop does with a readable socket until the answer is whole, or not for it."""
    conn = exchange.conn
    while True:
        had = len(conn.buf)
        more = conn.take_ready()
        whole = conn.whole(max_body)
        if whole or whole is None or not more or len(conn.buf) == had:  # the last: nothing more came yet
            return whole, more


def test_begin_sends_only_on_a_kept_connection_and_never_connects():
    fetcher = Fetcher()
    assert fetcher.begin(URL, 5.0) is None and FLEET.conns == []  # nothing kept: the caller connects
    assert fetcher.get(URL, 5.0) == "conn0 req0"
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None and FLEET.conns[0].attempts == 2
    assert fetcher.begin(URL, 5.0) is None  # the one kept connection is busy with that GET
    assert _take(exchange) == (True, True)
    assert fetcher.finish(exchange) == "conn0 req1"
    assert fetcher.get(URL, 5.0) == "conn0 req2" and len(FLEET.conns) == 1  # given back, kept
    fetcher.close()


def test_whole_waits_for_the_last_byte_of_the_body():
    whole = ok("x" * 1000)
    FLEET.answer = lambda conn, n: whole if n == 0 else whole[:-1]
    fetcher = Fetcher()
    fetcher.get(URL, 5.0)
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None
    assert _take(exchange) == (False, True)
    FLEET.conns[0].peer.sendall(whole[-1:])
    assert _take(exchange) == (True, True)
    assert fetcher.finish(exchange) == "x" * 1000
    fetcher.close()


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"


@pytest.mark.parametrize("answer, text", [
    (b"HTTP/1.1 100 Continue\r\n\r\n" + ok("after"), "after"),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end", "to the end"),
    (ok("y" * 2048), None),  # over the caller's cap: the blocking read refuses it
    (b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n", "conn1 req0"),  # the fresh try connects
])
def test_an_answer_framed_otherwise_is_left_to_the_blocking_read(answer, text):
    FLEET.answer = lambda conn, n: answer if n == 1 and conn.index == 0 else ok(f"conn{conn.index} req{n}")
    fetcher = Fetcher(max_body=1024)
    fetcher.get(URL, 5.0)
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None
    assert _take(exchange, fetcher.max_body)[0] is None
    if text is None:
        with pytest.raises(FetchError) as err:
            fetcher.finish(exchange)
        assert err.value.reason == "too_large"
    else:
        if answer.endswith(b"to the end"):  # framed by the connection's end: the server closes it
            FLEET.conns[0].peer.close()
        assert fetcher.finish(exchange) == text
    fetcher.close()


def test_a_kept_connection_that_ends_before_any_byte_is_asked_again_on_a_fresh_one():
    def answer(conn, n):
        if n == 1:
            conn.peer.close()  # the server closed it as the GET went
            return b""
        return ok(f"conn{conn.index} req{n}")
    FLEET.answer = answer
    fetcher = Fetcher()
    fetcher.get(URL, 5.0)
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None
    assert _take(exchange) == (False, False) and exchange.conn.received == 0
    assert fetcher.finish(exchange) == "conn1 req0"
    fetcher.close()


def test_an_answer_that_breaks_part_way_after_begin_is_truncated_not_asked_again():
    def answer(conn, n):
        if n == 1:
            conn.peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            conn.peer.shutdown(socket.SHUT_WR)
            return b""
        return ok("x")
    FLEET.answer = answer
    fetcher = Fetcher()
    fetcher.get(URL, 5.0)
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None
    assert _take(exchange) == (False, False) and exchange.conn.received > 0
    with pytest.raises(FetchError) as err:
        fetcher.finish(exchange)
    assert err.value.reason == "truncated" and len(FLEET.conns) == 1
    fetcher.close()


@pytest.mark.parametrize("pieces, text", [
    ([CHUNKED], "hello"),
    ([CHUNKED[:40], CHUNKED[40:50], CHUNKED[50:]], "hello"),  # size line, data and the last chunk apart
    ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"],
     "abcde"),  # an extension, two chunks, a trailer
])
def test_a_chunked_answer_is_whole_once_its_last_chunk_and_blank_line_came(pieces, text):
    FLEET.answer = lambda conn, n: pieces[0] if n == 1 else ok("x")
    fetcher = Fetcher()
    fetcher.get(URL, 5.0)
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None
    for piece in pieces[1:]:
        assert _take(exchange) == (False, True)
        FLEET.conns[0].peer.sendall(piece)
    assert _take(exchange) == (True, True)
    assert fetcher.finish(exchange) == text
    fetcher.close()


@pytest.mark.parametrize("answer, whole", [
    # what the loop does not walk is left to the blocking read (None): not plain hex, no CRLF after the
    # data, another coding, a head ended by bare LFs
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", None),
    # a bare LF inside a size line: `_read_chunked` ends the line there, so the loop must not walk it
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;a\nfff\r\nabc\r\n0\r\n\r\n", None),
    # the trailers' end by bare LF: whole for `_read_chunked`, so whole here too
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\n", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: v\n\r\n", True),
])
def test_the_loop_and_the_blocking_read_agree_where_an_answer_ends(answer, whole):
    FLEET.answer = lambda conn, n: answer if n == 1 else ok("x")
    fetcher = Fetcher()
    fetcher.get(URL, 5.0)
    exchange = fetcher.begin(URL, 5.0)
    assert exchange is not None
    assert _take(exchange)[0] is whole
    if whole:
        assert fetcher.finish(exchange) == "ok"
    fetcher.close()
