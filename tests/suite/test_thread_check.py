"""The suite's check that no thread outlives its test (conftest.py `no_thread_outlives_its_test`):
it sees a thread started during a test and still running, and not one that was running before or
has ended."""
from __future__ import annotations

import threading

from conftest import _lingering


def test_a_thread_left_running_is_seen_until_it_ends():
    before = set(threading.enumerate())
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="left-behind", daemon=True)
    thread.start()
    try:
        assert [t.name for t in _lingering(before)] == ["left-behind"]
        assert _lingering(set(threading.enumerate())) == []  # running before the test began: not its
    finally:
        release.set()
        thread.join(10)
    assert not thread.is_alive() and _lingering(before) == []


def test_a_connection_thread_of_a_longer_lived_server_is_exempt():
    from socketserver import ThreadingMixIn

    before = set(threading.enumerate())
    release = threading.Event()

    class Server(ThreadingMixIn):  # what ThreadingMixIn.process_request_thread calls, the connection held
        def finish_request(self, request, client_address):
            release.wait()

        def shutdown_request(self, request):
            pass

    thread = threading.Thread(target=Server().process_request_thread, args=(None, None), daemon=True)
    thread.start()
    try:
        assert thread.is_alive() and _lingering(before) == []
    finally:
        release.set()
        thread.join(10)


def test_the_check_waits_for_a_thread_on_its_way_out_as_long_as_it_takes_within_the_deadline():
    """On a loaded machine a server's worker may still be finishing a render when its test ends: the
    check waits for the threads to end (a condition), up to a deadline, not a fixed grace."""
    from conftest import THREAD_DEADLINE_SECONDS, _wait_for_threads

    assert THREAD_DEADLINE_SECONDS >= 60
    before = set(threading.enumerate())
    release, started = threading.Event(), threading.Event()

    def finishing():
        started.set()
        release.wait()
    thread = threading.Thread(target=finishing, name="finishing", daemon=True)
    thread.start()
    started.wait(10)
    # a thread that has not ended by the deadline is named
    assert [t.name for t in _wait_for_threads(before, 0.05)] == ["finishing"]

    def release_when_waited_on():  # ends `finishing` once the check below is waiting on it
        while not any(f.f_code.co_name == "_wait_for_threads" for f in _frames()):
            if release.wait(0.01):
                return
        release.set()
    helper = threading.Thread(target=release_when_waited_on, name="releaser", daemon=True)
    helper.start()
    try:
        assert _wait_for_threads(before, THREAD_DEADLINE_SECONDS) == []
    finally:
        release.set()
        thread.join(10)
        helper.join(10)


def _frames():
    import sys
    for frame in sys._current_frames().values():
        while frame is not None:
            yield frame
            frame = frame.f_back


def test_a_worker_pool_that_existed_before_the_test_may_grow_in_it_a_new_pool_may_not():
    # a module fixture's daemon starts scrape workers on demand (monitor/sources/deadline_pool.py Workers): a
    # CI run under two busy loops saw 'scrape-5' and 'scrape-6' start during a test of that module
    from monitor.sources.deadline_pool import Workers
    older = Workers(4, "fixture-pool")
    older.submit(lambda: None).result(10)  # one worker, started before the test
    before = set(threading.enumerate())
    release = threading.Event()
    busy = [older.submit(release.wait) for _ in range(3)]  # the pool grows during the test
    mine = Workers(2, "test-pool")
    mine.submit(release.wait)
    try:
        assert {t.name.rsplit("-", 1)[0] for t in _lingering(before)} == {"test-pool"}
    finally:
        release.set()
        for f in busy:
            f.result(10)
        older.shutdown(wait=True)
        mine.shutdown(wait=True)
