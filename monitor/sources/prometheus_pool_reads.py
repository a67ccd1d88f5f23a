"""Prometheus mode's pool latency histograms, as the reader asks for them (prometheus_reader.py).

From headroom's bundled recording rules when they are loaded and fit, else one increase query per
histogram family (prometheus_queries.pool_histogram_queries). The reader starts the queries of the
last read's histograms with the replica read; what this read needs and was not started (a histogram
new this read, the rules gone) is asked here; a pool SLO's cumulative buckets apart, every read
(prometheus_pool_totals.py). A mixin of PrometheusSourceReader: it uses the
reader's source, pools, window, selector, query and note methods.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union, cast

from monitor.derive.core import pool_of
from monitor.kit.http import redact

from .prometheus import PrometheusError
from .prometheus_pool_totals import Answer, PoolTotalReads, joined, lacking_kinds
from .prometheus_queries import (
    RULE_WINDOW,
    RULES_QUERY,
    pool_histogram_queries,
    pool_histograms,
    rule_histograms,
    rule_tagged,
)

if TYPE_CHECKING:
    from .settings import PrometheusSource

log = logging.getLogger("monitor.sources.prometheus")

# The pools' bucket increases over the latency window are asked again once this share of the window
# has passed since they last answered (30 s at 5m; every third 10 s cycle), not every cycle: a
# tenth of the window at most is missing from them, their age is exported
# (headroom_source_stale_seconds{part="histograms"}), and four queries of every bucket series were
# three quarters of Prometheus' CPU for a cycle (issue 42). Asked at once whatever their age after a
# failure and when the histograms or queries change. A pool SLO's cumulative buckets are asked apart,
# every cycle (prometheus_pool_totals.py).
REFRESH_SHARE = 0.1
REFRESH_SLACK = 1.0  # seconds: a read that much early (a cycle's jitter) counts as due
RULES = "rules"  # the key of the rules' query among the histogram queries (the others: their base names)


class PoolHistogramReads(PoolTotalReads):
    """The pool histogram part of PrometheusSourceReader (the cumulative buckets: PoolTotalReads)."""

    if TYPE_CHECKING:  # what PrometheusSourceReader gives this mixin (its __init__ and methods)
        src: PrometheusSource
        selector: str
        pool_by: list[str]
        latency_window: float
        _hists: Optional[tuple[float, dict]]
        _rules: Optional[bool]
        _spare: dict[str, str]
        _failing: dict[str, str]
        histogram_every: float
        _hist_asked: Optional[tuple[float, dict[str, str], frozenset[str]]]

        def _start(self, call: Callable[..., list]) -> Future: ...
        @staticmethod
        def _answer(call: Callable[[], list]) -> Answer: ...
        def _query(self, query: str, deadline: Optional[float], **kw: Any) -> list: ...
        def _note(self, part: str, reason: Optional[str], detail: str = "") -> None: ...
        def _last_histograms(self, now: float, out: Any) -> None: ...  # out: a PrometheusRead

    def _histograms(self, now: float, deadline: Optional[float], out: Any, present: dict[str, str],
                    started: dict[str, tuple[str, Future]], start: float) -> None:
        """Every pool's latency histograms, summed by the query layer, into `out` (a PrometheusRead):
        the increases over the window (the last ones when due later or when it fails) and, with a
        pool SLO, the cumulative buckets of this read (PoolTotalReads).
        `started`: the queries already asked (key -> (query, future)); one this read needs and did
        not start (a histogram new this read, the rules gone) is asked now. `start`: the steady time
        the read began (what the refresh is timed from, so a slow read does not push it a cycle on)."""
        self._window_histograms(now, deadline, out, present, started, start)
        self._pool_totals(now, deadline, out, present, started)

    def _window_histograms(self, now: float, deadline: Optional[float], out: Any, present: dict[str, str],
                           started: dict[str, tuple[str, Future]], start: float) -> None:
        """`_histograms`' bucket increases over the latency window (`out.pool_histograms`)."""
        if not present:  # no replica has a latency histogram: nothing to ask
            out.pool_histograms = {}
            out.stale_seconds["histograms"] = 0.0
            self._hist_asked = None
            return
        pools = frozenset(self._reading_pools(out))
        if not self._histograms_due(present, start, pools):
            self._last_histograms(now, out)
            return

        def answer(key: str, query: str) -> Answer:
            got = started.get(key)
            future = got[1] if got is not None and got[0] == query else self._start(lambda: self._query(query, deadline))
            return self._answer(future.result)

        from_rules: Union[dict, PrometheusError] = {}
        ruled: list = []  # the rules' series, tagged with their base names (a pool SLO's `le` values)
        rules = self._histogram_asks(present, with_rules=True).get(RULES)
        if rules is not None:
            got_rules = answer(RULES, rules)
            from_rules = self._rules_answer(got_rules)
            ruled = [] if isinstance(got_rules, PrometheusError) else rule_tagged(got_rules)
        asks = self._histogram_asks(present, with_rules=False)
        for key, query in asks.items():  # every query this read needs under way before one is waited on
            if started.get(key, ("",))[0] != query:
                started[key] = (query, self._start(lambda q=query: self._query(q, deadline)))
        got = joined([answer(key, query) for key, query in asks.items()])
        if isinstance(from_rules, PrometheusError) or isinstance(got, PrometheusError):
            exc = from_rules if isinstance(from_rules, PrometheusError) else cast(PrometheusError, got)
            self._note("histograms", exc.reason, exc.detail)
            self._last_histograms(now, out)
            return
        vector = got
        self._relearn_les(vector + ruled)  # every bucket each pool has: a pool SLO's reads pick theirs
        out.pool_histograms = pool_histograms(vector, self.pool_by)[0]
        for pool, kinds in from_rules.items():
            out.pool_histograms.setdefault(pool, {}).update(kinds)
        if self._spare and lacking_kinds(out.pool_histograms, self._spare, None):
            spare = joined([self._answer(partial(self._query, q, deadline)) for q in pool_histogram_queries(
                self.selector, self.pool_by, self.latency_window, self._spare).values()])
            if isinstance(spare, PrometheusError):
                self._note("histograms", spare.reason, spare.detail)
                self._last_histograms(now, out)
                return
            window = pool_histograms(vector + spare, self.pool_by)[0]
            for pool, kinds in from_rules.items():
                window.setdefault(pool, {}).update(kinds)
            out.pool_histograms = window
        self._note("histograms", None)
        out.stale_seconds["histograms"] = 0.0
        self._hists = (now, out.pool_histograms)
        self._hist_asked = (start, self._histogram_asks(present, with_rules=True), pools)

    def _histograms_due(self, present: dict[str, str], start: float, pools: Optional[frozenset] = None) -> bool:
        """Whether this read (begun at steady time `start`) asks the pools' histograms: none held, the
        last read of them failed, the queries changed (histograms found or gone, the rules loaded or
        not), a pool read now was not read when they last answered (`pools`, once the replicas are
        read: a new pool's quantiles are not left unknown until the next refresh), or
        `histogram_every` seconds have passed between the starts of the reads (REFRESH_SHARE). A pool
        SLO's cumulative buckets are asked every read, apart (prometheus_pool_totals.py)."""
        asked = self._hist_asked
        return (asked is None or self._hists is None or "histograms" in self._failing
                or start - asked[0] >= self.histogram_every - REFRESH_SLACK
                or asked[1] != self._histogram_asks(present, with_rules=True)
                or (pools is not None and not pools <= asked[2]))

    def _reading_pools(self, out: Any) -> Iterable[str]:
        """The pool keys of this read's replica readings (the keys the histograms' answer is filed under)."""
        return (pool_of(r, tuple(self.pool_by) or "model_name") for r in out.readings)

    def _histogram_asks(self, present: dict[str, str], with_rules: bool) -> dict[str, str]:
        """key -> query of the pools' histograms: the bundled rules' (key RULES) when they fit and
        `with_rules`, and one increase query per histogram family of `present` (key: its base) -
        the vLLM ones left out while the rules answer."""
        asks: dict[str, str] = {}
        if self._rules_fit(present):
            if with_rules:
                asks[RULES] = RULES_QUERY
            if self._rules:
                present = {base: name for base, name in present.items() if not base.startswith("vllm:")}
        asks.update(pool_histogram_queries(self.selector, self.pool_by, self.latency_window, present))
        return asks

    def _rules_fit(self, present: dict[str, str]) -> bool:
        """Whether the bundled recording rules can give the vLLM pools' latency buckets: enabled,
        latency_window 5m, pools by model_name (a pool SLO's cumulative buckets are asked apart)."""
        return (self.src.recording_rules and self.latency_window == RULE_WINDOW and self.pool_by == ["model_name"]
                and any(b.startswith("vllm:") for b in present))

    def _rules_answer(self, got: Answer) -> Union[dict, PrometheusError]:
        """The vLLM pools' latency buckets from the rules' answer (empty: not loaded); whether they
        answered is kept (`_rules`: the next asks leave the vLLM increase queries out) and said when
        it changes."""
        if isinstance(got, PrometheusError):
            return got
        hists = rule_histograms(got)
        if not hists:
            if self._rules is not False:
                log.info("the bundled recording rules are not loaded in %s: the pools' latency buckets are "
                         "computed by one query per histogram family each cycle", redact(self.src.url))
            self._rules = False
            return {}
        if self._rules is not True:
            log.info("the pools' latency buckets come from headroom's recording rules in %s", redact(self.src.url))
        self._rules = True
        return hists
