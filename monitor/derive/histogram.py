"""Quantiles and threshold fractions from cumulative Prometheus histograms (pure). The one
implementation: the derive layer (pool latency quantiles) and the capacity layer (SLOs, tasks, the
knee) both use it.

Same interpolation as PromQL's histogram_quantile: linear within the bucket that holds the rank,
the lowest bucket starts at 0 (or at its upper bound when that is <= 0), and a rank in the +Inf
bucket answers with the largest finite bound.

Two of those answers are only bounds of the true quantile, and `quantile_bound` says which: a rank
in the first bucket is interpolated between 0 and the first bound (a near-idle queue whose every
wait is 22 us still reads p50 = half the first bound): the truth is "<= first bound"; a rank in
the +Inf bucket reads the last finite bound: the truth is ">= last finite bound". The values
are kept as PromQL computes them (dashboards and rules read the same numbers); `Quantiles.bounds`
carries the flag to the JSON and the landing page, and `Quantiles.buckets` the bucket each
quantile was interpolated in (any value inside it is as likely as the one interpolated).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

from monitor.model import Histogram, Quantiles


def _check(h: Histogram) -> None:
    if not h.bounds:
        raise ValueError("histogram has no buckets")
    if list(h.bounds) != sorted(h.bounds):
        raise ValueError(f"histogram bounds are not ascending: {h.bounds}")


def total(h: Histogram) -> float:
    """Observations in the histogram (the +Inf bucket, or the count when there is none)."""
    if h.has_inf:
        return float(h.counts[-1])
    return float(h.count)


def _rank_bucket(h: Histogram, q: float) -> Optional[tuple[int, float]]:
    """(index of the bucket holding the q-quantile's rank, the rank); None when empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    _check(h)
    n = total(h)
    if n <= 0:
        return None
    rank = q * n
    return next(i for i, c in enumerate(h.counts) if c >= rank or i == len(h.counts) - 1), rank


def quantile(h: Histogram, q: float) -> Optional[float]:
    """The q-quantile (0 <= q <= 1) of a cumulative histogram; None when it holds no observation."""
    found = _rank_bucket(h, q)
    if found is None:
        return None
    idx, rank = found
    bound = h.bounds[idx]
    if math.isinf(bound):
        finite = [b for b in h.bounds if not math.isinf(b)]
        return finite[-1] if finite else None
    if idx == 0:
        lower, below = (0.0 if bound > 0 else bound), 0.0
    else:
        lower, below = h.bounds[idx - 1], h.counts[idx - 1]
    in_bucket = h.counts[idx] - below
    if in_bucket <= 0:
        return bound
    return lower + (bound - lower) * (rank - below) / in_bucket


def quantile_bound(h: Histogram, q: float) -> Optional[tuple[str, float]]:
    """("upper", first bound) when the q-quantile's rank is in the first bucket (the truth is <= it),
    ("lower", last finite bound) when it is in the +Inf bucket (the truth is >= it), else None."""
    found = _rank_bucket(h, q)
    if found is None:
        return None
    idx = found[0]
    finite = [b for b in h.bounds if not math.isinf(b)]
    if math.isinf(h.bounds[idx]):
        return ("lower", finite[-1]) if finite else None
    if idx == 0:
        return "upper", h.bounds[0]
    return None


def quantile_bucket(h: Histogram, q: float) -> Optional[tuple[float, float]]:
    """(lower, upper) bound of the bucket holding the q-quantile's rank (the lowest starts at 0, or at
    its bound when that is <= 0; the +Inf bucket is (last finite bound, inf)); None when empty."""
    found = _rank_bucket(h, q)
    if found is None:
        return None
    idx = found[0]
    upper = h.bounds[idx]
    if idx == 0:
        return (0.0 if upper > 0 else upper), upper
    return h.bounds[idx - 1], upper


def fraction_above(h: Histogram, threshold: float) -> Optional[float]:
    """Share of observations above `threshold`, interpolating linearly inside the bucket holding it.

    Exact when the threshold is a bucket bound; configure SLO targets on bucket bounds for exact
    answers. None when the histogram holds no observation.
    """
    _check(h)
    n = total(h)
    if n <= 0:
        return None
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts):
        if threshold <= bound:
            if math.isinf(bound):
                below = prev_count  # every finite bound is below the threshold: assume all above
            else:
                lower = min(prev_bound, bound)
                if threshold <= lower:
                    below = prev_count
                else:
                    below = prev_count + (count - prev_count) * (threshold - lower) / (bound - lower)
            return max(0.0, min(1.0, 1.0 - below / n))
        prev_bound, prev_count = bound, count
    return max(0.0, min(1.0, 1.0 - prev_count / n))


def quantiles(h: Optional[Histogram]) -> Quantiles:
    """p50/p90/p95/p99 and the mean of a histogram (all None when empty)."""
    if h is None:
        return Quantiles()
    n = total(h)
    if n <= 0:
        return Quantiles(count=0.0)
    levels = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
    bounds = {name: b for name, q in levels.items() if (b := quantile_bound(h, q)) is not None}
    buckets = {name: bk for name, q in levels.items() if (bk := quantile_bucket(h, q)) is not None}
    return Quantiles(
        p50=quantile(h, 0.5), p90=quantile(h, 0.9), p95=quantile(h, 0.95), p99=quantile(h, 0.99),
        mean=(h.sum / h.count) if h.count else None, count=n, bounds=bounds, buckets=buckets,
    )


def merge(histograms: Iterable[Histogram]) -> Optional[Histogram]:
    """Bucket-wise sum of histograms with identical bounds; ValueError when the bounds differ."""
    out: Optional[Histogram] = None
    for h in histograms:
        if out is None:
            out = h
            continue
        merged = out.plus(h)
        if merged is None:
            raise ValueError(f"cannot merge histograms with different bounds: {out.bounds} vs {h.bounds}")
        out = merged
    return out


def bucket_index(bounds: tuple[float, ...], value: float) -> int:
    """Index of the bucket (le bound) that holds `value`."""
    for i, b in enumerate(bounds):
        if value <= b:
            return i
    return len(bounds) - 1
