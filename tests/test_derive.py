"""Derivations checked against hand-computed numbers."""
import math

import pytest

from monitor.derive.core import counter_delta, derive_pools
from monitor.derive.histogram import fraction_above, quantile, quantiles
from monitor.model import Histogram, ReplicaReading

B = (0.5, 1.0, 2.0, math.inf)


def hist(counts, total_sum):
    return Histogram(B, tuple(counts), total_sum, counts[-1])


def reading(target, t, running, waiting, success, e2e, model="m", kv=(0.5, 1000.0), **counters):
    r = ReplicaReading(target=target, model=model, timestamp=t, running=running, waiting=waiting,
                       kv_usage=kv[0], kv_capacity_tokens=kv[1], kv_live_tokens=kv[0] * kv[1])
    r.counters = {"request_success": success, **counters}
    r.histograms = {"e2e": e2e}
    return r


def test_quantile_interpolates_inside_bucket_like_promql():
    h = Histogram(B, (10, 30, 40, 40), 30.0, 40)
    # rank 20 of 40: in (0.5, 1.0], 10 below, 20 inside -> 0.5 + 0.5 * (10/20)
    assert quantile(h, 0.5) == pytest.approx(0.75)
    assert quantile(h, 0.25) == pytest.approx(0.5)
    assert quantile(h, 1.0) == pytest.approx(2.0)
    assert quantile(Histogram(B, (0, 0, 0, 0), 0, 0), 0.5) is None


def test_quantile_in_inf_bucket_returns_last_finite_bound():
    assert quantile(Histogram(B, (0, 0, 1, 10), 50.0, 10), 0.99) == 2.0


def test_summary_mean_and_fraction_over():
    h = Histogram(B, (10, 30, 40, 40), 30.0, 40)
    q = quantiles(h)
    assert q.mean == pytest.approx(0.75) and q.count == 40
    assert fraction_above(h, 1.0) == pytest.approx(0.25)
    assert fraction_above(h, 1.5) == pytest.approx(0.125)


def test_counter_delta_handles_reset():
    assert counter_delta(15.0, 10.0) == 5.0
    assert counter_delta(3.0, 10.0) is None
    assert counter_delta(None, 1.0) is None


def test_pool_gauges_rates_and_quantiles_hand_computed():
    h0 = hist((0, 0, 0, 0), 0.0)
    h1 = hist((10, 30, 40, 40), 30.0)
    hist_b = {
        "a": [reading("a", 0, 4, 2, 100, h0, prompt_tokens=1000), reading("a", 10, 6, 2, 140, h1, prompt_tokens=3000)],
        "b": [reading("b", 0, 2, 0, 50, h0, prompt_tokens=0), reading("b", 10, 2, 0, 60, h0, prompt_tokens=500)],
    }
    [p] = derive_pools(hist_b, now=10, window_seconds=60)
    assert p.pool == "m" and p.replicas == 2
    assert p.active_requests == 8 and p.queued_requests == 2  # separate numbers, never summed
    assert p.kv_tokens_live == 1000 and p.kv_tokens_capacity == 2000
    assert p.completion_rate == pytest.approx(4.0 + 1.0)  # (140-100)/10 + (60-50)/10
    assert p.prompt_tokens_rate == pytest.approx(200 + 50)
    assert p.latency["e2e"].p50 == pytest.approx(0.75)
    assert p.latency["e2e"].mean == pytest.approx(0.75)
    # mean concurrency: a: (6 + 8)/2 = 7, b: 2 -> 9; Little: 5 * 0.75 / 9
    assert p.mean_concurrency == pytest.approx(9.0)
    assert p.littles_law_ratio == pytest.approx(5 * 0.75 / 9)


def test_counter_reset_drops_that_replica_from_the_rate():
    h0 = hist((0, 0, 0, 0), 0.0)
    hs = {"a": [reading("a", 0, 1, 0, 100, h0), reading("a", 10, 1, 0, 5, h0)],
          "b": [reading("b", 0, 1, 0, 10, h0), reading("b", 10, 1, 0, 30, h0)]}
    [p] = derive_pools(hs, now=10, window_seconds=60)
    assert p.completion_rate == pytest.approx(2.0)


def test_one_reading_gives_no_rates():
    [p] = derive_pools({"a": [reading("a", 0, 1, 0, 100, hist((0, 0, 0, 0), 0))]}, now=0, window_seconds=60)
    assert p.completion_rate is None and p.latency == {} and p.littles_law_ratio is None


def test_window_uses_oldest_reading_inside_it():
    h0 = hist((0, 0, 0, 0), 0.0)
    rs = [reading("a", t, 1, 0, c, h0) for t, c in [(0, 0), (50, 500), (100, 600), (110, 700)]]
    [p] = derive_pools({"a": rs}, now=110, window_seconds=60)
    assert p.window_seconds == 60 and p.completion_rate == pytest.approx((700 - 500) / 60)


def test_down_target_is_excluded_and_pool_has_less_capacity():
    h0 = hist((0, 0, 0, 0), 0.0)
    hs = {"a": [reading("a", 0, 3, 1, 0, h0)], "b": [reading("b", 0, 5, 5, 0, h0)]}
    [p] = derive_pools(hs, now=0, window_seconds=60, down_targets={"b"})
    assert not p.stale and p.replicas == 1 and p.replicas_configured == 2
    assert p.active_requests == 3 and p.queued_requests == 1
    assert p.kv_tokens_capacity == 1000  # the lost replica's KV is not counted
    assert [r.up for r in p.replica_detail] == [True, False]


def test_pool_with_no_answering_replica_is_stale():
    h0 = hist((0, 0, 0, 0), 0.0)
    hs = {"a": [reading("a", 0, 3, 1, 0, h0)], "b": [reading("b", 0, 5, 5, 0, h0)]}
    [p] = derive_pools(hs, now=0, window_seconds=60, down_targets={"a", "b"})
    assert p.stale and p.replicas == 0


def test_pools_by_label():
    h0 = hist((0, 0, 0, 0), 0.0)
    a = reading("a", 0, 1, 0, 0, h0)
    a.labels = {"pool": "gold"}
    b = reading("b", 0, 2, 0, 0, h0)
    b.labels = {"pool": "silver"}
    pools = derive_pools({"a": [a], "b": [b]}, now=0, window_seconds=60, pool_by="pool")
    assert [(p.pool, p.active_requests) for p in pools] == [("gold", 1), ("silver", 2)]


def test_exported_series_per_metric_are_capped_and_counted():
    from monitor.export import samples as S
    from monitor.model import PoolSnapshot, Snapshot
    pools = [PoolSnapshot(pool="p", model="m", replicas=1)]
    pools[0].tasks = {"samples": [("headroom_task_arrival_rate", {"task_type": f"session-{i}"}, 1.0)
                                  for i in range(S.MAX_SERIES_PER_METRIC + 25)]}
    before = S.DROPPED.get("headroom_task_arrival_rate", 0.0)
    out = S.snapshot_samples(Snapshot(timestamp=0.0, pools=pools))
    assert len(out["headroom_task_arrival_rate"]) == S.MAX_SERIES_PER_METRIC
    assert S.DROPPED["headroom_task_arrival_rate"] - before == 25
    assert ({"what": "headroom_task_arrival_rate"}, S.DROPPED["headroom_task_arrival_rate"]) in out["headroom_dropped_series"]
