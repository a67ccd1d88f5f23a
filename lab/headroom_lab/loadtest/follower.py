"""The deferrable-budget follower: a gate that lets at most floor(budget x max) deferrable calls fly.

The contract it follows (issue 39): headroom exports `headroom_deferrable_budget_ratio{pool}` in
[0, 1], falling to 0 when the pool is over its SLO or the data behind it is stale. A batch worker
reads it every few seconds (from a headroom daemon's /metrics or a Prometheus query endpoint) and
keeps at most floor(budget x its max concurrency) deferrable calls in flight; 0 stops new ones.
Calls already in flight are never cut. A budget that cannot be read counts as 0: a worker that
cannot see the budget must not add load (the same rule as the budget's own fall to 0 on stale data).

Sources are callables returning a `Reading` (the budget, or None with the reason it is unknown),
so the gate works with any of them: headroom's /metrics, PromQL, or a stand-in for a run where the
metric does not exist yet (labelled as such in the results by whoever passes it).
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional
from urllib.parse import urlencode, urlparse

import requests

from monitor.kit.exposition import ExpositionError, parse

BUDGET_METRIC = "headroom_deferrable_budget_ratio"


@dataclass(frozen=True)
class Reading:
    budget: Optional[float]  # in [0, 1]; None: unknown (counted as 0)
    note: str = ""  # why it is unknown, or where it came from


def allowed_calls(budget: Optional[float], max_concurrency: int) -> int:
    """floor(budget x max), the budget clipped to [0, 1]; unknown or NaN budget: 0."""
    if budget is None or not math.isfinite(budget):
        return 0
    b = min(1.0, max(0.0, float(budget)))
    return int(math.floor(b * max_concurrency + 1e-9))


def budget_from_exposition(text: str, pool: Optional[str]) -> Reading:
    """The budget of `pool` in a Prometheus/OpenMetrics exposition body (headroom's /metrics). With
    pool None the body must hold exactly one series."""
    try:
        samples = parse(text, wanted=[BUDGET_METRIC], strict_end=False).get(BUDGET_METRIC)
    except ExpositionError as exc:
        return Reading(None, f"unreadable exposition: {exc}")
    if pool is not None:
        samples = [s for s in samples if s[0].get("pool") == pool]
    if not samples:
        return Reading(None, f"no {BUDGET_METRIC} series" + (f" for pool {pool!r}" if pool is not None else ""))
    if len(samples) > 1:
        pools = sorted(s[0].get("pool", "") for s in samples)
        return Reading(None, f"{len(samples)} {BUDGET_METRIC} series ({', '.join(pools)}): name the pool")
    return Reading(samples[0][1], "metrics")


def budget_from_promql(answer: dict, pool: Optional[str]) -> Reading:
    """The budget in a Prometheus /api/v1/query answer (an instant vector of the metric)."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        return Reading(None, f"query failed: {str(answer.get('error') if isinstance(answer, dict) else answer)[:200]}")
    result = (answer.get("data") or {}).get("result") or []
    if pool is not None:
        result = [r for r in result if (r.get("metric") or {}).get("pool") == pool]
    if len(result) != 1:
        return Reading(None, f"the query returned {len(result)} series, expected 1")
    try:
        return Reading(float(result[0]["value"][1]), "promql")
    except (KeyError, IndexError, TypeError, ValueError):
        return Reading(None, "the query's sample is not a number")


class HttpBudget:
    """Reads the budget over HTTP: a URL whose path ends in /api/v1/query is a Prometheus query
    endpoint (the metric is asked for by name and pool), any other is an exposition (/metrics)."""

    def __init__(self, url: str, pool: Optional[str] = None, timeout: float = 2.0,
                 http: Optional[requests.Session] = None):
        u = urlparse(url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"--budget-url must be an http(s) URL, got {url!r}")
        if u.username or u.password:
            raise ValueError("--budget-url must not carry credentials")
        self.url, self.pool, self.timeout = url, pool, timeout
        self.promql = u.path.rstrip("/").endswith("/api/v1/query")
        self.http = http or requests.Session()
        self.label = ("promql " if self.promql else "metrics ") + url

    def __call__(self) -> Reading:
        try:
            if self.promql:
                quoted = json.dumps(self.pool) if self.pool is not None else None  # PromQL takes Go string escapes
                sel = BUDGET_METRIC + (f"{{pool={quoted}}}" if quoted is not None else "")
                r = self.http.get(self.url + "?" + urlencode({"query": sel}), timeout=self.timeout)
                return budget_from_promql(r.json(), self.pool) if r.status_code == 200 else \
                    Reading(None, f"HTTP {r.status_code}")
            r = self.http.get(self.url, timeout=self.timeout)
            if r.status_code != 200:
                return Reading(None, f"HTTP {r.status_code}")
            return budget_from_exposition(r.text, self.pool)
        except (requests.RequestException, ValueError) as exc:
            return Reading(None, f"cannot read: {type(exc).__name__}")


class Gate:
    """At most `limit` holders at a time; the limit can change at any moment (a lower limit never
    takes a slot back: holders finish, and no new one enters until in flight < limit)."""

    def __init__(self, limit: int):
        self._cond = threading.Condition()
        self.limit = limit
        self.in_flight = 0
        self.peak = 0

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self.limit = limit
            self._cond.notify_all()

    def acquire(self, stop: threading.Event, until: float) -> bool:
        """Wait for a slot until `until` (epoch seconds) or `stop`; True when one was taken."""
        with self._cond:
            while self.in_flight >= self.limit:
                left = until - time.time()
                if stop.is_set() or left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
            if stop.is_set():
                return False
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            return True

    def release(self) -> None:
        with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()


class Follower:
    """Every `interval` seconds: read the budget, set the gate to floor(budget x max_concurrency)."""

    def __init__(self, source: Callable[[], Reading], max_concurrency: int, interval: float = 2.0,
                 label: str = ""):
        if max_concurrency < 1:
            raise ValueError(f"deferrable max concurrency must be >= 1, got {max_concurrency}")
        self.source = source
        self.max = max_concurrency
        self.interval = interval
        self.label = label or getattr(source, "label", "budget")
        self.gate = Gate(0)  # closed until the first reading
        self.log: list[tuple[float, Optional[float], int, str]] = []  # (time, budget, allowed, note)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def tick(self) -> int:
        try:
            reading = self.source()
        except Exception as exc:  # a broken source closes the gate, never the run
            reading = Reading(None, f"source failed: {type(exc).__name__}")
        n = allowed_calls(reading.budget, self.max)
        self.gate.set_limit(n)
        self.log.append((time.time(), reading.budget, n, reading.note))
        return n

    def start(self) -> "Follower":
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="budget-follower", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        nxt = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, nxt - time.monotonic())):
            nxt += self.interval
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def summary(self, t0: float, t1: float) -> dict:
        """What the gate allowed over [t0, t1): readings, unknown readings, the time-weighted mean
        of the allowed calls and the share of the time the gate was shut."""
        log = sorted(self.log)
        inside = [e for e in log if t0 <= e[0] < t1]
        span = max(1e-9, t1 - t0)
        weighted = shut = 0.0
        for i, (t, _b, n, _note) in enumerate(log):
            a, b = max(t, t0), min(log[i + 1][0] if i + 1 < len(log) else t1, t1)
            if b > a:
                weighted += n * (b - a)
                shut += (b - a) if n == 0 else 0.0
        notes = sorted({e[3] for e in inside if e[1] is None})
        return {"source": self.label, "max_concurrency": self.max, "interval_seconds": self.interval,
                "readings": len(inside), "unknown_readings": sum(1 for e in inside if e[1] is None),
                "unknown_reasons": notes[:5],
                "allowed_mean": weighted / span, "shut_fraction": shut / span, "gate_peak_in_flight": self.gate.peak}
