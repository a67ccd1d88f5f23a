"""A pool's latency targets judged each cycle (pure): the SLO shares, burn rates and what the slo
limit reads (monitor/capacity/enrich.py calls these with its `CapacityState`).

    stats = slo_windows(state, pool, task_cumulative, stats, now)   # a task type's share and burn rates
    slos = pool_slos(state, pool, history, now, gateway_calls)       # the pool's own targets
    state.judged[pool]                                               # every target, for slo_limit.py

Each target's observations and bad ones over the latency window are the SLO tracker's
(`SloTracker.counts`, monitor/capacity/slo.py): `judge` keeps them as a `Judged` for the pool's slo
limit (monitor/capacity/slo_limit.py). A pool target on `call` is judged on the pool's gateways' call
latency (monitor/capacity/gateway_latency.py `gateway_call_totals`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Optional, Sequence

from monitor.capacity.slo import Target, bad_count, window_burn
from monitor.capacity.slo_limit import judged_from_counts
from monitor.derive import histogram as histo
from monitor.model import Histogram, PoolSlo, PoolSnapshot, ReplicaReading, TaskStats
from monitor.model.poolkey import extras_of

History = Mapping[str, Sequence[ReplicaReading]]  # "target|model" -> readings, oldest first


def _sum_hist(hs: list[Histogram]) -> Optional[Histogram]:
    try:
        return histo.merge(hs)
    except ValueError:
        return None


def slo_windows(state, pool: str, t, stats: TaskStats, now: float) -> TaskStats:
    """The task type's SLO share over the latency window and its burn rates (SloTracker)."""
    target = state.slo.task_target(stats.task_type)
    if target is None:
        return stats
    h = t.task_duration if target.signal == "task" else (t.ttft if target.signal == "ttft" else t.call_latency)
    if h is None:
        return stats
    total = histo.total(h)
    bad = (histo.fraction_above(h, target.seconds) or 0.0) * total
    key = (pool, stats.task_type, target_tag(target))
    try:
        state.tracker.observe(key, now, total, bad)
    except ValueError:
        return stats
    ratio = state.tracker.ratio(key, state.window)
    judge(state, pool, stats.task_type, target, key)
    if ratio is not None:
        stats = replace(stats, slo_violation_ratio=ratio, slo_window_seconds=state.window)
    rates, source = burn_rates(state, key, target)
    return replace(stats, slo_burn_rate=rates, slo_source=source)


def judge(state, pool: str, name: str, target: Target, key: tuple) -> None:
    """The target's counts over the latency window, for the pool's slo limit (slo_limit.py)."""
    judged = judged_from_counts(name, target.seconds, target.budget, state.tracker.counts(key, state.window))
    if judged is not None:
        state.judged.setdefault(pool, []).append(judged)


def target_tag(target: Target) -> str:
    """Part of a tracker key: counts over another target (a changed config) are not mixed in."""
    return f"{target.signal}<={target.seconds:g}"


def burn_rates(state, key: tuple, target: Target) -> tuple[dict, str]:
    """(window -> burn rate, source): Prometheus' counts when it has the task type's series and the
    task type feeds one pool only (its series carry no pool; with extra pool_by labels, one pool of
    the series' cluster; series without the cluster label, one pool of the whole fleet), else the
    tracker's."""
    pool, task_type = key[0], key[1]
    seen = state.slo_task_pools.setdefault(task_type, {})
    seen[pool] = state.tracker.newest(key) or seen.get(pool, 0.0)
    extras = tuple(extras_of(pool).items())  # with extra pool_by labels, Prometheus' windows are per cluster
    cycle = state.slo_cycle_windows or {}
    windows = cycle.get((target.signal, task_type, *((extras,) if extras else ())))
    feeding = sum(1 for p in seen if tuple(extras_of(p).items()) == extras)
    if windows is None and extras:  # the gateway's series carry no cluster label: fleet-wide counts
        windows, feeding = cycle.get((target.signal, task_type, tuple((k, "") for k, _ in extras))), len(seen)
    if windows is None or feeding > 1:
        return state.tracker.burn_rates(key, target), "tracker"
    return {name: window_burn(bad_count(windows.get(name), target), target) for name in state.slo.windows}, "prometheus"


def pool_slos(state, p: PoolSnapshot, history: History, now: float,
               calls: Optional[Histogram] = None) -> dict[str, PoolSlo]:
    """Pool-level latency targets (ttft, e2e, queue, itl) over the summed replica histograms (in
    Prometheus mode the query layer's sums, observed at the time they were read); `call` over the
    pool's gateways' call latency (`calls`, cumulative)."""
    out: dict[str, PoolSlo] = {}
    targets = state.slo.pool_targets.get(p.pool) or state.slo.pool_targets.get(p.name, [])
    if not targets:
        return out
    newest = [rs[-1] for rs in history.values() if rs]  # the pool's own series
    for target in targets:
        at = now
        if target.signal == "call":  # the gateways' call latency: what the callers wait
            h = calls
        elif p.latency_totals is not None:  # Prometheus mode: the query layer summed the pool's buckets
            h = p.latency_totals.get(target.signal)
            at = now if p.latency_totals_at is None else min(now, p.latency_totals_at)
        else:
            h = _sum_hist([r.histograms[target.signal] for r in newest if target.signal in r.histograms])
        if h is None:
            continue
        slo = PoolSlo(target.signal, target.seconds, target.objective)
        total = histo.total(h)
        key = (p.pool, slo.key, target_tag(target))
        held = state.tracker.newest(key)
        # the query layer's last totals, reused (it did not answer this cycle): a point when they were
        # read, never again at a later time (that would flatten the burn)
        if not (at < now and held is not None and at <= held):
            try:
                state.tracker.observe(key, at, total, (histo.fraction_above(h, target.seconds) or 0.0) * total)
            except ValueError:
                continue
        judge(state, p.pool, slo.key, target, key)
        out[slo.key] = replace(slo, slo_violation_ratio=state.tracker.ratio(key, state.window),
                               slo_burn_rate=state.tracker.burn_rates(key, target))
    return out


__all__ = ["burn_rates", "judge", "pool_slos", "slo_windows", "target_tag"]
