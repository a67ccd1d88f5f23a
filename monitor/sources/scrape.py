"""Direct mode: scrape every replica's /metrics, with a timeout and bounded concurrency."""
from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

from ..config import Target
from ..model import ReplicaReading, SourceStatus
from .exposition import ExpositionError
from .http import FetchError, Fetcher, redact
from .vllm import parse_vllm, readings_from_scrape


@dataclass
class ScrapeResult:
    target: Target
    readings: list[ReplicaReading]
    status: SourceStatus
    anomalies: Optional[dict[str, int]] = None


def scrape_one(fetcher: Fetcher, target: Target, timeout: float, clock=time.time) -> ScrapeResult:
    start = time.monotonic()
    name = redact(target.url)
    try:
        text = fetcher.get(target.url, timeout)
        scrape = parse_vllm(text)
        readings = readings_from_scrape(scrape, name, clock(), target.labels)
        if not readings:
            raise FetchError("no_vllm_metrics", "no vllm:num_requests_running or KV usage series in the body")
        return ScrapeResult(target, readings, SourceStatus("vllm", name, True, duration_seconds=time.monotonic() - start),
                            scrape.anomalies or None)
    except FetchError as exc:
        return ScrapeResult(target, [], SourceStatus("vllm", name, False, exc.reason, exc.detail,
                                                     time.monotonic() - start))
    except ExpositionError as exc:
        return ScrapeResult(target, [], SourceStatus("vllm", name, False, exc.reason, str(exc),
                                                     time.monotonic() - start))


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
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="scrape")
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.rng = rng
        self.failing: dict[str, tuple[int, float, SourceStatus]] = {}  # url -> (failures, retry at, last)

    def _one(self, target: Target, clock) -> ScrapeResult:
        state = self.failing.get(target.url)
        now = time.monotonic()
        if state is not None and now < state[1]:
            last = state[2]
            return ScrapeResult(target, [], SourceStatus(
                "vllm", last.target, False, last.error, f"{last.detail}; retry in {state[1] - now:.1f}s",
                0.0, attempted=False))
        result = scrape_one(self.fetcher, target, self.timeout, clock)
        if result.status.up:
            self.failing.pop(target.url, None)
        else:
            failures = (state[0] if state else 0) + 1
            delay = self.rng() * min(self.max_backoff, self.base_backoff * 2 ** (failures - 1))
            self.failing[target.url] = (failures, time.monotonic() + delay, result.status)
        return result

    def scrape(self, targets: list[Target], clock=time.time) -> list[ScrapeResult]:
        return list(self.pool.map(lambda t: self._one(t, clock), targets))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.fetcher.close()


def fetch_texts(fetcher: Fetcher, urls: list[str], timeout: float,
                concurrency: int = 8) -> list[tuple[str, Optional[str], Optional[FetchError]]]:
    """Fetch several bodies (gateways, DCGM): (url, text or None, error or None)."""
    def one(url: str):
        try:
            return url, fetcher.get(url, timeout), None
        except FetchError as exc:
            return url, None, exc
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(urls) or 1))) as ex:
        return list(ex.map(one, urls))
