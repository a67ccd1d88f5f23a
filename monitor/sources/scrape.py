"""Direct mode: scrape every replica's /metrics, with a timeout and bounded concurrency."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from ..config import Target
from ..model import ReplicaReading, SourceStatus
from .exposition import ExpositionError
from .http import FetchError, Fetcher, redact
from .vllm import readings_from_text


@dataclass
class ScrapeResult:
    target: Target
    readings: list[ReplicaReading]
    status: SourceStatus


def scrape_one(fetcher: Fetcher, target: Target, timeout: float, clock=time.time) -> ScrapeResult:
    start = time.monotonic()
    name = redact(target.url)
    try:
        text = fetcher.get(target.url, timeout)
        readings = readings_from_text(text, name, clock(), target.labels)
        if not readings:
            raise FetchError("no_vllm_metrics", "no vllm:num_requests_running or KV usage series in the body")
        return ScrapeResult(target, readings, SourceStatus("vllm", name, True, duration_seconds=time.monotonic() - start))
    except FetchError as exc:
        return ScrapeResult(target, [], SourceStatus("vllm", name, False, exc.reason, exc.detail,
                                                     time.monotonic() - start))
    except ExpositionError as exc:
        return ScrapeResult(target, [], SourceStatus("vllm", name, False, exc.reason, str(exc),
                                                     time.monotonic() - start))


class Scraper:
    """Holds the session and worker pool across cycles."""

    def __init__(self, fetcher: Fetcher, timeout: float, concurrency: int):
        self.fetcher = fetcher
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="scrape")

    def scrape(self, targets: list[Target], clock=time.time) -> list[ScrapeResult]:
        return list(self.pool.map(lambda t: scrape_one(self.fetcher, t, self.timeout, clock), targets))

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
