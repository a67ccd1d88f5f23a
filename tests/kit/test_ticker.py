"""The daemon's scheduler keeps its cadence whatever the wall clock does (monitor/kit/ticker.py).

Under APScheduler 3.x a wall clock stepped back an hour stopped every cycle for that hour. Here the
wall clock is driven by the test (`wall`), the cadence runs on the real monotonic clock, and every
wait is on a condition with a deadline."""
import logging
import threading

import pytest
from servers import wait_for

from monitor.kit.ticker import Ticker


class Wall:
    """A wall clock the test steps."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t
        self.reads = 0  # how often the ticker looked at it
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            self.reads += 1
            return self.t

    def step(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def test_interval_jobs_keep_running_while_the_wall_clock_steps_back_and_forward():
    wall = Wall()
    runs = []
    ticker = Ticker(wall_clock=wall)
    ticker.every("cycle", 0.02, lambda: runs.append(wall()))
    ticker.start()
    try:
        wait_for(lambda: len(runs), lambda n: n >= 3, timeout=30, what="three runs")
        wall.step(-3600)
        n = len(runs)
        wait_for(lambda: len(runs), lambda m: m >= n + 3, timeout=30, what="three runs after a step back")
        wall.step(86400)
        n = len(runs)
        wait_for(lambda: len(runs), lambda m: m >= n + 3, timeout=30, what="three runs after a step forward")
    finally:
        ticker.shutdown(wait=5)
    job = ticker.get_job("cycle")
    assert job.runs == len(runs) and job.failures == 0


def test_an_overrunning_job_never_overlaps_itself_and_is_logged_once(caplog):
    active, overlaps, runs = [0], [0], []
    lock = threading.Lock()
    release = threading.Event()

    def slow():
        with lock:
            active[0] += 1
            overlaps[0] = max(overlaps[0], active[0])
        if len(runs) < 2:
            release.wait(0.2)  # the first two runs take ten intervals each
        with lock:
            active[0] -= 1
        runs.append(1)

    ticker = Ticker()
    with caplog.at_level(logging.WARNING, logger="monitor.kit.ticker"):
        ticker.every("cycle", 0.02, slow)
        ticker.start()
        try:
            wait_for(lambda: len(runs), lambda n: n >= 6, timeout=30, what="six runs")
        finally:
            ticker.shutdown(wait=5)
    job = ticker.get_job("cycle")
    assert overlaps[0] == 1  # never two at once
    assert job.skipped >= 2  # the intervals the slow runs covered were coalesced away
    warnings = [r.getMessage() for r in caplog.records if "overran" in r.getMessage()]
    # the two slow runs in a row are one overrun streak: one line for them (a loaded machine may add
    # later streaks of its own); never one line per skipped run
    assert 1 <= len(warnings) <= job.skipped, warnings
    assert "job cycle overran its 0.02 s interval" in warnings[0]


def test_a_failing_job_keeps_its_cadence():
    calls = []

    def boom():
        calls.append(1)
        raise RuntimeError("source exploded")

    ticker = Ticker()
    ticker.every("cycle", 0.02, boom)
    ticker.start()
    try:
        wait_for(lambda: len(calls), lambda n: n >= 3, timeout=30, what="three failing runs")
    finally:
        ticker.shutdown(wait=5)
    assert ticker.get_job("cycle").failures >= 3


def test_wall_clock_job_fires_when_the_wall_clock_reaches_its_time_after_a_step_either_way():
    wall = Wall()
    fired = []
    ticker = Ticker(wall_clock=wall, wall_poll=0.02)
    start = wall()
    # fires every 1,000 wall seconds (a stand-in for the weekly cron)
    job = ticker.on_wall_clock("digest", lambda after: (after // 1000 + 1) * 1000, lambda: fired.append(wall()),
                               grace=600)
    first = job.next_wall
    assert first == (start // 1000 + 1) * 1000 and first > start
    ticker.start()
    try:
        wall.step(-3600)  # stepped back: nothing fires, the time stays where it was
        looked = wall.reads
        wait_for(lambda: wall.reads, lambda n: n >= looked + 5, timeout=30, what="five looks at the stepped clock")
        assert fired == [] and job.next_wall == first
        wall.step(3600 + (first - start) + 1)  # the wall clock reaches the time: it fires within a poll
        wait_for(lambda: len(fired), lambda n: n == 1, timeout=30, what="the job at its time")
        wait_for(lambda: job.next_wall, lambda v: v == first + 1000, timeout=30, what="the next time set")
        wall.step(5 * 1000 + 900)  # jumped well past the next time, beyond the grace: skipped, not run
        wait_for(lambda: job.skipped, lambda n: n == 1, timeout=30, what="a missed time skipped")
        wait_for(lambda: job.next_wall, lambda v: v > wall(), timeout=30, what="the next time after the jump")
        assert len(fired) == 1
    finally:
        ticker.shutdown(wait=5)


def test_run_now_and_shutdown():
    fired = threading.Event()
    ticker = Ticker()
    job = ticker.every("refit", 3600, fired.set, first_delay=3600)
    ticker.start()
    try:
        assert not fired.is_set()
        job.run_now()
        assert fired.wait(30)
    finally:
        ticker.shutdown(wait=5)
    assert not any(t.is_alive() for t in ticker._threads)
    with pytest.raises(ValueError, match="interval must be positive"):
        Ticker().every("x", 0, lambda: None)
    with pytest.raises(ValueError, match="scheduled already"):
        t = Ticker()
        t.every("x", 1, lambda: None)
        t.every("x", 1, lambda: None)
