"""The pure half of a cycle: `step(state, inputs, now) -> (state, snapshot)`.

No I/O and no clock: what the cycle learned from its sources is `inputs` (a `CycleInputs`, built by
monitor/pipeline/cycle.py `collect`), the cycle's time is `now`, and what survives from one cycle to the
next is `state` (a `CycleState`; both in monitor/step/cycle_state.py). `step` updates `state` in place
and returns it - copying every reading and every knee observation each cycle would cost more than the
cycle - so the same state, inputs and `now` give the same snapshot and the same next state
(tests/app/test_cycle_step.py).

In order:
  1. count the cycle, the sources that failed (by reason) and the input anomalies (by kind);
  2. cap the models of one target at global.max_models_per_target and new replica series at
     global.max_series (what is cut is counted);
  3. keep each reading for global.history_keep; forget replicas that have been silent that long;
  4. derive the pools (monitor/derive/core.py); a replica that did not answer is stale;
  5. keep the shard's pools (global.shard) and each pool's last fresh time;
  6. capacity, tasks and power (monitor/capacity/enrich.py `assess`, which returns them; attached here),
     when the state has them;
  7. each pool's forecast: the forecaster's latest result, as `collect` found it; then its spare
     capacity for deferrable work until the next peak (monitor/capacity/spare_pool.py);
  8. forget what has not been seen for global.forget_after (`expire`): state stays bounded under churn.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace
from typing import Optional

from ..capacity.enrich import Assessed, assess
from ..capacity.headroom import recommended_replicas
from ..capacity.spare_pool import spare_for
from ..derive.core import derive_pools, pool_of
from ..derive.gateway_queues import apply_gateway_queues
from ..derive.slow import SLOW_HOLD, SLOW_RATIO
from ..forecast.pool import exhaustion_seconds
from ..model import PoolSnapshot, ReplicaReading, Snapshot
from .cycle_state import CycleInputs, CycleState, count_into

log = logging.getLogger(__name__)


def step(state: CycleState, inputs: CycleInputs, now: float) -> tuple[CycleState, Snapshot]:
    state.cycles += 1
    for st in inputs.statuses:
        key = (st.source, st.target)
        if not st.up and st.attempted:
            count_into(state.errors, {(st.source, st.error or "unknown"): 1.0})
            if key not in state.down:  # logged when it goes down and when it comes back, not every cycle
                log.warning("source %s %s down: %s", st.source, st.target, st.error)
            state.down[key] = st.error or "unknown"
            state.down_seen[key] = now
        elif st.up and state.down.pop(key, None) is not None:
            state.down_seen.pop(key, None)
            log.info("source %s %s is back", st.source, st.target)
        if st.up and st.slow:
            count_into(state.slow, {key: 1.0})
    count_into(state.anomalies, inputs.anomalies)
    readings = _cap(state, inputs.readings)
    _watch_kv_capacity(state, readings, now)
    state.lead_times.observe(readings, state.settings.pool_by, first_cycle=state.cycles == 1)
    history = _remember(state, readings, now)
    pools = _derive(state, history, inputs, now)
    _name_slow(state, pools, now)
    gateway_anomalies: dict = {}
    apply_gateway_queues(pools, inputs.gateways, list(state.settings.gateway_pools), gateway_anomalies,
                         state.fleet)
    if state.capacity is not None:
        try:
            assessed = assess(state.capacity, pools, history, inputs.gateways, inputs.dcgm, now, inputs.slo_windows,
                              gateway_anomalies, state.fleet)
        except Exception:  # the capacity layer must never take the cycle down
            log.exception("capacity assessment failed")
            count_into(state.errors, {("enricher", "capacity"): 1.0})
        else:
            for p in pools:
                attach_capacity(p, assessed.get(p.pool))
    if gateway_anomalies.get("gateway_queue_unmapped") and "gateway_queue_unmapped" not in state.anomalies:
        log.warning("a gateway queue names no one pool it may feed (a model served by two pools in its scope, or a "
                    "pool label its pools: map leaves out): not counted on any pool; give the gateway labels "
                    "(e.g. {cluster: a}) or pools: (headroom_input_anomalies_total{kind=\"gateway_queue_unmapped\"})")
    count_into(state.anomalies, gateway_anomalies)
    spare_settings = state.settings.spare
    for p in pools:
        for rd in p.replica_detail:
            rd.kv_capacity_changes = state.kv_capacity_changes.get((p.pool, rd.replica), 0.0)
        configured = state.settings.pool_settings(p.pool).replica_lead_time
        measured = state.lead_times.measured.get(p.pool)
        p.replica_lead_time_seconds = configured if configured is not None else measured
        p.replica_lead_time_source = ("configured" if configured is not None else
                                      "measured" if measured is not None else None)
        if inputs.forecast is not None:
            p.forecast = _exhaustion_now(inputs.forecast.pools.get(p.pool), p, now)
        _recommend(p)
        p.spare = spare_for(p, spare_settings, now)
    if any(st.up for st in inputs.statuses if st.source in ("vllm", "prometheus")):
        state.last_success = now
    expire(state, now, {p.pool for p in pools})
    return state, Snapshot(timestamp=now, pools=pools, sources=list(inputs.statuses),
                           last_success_timestamp=state.last_success,
                           errors={f"{s}|{r}": v for (s, r), v in state.errors.items()},
                           cycles=state.cycles, dropped=dict(state.dropped), anomalies=dict(state.anomalies),
                           forecast=inputs.forecast, alerts=inputs.alerts, alerts_ui=inputs.alerts_ui,
                           source_stale_seconds=dict(inputs.stale_seconds),
                           slow={f"{s}|{t}": v for (s, t), v in state.slow.items()})


def attach_capacity(p: PoolSnapshot, assessed: Optional[Assessed]) -> None:
    """The capacity layer's results on the pool the step is building."""
    if assessed is None:
        return
    p.capacity, p.tasks, p.shed_rates = assessed.capacity, assessed.tasks, assessed.shed_rates
    p.gateway_queued, p.gateway_queued_source = assessed.gateway_queued, assessed.gateway_queued_source
    p.gateway_added_latency, p.kv_tiers = assessed.gateway_added_latency, assessed.kv_tiers


def expire(state: CycleState, now: float, present: frozenset | set = frozenset()) -> None:
    """Forget what has not been seen for global.forget_after: sources no longer reported down, pools'
    last fresh times (not of the `present` pools), lead-time bookkeeping, the capacity layer's
    per-pool and per-replica state (the readings themselves go after global.history_keep)."""
    before = now - state.settings.forget_after
    for key in [k for k, t in state.down_seen.items() if t < before]:
        del state.down_seen[key]
        state.down.pop(key, None)
    for pool in [p for p, t in state.last_fresh.items() if t < before and p not in present]:
        del state.last_fresh[pool]
    for key in [k for k, t in state.slow_since.items() if t < before]:
        del state.slow_since[key]
        state.slow_named.discard(key)
    for key in [k for k, (_, t) in state.kv_capacity.items() if t < before]:
        del state.kv_capacity[key]
        state.kv_capacity_changes.pop(key, None)
    state.lead_times.expire(before)
    if state.capacity is not None:
        state.capacity.expire(before)


def _exhaustion_now(fc, p: PoolSnapshot, now: float):
    """The refit's forecast with its time to exhaustion counted from `now` against the pool's
    capacity at the knee this cycle (the refit may have run before the capacity was known, or
    against a knee that has moved since)."""
    c = p.capacity
    if fc is None or fc.path is None or c is None or c.withheld:
        return fc
    cap = c.exhaustion_requests
    if cap is None:
        return fc
    current = p.offered_requests if getattr(fc, "capacity_series", "load") == "offered" else None
    left = exhaustion_seconds(fc.path.timestamps, fc.path.upper, cap, now,
                              current if current is not None else p.load_requests)
    return replace(fc, exhaustion_seconds=left, capacity_requests=cap)


def _recommend(p) -> None:
    """The replicas each forecast horizon needs (monitor/capacity/headroom.py recommended_replicas)."""
    c = p.capacity
    if p.forecast is None or c is None or c.withheld or p.stale:
        return
    for horizon, h in p.forecast.horizons.items():
        n = recommended_replicas(h.peak_upper if h is not None else None, c.knee_requests,
                                 p.replicas - p.stalled_replicas)
        if n is not None:
            p.recommended_replicas[horizon] = n


def _name_slow(state: CycleState, pools: list[PoolSnapshot], now: float) -> None:
    """A replica whose latency ratio (monitor/derive/slow.py) has stayed >= SLOW_RATIO for SLOW_HOLD
    seconds is slow: named (logged once, when it becomes so) and its share of the knee discounted
    (`slow_capacity_lost`). A ratio below it, or unknown, starts the watch again."""
    for p in pools:
        for rd in p.replica_detail:
            key = (p.pool, rd.replica)
            if rd.latency_ratio is None or rd.latency_ratio < SLOW_RATIO:
                state.slow_since.pop(key, None)
                if key in state.slow_named:
                    state.slow_named.discard(key)
                    log.info("replica %s of pool %s is no longer slow", rd.replica, p.pool)
                continue
            since = state.slow_since.setdefault(key, now)
            rd.slow = now - since >= SLOW_HOLD
            if not rd.slow:
                continue
            p.slow_capacity_lost += 1.0 - 1.0 / rd.latency_ratio
            if key not in state.slow_named:
                state.slow_named.add(key)
                log.warning("replica %s of pool %s is slow: its inter-token latency has been %.1fx its "
                            "peers' for %.0f s", rd.replica, p.pool, rd.latency_ratio, now - since)


def _watch_kv_capacity(state: CycleState, readings: list[ReplicaReading], now: float) -> None:
    """Read each replica's KV capacity every cycle: vLLM 0.34 sizes an extensible KV cache after
    warm-up, so identical replicas may differ and a restart may change it. A change is counted
    (headroom_replica_kv_capacity_changes_total) and logged once, when it is seen."""
    for r in readings:
        if r.kv_capacity_tokens is None:
            continue
        key = (pool_of(r, state.settings.pool_by), r.target)
        old = state.kv_capacity.get(key)
        state.kv_capacity[key] = (r.kv_capacity_tokens, now)
        if old is not None and old[0] != r.kv_capacity_tokens:
            state.kv_capacity_changes[key] = state.kv_capacity_changes.get(key, 0.0) + 1.0
            log.warning("replica %s of pool %s: KV capacity changed from %.0f to %.0f tokens", r.target,
                        key[0], old[0], r.kv_capacity_tokens)


def _key(r: ReplicaReading) -> str:
    return f"{r.target}|{r.model}"


def _per_target(state: CycleState, readings: list[ReplicaReading]) -> list[ReplicaReading]:
    """At most global.max_models_per_target readings per target (the first models by name)."""
    limit = state.settings.max_models_per_target
    by_target: dict[str, list[ReplicaReading]] = {}
    for r in readings:
        by_target.setdefault(r.target, []).append(r)
    if all(len(rs) <= limit for rs in by_target.values()):
        return readings
    kept: list[ReplicaReading] = []
    for target, rs in by_target.items():
        if len(rs) > limit:
            count_into(state.dropped, {"models_per_target": float(len(rs) - limit)})
            log.warning("target %s serves %d models; the first %d are read (global.max_models_per_target)",
                        target, len(rs), limit)
            rs = sorted(rs, key=lambda r: r.model)[:limit]
        kept.extend(rs)
    return kept


def _cap(state: CycleState, readings: list[ReplicaReading]) -> list[ReplicaReading]:
    readings = _per_target(state, readings)
    limit = state.settings.max_series
    if len(readings) + len(state.history) <= limit:
        return readings
    known = [r for r in readings if _key(r) in state.history]
    new = [r for r in readings if _key(r) not in state.history]
    room = max(0, limit - len(state.history))
    dropped = len(new) - min(room, len(new))
    if dropped:
        count_into(state.dropped, {"replicas": float(dropped)})
        log.warning("cardinality cap: %d new replica series dropped (global.max_series=%d)", dropped, limit)
    return known + new[:room]


def _remember(state: CycleState, readings: list[ReplicaReading], now: float) -> dict[str, list[ReplicaReading]]:
    """Add the cycle's readings to the history; returns it as plain lists, with the keys fresh now."""
    keep = state.settings.history_keep
    for r in readings:
        dq = state.history.get(_key(r))
        if dq is None:
            dq = state.history[_key(r)] = deque()
        dq.append(r)
        while dq and now - dq[0].timestamp > keep:
            dq.popleft()
    # forget targets that have been silent for longer than the history we keep
    for key in [k for k, dq in state.history.items() if not dq or now - dq[-1].timestamp > keep]:
        del state.history[key]
    return {key: list(dq) for key, dq in state.history.items()}


def _derive(state: CycleState, history: dict[str, list[ReplicaReading]], inputs: CycleInputs,
            now: float) -> list[PoolSnapshot]:
    settings = state.settings
    down_targets = {st.target for st in inputs.statuses if not st.up}
    fresh_keys = {_key(r) for r in inputs.readings}
    # the query layer did not answer: the replicas are not known down, only unread. The pools keep
    # the last read's replicas and values, marked stale (never zero replicas for a fleet that is up)
    blind = any(not st.up for st in inputs.statuses if st.source == "prometheus")
    last_read = max((rs[-1].timestamp for rs in history.values() if rs), default=None)
    # a target that answered this cycle is current; one that did not is stale
    stale_targets = set(down_targets)
    expected: dict[str, set[str]] = {}
    for key, readings in history.items():
        if key not in fresh_keys and not (blind and readings[-1].timestamp == last_read):
            stale_targets.add(readings[-1].target)
        expected.setdefault(pool_of(readings[-1], settings.pool_by), set()).add(readings[-1].target)
    overflow: dict = {}
    pools = derive_pools(history, now, settings.latency_window, settings.pool_by, down_targets=stale_targets,
                         expected=expected, stall_window=settings.stall_window, anomalies=overflow,
                         pool_histograms=inputs.pool_histograms, pool_totals=inputs.pool_totals,
                         pool_totals_at=inputs.pool_totals_at)
    count_into(state.anomalies, overflow)
    if blind and not fresh_keys:
        for p in pools:
            p.stale = True
    state.fleet = [(p.pool, p.model) for p in pools]
    if settings.shard is not None:
        from ..model.shard import owns  # noqa: PLC0415
        pools = [p for p in pools if owns(p.pool, settings.shard)]
    for p in pools:
        if not p.stale:
            state.last_fresh[p.pool] = now
        p.last_fresh_timestamp = state.last_fresh.get(p.pool, p.last_fresh_timestamp)
    return pools
