"""Prometheus mode's pool cumulative latency buckets for pool SLOs, as the reader asks for them
(prometheus_reader.py).

A pool SLO's burn windows (monitor/capacity/slo.py SloTracker) record the pool's cumulative counts at
the cycle's time, so these are asked every cycle, apart from the bucket increases (asked again only
once a tenth of the latency window has passed: prometheus_pool_reads.py); a reused answer would be a
fresh point at a later time, the burn flattened. To cost the query layer little they read only the
buckets the targets' bad counts need (prometheus_queries.needed_les: around each target and +Inf)
of the `le` values each pool's histogram has, learned from a read of every bucket (the first, and
again when a pool's answer lacks what it needs: a pool new, a bucket gone) and relearned from each
answer of the bucket increases, which carries every bucket (a bound added between those around a
target, which an answer at the values learned cannot show, is read from the next refresh on: 30 s
at 5m). Those buckets give the same total and count over each target as every bucket when the
pool's buckets summed by `le` rise from bound to bound, as one histogram's do; while the pool's
replicas have different bucket layouts (a rolling upgrade that changes them) the sums are not one
histogram, and the counts from the selected buckets can differ from those of every bucket. What
answered is stamped with the cycle it was read in (`PrometheusRead.totals_at`): after a failure the
last ones are used with their own time, never recorded again as a new point. A mixin of
PrometheusSourceReader: it uses the reader's source, window, selector, query and note methods.
"""
from __future__ import annotations

import math
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union, cast

from ..model.poolkey import name_of
from .prometheus import PrometheusError
from .prometheus_queries import histogram_bases, needed_les, pool_bucket_les, pool_histograms, pool_total_queries

Answer = Union[list, PrometheusError]  # a query's vector, or why it has none
TOTAL = "total:"  # the prefix of the totals' keys among a read's queries (the increases': their base names)


class PoolTotalReads:
    """The pool cumulative buckets part of PrometheusSourceReader."""

    if TYPE_CHECKING:  # what PrometheusSourceReader gives this mixin (its __init__ and methods)
        selector: str
        pool_by: list[str]
        total_kinds: tuple[str, ...]
        total_bounds: Optional[dict[str, tuple[float, ...]]]
        total_pools: Optional[dict[str, tuple[str, ...]]]
        _totals: Optional[tuple[float, dict]]
        _total_les: dict[str, dict[str, tuple[tuple[float, str], ...]]]
        _spare: dict[str, str]

        def _start(self, call: Callable[..., list]) -> Future: ...
        @staticmethod
        def _answer(call: Callable[[], list]) -> Answer: ...
        def _query(self, query: str, deadline: Optional[float], **kw: Any) -> list: ...
        def _note(self, part: str, reason: Optional[str], detail: str = "") -> None: ...

    def _total_asks(self, present: Mapping[str, str]) -> dict[str, str]:
        """key -> query of the pools' cumulative buckets (none without a pool SLO): per histogram of
        `present` whose kind a pool SLO reads, only the `le` values its targets need where every
        pool's are known (`_total_les`), else every bucket."""
        if not self.total_kinds:
            return {}
        les: dict[str, set[str]] = {}
        for base, pools in self._total_les.items():
            thresholds = self._thresholds(base)
            if pools and thresholds is not None:
                les[base] = {le for bounds in pools.values() for le in needed_les(bounds, thresholds)}
        queries = pool_total_queries(self.selector, self.pool_by, self.total_kinds, dict(present), les)
        return {TOTAL + base: query for base, query in queries.items()}

    def _pool_totals(self, now: float, deadline: Optional[float], out: Any, present: Mapping[str, str],
                     started: dict[str, tuple[str, Future]]) -> None:
        """Every pool's cumulative buckets of the kinds a pool SLO reads, into `out` (a PrometheusRead)
        with the time they were read (`now`); the last ones with theirs when a query fails.
        `started`: the queries already asked (key -> (query, future)), as for the increases."""
        if not self.total_kinds:
            out.pool_totals = {}
            return
        got = self._total_vector(deadline, present, started)
        if not isinstance(got, PrometheusError):
            totals = pool_histograms(got, self.pool_by)[1]
            spare = {b: n for b, n in self._spare.items() if _kind_of(b) in self.total_kinds}
            if spare and lacking_kinds(totals, spare, self.total_pools):  # an earlier candidate's gave a pool SLO nothing
                more = joined([self._answer(partial(self._query, q, deadline)) for q in
                                pool_total_queries(self.selector, self.pool_by, self.total_kinds, spare).values()])
                if isinstance(more, PrometheusError):
                    got = more
                else:
                    totals = pool_histograms(got + more, self.pool_by)[1]
        if isinstance(got, PrometheusError):
            self._note("totals", got.reason, got.detail)
            self._last_totals(now, out)
            return
        self._note("totals", None)
        out.pool_totals, out.totals_at = totals, now
        out.stale_seconds["totals"] = 0.0
        self._totals = (now, totals)

    def _total_vector(self, deadline: Optional[float], present: Mapping[str, str],
                      started: dict[str, tuple[str, Future]]) -> Union[list, PrometheusError]:
        """The answers of `_total_asks` in one vector (or the first failure). A base asked at the `le`
        values learned whose answer lacks a bucket a pool needs, or names a pool not learned, is
        asked again for every bucket; a read of every bucket is what its pools' `le` values are
        learned from."""
        asks = {key[len(TOTAL):]: query for key, query in self._total_asks(present).items()}
        for base, query in asks.items():  # every query under way before one is waited on
            if started.get(TOTAL + base, ("",))[0] != query:
                started[TOTAL + base] = (query, self._start(partial(self._query, query, deadline)))
        answers = {base: self._answer(started[TOTAL + base][1].result) for base in asks}
        whole = pool_total_queries(self.selector, self.pool_by, self.total_kinds, dict(present))
        again = [base for base, got in answers.items() if asks[base] != whole[base]
                 and not isinstance(got, PrometheusError) and not self._fits(base, got)]
        redo = {base: self._start(partial(self._query, whole[base], deadline)) for base in again}
        answers.update({base: self._answer(future.result) for base, future in redo.items()})
        for base, got in answers.items():  # a read of every bucket: its pools' `le` values, as they are now
            if asks[base] == whole[base] or base in redo:
                if not isinstance(got, PrometheusError):
                    self._total_les[base] = pool_bucket_les(got, self.pool_by).get(base, {})
        return joined(list(answers.values()))

    def _relearn_les(self, samples: list) -> None:
        """The learned pools' `le` values as an answer of the bucket increases has them (tagged, as
        `pool_bucket_les` reads; asked every REFRESH_SHARE of the latency window, every bucket each
        pool had over it): a bound added between those around a target (an engine upgrade) is read
        from the next cycle on, where `_fits` would not notice it. A pool not learned is left to a
        read of every bucket. A bound gone stays in the increases for a window: each refresh then
        asks for it, and the totals' answer lacking it is read whole again (`_fits`)."""
        for base, pools in pool_bucket_les(samples, self.pool_by).items():
            learned = self._total_les.get(base)
            if learned:
                learned.update((pool, les) for pool, les in pools.items() if pool in learned)

    def _fits(self, base: str, got: list) -> bool:
        """Whether an answer read at the `le` values learned has, for every pool in it or learned,
        each bucket that pool's targets need (else the pool is new, or a bucket went; a bound added
        among the learned ones is not seen here but from the increases: `_relearn_les`)."""
        learned = self._total_les.get(base, {})
        found = pool_bucket_les(got, self.pool_by).get(base, {})
        thresholds = self._thresholds(base) or ()
        for pool in set(learned) | set(found):
            if pool not in learned:
                return False
            have = {le for _b, le in found.get(pool, ())}
            if not needed_les(learned[pool], thresholds) <= have:
                return False
        return True

    def _thresholds(self, base: str) -> Optional[tuple[float, ...]]:
        """The pool SLO targets' seconds on the base's kind; None: not known (every bucket is read)."""
        if self.total_bounds is None:
            return None
        return self.total_bounds.get(_kind_of(base))

    def _last_totals(self, now: float, out: Any) -> None:
        """The last cumulative buckets read, with the time they were read (none yet: empty, unknown):
        a pool SLO never records them again as a new point (monitor/capacity/slo_judge.py)."""
        if not self.total_kinds:
            out.pool_totals = {}
            return
        if self._totals is not None:
            out.totals_at, out.pool_totals = self._totals
            out.stale_seconds["totals"] = max(0.0, now - self._totals[0])
        else:
            out.pool_totals, out.totals_at = {}, None
            out.stale_seconds["totals"] = math.nan


def _kind_of(base: str) -> str:
    return next((kind for kind, b in histogram_bases() if b == base), "")


def joined(answers: list[Answer]) -> Union[list, PrometheusError]:
    """The answers' samples in one vector, or the first failure among them."""
    failed = next((a for a in answers if isinstance(a, PrometheusError)), None)
    return failed if failed is not None else [s for got in cast("list[list]", answers) for s in got]


def lacking_kinds(hists: dict[str, dict], spare: dict[str, str], slos: Optional[dict[str, tuple[str, ...]]]) -> bool:
    """Whether a pool's histograms (per pool key and kind: the cumulative buckets here, the window's
    increases in prometheus_pool_reads) lack a kind one of `spare`'s candidates (found, not asked:
    prometheus_queries.needed_bases) could give - the earlier candidate's buckets answered nothing
    for it - and its pool SLO reads (`slos`: pool name or key -> kinds; None: every pool, every
    kind): a pool without one lacking a kind (its engine has no such histogram) does not have the
    spare ones asked every read."""
    kinds = {_kind_of(base) for base in spare} - {""}
    for pool, got in hists.items():
        wanted = kinds if slos is None else kinds & set(slos.get(pool) or slos.get(name_of(pool), ()))
        if any(kind not in got for kind in wanted):
            return True
    return False


__all__ = ["TOTAL", "Answer", "PoolTotalReads", "joined", "lacking_kinds"]
