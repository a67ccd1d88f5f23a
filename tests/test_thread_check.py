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
