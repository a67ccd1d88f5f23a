"""Direct mode: scrape every replica's /metrics, with a deadline per request and per cycle.

Each request ends within `scrape_timeout` (see `http.Fetcher`). A batch of requests (one cycle's)
is waited for only until the cycle deadline: what is still running then is abandoned, reported
`deadline`, and finishes on its own in its worker when its own deadline fires. The workers are
daemon threads, so a request stuck in a source never holds the process at exit.
"""
from __future__ import annotations

import queue
import random
import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Hashable, Optional

from monitor.kit.exposition import ExpositionError
from monitor.kit.http import Fetcher, FetchError, redact

from ..model import ReplicaReading, SourceStatus
from . import sglang, vllm
from .settings import Target

# a sample whose own timestamp is older than this (Prometheus's default lookback) is stale
STALE_SAMPLE_SECONDS = 300.0


@dataclass
class ScrapeResult:
    target: Target
    readings: list[ReplicaReading]
    status: SourceStatus
    anomalies: Optional[dict[str, int]] = None
    engine: Any = None  # the reader module the body was read with (vllm or sglang), None when down


def engine_of(text: str, kind: str = "auto"):
    """The reader module for a body: the target's `kind`, or for `auto` the engine whose metric
    contract families dominate the body (substring checks: no parse). A body with one engine's
    names only (the usual case) costs a search or two; one with both counts each engine's contract
    families (one search per contract name: bounded), so a stray `vllm:` series in an SGLang body
    does not make it vLLM's, nor the reverse; a tie is vLLM."""
    if kind == "sglang":
        return sglang
    if kind == "vllm":
        return vllm
    if not _mentions(text, "sglang"):
        return vllm
    if not _mentions(text, "vllm"):
        return sglang
    return sglang if vllm.families_present(sglang.CONTRACT, text) > vllm.families_present(vllm.CONTRACT, text) \
        else vllm


SGLANG_MARKS = ("sglang:", "sglang_")  # what `_mentions(text, "sglang")` looks for, as parse notices


def read_body(text: str, kind: str = "auto", last: Any = None) -> tuple[Any, Any]:
    """(reader module, parsed scrape) for a body, the module as `engine_of` chooses it. A target
    whose last body was not SGLang's is first parsed as vLLM with SGLang's line starts noticed by
    the same regex pass: none (the usual case) is `engine_of`'s vLLM answer without searching the
    body again; otherwise (or when that parse fails) `engine_of` decides, as for SGLang targets."""
    scrape = None
    if kind == "auto" and last is not sglang:
        try:
            scrape = vllm.parse_vllm(text, notice=SGLANG_MARKS)
        except ExpositionError:
            scrape = None
        if scrape is not None and not scrape.noticed:
            return vllm, scrape
    engine = engine_of(text, kind)
    if engine is vllm:
        return vllm, scrape if scrape is not None else vllm.parse_vllm(text)
    return sglang, sglang.parse_sglang(text)


def _mentions(text: str, prefix: str) -> bool:
    """Whether a sample line starts with `prefix:` or `prefix_` (one search when the word is absent)."""
    return prefix in text and (f"\n{prefix}:" in text or f"\n{prefix}_" in text or text.startswith((prefix + ":", prefix + "_")))


def scrape_one(fetcher: Fetcher, target: Target, timeout: float, clock=time.time, last_engine: Any = None
               ) -> ScrapeResult:
    """One target read: its readings, or down with a reason. `last_engine`: the module its last
    body was read with (`read_body`)."""
    start = time.monotonic()
    name = redact(target.url)
    try:
        text = fetcher.get(target.url, timeout)
        engine, scrape = read_body(text, getattr(target, "kind", "auto"), last_engine)  # config.EngineTarget
        now = clock()
        if scrape.oldest_timestamp is not None and now - scrape.oldest_timestamp > STALE_SAMPLE_SECONDS:
            scrape.anomaly("stale_sample")  # used, but the target says it is old: counted, never silent
        readings = engine.readings_from_scrape(scrape, name, now, target.labels)
        if not readings:
            raise FetchError("no_engine_metrics", "no vllm: or sglang: running-requests or KV usage series in the body")
        return ScrapeResult(target, readings, SourceStatus("vllm", name, True, duration_seconds=time.monotonic() - start,
                                                           missing=engine.missing_families(scrape)),
                            scrape.anomalies or None, engine)
    except FetchError as exc:
        return ScrapeResult(target, [], SourceStatus("vllm", name, False, exc.reason, exc.detail,
                                                     time.monotonic() - start))
    except ExpositionError as exc:
        return ScrapeResult(target, [], SourceStatus("vllm", name, False, exc.reason, str(exc),
                                                     time.monotonic() - start))


# ---- workers and deadlines ----------------------------------------------------------------------

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
                "not_started": f"not started within the cycle deadline ({deadline_seconds:.1f}s): workers busy",
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
                prev = self._running.get(key)
                if self.closed or (prev is not None and not prev.done()):
                    out.append((key, Late("closed" if self.closed else "busy")))
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

    def wait(self, started: list[tuple[Hashable, Future | Late]], deadline: Optional[float]) -> list[Any]:
        """Results in order; a job not finished by `deadline` (monotonic; None: no limit) gives a `Late`.

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
                out.append(Late("not_started" if job.cancel() else "running"))
        return out

    def run(self, jobs: list[tuple[Hashable, Callable[..., Any]]], deadline: Optional[float]) -> list[Any]:
        return self.wait(self.start(jobs), deadline)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for event in self._waiting:
                event.set()
        self.workers.shutdown(cancel_futures=True)


# ---- the vLLM scraper ---------------------------------------------------------------------------

class Scraper:
    """Holds the connections and worker pool across cycles.

    A target that fails is retried on later cycles with exponential backoff and full jitter
    (capped at `max_backoff` seconds); while it waits it stays reported down with its last error,
    and recovery is automatic on the first answer.
    """

    def __init__(self, fetcher: Fetcher, timeout: float, concurrency: int, base_backoff: float = 1.0,
                 max_backoff: float = 60.0, rng: Callable[[], float] = random.random):
        self.fetcher = fetcher
        self.timeout = timeout
        self.pool = DeadlinePool(concurrency, "scrape")
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.rng = rng
        self.failing: dict[str, tuple[int, float, SourceStatus]] = {}  # url -> (failures, retry at, last)
        self.engines: dict[str, Any] = {}  # url -> the reader its last answer was read with

    def _one(self, target: Target, clock) -> ScrapeResult:
        state = self.failing.get(target.url)
        now = time.monotonic()
        if state is not None and now < state[1]:
            last = state[2]
            return ScrapeResult(target, [], SourceStatus(
                "vllm", last.target, False, last.error, f"{last.detail}; retry in {state[1] - now:.1f}s",
                0.0, attempted=False))
        result = scrape_one(self.fetcher, target, self.timeout, clock, self.engines.get(target.url))
        if result.status.up:
            self.failing.pop(target.url, None)
            if self.engines.get(target.url) is not result.engine:
                if len(self.engines) >= 100_000:
                    self.engines.clear()
                self.engines[target.url] = result.engine
        else:
            failures = (state[0] if state else 0) + 1
            delay = self.rng() * min(self.max_backoff, self.base_backoff * 2 ** (failures - 1))
            self.failing[target.url] = (failures, time.monotonic() + delay, result.status)
        return result

    def start(self, targets: list[Target], clock=time.time) -> list:
        """Start one cycle's scrapes; `finish` collects them. The kept connections the targets closed
        since the last cycle are closed first (`Fetcher.prune`: one poll over them)."""
        self.fetcher.prune()
        return self.pool.start([(t.url, lambda t=t: self._one(t, clock)) for t in targets])

    def finish(self, targets: list[Target], started: list, deadline: Optional[float],
               began: Optional[float] = None) -> list[ScrapeResult]:
        """Results in target order; a target without an answer by `deadline` is down with reason `deadline`."""
        began = time.monotonic() if began is None else began
        out = []
        for target, result in zip(targets, self.pool.wait(started, deadline)):
            if isinstance(result, Late):
                waited = time.monotonic() - began
                result = ScrapeResult(target, [], SourceStatus(
                    "vllm", redact(target.url), False, "deadline", result.detail(waited), waited,
                    attempted=result.state not in ("busy", "closed")))
            elif isinstance(result, BaseException):
                result = ScrapeResult(target, [], SourceStatus(
                    "vllm", redact(target.url), False, "internal", type(result).__name__))
            out.append(result)
        return out

    def scrape(self, targets: list[Target], clock=time.time, deadline: Optional[float] = None) -> list[ScrapeResult]:
        began = time.monotonic()
        return self.finish(targets, self.start(targets, clock), deadline, began)

    def close(self) -> None:
        self.pool.close()
        self.fetcher.close()
