"""Jobs on a cadence that no wall-clock step can freeze (the daemon's one scheduler, monitor/app).

    ticker = Ticker()
    ticker.every("cycle", 15.0, pipeline.run_cycle)                 # monotonic: every 15 s, first at once
    ticker.on_wall_clock("digest", next_fire, weekly, grace=6 * 3600)  # cron-like, on the wall clock
    ticker.start() ... ticker.shutdown()

Why not APScheduler 3.x: it computes each wake-up from `datetime.now()` and sleeps that long, so a
wall clock stepped back an hour (an NTP step, a VM resumed) stopped every cycle for that hour while
the probes said ready.

- `every` jobs wait on `time.monotonic()`: a wall-clock step either way changes nothing about when
  they run. Each job runs in its own daemon thread, so a slow job never delays another and never
  overlaps itself. A run longer than the interval makes the runs it covered be skipped
  (coalesced): counted in `Job.skipped`, logged once per overrun streak in headroom's words.
- `on_wall_clock` jobs (the weekly digest) fire when the wall clock reaches `next_fire(after)` (Unix
  seconds), but sleep at most `WALL_POLL` seconds at a time, so after a step either way they fire
  when the wall clock reaches their time, never an hour or a day late. A fire time passed by more
  than `grace` seconds is skipped (logged), as a cron missed while the process was down would be.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional


def steady_clock() -> float:
    """Seconds on a clock that never steps and, unlike time.monotonic, counts a suspend (Linux
    CLOCK_BOOTTIME), so a resumed machine's wall-clock jump is not taken for a step."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


log = logging.getLogger(__name__)

WALL_POLL = 30.0  # seconds a wall-clock job sleeps at most before it looks at the wall clock again


@dataclass
class Job:
    name: str
    fn: Callable[[], object]
    interval: Optional[float] = None  # every: seconds (monotonic)
    next_fire: Optional[Callable[[float], Optional[float]]] = None  # wall clock: after -> next Unix time
    grace: float = 0.0
    first_delay: float = 0.0
    runs: int = 0
    skipped: int = 0  # runs coalesced away by an overrun (every) or missed past the grace (wall clock)
    failures: int = 0
    next_wall: Optional[float] = None  # wall-clock jobs: the next fire time (Unix seconds)
    _overrunning: bool = field(default=False, repr=False)
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)

    def run_now(self) -> None:
        """Run at the next opportunity (tests, an operator's nudge): the wait ends at once."""
        if self.next_fire is not None:
            self.next_wall = float("-inf")
        self._wake.set()


class Ticker:
    def __init__(self, wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, wall_poll: float = WALL_POLL) -> None:
        self.jobs: dict[str, Job] = {}
        self.wall_poll = wall_poll
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.running = False

    def every(self, name: str, seconds: float, fn: Callable[[], object], first_delay: float = 0.0) -> Job:
        if not seconds > 0:
            raise ValueError(f"job {name}: interval must be positive seconds, got {seconds!r}")
        return self._add(Job(name, fn, interval=float(seconds), first_delay=first_delay))

    def on_wall_clock(self, name: str, next_fire: Callable[[float], Optional[float]], fn: Callable[[], object],
                      grace: float = 0.0) -> Job:
        return self._add(Job(name, fn, next_fire=next_fire, grace=grace))

    def get_job(self, name: str) -> Optional[Job]:
        return self.jobs.get(name)

    def _add(self, job: Job) -> Job:
        if job.name in self.jobs:
            raise ValueError(f"job {job.name} is scheduled already")
        self.jobs[job.name] = job
        if self.running:
            self._spawn(job)
        elif job.next_fire is not None:
            job.next_wall = job.next_fire(self.wall_clock())
        return job

    def start(self) -> None:
        self.running = True
        for job in self.jobs.values():
            self._spawn(job)

    def _spawn(self, job: Job) -> None:
        if job.interval is not None:
            t = threading.Thread(target=self._every_loop, args=(job, job.interval), name=f"job-{job.name}",
                                 daemon=True)
        elif job.next_fire is not None:
            t = threading.Thread(target=self._wall_loop, args=(job, job.next_fire), name=f"job-{job.name}",
                                 daemon=True)
        else:
            raise ValueError(f"job {job.name}: neither an interval nor a wall-clock schedule")
        self._threads.append(t)
        t.start()

    def shutdown(self, wait: float = 0.0) -> None:
        """No run starts after this; `wait` seconds for runs in progress to end."""
        self.running = False
        self._stop.set()
        for job in self.jobs.values():
            job._wake.set()
        end = self.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, end - self.monotonic()) if wait > 0 else 0.0)

    def _sleep(self, job: Job, seconds: float) -> bool:
        """Sleep up to `seconds` (woken early by run_now or shutdown); True when stopping."""
        if seconds > 0:
            job._wake.wait(seconds)
        job._wake.clear()
        return self._stop.is_set()

    def _run(self, job: Job) -> None:
        try:
            job.fn()
        except Exception:  # a job's failure is its own; the cadence goes on
            job.failures += 1
            log.exception("job %s failed", job.name)
        job.runs += 1

    def _every_loop(self, job: Job, interval: float) -> None:
        due = self.monotonic() + job.first_delay
        while not self._stop.is_set():
            if self._sleep(job, due - self.monotonic()):
                return
            self._run(job)
            due += interval
            now = self.monotonic()
            if due > now:
                if job._overrunning:
                    log.info("job %s is back on its %g s cadence", job.name, job.interval)
                job._overrunning = False
                continue
            missed = int((now - due) // interval) + 1
            due += missed * interval
            job.skipped += missed
            if not job._overrunning:
                log.warning("job %s overran its %g s interval: %d run(s) skipped; logged once until it is back"
                            " on cadence", job.name, job.interval, missed)
            job._overrunning = True

    def _wall_loop(self, job: Job, next_fire: Callable[[float], Optional[float]]) -> None:
        if job.next_wall is None:
            job.next_wall = next_fire(self.wall_clock())
        while not self._stop.is_set():
            now = self.wall_clock()
            due = job.next_wall
            if due is None:  # nothing left to fire
                if self._sleep(job, self.wall_poll):
                    return
                continue
            if now < due:
                if self._sleep(job, min(self.wall_poll, due - now)):
                    return
                continue
            if due == float("-inf") or now - due <= job.grace:
                self._run(job)
            else:
                job.skipped += 1
                log.warning("job %s missed its time by %.0f s (more than its %g s grace): skipped until the next",
                            job.name, now - due, job.grace)
            job.next_wall = next_fire(max(now, self.wall_clock()))
