"""Pure derivations: replica readings over time -> per-replica and per-pool snapshots.

Input is the recent history of readings per target (oldest first). Gauges come from the newest
reading; rates and latency windows from the oldest reading inside the window against the newest,
counter resets handled as PromQL does (monitor/derive/counters.py: the increase across a reset is
the new value; it never goes negative). Nothing is invented: a rate needs two readings, a quantile
needs observations in the window.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

from ..model import COUNTERS, Histogram, PoolSnapshot, Quantiles, ReplicaReading, ReplicaSnapshot
from ..model.poolkey import PoolBy, key_of, make_key, name_of
from .counters import histogram_increase, increase
from .edges import derive_edges
from .histogram import quantiles
from .kv_band import KvBand, kv_band, sum_bands, tokens_per_request_between
from .slow import itl_in_window, latency_ratios

LATENCY_KINDS = ("ttft", "itl", "e2e", "queue")


def pool_of(reading: ReplicaReading, pool_by: PoolBy = "model_name") -> str:
    """The replica's pool key (monitor/model/poolkey.py): the last pool_by label names it, the others
    ride along (`global.pool_by: [cluster, model_name]` -> 'model{cluster="a"}')."""
    if pool_by in ("model_name", "model") or pool_by == ("model_name",):
        return make_key(reading.model)  # the model itself unless it would read back as labels
    return key_of(reading.labels, reading.model, pool_by)


def window_pair(readings: list[ReplicaReading], now: float, window_seconds: float
                ) -> Optional[tuple[ReplicaReading, ReplicaReading]]:
    """(oldest reading inside the window, newest reading), or None with fewer than two."""
    if len(readings) < 2:
        return None
    newest = readings[-1]
    oldest = None
    for r in readings[:-1]:
        if newest.timestamp - r.timestamp <= window_seconds + 1e-9:
            oldest = r
            break
    if oldest is None:
        oldest = readings[-2]
    if newest.timestamp <= oldest.timestamp:
        return None
    return oldest, newest


def stalled(readings: list[ReplicaReading], window: float) -> bool:
    """A replica with work (running or waiting) at both ends of the last `window` seconds whose
    completions and generated tokens did not move over it: admitted work is not being done. Slow
    but moving work is not stalled; a counter reset is movement (the engine restarted)."""
    if not readings or window <= 0:
        return False
    newest = readings[-1]
    if (newest.running or 0) + (newest.waiting or 0) <= 0:
        return False
    older = [r for r in readings if r.timestamp <= newest.timestamp - window]
    if not older:
        return False  # not watched for a whole window yet
    old = older[-1]
    if (old.running or 0) + (old.waiting or 0) <= 0:
        return False
    moved = False
    for key in ("request_success", "generation_tokens"):
        a, b = newest.counters.get(key), old.counters.get(key)
        if a is None or b is None:
            return False  # no counter to judge by: unknown, never stalled
        d = increase(a, b)
        moved = moved or (d is not None and d > 0) or a < b
    return not moved


def derive_pools(history: dict[str, list[ReplicaReading]], now: float, window_seconds: float,
                 pool_by: PoolBy = "model_name", down_targets: Iterable[str] = (),
                 expected: Optional[dict[str, set[str]]] = None, stall_window: float = 0.0,
                 anomalies: Optional[dict[str, float]] = None,
                 pool_histograms: Optional[dict[str, dict[str, Histogram]]] = None,
                 pool_totals: Optional[dict[str, dict[str, Histogram]]] = None,
                 pool_totals_at: Optional[float] = None) -> list[PoolSnapshot]:
    """Per-pool snapshots from readings. `history` maps target -> readings of ONE model, oldest first.

    down_targets: targets that failed this cycle (their old readings are not used as current).
    expected: pool -> targets known to belong to it (for replicas_configured and staleness).
    stall_window: seconds over which a replica with work must complete something (`stalled`);
        0 turns the check off. A stalled replica is counted in `stalled_replicas` and its KV
        capacity in `stalled_kv_tokens_capacity`, so the capacity layer can leave both out.
    anomalies: counts by kind; a pool sum of finite values that overflows (to +Inf) is unknown
        (None) and counted here as `overflow`, never +Inf.
    pool_histograms: Prometheus mode: pool -> kind -> the latency histogram's increase over the
        window as the query layer summed it; the pools' quantiles come from these (a kind absent is
        unknown), not from the replicas' readings. pool_totals: the same, cumulative (pool SLOs),
        read at `pool_totals_at` (earlier than `now` when the last read of them is reused).
    """
    down = set(down_targets)
    pools: dict[str, PoolSnapshot] = {}
    members: dict[str, list[list[ReplicaReading]]] = {}
    for readings in history.values():
        if not readings:
            continue
        newest = readings[-1]
        pool = pool_of(newest, pool_by)
        if pool not in pools:
            pools[pool] = PoolSnapshot(pool=pool, model=newest.model, replicas=0)
            members[pool] = []
        members[pool].append(readings)
    if expected:
        for pool in expected:
            if pool not in pools:
                pools[pool] = PoolSnapshot(pool=pool, model=name_of(pool), replicas=0)
                members[pool] = []

    for pool, snap in pools.items():
        series = members[pool]
        configured = {rs[-1].target for rs in series}
        if expected and pool in expected:
            configured |= expected[pool]
        snap.replicas_configured = len(configured)
        fresh = [rs for rs in series if rs[-1].target not in down]
        snap.replicas = len(fresh)
        # stale = nothing current is known about the pool. A pool that lost some replicas is not
        # stale: its values come from the replicas that answered, and the lost ones show up as lost
        # capacity (replicas < replicas_configured), which is exactly when headroom matters.
        snap.stale = not fresh
        if fresh:
            snap.last_fresh_timestamp = max(rs[-1].timestamp for rs in fresh)
        _gauges(snap, fresh)
        bands = {id(rs): replica_band(rs, now, window_seconds) for rs in series}
        ratios = latency_ratios({rs[-1].target: itl_in_window(rs, now) for rs in fresh})
        pool_band = sum_bands([bands[id(rs)] for rs in fresh])
        snap.kv_tokens_live, snap.kv_tokens_live_low, snap.kv_tokens_live_high = pool_band[:3]
        snap.kv_tokens_method = None if pool_band.method == "unknown" else pool_band.method
        for rs in series:
            r = rs[-1]
            up = r.target not in down
            stuck = up and stalled(rs, stall_window)
            band = bands[id(rs)]
            if stuck:
                snap.stalled_replicas += 1
                snap.stalled_kv_tokens_capacity += r.kv_capacity_tokens or 0.0
            snap.replica_detail.append(ReplicaSnapshot(
                replica=r.target, pool=pool, up=up,
                active_requests=r.running if up else None,
                queued_requests=r.waiting if up else None,
                kv_tokens_live=band.estimate if up else None,
                kv_tokens_capacity=r.kv_capacity_tokens,
                kv_usage_ratio=r.kv_usage if up else None,
                stalled=stuck,
                kv_tokens_live_low=band.low if up else None,
                kv_tokens_live_high=band.high if up else None,
                kv_tokens_method=band.method if up and band.high is not None else None,
                latency_ratio=ratios.get(r.target) if up else None,
            ))
        given = None if pool_histograms is None else pool_histograms.get(pool, {})
        if pool_totals is not None:
            snap.latency_totals = pool_totals.get(pool, {})
            snap.latency_totals_at = pool_totals_at
        overflowed = _rates(snap, fresh, now, window_seconds, given)
        derive_edges(snap, fresh, lambda rs: window_pair(rs, now, window_seconds))
        _unknown_if_overflowed(snap, anomalies if anomalies is not None else {}, overflowed)
    return sorted(pools.values(), key=lambda p: p.pool)


def replica_band(readings: list[ReplicaReading], now: float, window: float) -> KvBand:
    """A replica's live KV tokens with their band (derive/kv_band.py): block usage x capacity
    corrected for the running requests' partly filled last blocks, with the tokens per request of
    the requests finished over the window when they say requests fit in one block."""
    newest = readings[-1]
    pair = window_pair(readings, now, window)
    per_request = tokens_per_request_between(pair[0], newest) if pair is not None else None
    return kv_band(newest.kv_live_tokens, newest.running, newest.block_size, per_request,
                   None if newest.kv_unit_exact else newest.kv_unit_max)


SUMMED = ("active_requests", "queued_requests", "kv_tokens_live", "kv_tokens_live_low", "kv_tokens_live_high",
          "rendering_requests", "kv_tokens_capacity", "kv_usage_ratio",
          "completion_rate", "prompt_tokens_rate", "generation_tokens_rate", "prefix_cache_hit_ratio",
          "preemption_rate", "mean_concurrency", "littles_law_ratio", "stalled_kv_tokens_capacity")


def _unknown_if_overflowed(snap: PoolSnapshot, anomalies: dict[str, float], over: int = 0) -> None:
    """The replicas' values are finite (sources/vllm.py `checked`); a pool sum of them that is not
    (two replicas at 1.7e308) is unknown, counted as `overflow` (with the `over` latency histograms
    `_rates` left out). The load (active + queued) too."""
    for name in SUMMED:
        v = getattr(snap, name)
        if v is not None and not math.isfinite(v):
            setattr(snap, name, None if name != "stalled_kv_tokens_capacity" else 0.0)
            over += 1
    for reason in [k for k, v in snap.queued_by_reason.items() if not math.isfinite(v)]:
        del snap.queued_by_reason[reason]
        over += 1
    if snap.active_requests is not None and snap.queued_requests is not None and \
            not math.isfinite(snap.active_requests + snap.queued_requests):
        snap.active_requests = snap.queued_requests = None
        over += 1
    if over:
        anomalies["overflow"] = anomalies.get("overflow", 0.0) + over


def _sum(values: Iterable[Optional[float]]) -> Optional[float]:
    total = None
    for v in values:
        if v is not None:
            total = (total or 0.0) + v
    return total


def _gauges(snap: PoolSnapshot, fresh: list[list[ReplicaReading]]) -> None:
    newest = [rs[-1] for rs in fresh]
    snap.active_requests = _sum(r.running for r in newest)  # None: no replica exposed the family
    snap.queued_requests = _sum(r.waiting for r in newest)
    snap.engines = tuple(sorted({"sglang" if r.naming == "sglang" else "vllm" for r in newest}))
    reasons: dict[str, float] = {}
    for r in newest:
        for reason, v in r.waiting_by_reason.items():
            reasons[reason] = reasons.get(reason, 0.0) + v
    snap.queued_by_reason = reasons
    snap.kv_tokens_capacity = _sum(r.kv_capacity_tokens for r in newest)
    # the usage of the replicas whose live KV is known: a replica whose usage was unusable (NaN, > 1)
    # is unknown, never 0; none known -> None
    known = [r for r in newest if r.kv_live_tokens is not None and r.kv_capacity_tokens]
    capacity = _sum(r.kv_capacity_tokens for r in known)
    if capacity:
        snap.kv_usage_ratio = (_sum(r.kv_live_tokens for r in known) or 0.0) / capacity
    _engine_breakdowns(snap, newest)


def _summed(dicts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _engine_breakdowns(snap: PoolSnapshot, newest: list[ReplicaReading]) -> None:
    """By priority and by KV pool of hybrid models: each over the replicas reporting it (LoRA slots:
    monitor/derive/edges.py)."""
    snap.active_by_priority = _summed(r.running_by_priority for r in newest)
    snap.queued_by_priority = _summed(r.waiting_by_priority for r in newest)
    used = _summed({k: u for k, (u, _c) in r.kv_pools.items()} for r in newest)
    size = _summed({k: c for k, (_u, c) in r.kv_pools.items()} for r in newest)
    snap.kv_pool_usage = {k: used[k] / size[k] for k in sorted(size) if size[k] > 0}


def _rates(snap: PoolSnapshot, fresh: list[list[ReplicaReading]], now: float, window: float,
           given: Optional[dict[str, Histogram]] = None) -> int:
    """Rates, latency quantiles and Little's law over the window; returns how many latency kinds were
    left unknown because the replicas' histogram increases summed past the largest float. `given`:
    the pool's window histograms as the query layer summed them (Prometheus mode), used instead of
    the replicas' (which carry only sums and counts there)."""
    deltas: dict[str, float] = {}
    seconds: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    conc_sum = 0.0
    conc_n = 0
    window_used = None
    for rs in fresh:
        pair = window_pair(rs, now, window)
        if pair is None:
            continue
        old, new = pair
        dt = new.timestamp - old.timestamp
        window_used = max(window_used or 0.0, dt)
        for key in COUNTERS:
            d = increase(new.counters.get(key), old.counters.get(key))
            if d is None:
                continue
            deltas[key] = deltas.get(key, 0.0) + d
            seconds[key] = seconds.get(key, 0.0) + dt  # per-replica time, for the per-second sum
            deltas.setdefault("_rate_" + key, 0.0)
            deltas["_rate_" + key] += d / dt
        if new.waiting is not None and old.waiting is not None:
            snap.queue_growth_rate = (snap.queue_growth_rate or 0.0) + (new.waiting - old.waiting) / dt
        rendered = histogram_increase(new.histograms.get("render"), old.histograms.get("render"))
        if rendered is not None and rendered.sum >= 0:  # seconds spent rendering per second: requests rendering
            snap.rendering_requests = (snap.rendering_requests or 0.0) + rendered.sum / dt
        for kind in LATENCY_KINDS:
            hd = histogram_increase(new.histograms.get(kind), old.histograms.get(kind))
            if hd is None:
                continue
            hists[kind] = hd if kind not in hists else (hists[kind].plus(hd) or hists[kind])
        # mean observed concurrency over the window for this replica (time-weighted over readings)
        in_window = [r for r in rs if r.timestamp >= old.timestamp]
        c = _time_weighted_concurrency(in_window)
        if c is not None:
            conc_sum += c
            conc_n += 1
    snap.window_seconds = window_used
    if window_used is None:
        if given is not None:  # the query layer's window needs no second reading
            _given_latency(snap, given, {})
        return 0
    overflowed = [kind for kind, h in hists.items() if not _finite(h)]
    for kind in overflowed:
        del hists[kind]  # unknown: its quantiles would read the last bucket, its mean NaN
    snap.completion_rate = deltas.get("_rate_request_success")
    snap.prompt_tokens_rate = deltas.get("_rate_prompt_tokens")
    snap.generation_tokens_rate = deltas.get("_rate_generation_tokens")
    snap.preemption_rate = deltas.get("_rate_preemptions")
    for reason, key in (("rejected", "admission_rejections"), ("aborted", "request_aborted")):
        if "_rate_" + key in deltas:
            snap.shed_rates[reason] = deltas["_rate_" + key]
    q = deltas.get("prefix_cache_queries")
    if q:
        snap.prefix_cache_hit_ratio = deltas.get("prefix_cache_hits", 0.0) / q
    if given is not None:
        _given_latency(snap, given, hists)
    else:
        for kind in LATENCY_KINDS:
            snap.latency[kind] = quantiles(hists.get(kind)) if kind in hists else Quantiles()
    if conc_n:
        snap.mean_concurrency = conc_sum
    e2e = snap.latency.get("e2e")
    if (snap.completion_rate is not None and e2e is not None and e2e.mean is not None
            and snap.mean_concurrency):
        snap.littles_law_ratio = snap.completion_rate * e2e.mean / snap.mean_concurrency
    return len(overflowed)


def _given_latency(snap: PoolSnapshot, given: dict[str, Histogram], own: dict[str, Histogram]) -> None:
    """Prometheus mode: quantiles from the pool's bucket increases the query layer summed; the mean
    and the count of observations from the replicas' own sums and counts over their readings (exact,
    as in direct mode; the query layer's increases are extrapolated to the window's edges)."""
    for kind in LATENCY_KINDS:
        h = given.get(kind)
        q = quantiles(h) if h is not None and _finite(h) else Quantiles()
        mine = own.get(kind)
        if mine is not None and mine.count > 0:
            q.mean, q.count = mine.sum / mine.count, mine.count
        elif h is not None and q.count:
            q.mean = None  # the query layer gave buckets only: the mean needs the replicas' sums
        snap.latency[kind] = q


def _finite(h: Histogram) -> bool:
    return math.isfinite(h.sum) and math.isfinite(h.count) and all(map(math.isfinite, h.counts))


def _time_weighted_concurrency(readings: list[ReplicaReading]) -> Optional[float]:
    """Mean of running + waiting over the readings, weighting each by the time until the next."""
    pts = [(r.timestamp, (r.running or 0.0) + (r.waiting or 0.0)) for r in readings
           if r.running is not None or r.waiting is not None]
    if not pts:
        return None
    if len(pts) == 1:
        return pts[0][1]
    total = 0.0
    span = pts[-1][0] - pts[0][0]
    if span <= 0:
        return sum(v for _, v in pts) / len(pts)
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        total += (v0 + v1) / 2.0 * (t1 - t0)  # trapezoid: gauges are sampled, not stepped
    return total / span
