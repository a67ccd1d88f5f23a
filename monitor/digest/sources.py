"""Digest input from headroom's history, read through one `HistorySource` (monitor/history): the
embedded HistoryStore (direct mode) or Prometheus (headroom's exported series, else vLLM's).

History covers the two weeks before `week_end` plus one more (for "how last week's forecast did"
the forecast is refitted on what came before last week), in `digest.history.step` buckets, with the
schema's names and meanings (active and queued apart, `load` their sum at the same instant). What
history does not carry comes from the daemon's `pools.<name>` (replicas, GPUs, watts, optionally a pinned
knee) and `digest.tasks.<name>` (tokens per call, calls per task). The knee is the one headroom
learned where it learned one (`knees`: monitor/digest/knee_report.py reads it from Prometheus or the
daemon's newest snapshot), else a prior, and the digest says which. A sharded daemon reports its
own pools only (monitor/model/shard.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import pandas as pd

from monitor.capacity.settings import PoolSettings
from monitor.digest.content import WEEK, DigestError, DigestInput, PoolInput, fmt_time
from monitor.digest.knee_report import KneeReading, choose, knees_from_prometheus
from monitor.digest.settings import DigestSettings
from monitor.history.query_range import MAX_POINTS, PrometheusHistory
from monitor.history.store import StoreHistory
from monitor.model.poolkey import name_of
from monitor.model.schema import HistorySource

HISTORY_WEEKS = 3


KneeFn = Callable[[float, float, float], dict[str, KneeReading]]  # (start, end, step) -> {pool: knee}


def _pool_input(name: str, series: dict[str, pd.Series], settings: DigestSettings,
                knee: Optional[KneeReading] = None) -> PoolInput:
    f = settings.pools.get(name) or settings.pools.get(name_of(name)) or settings.pools.get("*") or PoolSettings()
    if not f.replicas and knee is not None and knee.replicas:
        f = replace(f, replicas=knee.replicas)  # the replicas headroom saw with its knee
    if not f.replicas:
        raise DigestError(f"pool {name}: set pools.{name}.replicas (neither history nor a cycle of "
                          f"headroom's says how many replicas run)")
    per_rep, source, note = choose(f.knee_requests_per_replica, knee, f.max_num_seqs,
                                   lambda t: fmt_time(t, settings.zone))
    tasks = {t: tf for t, tf in settings.tasks.items() if tf.pool in (None, name)}
    return PoolInput(name=name, series=series, replicas=f.replicas, knee_requests_per_replica=per_rep,
                     knee_source=source, knee_note=note,
                     gpus_per_replica=f.gpus_per_replica, max_num_seqs=f.max_num_seqs,
                     kv_capacity_tokens_per_replica=f.kv_capacity_tokens_per_replica,
                     idle_watts_per_gpu=f.idle_watts_per_gpu, max_watts_per_gpu=f.max_watts_per_gpu,
                     tasks=tasks)


def from_source(source: HistorySource, week_end: float, settings: DigestSettings,
                pools: Optional[list[str]] = None, knees: Optional[KneeFn] = None,
                shard: Optional[tuple[int, int]] = None) -> DigestInput:
    """Every pool of the source (or `pools`; with `shard`, those the shard owns) with its series
    over the last HISTORY_WEEKS weeks, and its knee from `knees(start, end, step)`."""
    start, step = week_end - HISTORY_WEEKS * WEEK, settings.history_step
    data = source.load(pools, start, week_end, step)
    if shard is not None:
        from monitor.model.shard import owns  # noqa: PLC0415
        data = {pool: series for pool, series in data.items() if owns(pool, shard)}
    known = knees(start, week_end, step) if (knees is not None and data) else {}
    out = [_pool_input(pool, series, settings, known.get(pool)) for pool, series in sorted(data.items()) if series]
    if not out:
        raise DigestError(f"the {source.describe} holds no pool series in the {HISTORY_WEEKS} weeks "
                          f"before {week_end:.0f}")
    return DigestInput(week_end, out, source=source.describe, step=step, shard=shard)


def from_store(store, week_end: float, settings: DigestSettings, pools: Optional[list[str]] = None,
               knees: Optional[KneeFn] = None, shard: Optional[tuple[int, int]] = None) -> DigestInput:
    return from_source(StoreHistory(store), week_end, settings, pools, knees, shard)


# Prometheus history is sampled every RESOLUTION seconds within each step: a scrape interval of 15 s
# or more has every scrape seen, so the store (every cycle) and Prometheus (every scrape) give the
# same peaks within one scrape. (PrometheusHistory's own default, 60 s, sees one scrape in four.)
RESOLUTION = 15.0


def prometheus_knees(client, selector: str = "", max_points: int = MAX_POINTS, extra: tuple[str, ...] = ()) -> KneeFn:
    return lambda start, end, step: knees_from_prometheus(client, start, end, step, selector, max_points, extra)


def from_prometheus(client, week_end: float, settings: DigestSettings, max_points: int = MAX_POINTS,
                    shard: Optional[tuple[int, int]] = None, **history) -> DigestInput:
    """`client.query_range` as in monitor.sources.prometheus; `history` goes to PrometheusHistory
    (e.g. vllm_selector, vllm_pool_label, resolution: default RESOLUTION where the step allows)."""
    history.setdefault("resolution", resolution_for(settings.history_step))
    source = PrometheusHistory(client, max_points=max_points, **history)
    return from_source(source, week_end, settings, knees=prometheus_knees(client, source.selector, max_points, source.extra),
                       shard=shard)


def resolution_for(step: float) -> Optional[float]:
    """RESOLUTION when the step is a whole multiple of it, else None (PrometheusHistory's default)."""
    ms = round(step * 1000)
    return RESOLUTION if ms % round(RESOLUTION * 1000) == 0 else None
