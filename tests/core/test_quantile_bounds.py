"""Histogram quantiles that are only bounds of the truth (first bucket, past the last finite bound):
flagged in `Quantiles.bounds`, in the snapshot JSON and on the landing page. Hand-computed numbers."""
from __future__ import annotations

import math

import pytest

from monitor.derive.histogram import quantile, quantile_bound, quantiles
from monitor.export.landing import Trends, render
from monitor.export.snapshot_json import pool_to_dict
from monitor.model import Histogram, PoolSnapshot, Quantiles, Snapshot

INF = math.inf
# vLLM's queue-time buckets start at 0.3 s; ten near-idle waits of 22 us each
IDLE_QUEUE = Histogram((0.3, 0.5, 0.8, 1.0, INF), (10, 10, 10, 10, 10), sum=10 * 22e-6, count=10)
# 2 in (0.3, 0.5], 6 in (0.5, 1.0], 2 past 1.0
SPREAD = Histogram((0.3, 0.5, 1.0, INF), (0, 2, 8, 10), sum=9.0, count=10)


def test_a_rank_in_the_first_bucket_is_an_upper_bound_and_keeps_the_promql_value():
    # PromQL: rank 5 of 10 in [0, 0.3] -> 0 + 0.3 x 5/10 = 0.15; p95: 0.3 x 9.5/10 = 0.285
    assert quantile(IDLE_QUEUE, 0.5) == pytest.approx(0.15)
    assert quantile(IDLE_QUEUE, 0.95) == pytest.approx(0.285)
    assert quantile_bound(IDLE_QUEUE, 0.5) == ("upper", 0.3)
    q = quantiles(IDLE_QUEUE)
    assert q.p95 == pytest.approx(0.285) and q.mean == pytest.approx(22e-6)
    assert q.bounds == {n: ("upper", 0.3) for n in ("p50", "p90", "p95", "p99")}


def test_a_rank_in_the_inf_bucket_is_a_lower_bound_and_a_rank_inside_is_not_flagged():
    # p50: rank 5 in (0.5, 1.0] holding 6 above 2 -> 0.5 + 0.5 x 3/6 = 0.75; p90: rank 9 > 8 -> +Inf bucket
    assert quantile(SPREAD, 0.5) == pytest.approx(0.75)
    assert quantile_bound(SPREAD, 0.5) is None
    assert quantile(SPREAD, 0.9) == 1.0
    q = quantiles(SPREAD)
    assert q.bounds == {"p90": ("lower", 1.0), "p95": ("lower", 1.0), "p99": ("lower", 1.0)}


def test_a_rank_equal_to_the_first_buckets_count_is_still_in_it():
    h = Histogram((1.0, 2.0, INF), (5, 10, 10))
    assert quantile_bound(h, 0.5) == ("upper", 1.0)  # rank 5 <= 5: the median is <= 1
    assert quantile_bound(h, 0.51) is None  # rank 5.1: in (1, 2]
    assert quantile_bound(Histogram((1.0, INF), (0, 0)), 0.5) is None  # empty


def test_the_snapshot_json_carries_the_bound_per_quantile():
    p = PoolSnapshot(pool="chat", model="m", replicas=1)
    p.latency = {"queue": quantiles(IDLE_QUEUE), "e2e": quantiles(SPREAD), "ttft": Quantiles()}
    d = pool_to_dict(p)["latency_seconds"]
    assert d["queue"]["p50"] == pytest.approx(0.15)
    assert d["queue"]["bounds"]["p50"] == {"bound": "upper", "value": 0.3}
    assert d["e2e"]["bounds"] == {"p90": {"bound": "lower", "value": 1.0}, "p95": {"bound": "lower", "value": 1.0},
                                  "p99": {"bound": "lower", "value": 1.0}}
    assert d["ttft"]["bounds"] == {}


def test_the_landing_page_shows_bounds_as_bounds():
    p = PoolSnapshot(pool="chat", model="m", replicas=1)
    p.latency = {"queue": quantiles(IDLE_QUEUE), "e2e": quantiles(SPREAD)}
    page = render(Snapshot(timestamp=1.8e9, pools=[p]), Trends())
    assert "queue p50 ≤ 0.3 s, p95 ≤ 0.3 s" in page
    assert "end-to-end p50 0.75 s, p95 ≥ 1 s" in page
    assert "0.15" not in page and "0.285" not in page


def test_every_quantile_carries_the_bucket_it_was_interpolated_in():
    # vLLM's TTFT buckets around 10 s: 5, 7.5, 10, 20, 40; 100 calls, 90 by 10 s, all 100 by 20 s
    h = Histogram((5.0, 7.5, 10.0, 20.0, 40.0, INF), (50, 80, 90, 100, 100, 100), sum=600.0, count=100)
    q = quantiles(h)
    # p95: rank 95, bucket (10, 20] holds 10 above 90 -> 10 + 10 x 5/10 = 15
    assert q.p95 == pytest.approx(15.0) and q.buckets["p95"] == (10.0, 20.0)
    assert q.buckets["p50"] == (0.0, 5.0) and q.bounds == {"p50": ("upper", 5.0)}
    assert q.buckets["p90"] == (7.5, 10.0)
    assert quantiles(SPREAD).buckets["p99"] == (1.0, INF)
    d = pool_to_dict(PoolSnapshot(pool="p", model="m", replicas=1, latency={"ttft": q, "e2e": quantiles(SPREAD)}))
    assert d["latency_seconds"]["ttft"]["buckets"]["p95"] == [10.0, 20.0]
    assert d["latency_seconds"]["e2e"]["buckets"]["p99"] == [1.0, "+Inf"]
