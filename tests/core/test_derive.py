"""Derivations checked against hand-computed numbers."""
import math

import pytest

from monitor.derive.core import derive_pools
from monitor.derive.counters import histogram_increase, increase
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


def test_increase_is_promql_across_a_reset():
    assert increase(15.0, 10.0) == 5.0
    assert increase(10.0, 10.0) == 0.0
    assert increase(3.0, 10.0) == 3.0  # went down: a reset, and the 3 counted since are the increase
    assert increase(None, 1.0) is None and increase(1.0, None) is None
    assert increase(-1.0, 0.0) is None and increase(2.0, -1.0) is None  # not a counter's value
    new, old = hist((1, 2, 3, 3), 2.0), hist((2, 4, 6, 6), 5.0)
    assert histogram_increase(hist((3, 5, 8, 8), 7.0), old) == hist((1, 1, 2, 2), 2.0)
    assert histogram_increase(new, old) == new  # every bucket went down: a reset
    other = Histogram((1.0, math.inf), (1, 1), 1.0, 1)
    assert histogram_increase(other, old) == other  # new bounds: a reset too
    assert histogram_increase(None, old) is None and histogram_increase(new, None) is None


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


def test_counter_reset_counts_the_new_value_as_promql_increase_does():
    # a restarted between its readings: 100 -> 5 is a reset, its increase is 5 (5 / 10 s); b: 20 / 10 s
    h0, h1 = hist((0, 0, 0, 0), 0.0), hist((4, 8, 10, 10), 6.0)
    hs = {"a": [reading("a", 0, 1, 0, 100, h1), reading("a", 10, 1, 0, 5, h0)],
          "b": [reading("b", 0, 1, 0, 10, h0), reading("b", 10, 1, 0, 30, h0)]}
    [p] = derive_pools(hs, now=10, window_seconds=60)
    assert p.completion_rate == pytest.approx(0.5 + 2.0)
    # a's latency histogram went down too: its observations since the restart (none) are the window's
    assert p.latency["e2e"].count == 0


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


def test_exported_series_per_metric_are_capped_and_counted_per_renderer():
    from monitor.export.samples import MAX_SERIES_PER_METRIC, Renderer
    from monitor.model import PoolSnapshot, PoolTasks, Snapshot, TaskStats
    pools = [PoolSnapshot(pool="p", model="m", replicas=1)]
    pools[0].tasks = PoolTasks({f"session-{i}": TaskStats(f"session-{i}", arrival_rate=1.0)
                                for i in range(MAX_SERIES_PER_METRIC + 25)})
    renderer = Renderer()
    out = renderer.render(Snapshot(timestamp=0.0, pools=pools))
    assert len(out["headroom_task_arrival_rate"]) == MAX_SERIES_PER_METRIC
    assert renderer.dropped == {"headroom_task_arrival_rate": 25}
    assert out["headroom_dropped_series"] == [({"what": "headroom_task_arrival_rate"}, 25.0)]
    # a counter: the renderer's cuts add up over renders; another renderer has its own
    again = renderer.render(Snapshot(timestamp=1.0, pools=pools))
    assert again["headroom_dropped_series"] == [({"what": "headroom_task_arrival_rate"}, 50.0)]
    assert Renderer().dropped == {}
