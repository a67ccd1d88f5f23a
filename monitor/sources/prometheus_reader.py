"""Prometheus mode's reader: one cycle's read of the fleet through the query layer.

Instant queries (monitor/sources/prometheus_queries.py builds them): the per-replica series
(gauges and counters; histogram sums and counts), `up`, and the pools' latency buckets - from
headroom's bundled recording rules when they are loaded, else summed over the latency window by one
query per histogram family. `up` goes first (a small answer that fixes the cycle's query time,
query_clock.py; with each target's last scrape time, so only the replicas scraped since their last
read are asked for again: prometheus_since.py); the rest are asked at once, each bounded by the read's deadline, so the query layer
answers them on all its cores while headroom reads the replica answer (the histogram queries are
those of the histograms the last read found; a histogram new this cycle is asked after). The first
read, and a read after the replica series failed, asks them in order of need. The pools' histograms
are asked again once a tenth of the latency window has passed since they answered (every third
cycle at 5m and 10 s; prometheus_pool_reads.REFRESH_SHARE), the last ones used in between; a pool
SLO's cumulative buckets every cycle, apart (prometheus_pool_totals.py). A query that fails or
misses the deadline leaves the rest of the read
usable; what could not be read keeps its last values, their age in `PrometheusRead.stale_seconds`
(exported as headroom_source_stale_seconds), and the failure is logged when it starts and when it
ends, never every cycle.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from monitor.kit.http import BodyBudget, redact

from ..model import Histogram, ReplicaReading, SourceStatus
from ..model.shard import filter_pools
from .prometheus import PrometheusClient, PrometheusError, engine_of_scrape, partial_warnings, scrapes_from_vector
from .prometheus_pool_reads import REFRESH_SHARE, Answer, PoolHistogramReads
from .prometheus_queries import (
    needed_bases,
    present_bases,
    replica_selector,
    replica_selectors,
    shard_pools_query,
    with_pools,
)
from .prometheus_since import ReplicaSince, by_instance, split_up, up_query
from .query_clock import QueryClock
from .settings import PrometheusSource

log = logging.getLogger("monitor.sources.prometheus")

# The replica answer's own cap, sized from the fleet: one 60 MB answer (under the client's 64 MiB cap)
# took 1.26 GB and 17.6 s to read. The fleet's series are counted by the query layer (`count(...)`) on
# the first read and after a refusal, else taken as twice the last whole answer's; each may take
# SERIES_BYTES of JSON (a Kubernetes label set is ~500), and no answer is held to less than the floor.
ANSWER_FLOOR_BYTES = 4 << 20
SERIES_BYTES = 1536
RETURN_MARGIN = 0.3  # seconds a read keeps between its last query's deadline and the cycle's
FORGET_AFTER = 3600.0  # global.forget_after's default, for a reader built without it (a test holds them equal)


@dataclass
class PrometheusRead:
    """One cycle's read: replica readings, statuses, anomalies by kind, and per pool key the latency
    histograms the query layer summed (`pool_histograms`: increases over the latency window;
    `pool_totals`: cumulative, for pool SLOs, read at `totals_at`, the `now` of the read they
    answered in) - None when never read. `stale_seconds`: per part (replicas, histograms; totals
    with a pool SLO) the age of the values in use, 0 when this cycle's query answered (the
    histograms are asked again once a tenth of the latency window has passed: prometheus_pool_reads.py)."""

    readings: list[ReplicaReading]
    statuses: list[SourceStatus]
    anomalies: dict[str, int] = field(default_factory=dict)
    pool_histograms: Optional[dict[str, dict[str, Histogram]]] = None
    pool_totals: Optional[dict[str, dict[str, Histogram]]] = None
    totals_at: Optional[float] = None
    stale_seconds: dict[str, float] = field(default_factory=dict)


class PrometheusSourceReader(PoolHistogramReads):
    """Reads the fleet with three instant queries per cycle, in order of need: the per-replica
    series (gauges, counters, histogram sums and counts), `up`, then every pool's latency
    histograms as the query layer sums them (monitor/sources/prometheus_queries.py). A query that
    fails or misses the deadline leaves the rest of the read usable; pool histograms that could not
    be read are the last ones read, their age in `stale_seconds`."""

    def __init__(self, src: PrometheusSource, client: Optional[PrometheusClient] = None,
                 budget: Optional[BodyBudget] = None, forget_after: float = FORGET_AFTER,
                 pool_by: Sequence[str] = ("model_name",), latency_window: float = 300.0,
                 total_kinds: Sequence[str] = (), shard: Optional[tuple[int, int]] = None,
                 max_series: int = 100_000, histogram_every: Optional[float] = None,
                 total_bounds: Optional[Mapping[str, Sequence[float]]] = None,
                 total_pools: Optional[Mapping[str, Sequence[str]]] = None):
        self.src = src
        self.client = client or PrometheusClient.from_config(src, budget)
        self.known: dict[str, float] = {}  # instance that served vLLM series -> the last time it did
        self.forget_after = forget_after  # an instance silent this long is forgotten (global.forget_after)
        self.pool_by = list(pool_by)
        self.latency_window = latency_window
        self.total_kinds = tuple(total_kinds)  # latency kinds with a pool SLO: their cumulative buckets
        # kind -> the pool SLO targets' seconds on it: only the buckets their bad counts need are read
        # each cycle (prometheus_pool_totals.py); None: every bucket
        self.total_bounds = None if total_bounds is None else {k: tuple(v) for k, v in total_bounds.items()}
        # pool (name or key) -> the kinds its pool SLO reads: what a spare candidate's buckets are asked
        # for when an earlier one's gave nothing (prometheus_pool_totals.py); None: every pool, every kind
        self.total_pools = None if total_pools is None else {p: tuple(k) for p, k in total_pools.items()}
        self._hists: Optional[tuple[float, dict]] = None  # (when read, window increases)
        self._totals: Optional[tuple[float, dict]] = None  # (when read, cumulative buckets)
        self._total_les: dict[str, dict[str, tuple[tuple[float, str], ...]]] = {}  # base -> pool -> its buckets
        self._replicas_at: Optional[float] = None  # when the replica series last answered
        self._rules: Optional[bool] = None  # whether the bundled recording rules answered last time
        self.shard = shard  # global.shard: read only the pools this shard owns
        self.selector = src.selector  # the selector of the cycle's queries (narrowed to the shard's pools)
        self._failing: dict[str, str] = {}  # part -> the reason it last failed (logged once)
        self._partials = 0  # this read's queries that answered partially
        self._lock = threading.Lock()  # _partials, counted from the query threads
        self._present: Optional[dict[str, str]] = None  # the histograms the last whole replica read found
        self._spare: dict[str, str] = {}  # later candidates found beside an earlier one (needed_bases): not asked
        # seconds between two reads of the pools' histograms (prometheus_pool_reads.REFRESH_SHARE; 0: every read)
        self.histogram_every = REFRESH_SHARE * latency_window if histogram_every is None else histogram_every
        # (steady time the read began, queries, pools read) of the histograms' last answer
        self._hist_asked: Optional[tuple[float, dict[str, str], frozenset[str]]] = None
        self._pool: Optional[ThreadPoolExecutor] = None  # the queries asked at once (made on first use)
        self.max_series = max_series  # global.max_series: no answer is sized for more series than this
        self._series: Optional[int] = None  # series in the last whole replica answer (None: count them)
        self.clock = QueryClock()  # every query at the query layer's time; its steps counted (query_clock.py)
        self.since = ReplicaSince(src.instance_label)  # replicas not scraped since their last read (prometheus_since.py)

    def read(self, now: Optional[float] = None, deadline: Optional[float] = None
             ) -> tuple[list[ReplicaReading], list[SourceStatus], dict[str, int]]:
        """Readings, statuses and input anomalies by kind (`read_all` without the pool histograms)."""
        got = self.read_all(now, deadline)
        return got.readings, got.statuses, got.anomalies

    def read_all(self, now: Optional[float] = None, deadline: Optional[float] = None) -> PrometheusRead:
        """The cycle's read; no request runs past `deadline` (monotonic seconds), if given. A partial
        answer (Prometheus `warnings` other than PromQL's own notes: a store, shard or tenant did not
        answer) is never taken for the whole fleet: its part is read as failed (reason `partial`, the
        last values kept and marked stale) and counted as the anomaly `partial_response`."""
        now = time.time() if now is None else now
        name = redact(self.src.url)
        start = time.monotonic()
        if deadline is not None:  # end the queries a little before the cycle stops waiting: what was read counts
            deadline -= min(RETURN_MARGIN, 0.1 * max(0.0, deadline - start))
        self.clock.begin()
        self._partials = 0
        ups: Optional[Answer] = None
        started: dict[str, tuple[str, Future]] = {}
        try:
            self.selector = self._shard_selector(now, deadline)
            if self._present is None or self._series is None:
                self.since.plan(None, self.selector, time.monotonic())  # a full read, held by none
                vector = self._replica_read(deadline)
            else:
                vector, ups, started = self._read_at_once(deadline, start)
        except PrometheusError as exc:
            self._present = None  # the next read asks in order of need
            self.since.forget()
            self._note("replicas", exc.reason, exc.detail)
            status = SourceStatus("prometheus", name, False, exc.reason, exc.detail, time.monotonic() - start)
            out = PrometheusRead([], [status])
            out.stale_seconds["replicas"] = math.nan if self._replicas_at is None else max(0.0, now - self._replicas_at)
            self._last_histograms(now, out)
            self._last_totals(now, out)
            self._count_partials(out)
            return out
        self._note("replicas", None)
        self._replicas_at = now
        out = PrometheusRead([], [SourceStatus("prometheus", name, True, duration_seconds=time.monotonic() - start)],
                             stale_seconds={"replicas": 0.0})
        missing, present = self._readings(vector, now, out)
        self._statuses(now, deadline, missing, out, ups)
        self._histograms(now, deadline, out, dict(present), started, start)
        self._present = present
        self._count_partials(out)
        return out

    def _read_at_once(self, deadline: Optional[float], start: float
                      ) -> tuple[list, Answer, dict[str, tuple[str, Future]]]:
        """`up` first (it fixes the cycle's query time; with each target's last scrape time), then the
        series of the replicas scraped since their last read (prometheus_since.py; all of them when
        that cannot be judged) and the histogram queries of the last read's histograms at once, each
        bounded by the read's deadline: the replica vector, `up`'s answer and the histogram queries
        started (key -> (query, future))."""
        got = self._answer(lambda: self._query(up_query(_up_selector(self.src.selector)), deadline))
        ups, times = (got, None) if isinstance(got, PrometheusError) else split_up(got, self.src.instance_label)
        if self.clock.at is None:  # no `up` series gave the time: the replica read fixes it, the rest follow
            self.since.plan(None, self.selector, time.monotonic())
            return self._replica_read(deadline), ups, {}
        narrow = self.since.plan(times, self.selector, time.monotonic())
        cap, series = self._replica_cap(deadline)
        queries = [] if narrow == "" else self._replica_queries(narrow or "")
        parts = [self._start(lambda q=q: self._query(q, deadline, max_bytes=cap)) for q in queries]
        assert self._present is not None  # read_all asks at once only after a whole replica read
        asks = self._histogram_asks(self._present, with_rules=True) if self._histograms_due(self._present, start) else {}
        asks.update(self._total_asks(self._present))
        started = {key: (query, self._start(lambda q=query: self._query(q, deadline))) for key, query in asks.items()}
        vector: list = []
        try:
            for part in parts:
                vector.extend(part.result())
        except PrometheusError as exc:
            raise self._too_large(exc, cap, series) from None
        return vector, ups, started

    def _replica_queries(self, narrow: str = "") -> list[str]:
        """The replica series' queries (prometheus_queries.replica_selectors), keeping the instance
        label and the pool_by labels on the trimmed ones; `narrow`: a matcher more (some instances)."""
        keep = [self.src.instance_label] + [label for label in self.pool_by if label not in ("model_name", "model")]
        return replica_selectors(",".join(m for m in (self.selector.strip().strip("{}").strip(), narrow) if m), keep)

    def _start(self, call: Callable[..., list]) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="prometheus-query")
        return self._pool.submit(call)

    @staticmethod
    def _answer(call: Callable[[], list]) -> Answer:
        try:
            return call()
        except PrometheusError as exc:
            return exc

    def _replica_read(self, deadline: Optional[float]) -> list:
        """The per-replica series, held to a cap sized from the fleet (`ANSWER_FLOOR_BYTES`,
        `SERIES_BYTES`): a bigger answer is refused (too_large) before it is parsed."""
        cap, series = self._replica_cap(deadline)
        queries = self._replica_queries()
        vector: list = []
        try:
            if self.clock.at is None:  # the first answer fixes the cycle's query time: the rest follow it
                vector.extend(self._query(queries.pop(0), deadline, max_bytes=cap))
            parts = [self._start(lambda q=q: self._query(q, deadline, max_bytes=cap)) for q in queries]
            for part in parts:
                vector.extend(part.result())
        except PrometheusError as exc:
            raise self._too_large(exc, cap, series) from None
        return vector

    def _replica_cap(self, deadline: Optional[float]) -> tuple[int, int]:
        """(the replica answer's cap in bytes, the series it is sized for): the fleet's series are
        counted by the query layer on the first read and after a refusal, else taken as twice the last
        whole answer's (room for the fleet to double between two cycles)."""
        if self._series is None:
            counted = self._query(f"count({replica_selector(self.selector)})", deadline)
            value = counted[0][1] if counted else 0.0
            series = int(value) if math.isfinite(value) and value > 0 else 0
        else:
            series = 2 * self._series
        series = min(series, self.max_series)
        return max(ANSWER_FLOOR_BYTES, series * SERIES_BYTES), series

    def _too_large(self, exc: PrometheusError, cap: int, series: int) -> PrometheusError:
        """The replica read's failure; a refused answer says the cap and how it was sized."""
        if exc.reason != "too_large":
            return exc
        self._series = None  # counted again next cycle
        return PrometheusError("too_large", f"the replica answer is over {cap} bytes, the cap sized from the "
                                            f"fleet ({series} series x {SERIES_BYTES} bytes, at least "
                                            f"{ANSWER_FLOOR_BYTES >> 20} MiB; global.max_series bounds it): "
                                            f"{exc.detail}")

    def _count_partials(self, out: PrometheusRead) -> None:
        if self._partials:  # a read whose answers were partial counts once, however many queries it asked
            out.anomalies["partial_response"] = out.anomalies.get("partial_response", 0) + 1

    def _query(self, query: str, deadline: Optional[float], **kw) -> list:
        """An instant query at the query layer's time (never headroom's clock: query_clock.py); a
        partial answer raises PrometheusError `partial` (its first warning, capped, as the detail)."""
        warnings: list[str] = []
        got = self.clock.query(self.client, query, deadline, warnings, **kw)
        partial = partial_warnings(warnings)
        if partial:
            with self._lock:
                self._partials += 1
            raise PrometheusError("partial", f"a partial answer ({len(partial)} warning(s)): {partial[0]}")
        return got

    def _shard_selector(self, now: float, deadline: Optional[float]) -> str:
        """The source's selector; on a shard (global.shard, pools by model_name), narrowed to the
        models this shard owns, so each shard's queries read only its own pools' series."""
        if self.shard is None or self.shard[1] <= 1 or self.pool_by != ["model_name"]:
            return self.src.selector
        names = self._query(shard_pools_query(self.src.selector), deadline)
        owned = filter_pools(sorted({labels.get("model_name", "") for labels, _v in names} - {""}), self.shard)
        return with_pools(self.src.selector, owned)

    def _readings(self, vector, now: float, out: PrometheusRead) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
        """Per instance: the engine's readings (its pool_by labels on them), from this read's series
        and those held for the replicas not scraped since (prometheus_since.py); returns each
        instance's missing contract families and the latency histograms whose pool buckets are asked (base -> stored name: prometheus_queries.needed_bases;
        the other candidates found in `_spare`).
        Takes the vector's label dicts over."""
        missing: dict[str, tuple[str, ...]] = {}  # instance -> contract families it has no series of
        extra = [label for label in self.pool_by if label not in ("model_name", "model")]
        present, series = by_instance(vector, self.src.instance_label, present_bases)
        fresh = scrapes_from_vector(vector, self.src.instance_label, keep=extra, consume=True)
        scrapes = self.since.merge(fresh, present, series, self.selector, time.monotonic())
        held = bool(self.since.held)
        self._series = max(self.since.series(), len(vector)) if held else len(vector)
        for instance, (scrape, labels) in sorted(scrapes.items()):
            regrouped = dict(scrape.anomalies)  # what the regrouping found; reading adds its own
            engine = engine_of_scrape(scrape)
            out.readings.extend(engine.readings_from_scrape(scrape, instance, now, labels or None))
            missing[instance] = engine.missing_families(scrape)
            for kind, n in scrape.anomalies.items():
                out.anomalies[kind] = out.anomalies.get(kind, 0) + n
            scrape.anomalies = regrouped  # a held scrape is read again next cycle: count each read's once
        found = self.since.found() if held else list(present.values())
        every: dict[str, str] = {}
        for got in found:
            for base, name in got.items():
                every.setdefault(base, name)
        needed = needed_bases(found)
        self._spare = {base: name for base, name in every.items() if base not in needed}
        return missing, needed

    def _statuses(self, now: float, deadline: Optional[float], missing: dict, out: PrometheusRead,
                  ups: Optional[Answer] = None) -> None:
        """Targets Prometheus itself sees as down, and the missing families of those that answered
        (`ups`: `up`'s answer when it was asked already)."""
        if ups is None:
            ups = self._answer(lambda: self._query(_up_selector(self.src.selector), deadline))
        if isinstance(ups, PrometheusError):
            self._note("up", ups.reason, ups.detail)
            return
        self._note("up", None)
        seen = {r.target for r in out.readings}
        self._remember(seen, now)
        for labels, value in ups:
            inst = labels.get(self.src.instance_label, "")
            if (not self.src.selector or self.selector != self.src.selector) and inst not in self.known:
                continue  # without a selector `up` covers every job, on a shard every pool: report only ours
            if value == 0 or math.isnan(value):
                out.statuses.append(SourceStatus("vllm", inst, False, "down_in_prometheus", "up == 0"))
            elif inst in seen:
                out.statuses.append(SourceStatus("vllm", inst, True, missing=missing.get(inst, ())))

    def stale_read(self, now: float, out: PrometheusRead) -> None:
        """What a read that missed the cycle's deadline leaves (monitor/pipeline/cycle.py): the last pool
        histograms and each part's age, said once."""
        self._note("replicas", "deadline")
        out.stale_seconds["replicas"] = math.nan if self._replicas_at is None else max(0.0, now - self._replicas_at)
        self._last_histograms(now, out)
        self._last_totals(now, out)

    def _last_histograms(self, now: float, out: PrometheusRead) -> None:
        """The last pool histogram increases read, with their age (none yet: empty, quantiles unknown)."""
        if self._hists is not None:
            when, out.pool_histograms = self._hists
            out.stale_seconds["histograms"] = max(0.0, now - when)
        else:
            out.pool_histograms = {}
            out.stale_seconds["histograms"] = math.nan

    def _note(self, part: str, reason: Optional[str], detail: str = "") -> None:
        """Log a part's failure when it starts and when it is over, never every cycle."""
        before = self._failing.get(part)
        if reason is None:
            if before is not None:
                del self._failing[part]
                log.info("Prometheus answers the %s query again", part)
            return
        if before is None:
            what = {"replicas": "replica series (the pools keep their last values, marked stale)",
                    "up": "up series (targets down in Prometheus are not named)",
                    "histograms": "pool latency histograms (the last ones read are used, marked stale)",
                    "totals": "pools' cumulative latency buckets (the pool SLOs' burn windows wait for the next "
                              "answer)"}[part]
            log.warning("could not read the %s from Prometheus: %s%s; said once until it answers again", what, reason,
                        f" ({detail})" if detail else "")
        self._failing[part] = reason

    def _remember(self, seen: set[str], now: float) -> None:
        """Note the instances seen now; forget those silent for `forget_after` (replica churn)."""
        for inst in seen:
            self.known[inst] = now
        for inst in [i for i, t in self.known.items() if now - t > self.forget_after]:
            del self.known[inst]

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds` (monitor/pipeline/cycle.py): the last-seen times move with it."""
        self.known = {inst: t + seconds for inst, t in self.known.items()}
        if self._hists is not None:
            self._hists = (self._hists[0] + seconds, self._hists[1])
        if self._totals is not None:
            self._totals = (self._totals[0] + seconds, self._totals[1])
        if self._replicas_at is not None:
            self._replicas_at += seconds

    def close(self) -> None:
        self.client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _up_selector(extra: str) -> str:
    matchers = ['__name__="up"']
    if extra.strip():
        matchers.append(extra.strip().strip("{}"))
    return "{" + ",".join(matchers) + "}"
