"""Worker threads and a deadline for a batch of keyed jobs (the sources' pools: direct mode's scrape,
the auxiliary sources, the cycle's Prometheus and SLO-window reads).

A batch is waited for only until its deadline: what is still running then is abandoned (reported
`Late`) and finishes on its own in its worker. The workers are daemon threads, so a job stuck in a
source never holds the process at exit.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Hashable, Optional, Sequence


class Workers(Executor):
    """Up to `size` daemon worker threads, started as work arrives and kept across cycles (the
    keep-alive connections are the fetcher's, shared by the threads: at most one per target)."""

    def __init__(self, size: int, name: str):
        self.size = max(1, size)
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0
        self._shut = False

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        if self._shut:
            raise RuntimeError("workers are shut down")
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                if self._threads < self.size:
                    self._threads += 1
                    threading.Thread(target=self._work, name=f"{self.name}-{self._threads}", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 (handed to whoever waits on the future)
                    future.set_exception(exc)
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Stop taking work and cancel what has not started; running work is never waited for."""
        self._shut = True
        while cancel_futures:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in range(self._threads):
            self._queue.put(None)


@dataclass
class Late:
    """A job without a result at the deadline: still running, never started, or busy from before."""

    state: str  # "running" | "not_started" | "busy" | "closed"

    def detail(self, deadline_seconds: float) -> str:
        return {"running": f"no answer within the cycle deadline ({deadline_seconds:.1f}s)",
                "not_started": f"not started within the cycle deadline ({deadline_seconds:.1f}s): scrape_concurrency requests in flight",
                "busy": "the previous request to it is still running",
                "closed": "shutting down"}[self.state]


class DeadlinePool:
    """Runs keyed jobs on `Workers` and waits for a batch of them only until a deadline.

    A key whose previous job is still running is not started again (reported Late("busy")), so a
    source that hangs costs one worker, not one per cycle. `close()` wakes every waiting batch.
    """

    def __init__(self, size: int, name: str):
        self.workers = Workers(size, name)
        self._running: dict[Hashable, Future] = {}
        self._lock = threading.RLock()  # a done-callback may run at once, in the thread that holds it
        self._waiting: set[threading.Event] = set()
        self.closed = False

    def start(self, jobs: list[tuple[Hashable, Callable[..., Any]]]) -> list[tuple[Hashable, Future | Late]]:
        out: list[tuple[Hashable, Future | Late]] = []
        with self._lock:
            for key, fn in jobs:
                late = self.late(key)
                if late is not None:
                    out.append((key, late))
                    continue
                future = self.workers.submit(fn)
                self._running[key] = future
                future.add_done_callback(partial(self._finished, key))
                out.append((key, future))
        return out

    def _finished(self, key: Hashable, future: Future) -> None:
        with self._lock:
            if self._running.get(key) is future:
                del self._running[key]

    def wait(self, started: Sequence[tuple[Hashable, Future | Late]], deadline: Optional[float],
             cancel: bool = True) -> list[Any]:
        """Results in order; a job not finished by `deadline` (monotonic; None: no limit) gives a `Late`:
        one not started yet is cancelled (`cancel`; otherwise it runs when a worker is free and counts
        as running).

        A job that raised gives its exception (the jobs here catch their own errors)."""
        futures = [f for _, f in started if isinstance(f, Future)]
        done = threading.Event()
        count = [len(futures)]
        count_lock = threading.Lock()

        def one_done(_):
            with count_lock:
                count[0] -= 1
                if count[0] <= 0:
                    done.set()
        if not futures:
            done.set()
        for f in futures:
            f.add_done_callback(one_done)
        with self._lock:
            self._waiting.add(done)
            if self.closed:
                done.set()
        try:
            done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._waiting.discard(done)
        out: list[Any] = []
        for _, job in started:
            if isinstance(job, Late):
                out.append(job)
            elif job.done() and not job.cancelled():
                exc = job.exception()
                out.append(exc if exc is not None else job.result())
            else:
                out.append(Late("not_started" if cancel and job.cancel() else "running"))
        return out

    def late(self, key: Hashable) -> Optional[Late]:
        """Late("busy") while `key`'s last job runs, Late("closed") once closed; None otherwise."""
        with self._lock:
            if self.closed:
                return Late("closed")
            prev = self._running.get(key)
            return Late("busy") if prev is not None and not prev.done() else None

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for event in self._waiting:
                event.set()
        self.workers.shutdown(cancel_futures=True)
