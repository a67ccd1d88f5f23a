"""The knee the digest reports: the one headroom learned where it learned one.

The history schema (monitor/model/schema.py) carries loads, not the knee. headroom records its
knee in two places, and the digest reads it from whichever it has:

- Prometheus mode: headroom's exported `headroom_knee_requests` (per pool: knee per replica x the
  replicas answering), `headroom_replicas` and `headroom_knee_info{source="learned"|"prior"}`.
  `knees_from_prometheus` reads them over the digest's history range with the history module's
  `read_range`, per copy of headroom (HA replicas of the daemon, a direct-mode and a Prometheus-mode
  daemon: series that differ in their target labels, `instance`, `pod`, `job`), and keeps per copy
  the newest learned knee (a restart starts from the prior again; the knee learned before it is
  still the best one known), else the newest prior, each with its own copy's source label. Across
  copies the pessimistic one decides (docs/runbook.md): the lowest knee per replica, named with the
  copy it came from.
- Direct mode (the daemon's store): the daemon's newest snapshot, `knees_from_snapshot`.

`choose` picks what a pool's digest uses, and says which:
    configured   pools.<pool>.knee_requests_per_replica (the operator pinned it)
    learned      headroom learned it from latency (the reading above)
    prior        nothing learned: headroom's prior from the engine's limits, else max_num_seqs
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from monitor.history.query_range import read_range
from monitor.model.poolkey import make_key


@dataclass(frozen=True)
class KneeReading:
    per_replica: float  # concurrent requests (active + queued) per replica at the knee
    source: str  # "learned" or "prior", as headroom labelled it
    at: Optional[float] = None  # Unix seconds of the reading
    signal: str = ""  # latency signal of a learned knee
    replicas: Optional[int] = None  # replicas answering when it was read (the digest's default replicas)
    copy: str = ""  # the copy of headroom it came from (its target labels, `instance="a:9880"`); "" for one
    copies: int = 1  # copies of headroom that exported a knee for the pool


COPY_RECENT = 900.0  # seconds: a copy whose knee was last seen longer before the pool's newest is gone
# labels of a knee series that are not the copy's: the pool's own and the knee's description
_NOT_COPY = ("__name__", "pool", "source", "signal")
_COPY_FIRST = ("job", "instance", "pod")


def copy_labels(labels: dict, extra: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """The labels that tell copies of headroom apart in one of its series: every label but the pool's
    (`pool` and the other pool_by labels) and the knee's own (`source`, `signal`)."""
    skip = set(_NOT_COPY) | set(extra)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in skip))


def copy_name(copy: tuple[tuple[str, str], ...]) -> str:
    """`job="headroom", instance="a:9880"` (job, instance, pod first, then the rest by name)."""
    order = sorted(copy, key=lambda kv: (_COPY_FIRST.index(kv[0]) if kv[0] in _COPY_FIRST else 9, kv[0]))
    return ", ".join(f'{k}="{v}"' for k, v in order)


def pessimistic(readings: dict, seen: Optional[dict] = None, recent: float = 0.0) -> dict:
    """{pool: {copy: KneeReading}} -> {pool: the reading with the lowest knee per replica}, named with
    its copy and the number of copies (the pessimistic copy decides, docs/runbook.md). With `seen`
    ({pool: {copy: when its knee series was last seen}}), only the copies seen within `recent`
    seconds of the pool's newest are compared: a pod replaced weeks ago is not a copy any more."""
    out = {}
    for pool, by_copy in readings.items():
        if seen is not None and seen.get(pool):
            newest = max(seen[pool].values())
            by_copy = {c: r for c, r in by_copy.items() if seen[pool].get(c, newest) >= newest - recent}
        copy, low = min(by_copy.items(), key=lambda kv: (kv[1].per_replica, kv[0]))
        out[pool] = replace(low, copy=copy_name(copy) if len(by_copy) > 1 else "", copies=len(by_copy))
    return out


def _per_replica_query(source: str, selector: str) -> str:
    m = f"{{{selector}}}" if selector else ""
    info = f'{{source="{source}"{", " + selector if selector else ""}}}'
    return (f"headroom_knee_requests{m} / (headroom_replicas{m} > 0) "
            f"and ignoring (source, signal) headroom_knee_info{info}")


def _key(labels: dict, extra: tuple[str, ...]) -> Optional[str]:
    """The pool key of a series of headroom's (its `cluster` beside `pool`: monitor/model/poolkey.py)."""
    name = labels.get("pool")
    if not name or not extra:
        return name
    return make_key(name, {e: labels.get(e, "") for e in extra}, extra)


def knees_from_prometheus(client, start: float, end: float, step: float, selector: str = "",
                          max_points: int = 10_000, extra: tuple[str, ...] = ()) -> dict[str, KneeReading]:
    """{pool key: the pessimistic copy's knee} from headroom's exported knee series
    (`client.query_range` as in monitor.sources.prometheus): per copy of headroom the newest learned
    knee in [start, end], else its newest prior, each with that copy's own source; across copies the
    lowest per replica. `extra`: the pool_by labels beside `pool` (a pool is (pool, cluster) with
    [cluster, model_name])."""
    per_copy: dict[str, dict] = {}
    seen: dict[str, dict] = {}  # pool -> copy -> newest time of its knee series, learned or prior
    for source in ("learned", "prior"):
        for labels, points in read_range(client, _per_replica_query(source, selector), start, end, step,
                                         max_points):
            pool, copy = _key(labels, extra), copy_labels(labels, extra)
            good = {t: v for t, v in points.items() if math.isfinite(v) and v > 0}
            if not pool or not good:
                continue
            t = max(good)
            seen.setdefault(pool, {})[copy] = max(t, seen.get(pool, {}).get(copy, t))
            if copy not in per_copy.get(pool, {}):
                per_copy.setdefault(pool, {})[copy] = KneeReading(float(good[t]), source, float(t))
    if per_copy:  # the replicas each copy saw at its newest reading: the digest's default replica count
        m = f"{{{selector}}}" if selector else ""
        for labels, points in read_range(client, f"headroom_replicas{m}", start, end, step, max_points):
            pool, copy = _key(labels, extra), copy_labels(labels, extra)
            good = {t: v for t, v in points.items() if math.isfinite(v) and v >= 1}
            if good and pool is not None and copy in per_copy.get(pool, {}):
                per_copy[pool][copy] = replace(per_copy[pool][copy], replicas=int(good[max(good)]))
    return pessimistic(per_copy, seen, max(2 * step, COPY_RECENT))


def knees_from_snapshot(snapshot) -> dict[str, KneeReading]:
    """{pool: its knee} from a `monitor.model.Snapshot` (the daemon's newest cycle)."""
    out: dict[str, KneeReading] = {}
    if snapshot is None:
        return out
    for p in snapshot.pools:
        c = p.capacity
        n = p.replicas - p.stalled_replicas
        if c is None or c.withheld or not c.knee_requests or n <= 0 or c.knee_source not in ("learned", "prior"):
            continue
        out[p.pool] = KneeReading(float(c.knee_requests) / n, c.knee_source, float(snapshot.timestamp),
                                  c.knee_signal or "", replicas=p.replicas)
    return out


def choose(configured: Optional[float], reading: Optional[KneeReading], max_num_seqs: Optional[int],
           fmt_time=None) -> tuple[Optional[float], str, str]:
    """(knee per replica, source, note in words) for one pool."""
    when = (lambda t: fmt_time(t)) if fmt_time else (lambda t: f"{t:.0f}")
    learned = reading if (reading is not None and reading.source == "learned") else None
    if configured:
        note = "configured in pools.<pool>"
        if learned is not None:
            note += f" (headroom learned {learned.per_replica:.1f} per replica)"
        return float(configured), "configured", note
    if learned is not None:
        signal = f" on {learned.signal}" if learned.signal else ""
        at = f", newest at {when(learned.at)}" if learned.at is not None else ""
        return learned.per_replica, "learned", f"learned by headroom from latency{signal}{at}{_copy_note(learned)}"
    if reading is not None:
        return reading.per_replica, "prior", ("nothing learned yet: headroom's prior from the engine's limits"
                                              + _copy_note(reading))
    if max_num_seqs:
        return float(max_num_seqs), "prior", "nothing learned yet: the prior max_num_seqs"
    return None, "prior", "nothing learned and no max_num_seqs: no knee"


def _copy_note(reading: KneeReading) -> str:
    """Which copy of headroom the knee came from, when several exported one."""
    if reading.copies <= 1 or not reading.copy:
        return ""
    return f"; from the copy {reading.copy}, the lowest of {reading.copies} copies of headroom"
