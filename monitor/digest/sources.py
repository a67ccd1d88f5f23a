"""Digest input from headroom's history, read through one `HistorySource` (monitor/history): the
embedded HistoryStore (direct mode) or Prometheus (headroom's exported series, else vLLM's).

History covers the two weeks before `week_end` plus one more (for "how last week's forecast did"
the forecast is refitted on what came before last week), in `digest.history.step` buckets, with the
schema's names and meanings (active and queued apart, `load` their sum at the same instant). What
history does not carry comes from `digest.pools.<name>` (replicas, knee per replica, GPUs, watts)
and `digest.tasks.<name>` (tokens per call, calls per task). A pool without replicas or a knee
there is reported with "n/a".
"""
from __future__ import annotations

from typing import Optional

import pandas as pd

from monitor.digest.content import WEEK, DigestError, DigestInput, PoolInput
from monitor.digest.settings import DigestSettings, PoolFacts
from monitor.history.prometheus import MAX_POINTS, PrometheusHistory
from monitor.history.schema import HistorySource
from monitor.history.store import StoreHistory

HISTORY_WEEKS = 3


def _pool_input(name: str, series: dict[str, pd.Series], settings: DigestSettings) -> PoolInput:
    f = settings.pools.get(name) or settings.pools.get("*") or PoolFacts()
    if not f.replicas:
        raise DigestError(f"pool {name}: set digest.pools.{name}.replicas (history does not carry it)")
    knee = f.knee_requests_per_replica
    if knee is None and f.max_num_seqs:
        knee = float(f.max_num_seqs)  # the engine's slot limit: a prior, until a knee is configured
    tasks = {t: tf for t, tf in settings.tasks.items() if tf.pool in (None, name)}
    return PoolInput(name=name, series=series, replicas=f.replicas, knee_requests_per_replica=knee,
                     knee_source="configured" if f.knee_requests_per_replica else "prior",
                     gpus_per_replica=f.gpus_per_replica, max_num_seqs=f.max_num_seqs,
                     kv_capacity_tokens_per_replica=f.kv_capacity_tokens_per_replica,
                     idle_watts_per_gpu=f.idle_watts_per_gpu, max_watts_per_gpu=f.max_watts_per_gpu,
                     tasks=tasks)


def from_source(source: HistorySource, week_end: float, settings: DigestSettings,
                pools: Optional[list[str]] = None) -> DigestInput:
    """Every pool of the source (or `pools`) with its series over the last HISTORY_WEEKS weeks."""
    data = source.load(pools, week_end - HISTORY_WEEKS * WEEK, week_end, settings.history_step)
    out = [_pool_input(pool, series, settings) for pool, series in sorted(data.items()) if series]
    if not out:
        raise DigestError(f"the {source.describe} holds no pool series in the {HISTORY_WEEKS} weeks "
                          f"before {week_end:.0f}")
    return DigestInput(week_end, out, source=source.describe)


def from_store(store, week_end: float, settings: DigestSettings, pools: Optional[list[str]] = None) -> DigestInput:
    return from_source(StoreHistory(store), week_end, settings, pools)


def from_prometheus(client, week_end: float, settings: DigestSettings, max_points: int = MAX_POINTS,
                    **history) -> DigestInput:
    """`client.query_range` as in monitor.sources.prometheus; `history` goes to PrometheusHistory
    (e.g. vllm_selector, vllm_pool_label)."""
    return from_source(PrometheusHistory(client, max_points=max_points, **history), week_end, settings)
