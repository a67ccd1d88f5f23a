"""Direct mode: scrape every replica's /metrics, with a deadline per request and per cycle.

Each request ends within `scrape_timeout` (see `http.Fetcher`). The GETs on kept connections are
sent and read by the cycle's own thread (`scrape_loop`), the rest by worker threads
(`deadline_pool`). A batch of requests (one cycle's) is waited for only until the cycle deadline:
what is still running then is abandoned, reported `deadline`, and finishes on its own in its worker
when its own deadline fires. The workers are daemon threads, so a request stuck in a source never
holds the process at exit.
"""
from __future__ import annotations

import random
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

from monitor.kit.exposition import ExpositionError
from monitor.kit.http import Exchange, Fetcher, FetchError, redact

from ..model import ReplicaReading, SourceStatus
from . import sglang, vllm
from .deadline_pool import DeadlinePool, Late
from .scrape_loop import read_kept
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
    return read_answer(target, lambda: fetcher.get(target.url, timeout), start, clock, last_engine)


def read_answer(target: Target, answer: Callable[[], str], start: float, clock=time.time, last_engine: Any = None
                ) -> ScrapeResult:
    """`scrape_one` of the answer's text (`answer()`: FetchError when there is none), asked at `start`
    (monotonic)."""
    name = redact(target.url)
    try:
        text = answer()
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


# ---- the vLLM scraper ---------------------------------------------------------------------------

@dataclass
class _Batch:
    """One cycle's scrapes between `Scraper.start` and `finish`: a slot per target (a result, a
    Late, a worker's Future, or None until read), each waiting target's slot, and the targets not
    sent yet."""

    clock: Callable[[], float]
    slots: list[Any]
    at: dict[int, int]  # id(target) -> its slot
    waiting: deque[Target]
    sent: set[int] = field(default_factory=set)  # the slots of the workers' jobs that read a sent GET


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
        return self._waiting(target) or self._record(
            target, scrape_one(self.fetcher, target, self.timeout, clock, self.engines.get(target.url)))

    def _sent(self, target: Target, exchange: Optional[Exchange], sent: float, clock) -> ScrapeResult:
        """The target's answer to `exchange` (read off its connection, waiting as needed), or, with
        nothing sent, its whole scrape."""
        if exchange is None:
            return self._one(target, clock)
        return self._record(target, read_answer(target, partial(self.fetcher.finish, exchange), sent, clock,
                                                self.engines.get(target.url)))

    def _waiting(self, target: Target) -> Optional[ScrapeResult]:
        """Down with its last error while a failing target waits for its retry; None otherwise."""
        state = self.failing.get(target.url)
        now = time.monotonic()
        if state is None or now >= state[1]:
            return None
        last = state[2]
        return ScrapeResult(target, [], SourceStatus(
            "vllm", last.target, False, last.error, f"{last.detail}; retry in {state[1] - now:.1f}s",
            0.0, attempted=False))

    def _record(self, target: Target, result: ScrapeResult) -> ScrapeResult:
        """The failures and backoff of a target, and the reader its body was read with."""
        if result.status.up:
            self.failing.pop(target.url, None)
            if self.engines.get(target.url) is not result.engine:
                if len(self.engines) >= 100_000:
                    self.engines.clear()
                self.engines[target.url] = result.engine
        else:
            state = self.failing.get(target.url)
            failures = (state[0] if state else 0) + 1
            delay = self.rng() * min(self.max_backoff, self.base_backoff * 2 ** (failures - 1))
            self.failing[target.url] = (failures, time.monotonic() + delay, result.status)
        return result

    def start(self, targets: list[Target], clock=time.time) -> _Batch:
        """Start one cycle's scrapes; `finish` sends and collects them. The kept connections the
        targets closed since the last cycle are closed first (`Fetcher.prune`: one poll over them);
        a target waiting for its retry, or whose last request still runs, is settled here."""
        self.fetcher.prune()
        batch = _Batch(clock, [None] * len(targets), {}, deque())
        asked: set[str] = set()
        for i, target in enumerate(targets):
            settled = self._waiting(target) or self.pool.late(target.url)
            if settled is None and target.url in asked:  # listed twice: asked once, as the pool did
                settled = Late("busy")
            if settled is not None:
                batch.slots[i] = settled
            else:
                asked.add(target.url)
                batch.at[id(target)] = i
                batch.waiting.append(target)
        return batch

    def finish(self, targets: list[Target], started: _Batch, deadline: Optional[float],
               began: Optional[float] = None) -> list[ScrapeResult]:
        """Results in target order; a target without an answer by `deadline` is down with reason
        `deadline`. The GETs on kept connections are sent and read here (`scrape_loop.read_kept`),
        the others by the worker threads."""
        began = time.monotonic() if began is None else began
        batch, clock = started, started.clock

        def done(target: Target, exchange: Exchange, sent: float) -> None:
            try:
                result: Any = self._sent(target, exchange, sent, clock)
            except Exception as exc:  # noqa: BLE001 (a reader's bug: that target is down `internal`, as in a worker)
                result = exc
            batch.slots[batch.at[id(target)]] = result

        def hand_off(target: Target, exchange: Optional[Exchange], sent: float) -> Optional[Future]:
            [(_, job)] = self.pool.start([(target.url, partial(self._sent, target, exchange, sent, clock))])
            at = batch.at[id(target)]
            batch.slots[at] = job
            if exchange is None:
                return None
            if isinstance(job, Late):  # closed meanwhile: nothing will read it
                self.fetcher.discard(exchange)
                return None
            batch.sent.add(at)
            return job

        read_kept(self.fetcher, batch.waiting, self.pool.workers.size, self.timeout,
                  float("inf") if deadline is None else deadline, done, hand_off)
        for target in batch.waiting:  # never sent by the deadline
            batch.slots[batch.at[id(target)]] = Late("not_started")
        for sent in (False, True):  # a job reading a sent GET is never cancelled: it gives its connection back
            jobs = [(i, job) for i, job in enumerate(batch.slots) if isinstance(job, Future) and (i in batch.sent) == sent]
            for (i, _), result in zip(jobs, self.pool.wait(jobs, deadline, cancel=not sent)):
                batch.slots[i] = result
        out = []
        for target, result in zip(targets, batch.slots):
            if isinstance(result, Late):
                waited = time.monotonic() - began
                result = ScrapeResult(target, [], SourceStatus(
                    "vllm", redact(target.url), False, "deadline", result.detail(waited), waited,
                    attempted=result.state not in ("busy", "closed")))
            elif not isinstance(result, ScrapeResult):  # an exception a job raised
                result = ScrapeResult(target, [], SourceStatus(
                    "vllm", redact(target.url), False, "internal", type(result).__name__))
            out.append(result)
        return out

    def close(self) -> None:
        self.pool.close()
        self.fetcher.close()
