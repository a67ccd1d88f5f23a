"""The cycle's pure half: `step(state, inputs, now)` is a function of its arguments.

Fed the simulated fleet's own /metrics texts (vLLM, Envoy-style gateway, application, DCGM), parsed
as `collect` parses them, and a forecaster's result: from two copies of one state, the same inputs
and the same `now` give the same snapshot (to the byte, in JSON and in /metrics samples) and the
same next state, while every clock of the process raises; the inputs are left as they were."""
from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import replace

import pytest
from simfleet import DCGM_URL, TASK_LABELS, cycle_inputs, one_pool, watched

from headroom_lab.sim.fleet import Fleet
from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo_settings import read_slos
from monitor.config import Capacity, PoolSettings
from monitor.config.inputs import capacity_inputs, step_settings
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.forecast.pool import CAPACITY_SERIES, Horizon, PoolForecast, SeriesOutlook
from monitor.model import RefitResult, SourceStatus
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

START = 1_790_000_000.0
DAY = Horizon(mean=20.0, upper=26.0, peak=24.0, peak_upper=31.0, peak_timestamp=START + 3600,
              end_timestamp=START + 86400)
LOAD = SeriesOutlook(True, model="ets", history_points=144, horizons={"1d": DAY})
FORECAST = RefitResult({"m": PoolForecast(START - 60, {CAPACITY_SERIES: LOAD}, {"1d": DAY}, exhaustion_seconds=5400.0,
                                          capacity_requests=32.0),
                        "gone": PoolForecast(START - 60, {CAPACITY_SERIES: SeriesOutlook(False, "history too short",
                                                                                        history_points=3)})},
                       started=START - 60, finished=START - 55, runs=1)


def fleet_and_config():
    fleet = Fleet(one_pool(3, gateway=TASK_LABELS), "steady", seed=3, start_time=START)
    urls, cfg = watched(fleet, Capacity(task_window=30.0),  # task rates are known once a window is covered
                        read_slos({"task_types": {"ask": {"p95_seconds": 5}}, "windows": ["1m", "5m"],
                                   "pools": {"m": {"ttft_p95_seconds": 0.5}}}))
    return fleet, urls, cfg


def inputs_at(fleet, urls, cfg, capacity: CapacityState, forecast=None) -> CycleInputs:
    statuses = [SourceStatus("vllm", u, True) for u in urls.values()]
    statuses.append(SourceStatus("dcgm", DCGM_URL, False, "timeout"))
    return cycle_inputs(fleet, urls, cfg, capacity, statuses=statuses, anomalies={"duplicate_series": 1.0},
                        forecast=forecast)


@pytest.fixture
def no_clock(monkeypatch):
    """Every clock of the process raises while the test holds it (logging is off: a record stamps
    the time it was made)."""
    def tick(*_):
        raise AssertionError("step read a clock")
    logging.disable(logging.CRITICAL)
    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"):
        monkeypatch.setattr(time, name, tick)
    yield
    logging.disable(logging.NOTSET)


def warmed_up(cycles: int = 12):
    fleet, urls, cfg = fleet_and_config()
    state = CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg)))
    for _ in range(cycles):
        fleet.advance(5.0)
        state, _snap = step(state, inputs_at(fleet, urls, cfg, state.capacity), fleet.t)
    fleet.advance(5.0)
    return state, inputs_at(fleet, urls, cfg, state.capacity, FORECAST), fleet.t


def rendered(snapshot) -> str:
    return json.dumps(snapshot_to_dict(snapshot), sort_keys=True, allow_nan=False)


def test_same_state_inputs_and_now_give_the_same_snapshot_and_read_no_clock(no_clock):
    with pytest.raises(AssertionError, match="read a clock"):
        time.monotonic()  # the clocks are really gone
    state, inputs, now = warmed_up()
    before = copy.deepcopy(inputs)
    one, two = copy.deepcopy(state), copy.deepcopy(state)
    one, snap_one = step(one, inputs, now)
    two, snap_two = step(two, inputs, now)
    assert rendered(snap_one) == rendered(snap_two)
    assert Renderer().render(snap_one) == Renderer().render(snap_two)
    assert inputs == before  # the inputs are read, never changed
    # the two next states are the same state: they answer the next inputs alike
    one, again_one = step(one, inputs, now + 5.0)
    two, again_two = step(two, inputs, now + 5.0)
    assert rendered(again_one) == rendered(again_two)
    # and the snapshot is built from the arguments only: the capacity layer ran, the time is `now`
    [pool] = snap_one.pools
    assert snap_one.timestamp == now and pool.last_fresh_timestamp == now
    assert pool.capacity is not None and pool.capacity.knee_requests is not None
    assert pool.tasks.by_type["ask"].arrival_rate is not None and pool.capacity.power_source == "dcgm"
    assert snap_one.errors == {"dcgm|timeout": 13.0} and snap_one.anomalies == {"duplicate_series": 13.0}
    assert snap_one.cycles == 13


def test_the_snapshot_carries_the_forecast_it_was_given(no_clock):
    state, inputs, now = warmed_up(cycles=2)
    state, snap = step(state, inputs, now)
    # one object from the forecaster to the snapshot and its pool: /metrics, the JSON and the
    # landing page read this very object
    assert snap.forecast is FORECAST and snap.pools[0].forecast is FORECAST.pools["m"]
    doc = snapshot_to_dict(snap)["pools"][0]["forecast"]
    assert doc["horizons"]["1d"]["peak"] == 24.0 and doc["exhaustion_seconds"] == 5400.0
    samples = Renderer().render(snap)
    assert samples["headroom_forecast_peak_requests"] == [({"pool": "m", "horizon": "1d"}, 24.0)]
    assert samples["headroom_exhaustion_seconds"] == [({"pool": "m"}, 5400.0)]
    assert samples["headroom_forecast_last_fit_timestamp_seconds"] == [({}, START - 55)]
    # a pool the forecaster knows but the cycle does not see is still exported, as before
    assert samples["headroom_history_points"] == [({"pool": "gone", "series": CAPACITY_SERIES}, 3.0),
                                                  ({"pool": "m", "series": CAPACITY_SERIES}, 144.0)]
    state, without = step(state, CycleInputs(inputs.readings, inputs.statuses), now + 5.0)
    assert without.forecast is None and without.pools[0].forecast is None
    assert snapshot_to_dict(without)["pools"][0]["forecast"] == {}


def test_recommended_replicas_is_the_hand_computation(no_clock):
    """peak_upper 31 over the day; the pool's knee over its 2 replicas; N - 1 replicas must hold 31."""
    import math
    state, inputs, now = warmed_up(cycles=2)
    state.settings = replace(state.settings, pools={"m": PoolSettings(max_num_seqs=16, watts_per_replica=700.0,
                                                                      replica_lead_time=600.0)})
    state, snap = step(state, inputs, now)
    pool = snap.pools[0]
    per_replica = pool.capacity.knee_requests / pool.replicas
    expect = math.ceil(31.0 / per_replica) + 1  # the smallest N with (N - 1) x per_replica >= 31
    assert (expect - 1) * per_replica >= 31.0 > (expect - 2) * per_replica
    assert pool.recommended_replicas == {"1d": expect}
    samples = Renderer().render(snap)
    assert samples["headroom_recommended_replicas"] == [({"pool": "m", "horizon": "1d"}, float(expect))]
    assert samples["headroom_replica_lead_time_seconds"] == [({"pool": "m"}, 600.0)]
    doc = snapshot_to_dict(snap)["pools"][0]
    assert doc["recommended_replicas"] == {"1d": expect} and doc["replica_lead_time_seconds"] == 600.0


def test_recommended_replicas_edges():
    from monitor.capacity.headroom import recommended_replicas
    assert recommended_replicas(31.0, 32.0, 2) == 3  # 16 per replica: 2 hold 32 >= 31, plus the spare
    assert recommended_replicas(32.0, 32.0, 2) == 3  # exactly at the knee: no extra replica
    assert recommended_replicas(32.5, 32.0, 2) == 4
    assert recommended_replicas(0.0, 32.0, 2) == 1
    assert recommended_replicas(None, 32.0, 2) is None and recommended_replicas(31.0, None, 2) is None
    assert recommended_replicas(31.0, 32.0, 0) is None and recommended_replicas(float("inf"), 32.0, 2) is None


def test_the_landing_page_shows_the_knee_source_and_the_forecast_peak_with_its_band(no_clock):
    import time as _time

    from monitor.export.landing import Trends, render
    state, inputs, now = warmed_up(cycles=2)
    state, snap = step(state, inputs, now)
    page = render(snap, Trends())
    cap = snap.pools[0].capacity
    how = (f"learned on {cap.knee_signal}, confidence {cap.knee_confidence_ratio:.2f}" if cap.knee_source == "learned"
           else f"prior from the {cap.knee_signal}")
    assert f"<span>knee requests ({how})</span>" in page
    at = _time.strftime("%a %H:%M UTC", _time.gmtime(DAY.peak_timestamp))
    assert f"forecast peak requests (1 d) at {at}: 95 % band up to 31 · capacity reached in 1.5 h" in page


def test_the_step_attaches_each_pools_spare_for_deferrable_work(no_clock):
    """Issue 39: with a forecast path the step gives the pool its spare (knee x 0.8 less the
    forecast's band and the load now) and a budget above 0; without a forecast the budget is 0."""
    from dataclasses import replace as _replace

    import numpy as np

    from monitor.forecast.pool import ForecastPath
    state, inputs, now = warmed_up(cycles=4)
    ts = now - 60 + 300.0 * np.arange(1, 300)
    band = np.full(len(ts), 1.0)
    fc = _replace(FORECAST.pools["m"], last_fit_timestamp=now - 60, path=ForecastPath(ts, band, band, band))
    inputs.forecast = RefitResult({"m": fc}, started=now - 60, finished=now - 55, runs=1)
    state, snap = step(state, inputs, now)
    [pool] = snap.pools
    ceiling = pool.capacity.knee_requests * 0.8
    load = max(1.0, pool.spare.interactive_requests)
    assert pool.spare.ceiling == pytest.approx(ceiling)
    assert pool.spare.requests["now"] == max(0.0, float(int(ceiling - load + 1e-9)))
    assert pool.spare.requests["1h"] is not None and 0 < pool.spare.budget_ratio <= 1, pool.spare
    samples = Renderer().render(snap)
    assert ({"pool": "m"}, pool.spare.budget_ratio) in samples["headroom_deferrable_budget_ratio"]
    state, without = step(state, CycleInputs(inputs.readings, inputs.statuses), now + 5.0)
    assert without.pools[0].spare.budget_ratio == 0.0 and "no forecast" in without.pools[0].spare.reason
