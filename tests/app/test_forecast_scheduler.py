"""ForecastScheduler: a scheduled job refits in the background and publishes the latest result."""
import threading

import numpy as np
import pandas as pd
from servers import wait_for

from monitor.forecast.pool import CAPACITY_SERIES, PoolSettings
from monitor.forecast.rolling_origin import ForecastSettings
from monitor.kit.ticker import Ticker
from monitor.pipeline.forecaster import ForecastScheduler

HOUR = 3600.0
NOW = 1_700_000_000.0 + HOUR * 5 * 24  # the hour after series()'s last point: the forecast starts now


def series(days=5, level=20.0):
    i = np.arange(days * 24)
    y = level * (1 + 0.5 * np.sin(2 * np.pi * i / 24)) + np.random.default_rng(0).normal(0, 0.5, len(i))
    return pd.Series(y, index=1_700_000_000.0 + HOUR * i)


SETTINGS = PoolSettings(forecast=ForecastSettings(models=("snaive_day",)), horizons=("1h", "1d"))


def test_background_job_refits_and_publishes_without_blocking_readers():
    calls = []

    def load():
        calls.append(threading.current_thread().name)
        return {"a": {CAPACITY_SERIES: series()}, "b": {CAPACITY_SERIES: series(level=5)}}

    sched = ForecastScheduler(load, lambda: {"a": 25.0, "b": 1000.0}, SETTINGS,
                              interval_minutes=60, clock=lambda: NOW)
    assert sched.latest.get() is None
    scheduler = Ticker()  # the application's one scheduler (monitor/app)
    assert sched.schedule(scheduler) == "headroom-forecast-refit"
    job = scheduler.get_job("headroom-forecast-refit")
    assert job.interval == 3600 and job.first_delay == 0
    scheduler.start()
    try:
        res = wait_for(sched.latest.get, cond=lambda r: r is not None, timeout=60, what="the first refit")
    finally:
        scheduler.shutdown()
    assert res is not None and res.runs == 1 and res.errors == {}
    assert set(res.pools) == {"a", "b"}
    assert res.started == NOW
    assert calls == ["forecast-refit"]  # in its own daemon thread: a stop never waits for a refit
    assert res.pools["a"].exhaustion_seconds < 86400  # 25 is crossed by the daily peak (~30)
    assert res.pools["b"].exhaustion_seconds == float("inf")


def test_failed_history_load_keeps_the_previous_forecasts_and_reports():
    state = {"fail": False}

    def load():
        if state["fail"]:
            raise ConnectionError("prometheus unreachable")
        return {"a": {CAPACITY_SERIES: series()}}

    sched = ForecastScheduler(load, lambda: {}, SETTINGS, clock=lambda: 1.0)
    first = sched.refit_now()
    assert "a" in first.pools and first.errors == {}
    state["fail"] = True
    second = sched.refit_now()
    assert second.runs == 2
    assert "prometheus unreachable" in second.errors["history"]
    assert second.pools is first.pools  # the last good forecasts stay published


def test_each_refit_is_one_log_line(caplog):
    import logging
    sched = ForecastScheduler(lambda: {"a": {CAPACITY_SERIES: series()}, "b": {CAPACITY_SERIES: series(days=0.1)}},
                              lambda: {}, SETTINGS, clock=lambda: 1_700_500_000.0)
    with caplog.at_level(logging.INFO, logger="monitor.pipeline.forecaster"):
        sched.refit_now()
    lines = [r.getMessage() for r in caplog.records if r.name == "monitor.pipeline.forecaster"]
    assert len(lines) == 1 and lines[0].startswith("forecast refit 1: 2 pools, 1 of 2 series forecast in ")


def test_stop_ends_a_refit_in_progress_before_its_next_pool():
    entered, release = threading.Event(), threading.Event()

    def load():  # the refit is inside its history load when the stop comes
        entered.set()
        release.wait(30)
        return {"a": {CAPACITY_SERIES: series()}, "b": {CAPACITY_SERIES: series(level=5)}}

    sched = ForecastScheduler(load, lambda: {}, SETTINGS, interval_minutes=60, clock=lambda: NOW)
    scheduler = Ticker()
    sched.schedule(scheduler)
    scheduler.start()
    try:
        assert entered.wait(30), "the scheduled refit did not start"
        assert sched.stop(wait=0) is False  # still loading: the thread is running
    finally:
        scheduler.shutdown()
        release.set()
    assert sched.stop(wait=30) is True
    assert [t.name for t in threading.enumerate() if t.name == "forecast-refit"] == []
    assert sched.latest.get() is None  # the refit cut short by the stop fitted no pool and published nothing
    assert sched.refit_now().pools == {} and sched.latest.get() is None  # nor does one asked for after it
