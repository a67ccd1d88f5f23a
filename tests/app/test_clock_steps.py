"""A wall-clock step between two cycles: found, counted, and the cycle state moved onto the new clock.

Two copies of one warmed-up state see the same simulated fleet: one on the true clock, one on a
clock stepped back an hour (its inputs stamped an hour earlier from the step on). The stepped one
is moved onto its new clock (`CycleState.shift_time`, what monitor/pipeline/cycle.py does when it finds the
step); from then on both give the same rates, quantiles, knees, task numbers and burn rates, and
timestamps exactly an hour apart. Without the move the stepped copy is wrong: that is what the
test guards."""
from __future__ import annotations

import copy
import json

from test_cycle_step import fleet_and_config, inputs_at, warmed_up  # the shared simulated fleet

from headroom_lab.sim.exposition import render_vllm
from monitor.config.inputs import pipeline_settings
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.pipeline.cycle import Pipeline
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_step import step

HOUR = 3600.0


def stamped(inputs, seconds: float):
    """The same inputs as read on a clock `seconds` off."""
    from dataclasses import replace
    out = copy.deepcopy(inputs)
    out.readings = [replace(r, timestamp=r.timestamp + seconds) for r in out.readings]
    out.gateways = [replace(g, timestamp=g.timestamp + seconds,
                            reading=replace(g.reading, timestamp=g.reading.timestamp + seconds) if g.reading else None)
                    for g in out.gateways]
    return out


def numbers(snapshot) -> dict:
    """The snapshot's numbers without its timestamps."""
    doc = snapshot_to_dict(snapshot)
    drop = {"timestamp", "last_success_timestamp", "last_fresh_timestamp", "started", "finished"}

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in drop}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    return clean(doc)


def test_a_step_back_moves_the_state_and_every_number_stays_what_it_would_have_been():
    state, _inputs, _now = warmed_up(cycles=70)
    fleet, urls, cfg = fleet_and_config()
    # rebuild the fleet at the warmed-up state's time: the twin states see the same next inputs
    true_state, stepped = copy.deepcopy(state), copy.deepcopy(state)
    stepped.shift_time(-HOUR)
    untouched = copy.deepcopy(state)  # stepped too, but never moved onto the new clock
    fleet2, urls2, cfg2 = fleet_and_config()
    for _ in range(71):
        fleet2.advance(5.0)
    for i in range(12):
        fleet2.advance(5.0)
        inputs = inputs_at(fleet2, urls2, cfg2, true_state.capacity)
        true_state, a = step(true_state, copy.deepcopy(inputs), fleet2.t)
        stepped, b = step(stepped, stamped(inputs, -HOUR), fleet2.t - HOUR)
        untouched, c = step(untouched, stamped(inputs, -HOUR), fleet2.t - HOUR)
        assert b.timestamp == a.timestamp - HOUR
        assert b.last_success_timestamp == a.last_success_timestamp - HOUR
        assert json.dumps(numbers(b), sort_keys=True) == json.dumps(numbers(a), sort_keys=True), i
    pa, pc = a.pools[0], c.pools[0]
    # the copy left on the old clock has no rates (its readings are "in the future") and its
    # capacity layer fails on the SLO windows: what the move prevents
    assert pa.completion_rate is not None and pa.latency["e2e"].p95 is not None
    assert numbers(c) != numbers(a)
    assert pc.completion_rate is None or c.errors.get("enricher|capacity")


def test_the_pipeline_finds_a_step_once_counts_it_by_direction_and_logs_it(caplog):
    fleet, urls, cfg = fleet_and_config()
    wall, steady = [1_800_000_000.0], [100.0]
    p = Pipeline(pipeline_settings(cfg), clock=lambda: wall[0], steady=lambda: steady[0])
    shifted = []
    p.on_clock_step(lambda seconds, now: shifted.append((seconds, now)))
    r = readings_from_text(render_vllm(fleet.pools["p"][0], fleet.t), "http://r/metrics", wall[0])[0]
    p.state.history["k"] = __import__("collections").deque([r])

    def tick(dt_wall, dt_steady):
        wall[0] += dt_wall
        steady[0] += dt_steady
        p._check_clock(wall[0])

    tick(0, 0)  # the first cycle: nothing to compare with
    tick(15.0, 15.0)
    tick(15.4, 15.0)  # drift within the tolerance: no step
    assert p.clock_steps == {"back": 0.0, "forward": 0.0} and shifted == []
    with caplog.at_level("WARNING", logger="monitor.pipeline.cycle"):
        tick(15.0 - HOUR, 15.0)
    assert p.clock_steps == {"back": 1.0, "forward": 0.0}
    assert shifted == [(-HOUR, wall[0])]
    assert p.state.history["k"][0].timestamp == r.timestamp - HOUR
    lines = [x.getMessage() for x in caplog.records if "stepped" in x.getMessage()]
    assert lines == ["the wall clock stepped back by 3600.0 s since the previous cycle; the cycle state is moved "
                     "onto the new clock (headroom_clock_steps_total counts steps)"]
    tick(15.0, 15.0)  # the next cycle on the new clock: no second step
    tick(86400.0 + 15.0, 15.0)
    assert p.clock_steps == {"back": 1.0, "forward": 1.0}


def test_a_driven_clock_without_a_steady_one_has_no_step_check():
    _fleet, _urls, cfg = fleet_and_config()
    t = [0.0]
    p = Pipeline(pipeline_settings(cfg), clock=lambda: t[0])
    assert p.steady is None
    for dt in (5.0, -HOUR, 86400.0):
        t[0] += dt
        p._check_clock(t[0])
    assert p.clock_steps == {"back": 0.0, "forward": 0.0}


def test_a_step_moves_the_saved_slo_windows_too(tmp_path):
    """The tracker's saved points (the store's slo_counts) follow it onto the new clock: after the
    next save the store holds exactly the moved points, also where a moved point lands on the time
    of an old one."""
    from monitor.capacity.slo import SloTracker, Target
    from monitor.history.slo_history import restore, save
    from monitor.history.store import HistoryStore
    tracker = SloTracker({"5m": 300.0, "1h": HOUR}, tolerance=5.0, journal=True)
    t0 = 1_800_000_000.0
    with HistoryStore(str(tmp_path / "h.sqlite")) as store:
        for i in range(1500):  # ~2 h at 5 s: points an hour apart exist on both sides of the step
            tracker.observe(("p", "ask", "task<=30"), t0 + 5 * i, 10.0 * i, 1.0 * i)
            if i % 50 == 0:
                save(tracker, store, t0 + 5 * i)
        save(tracker, store, t0 + 5 * 1499)
        before = tracker.burn_rates(("p", "ask", "task<=30"), Target(30.0))
        tracker.shift_time(-HOUR)
        save(tracker, store, t0 + 5 * 1499 - HOUR)
        again = SloTracker({"5m": 300.0, "1h": HOUR}, tolerance=5.0)
        restore(again, store)
    key = ("p", "ask", "task<=30")
    assert list(again._series[key]) == list(tracker._series[key])
    assert tracker._series[key][-1][0] == t0 + 5 * 1499 - HOUR
    assert again.burn_rates(key, Target(30.0)) == before  # the same windows on the new clock


def test_a_forecast_made_before_a_step_forward_does_not_read_as_exhausted_now():
    """A refit's path on the old clock lies before `now` after a step forward: those points are past,
    not 'capacity reached 0 s from now' (which would page HeadroomExhaustionWithinLeadTime)."""
    import numpy as np

    from monitor.forecast.pool import exhaustion_seconds
    now = 1_800_000_000.0
    times = np.array([now - 7200.0, now - 3600.0, now + 600.0, now + 1200.0])
    upper = np.array([50.0, 10.0, 10.0, 40.0])  # over 30 only an hour back and 20 min ahead
    assert exhaustion_seconds(times, upper, 30.0, now) == 1200.0
    assert exhaustion_seconds(times[:3], upper[:3], 30.0, now) == float("inf")


def test_the_prometheus_reader_s_last_seen_times_move_with_a_step():
    from monitor.config import PrometheusSource
    from monitor.sources.prometheus_reader import PrometheusSourceReader
    reader = PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"), forget_after=HOUR)
    try:
        reader.known = {"a:8000": 1_800_000_000.0}
        reader.shift_time(86400.0)
        assert reader.known == {"a:8000": 1_800_086_400.0}
        reader._remember(set(), 1_800_086_400.0 + 60)  # a minute later on the new clock: still known
        assert list(reader.known) == ["a:8000"]
    finally:
        reader.close()


class Answers:
    """A query API stub for the query clock alone: the query layer's now is `offset` + the steady
    clock; each request takes `takes` seconds of the steady clock, evaluated in its middle."""

    def __init__(self, steady: list):
        self.steady, self.offset, self.takes, self.asked, self.evaluated = steady, 1_800_000_000.0, 0.2, [], None

    def query(self, query, at=None, deadline=None, warnings=None, stamps=None):
        self.asked.append(at)
        self.evaluated = self.offset + self.steady[0] + self.takes / 2
        self.steady[0] += self.takes
        if stamps is not None:
            stamps.append(self.evaluated)
        return [({"__name__": "up", "instance": "a"}, 1.0)]


def test_every_query_of_a_cycle_is_at_the_query_layer_s_time_and_its_steps_are_counted():
    from monitor.sources.query_clock import QueryClock
    steady = [100.0]
    api = Answers(steady)
    clock = QueryClock(steady=lambda: steady[0])

    def cycle(advance: float):
        steady[0] += advance
        clock.begin()
        for q in ("replicas", "up", "histograms"):
            clock.query(api, q, deadline=None)
        return api.asked[-3]

    first = cycle(0.0)
    assert first is None and api.asked[-2:] == [clock.at, clock.at]  # the first without `time`, the rest at its answer's
    for _ in range(5):
        cycle(15.0)  # the query layer's clock keeps pace with the steady clock
    assert clock.steps == {"back": 0.0, "forward": 0.0}
    api.takes = 4.0  # one slow cycle: its answer may be evaluated anywhere within its request
    cycle(15.0)
    api.takes = 0.2
    cycle(15.0)
    assert clock.steps == {"back": 0.0, "forward": 0.0}
    api.offset -= 45.0  # the query layer's clock steps back 45 s
    cycle(15.0)
    assert clock.steps == {"back": 1.0, "forward": 0.0}
    assert clock.at == api.offset + steady[0] - 3 * 0.2 + 0.1  # read at its new time, never headroom's
    cycle(15.0)
    api.offset += 3600.0
    cycle(15.0)
    assert clock.steps == {"back": 1.0, "forward": 1.0}
