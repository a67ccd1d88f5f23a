"""A render that fails for one part drops that part, counts it and serves the rest; a render that
fails altogether keeps the previous body, turns /-/ready 503 and never claims freshness (issue 38)."""
from __future__ import annotations

from monitor.export.collector import Exposition
from monitor.export.landing import Trends
from monitor.export.samples import Cadence, Renderer
from monitor.export.server import WebState, probe
from monitor.kit.web.http11 import Request
from monitor.model import PoolSnapshot, Snapshot


def pool(name: str, active: float) -> PoolSnapshot:
    return PoolSnapshot(pool=name, model=name, replicas=1, active_requests=active, last_fresh_timestamp=1.0)


def test_a_pool_that_fails_to_render_is_dropped_whole_and_counted_and_the_others_served():
    bad = pool("bad", 5.0)
    bad.latency = {"ttft": None}  # raises half-way through the pool's series
    renderer = Renderer()
    samples = renderer.render(Snapshot(timestamp=1.0, pools=[pool("a", 1.0), bad, pool("b", 2.0)], cycles=4))
    assert samples["headroom_active_requests"] == [({"pool": "a"}, 1.0), ({"pool": "b"}, 2.0)]
    assert all(labels.get("pool") != "bad" for rows in samples.values() for labels, _ in rows)
    assert samples["headroom_cycles"] == [({}, 4.0)]
    assert renderer.errors == {"pool": 1.0}
    assert renderer.live(None)["headroom_render_errors"] == [({"family": "pool"}, 1.0)]


class Clock:
    """The cycle's cadence (its age: the last cycle finished 0.5 s ago) and the monotonic clock."""

    def __init__(self):
        self.age = 0.5
        self.now = 1000.0

    def __call__(self):
        return Cadence(self.age, 1.0)

    def monotonic(self) -> float:
        return self.now


def ready(state: WebState) -> tuple[int, bytes]:
    r = probe(state, Request("GET", "/-/ready", "/-/ready", "HTTP/1.1", {}))
    return r.status, r.body


def test_a_render_that_fails_altogether_keeps_the_body_and_turns_ready_503():
    broken = {"now": False}

    def status():
        if broken["now"]:
            raise RuntimeError("status exploded")
        return None
    clock = Clock()
    exp = Exposition(status=status, cadence=clock, monotonic=clock.monotonic)
    state = WebState(exp, Trends())
    state.publish(Snapshot(timestamp=1.0, pools=[pool("a", 1.0)], cycles=1))
    assert ready(state)[0] == 200
    good = exp.body()
    assert b"headroom_cycles_total 1.0" in good

    broken["now"] = True
    clock.now += 4.0  # the next cycle, 4 s later, cannot be rendered
    state.publish(Snapshot(timestamp=2.0, pools=[pool("a", 9.0)], cycles=2))
    status_code, text = ready(state)
    assert status_code == 503 and b"could not be rendered" in text
    body = exp.body()
    assert b"headroom_cycles_total 1.0" in body and b'headroom_active_requests{pool="a"} 1.0' in body
    assert b'headroom_render_errors_total{family="all"} 1.0' in body  # rendered at each scrape
    # the cycle just finished (age 0.5 s) but the body served is 4 s old: the age says so, and grows
    assert exp.served_cadence().last_cycle_age_seconds == 4.0
    assert b"headroom_last_cycle_age_seconds 4.0" in exp.body()
    clock.now += 6.0
    assert exp.served_cadence().last_cycle_age_seconds == 10.0
    assert b"Not ready" in ready(state)[1]

    broken["now"] = False
    state.publish(Snapshot(timestamp=3.0, pools=[pool("a", 3.0)], cycles=3))
    assert ready(state)[0] == 200
    assert b"headroom_cycles_total 3.0" in exp.body()
    assert exp.served_cadence().last_cycle_age_seconds == clock.age
    assert b'headroom_render_errors_total{family="all"} 1.0' in exp.body()  # a counter: it stays


def test_a_first_render_that_fails_is_not_ready():
    def status():
        raise RuntimeError("status exploded")
    clock = Clock()
    exp = Exposition(status=status, cadence=clock, monotonic=clock.monotonic)
    state = WebState(exp, Trends())
    state.publish(Snapshot(timestamp=1.0, pools=[], cycles=1))
    assert ready(state)[0] == 503
    clock.now += 30.0
    assert exp.served_cadence().last_cycle_age_seconds == 30.0


def test_a_forecast_that_fails_to_render_drops_the_forecasts_only():
    from monitor.model import RefitResult

    class Broken:
        horizons = {"1d": "not a forecast"}  # raises half-way through
    renderer = Renderer()
    snap = Snapshot(timestamp=1.0, pools=[pool("a", 1.0)], cycles=2,
                    forecast=RefitResult(pools={"a": Broken()}, finished=5.0))
    samples = renderer.render(snap)
    assert renderer.errors == {"forecast": 1.0}
    assert "headroom_forecast_last_fit_timestamp_seconds" not in samples
    assert samples["headroom_active_requests"] == [({"pool": "a"}, 1.0)]
    assert samples["headroom_cycles"] == [({}, 2.0)]
