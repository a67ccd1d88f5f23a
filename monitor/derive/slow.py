"""Slow replicas: up, answering, counting normally, but each token taking longer than its peers'.

A replica's latency at its load is its mean inter-token latency over the last SLOW_WINDOW seconds
(the increase of vllm:inter_token_latency_seconds: time per generated token, which a thermal
throttle, a bad node or a noisy neighbour stretch, and which the batch size moves far less; the
replicas behind one router carry similar batches). Its ratio is that over the median of its peers'
(the pool's other replicas with SLOW_MIN_TOKENS tokens in the window; none: no ratio). The cycle
(monitor/step/cycle_step.py) names a replica slow once its ratio has stayed >= SLOW_RATIO for SLOW_HOLD
seconds, and the capacity layer discounts its share of the knee by 1 - 1 / ratio.
"""
from __future__ import annotations

import statistics
from typing import Optional

from ..model import ReplicaReading
from .counters import histogram_increase

SLOW_RATIO = 1.5  # latency at its load over its pool's, from which a replica is slow
SLOW_WINDOW = 120.0  # seconds of histogram increase a replica's latency is read over
SLOW_HOLD = 60.0  # seconds the ratio must stay at or above SLOW_RATIO before the replica is named
SLOW_MIN_TOKENS = 50.0  # generated tokens in the window, for the replica and for each peer


def itl_in_window(readings: list[ReplicaReading], now: float, window: float = SLOW_WINDOW
                  ) -> Optional[tuple[float, float]]:
    """(mean inter-token latency, tokens) of one replica over the last `window` seconds (the
    newest reading against the oldest within it); None without two readings or the histogram."""
    if len(readings) < 2:
        return None
    newest = readings[-1]
    old = next((r for r in readings[:-1] if newest.timestamp - r.timestamp <= window + 1e-9), readings[-2])
    if old.timestamp >= newest.timestamp:
        return None
    d = histogram_increase(newest.histograms.get("itl"), old.histograms.get("itl"))
    if d is None or d.count <= 0:
        return None
    return d.sum / d.count, d.count


def latency_ratios(itl: dict[str, Optional[tuple[float, float]]]) -> dict[str, Optional[float]]:
    """replica -> its mean inter-token latency over the median of its peers' (None: too few tokens,
    or no peer with enough)."""
    enough = {k: v[0] for k, v in itl.items() if v is not None and v[1] >= SLOW_MIN_TOKENS and v[0] > 0}
    out: dict[str, Optional[float]] = {}
    for key in itl:
        peers = [m for k, m in enough.items() if k != key]
        out[key] = enough[key] / statistics.median(peers) if key in enough and peers else None
    return out
