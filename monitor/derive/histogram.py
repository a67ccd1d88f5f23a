"""Quantiles from cumulative histogram buckets (pure)."""
from __future__ import annotations

import math
from typing import Optional

from ..model import Histogram, Quantiles


def quantile(q: float, hist: Histogram) -> Optional[float]:
    """Quantile by linear interpolation inside the bucket, as PromQL's histogram_quantile does.

    Returns None for an empty histogram. When the quantile falls in the +Inf bucket, the upper
    bound of the last finite bucket is returned (nothing better is known).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    bounds, counts = hist.bounds, hist.counts
    if not bounds:
        return None
    total = counts[-1] if math.isinf(bounds[-1]) else max(counts[-1], hist.count)
    if total <= 0:
        return None
    rank = q * total
    prev_bound = 0.0
    prev_count = 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound
            if bound <= 0:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound = bound if not math.isinf(bound) else prev_bound
        prev_count = count
    return prev_bound


def summarise(hist: Optional[Histogram]) -> Quantiles:
    if hist is None or hist.count <= 0:
        return Quantiles(count=0.0 if hist is None else max(hist.count, 0.0))
    return Quantiles(
        p50=quantile(0.5, hist),
        p90=quantile(0.9, hist),
        p95=quantile(0.95, hist),
        p99=quantile(0.99, hist),
        mean=hist.sum / hist.count if hist.count else None,
        count=hist.count,
    )


def fraction_over(threshold: float, hist: Histogram) -> Optional[float]:
    """Share of observations above `threshold`, interpolating inside the bucket that holds it."""
    bounds, counts = hist.bounds, hist.counts
    total = counts[-1] if bounds and math.isinf(bounds[-1]) else hist.count
    if not bounds or total <= 0:
        return None
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if threshold <= bound:
            if math.isinf(bound):
                below = prev_count
            else:
                width = bound - prev_bound
                frac = (threshold - prev_bound) / width if width > 0 else 1.0
                below = prev_count + (count - prev_count) * max(0.0, min(1.0, frac))
            return max(0.0, min(1.0, 1.0 - below / total))
        prev_bound, prev_count = bound, count
    return max(0.0, 1.0 - prev_count / total)
