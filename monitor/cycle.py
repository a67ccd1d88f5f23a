"""One collection cycle: sources -> derive -> capacity -> snapshot.

`Pipeline` keeps what must survive between cycles (recent readings per target for counter deltas
and latency windows, cumulative error counters) and publishes each finished `Snapshot` atomically
for the exporter. Cycles never overlap: a cycle that finds the previous one still running is
skipped and counted.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Optional

from .config import Config, Target
from .derive.core import derive_pools, pool_of
from .model import PoolSnapshot, ReplicaReading, Snapshot, SourceStatus
from .sources.http import FetchError, Fetcher, redact
from .sources.prometheus import PrometheusSourceReader
from .sources.scrape import DeadlinePool, Late, Scraper

log = logging.getLogger(__name__)

DEADLINE_MARGIN = 0.5  # seconds a cycle waits beyond its sources' request timeouts


def cycle_deadline_seconds(cfg: Config) -> float:
    """How long a cycle waits for its sources before it publishes what it has.

    A little over the longest request timeout in use (every request ends by then, see
    sources/http.py), and never more than 90% of the interval: one stuck source cannot hold the
    cycle of the whole fleet.
    """
    timeouts = [cfg.prometheus.timeout] if cfg.prometheus else []
    if cfg.vllm_targets or cfg.gateways or cfg.dcgm_targets:
        timeouts.append(cfg.scrape_timeout)
    return max(0.05, min(0.9 * cfg.interval, max(timeouts, default=0.0) + DEADLINE_MARGIN))

# Hooks run on each cycle's pools after derivation: f(pools, pipeline) -> None. The capacity model,
# gateway/task readers and forecasts register here, so this module stays small.
Enricher = Callable[[list[PoolSnapshot], "Pipeline"], None]


class Pipeline:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time,
                 enrichers: Optional[list[Enricher]] = None):
        self.config = config
        self.clock = clock
        self.history: dict[str, deque[ReplicaReading]] = {}
        self.errors: dict[tuple[str, str], float] = {}
        self.dropped: dict[str, float] = {}
        self.anomalies: dict[str, float] = {}  # malformed-but-usable input, by kind
        self.cycles = 0
        self.skipped_cycles = 0
        self.last_success: Optional[float] = None
        self.last_fresh: dict[str, float] = {}
        self.latest: Optional[Snapshot] = None
        self.enrichers: list[Enricher] = list(enrichers or [])
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self.scraper: Optional[Scraper] = None
        self.prom: Optional[PrometheusSourceReader] = None
        if config.vllm_targets:
            self.scraper = Scraper(Fetcher(config.vllm_auth),
                                   config.scrape_timeout, config.scrape_concurrency)
        if config.prometheus:
            self.prom = PrometheusSourceReader(config.prometheus)
        # bodies of the gateway and DCGM endpoints from the last cycle, for the enrichers
        self.gateway_texts: list[tuple[object, Optional[str]]] = []
        self.dcgm_texts: list[tuple[str, Optional[str]]] = []
        self._aux_fetchers = {}

    def on_snapshot(self, listener: Callable[[Snapshot], None]) -> None:
        self._listeners.append(listener)

    # --- the cycle ---------------------------------------------------------------------------
    def run_cycle(self) -> Optional[Snapshot]:
        if not self._lock.acquire(blocking=False):
            self.skipped_cycles += 1
            log.warning("previous cycle still running; this one is skipped")
            return None
        try:
            return self._cycle()
        finally:
            self._lock.release()

    def _cycle(self) -> Snapshot:
        started = time.monotonic()
        now = self.clock()
        readings, statuses = self.collect(now)
        snapshot = self.build(readings, statuses, now)
        snapshot.cycle_duration_seconds = time.monotonic() - started
        self.publish(snapshot)
        return snapshot

    def collect(self, now: float, deadline: Optional[float] = None
                ) -> tuple[list[ReplicaReading], list[SourceStatus]]:
        """Every source at once; one without an answer by `deadline` (monotonic; default: now +
        `cycle_deadline_seconds`) is down with reason `deadline` and its request is abandoned."""
        began = time.monotonic()
        if deadline is None:
            deadline = began + cycle_deadline_seconds(self.config)
        pool = self._source_pool()
        prom = pool.start([("prometheus", lambda: self.prom.read(now, deadline))]) if self.prom else []
        aux = self._start_aux(pool)
        readings: list[ReplicaReading] = []
        statuses: list[SourceStatus] = []
        if self.scraper is not None:
            targets = self.config.vllm_targets
            started = self.scraper.start(targets, clock=self.clock)
            for result in self.scraper.finish(targets, started, deadline, began):
                readings.extend(result.readings)
                statuses.append(result.status)
                for kind, n in (result.anomalies or {}).items():
                    self.anomalies[kind] = self.anomalies.get(kind, 0.0) + n
        for result in pool.wait(prom, deadline):
            if isinstance(result, tuple):
                readings.extend(result[0])
                statuses.extend(result[1])
            else:
                statuses.append(_late("prometheus", self.config.prometheus.url, result, began))
        statuses.extend(self._collect_aux(deadline, aux, began))
        return readings, statuses

    def _source_pool(self) -> DeadlinePool:
        """Workers for Prometheus, gateways and DCGM (vLLM targets have the scraper's own)."""
        pool = getattr(self, "_sources", None)
        if pool is None:
            cfg = self.config
            pool = self._sources = DeadlinePool(1 + len(cfg.gateways) + len(cfg.dcgm_targets), "sources")
        return pool

    def _fetcher_for(self, auth) -> Fetcher:
        key = id(auth)
        f = self._aux_fetchers.get(key)
        if f is None:
            f = self._aux_fetchers[key] = Fetcher(auth)
        return f

    def _start_aux(self, pool: DeadlinePool) -> list:
        timeout = self.config.scrape_timeout
        jobs = [(("gateway", i, gw.url), lambda f=self._fetcher_for(gw.auth), u=gw.url: _fetch(f, u, timeout))
                for i, gw in enumerate(self.config.gateways)]
        dcgm = self._fetcher_for(None) if self.config.dcgm_targets else None
        jobs += [(("dcgm", t.url), lambda u=t.url: _fetch(dcgm, u, timeout)) for t in self.config.dcgm_targets]
        return pool.start(jobs)

    def _collect_aux(self, deadline: Optional[float] = None, started: Optional[list] = None,
                     began: Optional[float] = None) -> list[SourceStatus]:
        """Gateway and DCGM bodies (I/O only); enrichers parse them. Late ones are down (`deadline`)."""
        began = time.monotonic() if began is None else began
        pool = self._source_pool()
        if started is None:
            started = self._start_aux(pool)
        results = pool.wait(started, deadline)
        statuses: list[SourceStatus] = []
        gateway_texts, dcgm_texts = [], []
        sources = [("gateway", gw.url, gw) for gw in self.config.gateways]
        sources += [("dcgm", t.url, t.url) for t in self.config.dcgm_targets]
        for (kind, url, key), result in zip(sources, results):
            if isinstance(result, tuple):
                text, err, took = result
                statuses.append(SourceStatus(kind, redact(url), err is None, err.reason if err else None,
                                             err.detail if err else None, took))
            else:
                text = None
                statuses.append(_late(kind, url, result, began))
            (gateway_texts if kind == "gateway" else dcgm_texts).append((key, text))
        self.gateway_texts, self.dcgm_texts = gateway_texts, dcgm_texts
        return statuses

    def build(self, readings: list[ReplicaReading], statuses: list[SourceStatus], now: float) -> Snapshot:
        cfg = self.config
        self.cycles += 1
        for st in statuses:
            if not st.up and st.attempted:
                key = (st.source, st.error or "unknown")
                self.errors[key] = self.errors.get(key, 0.0) + 1
                log.info("source %s %s down: %s", st.source, st.target, st.error)
        readings = self._cap(readings)
        for r in readings:
            key = f"{r.target}|{r.model}"
            dq = self.history.get(key)
            if dq is None:
                dq = self.history[key] = deque()
            dq.append(r)
            while dq and now - dq[0].timestamp > cfg.history_keep:
                dq.popleft()
        # forget targets that have been silent for longer than the history we keep
        for key in [k for k, dq in self.history.items() if not dq or now - dq[-1].timestamp > cfg.history_keep]:
            del self.history[key]
        down_targets = {st.target for st in statuses if not st.up}
        fresh_keys = {f"{r.target}|{r.model}" for r in readings}
        # a target that answered this cycle is current; one that did not is stale
        history = {}
        stale_targets = set(down_targets)
        for key, dq in self.history.items():
            history[key] = list(dq)
            if key not in fresh_keys:
                stale_targets.add(dq[-1].target)
        expected: dict[str, set[str]] = {}
        for key, dq in self.history.items():
            expected.setdefault(pool_of(dq[-1], cfg.pool_by), set()).add(dq[-1].target)
        pools = derive_pools(history, now, cfg.latency_window, cfg.pool_by,
                             down_targets=stale_targets, expected=expected)
        if cfg.shard is not None:
            from .shard import owns  # noqa: PLC0415
            pools = [p for p in pools if owns(p.pool, cfg.shard)]
        for p in pools:
            if not p.stale:
                self.last_fresh[p.pool] = now
            p.last_fresh_timestamp = self.last_fresh.get(p.pool, p.last_fresh_timestamp)
        for enrich in self.enrichers:
            try:
                enrich(pools, self)
            except Exception:  # an enricher must never take the cycle down
                log.exception("enricher %s failed", getattr(enrich, "__name__", enrich))
                self.errors[("enricher", getattr(enrich, "__name__", "enricher"))] = \
                    self.errors.get(("enricher", getattr(enrich, "__name__", "enricher")), 0.0) + 1
        if any(st.up for st in statuses if st.source in ("vllm", "prometheus")):
            self.last_success = now
        return Snapshot(timestamp=now, pools=pools, sources=statuses,
                        last_success_timestamp=self.last_success,
                        errors={f"{s}|{r}": v for (s, r), v in self.errors.items()})

    def _cap(self, readings: list[ReplicaReading]) -> list[ReplicaReading]:
        limit = self.config.max_series
        if len(readings) + len(self.history) <= limit:
            return readings
        known = [r for r in readings if f"{r.target}|{r.model}" in self.history]
        new = [r for r in readings if f"{r.target}|{r.model}" not in self.history]
        room = max(0, limit - len(self.history))
        dropped = len(new) - min(room, len(new))
        if dropped:
            self.dropped["replicas"] = self.dropped.get("replicas", 0.0) + dropped
            log.warning("cardinality cap: %d new replica series dropped (global.max_series=%d)", dropped, limit)
        return known + new[:room]

    def publish(self, snapshot: Snapshot) -> None:
        self.latest = snapshot  # a single reference swap: readers never see half a snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("snapshot listener failed")

    def close(self, wait: float = 0.0) -> None:
        """Stop every source at once: requests in flight break, a cycle waiting on them goes on with
        what it has. `wait`: seconds to let a running cycle finish publishing."""
        if self.scraper is not None:
            self.scraper.close()
        if self.prom is not None:
            self.prom.close()
        pool = getattr(self, "_sources", None)
        if pool is not None:
            pool.close()
        for f in list(self._aux_fetchers.values()):
            f.close()
        if wait > 0 and self._lock.acquire(timeout=wait):
            self._lock.release()


def _fetch(fetcher: Fetcher, url: str, timeout: float) -> tuple[Optional[str], Optional[FetchError], float]:
    t0 = time.monotonic()
    try:
        return fetcher.get(url, timeout), None, time.monotonic() - t0
    except FetchError as exc:
        return None, exc, time.monotonic() - t0


def _late(source: str, url: str, result: object, began: float) -> SourceStatus:
    """The status of a source without an answer at the cycle deadline (or whose reader failed)."""
    waited = time.monotonic() - began
    if isinstance(result, Late):
        return SourceStatus(source, redact(url), False, "deadline", result.detail(waited), waited,
                            attempted=result.state not in ("busy", "closed"))
    log.error("%s reader failed", source, exc_info=result if isinstance(result, BaseException) else None)
    return SourceStatus(source, redact(url), False, "internal", type(result).__name__, waited)


def targets_from_urls(urls: list[str]) -> list[Target]:
    return [Target(u) for u in urls]
