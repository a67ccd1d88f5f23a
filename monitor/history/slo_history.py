"""Where the SLO burn windows' history is kept and read: the embedded store, or Prometheus.

    restore(tracker, store)        the tracker rebuilt from the store's `slo_counts` table (a restart)
    save(tracker, store, now)      what the tracker added and dropped since the last save, one transaction
    PrometheusWindows(client, ...) Prometheus mode: each window's counts per task type, read at the
                                   cycle's time with one query per window and histogram family
    keep_windows(tracker, store, writable=...)   restore, and the listener that saves after each cycle
    prometheus_windows(client, slos, gateways, interval=..., timeout=..., pool_by=...)   the cycle's reader

Direct mode: the tracker (monitor/capacity/slo.py `SloTracker`) journals its points and the store
holds exactly the points the tracker holds (about 1,000 per key over 3 days), so a daemon that
restarts finds its windows still covered. Keys are saved as JSON (`["chat-8b", "summarise"]`).

Prometheus mode: Prometheus holds the histograms' history, so a window is read from it, not from
the process' memory. For a histogram family `m` with task label `L`, window `w` and a cycle's
tolerance `tol` (the cycle interval), the one query of the window is

    sum by (L, le) (increase(m_bucket[w]))
      or label_replace(count by (L) (m_count offset (w - tol)), "le", "covered", "", "")

(with `global.pool_by: [cluster, model_name]` both groupings also keep `cluster`: a gateway series
carrying its cluster, e.g. a Prometheus target label, feeds that cluster's pools' windows only); its
bucket rows are the window's histogram per task type (the bad share is read from it as the
tracker does); the `covered` row says Prometheus held the series at the window's start (a sample in
the lookback before `now - w + tol`). A task type with bucket rows but no `covered` row is not yet
covered (its burn rate is None); a task type with no row at all is not in Prometheus (the gateway
is scraped directly, not by Prometheus): the caller falls back to the persisted tracker.
"""
from __future__ import annotations

import json
import logging
import math
import time
from typing import Callable, Iterable, Optional

from monitor.capacity.slo import SloTracker
from monitor.model import Histogram, Snapshot
from monitor.model.poolkey import extra_labels
from monitor.sources.gateway_schema import APP_TASK_DURATION, APP_TASK_LABEL, DEFAULT_LABELS, GATEWAY_FAMILIES
from monitor.sources.prometheus import PrometheusError, partial_warnings

log = logging.getLogger(__name__)
COVERED = "covered"  # the `le` value of a window's coverage rows


def _encode(key) -> str:
    return json.dumps(list(key) if isinstance(key, tuple) else key, separators=(",", ":"))


def _decode(text: str):
    """A saved key back as the tracker holds it: lists (nested ones too) as tuples."""
    def hashable(value):
        return tuple(hashable(v) for v in value) if isinstance(value, list) else value
    return hashable(json.loads(text))


def _is_key(key) -> bool:
    """A tracker's key: a string, or a non-empty tuple of strings, numbers and such tuples."""
    if isinstance(key, str):
        return True
    return isinstance(key, tuple) and bool(key) and all(
        _is_key(k) or (isinstance(k, (int, float)) and not isinstance(k, bool)) for k in key)


def restore(tracker: SloTracker, store, skipped=None) -> int:
    """Load the store's saved points into `tracker`; returns the number of keys restored. A row that
    cannot be placed (its key not a JSON string or list of strings, a value not a finite number:
    SQLite keeps a text in a REAL column) is skipped, never fatal: logged once, with how many, and
    `skipped(n)` told (headroom_store_errors_total{operation="restore"})."""
    rows, bad = [], 0
    for row in store.slo_rows():
        point = _slo_row(row)
        if point is None:
            bad += 1
        else:
            rows.append(point)
    if bad:
        log.warning("history store slo_counts: %d rows skipped (a key or value of the wrong type); the SLO windows "
                    "are restored from the other %d rows", bad, len(rows))
        if skipped is not None:
            skipped(bad)
    tracker.restore(rows)
    return len({r[0] for r in rows})


def _slo_row(row) -> Optional[tuple]:
    """(key, ts, total, bad, raw_total, raw_bad) of one saved row, typed; None for a row that is not."""
    try:
        key, *values = row
        key = _decode(key)
    except (TypeError, ValueError):
        return None
    if not _is_key(key):
        return None  # a number, a mapping, an empty list: not a tracker's key
    if len(values) != 5 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        return None
    return (key, *values)


def save(tracker: SloTracker, store, now: float) -> int:
    """Write what the tracker added and dropped since the last save (one transaction); keys not
    observed for longer than the tracker keeps history are deleted. Returns the points written."""
    added, dropped = tracker.drain()
    try:
        return store.slo_apply([(_encode(k), *rest) for k, *rest in added],
                               [(_encode(k), ts) for k, ts in dropped], expire_before=now - tracker.keep)
    except Exception:
        tracker.requeue(added, dropped)  # written at the next save that succeeds: no gap, no stale point
        raise


def _seconds(value: float) -> str:
    return f"{max(1, int(round(value)))}s"


def window_query(metric: str, label: str, window: float, tolerance: float, extra: tuple[str, ...] = ()) -> str:
    """The one PromQL query of a window (module docstring); `extra`: the extra pool_by labels, kept apart."""
    by = ", ".join((label, *extra))
    offset = window - tolerance
    present = f"count by ({by}) ({metric}_count{{{label}!=\"\"}}"
    present += f" offset {_seconds(offset)})" if offset >= 1 else ")"
    return (f"sum by ({by}, le) (increase({metric}_bucket{{{label}!=\"\"}}[{_seconds(window)}]))"
            f" or label_replace({present}, \"le\", \"{COVERED}\", \"\", \"\")")


def families(signal: str, gateways: Iterable[tuple[str, Optional[str]]]) -> list[tuple[str, str]]:
    """(histogram base name, task label) read for a target signal ("task", "call", "ttft"), given the
    configured gateways as (kind, task label or None for the kind's default)."""
    if signal == "task":
        return [(APP_TASK_DURATION, APP_TASK_LABEL)]
    out: list[tuple[str, str]] = []
    for kind, task_label in gateways:
        fam = GATEWAY_FAMILIES[kind]
        label = task_label if task_label is not None else DEFAULT_LABELS[kind][0]
        if not label:
            continue
        for metric in (fam.call_latency if signal == "call" else fam.ttft if signal == "ttft" else ()):
            if (metric, label) not in out:
                out.append((metric, label))
    return out


def histogram_of(rows: dict[float, float]) -> Optional[Histogram]:
    """le -> increase, as a cumulative `Histogram` (None without a +Inf bucket)."""
    if not rows or not any(math.isinf(b) for b in rows):
        return None
    bounds = tuple(sorted(rows))
    counts = tuple(max(0.0, rows[b]) for b in bounds)
    return Histogram(bounds, counts, 0.0, counts[-1])


# (signal, task type) -> window -> histogram; with extra pool_by labels the key is (signal, task type,
# ((label, value), ...)): the series' own cluster decides which pools' windows they are
Windows = dict[tuple, dict[str, Optional[Histogram]]]


class PrometheusWindows:
    """Reads every window's histogram per task type from Prometheus (`client.query`, the client of
    monitor/sources/prometheus.py) at the cycle's time. `signals`: the target signals configured;
    `gateways`: (kind, task label) of the configured gateways; `budget`: seconds all the cycle's
    queries may take together; `extra`: the extra pool_by labels (global.pool_by but the last): each
    window is read per task type and their values, as the pools are keyed."""

    def __init__(self, client, windows: dict[str, float], signals: Iterable[str],
                 gateways: Iterable[tuple[str, Optional[str]]] = (), tolerance: float = 0.0,
                 budget: float = 5.0, extra: tuple[str, ...] = ()) -> None:
        self.client, self.windows, self.tolerance, self.budget = client, dict(windows), float(tolerance), budget
        self.extra = tuple(extra)
        gws = list(gateways)
        self.plan = {sig: families(sig, gws) for sig in sorted(set(signals))}

    def _key(self, task_type: str, labels: dict) -> tuple:
        """(task type,) or, with extra pool_by labels, (task type, ((label, value), ...)): a series
        without one of them has it empty, as a replica without it is keyed."""
        if not self.extra:
            return (task_type,)
        return task_type, tuple((x, labels.get(x, "")) for x in self.extra)

    def _query(self, query: str, at: Optional[float], deadline: float) -> list:
        """One window's rows; a partial answer raises PrometheusError `partial`: the windows of a part
        of the fleet are never the fleet's (the caller falls back to the tracker, said once)."""
        warnings: list[str] = []
        got = self.client.query(query, at=at, deadline=deadline, warnings=warnings)
        partial = partial_warnings(warnings)
        if partial:
            raise PrometheusError("partial", f"a partial answer ({len(partial)} warning(s)): {partial[0]}")
        return got

    def queries(self) -> int:
        """Queries one read sends: one per window and histogram family."""
        return len(self.windows) * sum(len(f) for f in self.plan.values())

    def read(self, now: Optional[float] = None) -> Windows:
        """(signal, task type[, extra labels]) -> {window: histogram of the window, None when not
        covered} at `now`, or at the query layer's own time when None (the cycle's: never headroom's
        clock, which may have stepped); a task type Prometheus holds no series of is absent. Raises the
        client's error (PrometheusError) when a query fails: the caller falls back to the tracker."""
        deadline = time.monotonic() + self.budget
        out: Windows = {}
        for signal, fams in self.plan.items():
            for name, secs in self.windows.items():
                buckets: dict[tuple, dict[float, float]] = {}
                covered: set[tuple] = set()
                for metric, label in fams:
                    query = window_query(metric, label, secs, self.tolerance, self.extra)
                    for labels, value in self._query(query, now, deadline):
                        le = labels.get("le")
                        if not labels.get(label) or le is None:
                            continue
                        task = self._key(labels[label], labels)
                        if le == COVERED:
                            covered.add(task)
                            continue
                        try:
                            bound = float(le)
                        except ValueError:
                            continue
                        if math.isfinite(value):
                            rows = buckets.setdefault(task, {})
                            rows[bound] = rows.get(bound, 0.0) + value
                for task in sorted(set(buckets) | covered):
                    h = histogram_of(buckets.get(task, {})) if task in covered else None
                    out.setdefault((signal, *task), {})[name] = h
        return out


def keep_windows(tracker: SloTracker, store, *, writable: bool, guard=None,
                 skipped=None) -> Optional[Callable[[Snapshot], None]]:
    """The tracker restored from `store`; when `writable`, the listener that saves it after every
    published snapshot (the application hands it to the pipeline's `on_snapshot`), else None.
    `guard(operation, fn)`: how the application runs a store write (monitor/app Store.guarded: counted,
    logged once, never after the store closed); `skipped(n)`: told how many saved rows the restore left out."""
    restore(tracker, store, skipped)
    if not writable:
        return None
    tracker.journal = True
    if guard is not None:
        return lambda snapshot: guard("append", lambda: save(tracker, store, snapshot.timestamp))
    return lambda snapshot: _save_logged(tracker, store, snapshot.timestamp)


def prometheus_windows(client, slos, gateways: Iterable[tuple[str, Optional[str]]], *, interval: float,
                       timeout: float, pool_by) -> PrometheusWindows:
    """Prometheus mode: the reader of every SLO window over `client` (the cycle's Prometheus client),
    which the cycle's `collect` reads (monitor/pipeline/cycle.py). `slos`: the merged SLO settings (their task
    targets' signals and windows); `gateways`: (kind, task label) of the configured gateways;
    `interval` (global.interval) is each window's tolerance; `timeout`: sources.prometheus.timeout."""
    targets = [*slos.task_targets.values(), slos.default_task_target]
    return PrometheusWindows(client, slos.windows, {t.signal for t in targets if t is not None}, gateways,
                             tolerance=interval, budget=min(timeout, max(1.0, 0.5 * interval)),
                             extra=extra_labels(pool_by))


def _save_logged(tracker: SloTracker, store, now: float) -> None:
    try:
        save(tracker, store, now)
    except Exception as exc:  # noqa: BLE001 (a full disk or a damaged store: the windows go on in memory)
        log.warning("saving the SLO windows to the history store failed: %s: %s", type(exc).__name__, exc)
