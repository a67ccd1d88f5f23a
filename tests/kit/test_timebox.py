"""monitor/kit/timebox.py FitPool with real worker processes: started by the fork server (never forked
from the test process), the forecast modules preloaded there, a fit over its box killed."""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pandas as pd
import pytest
from servers import wait_for

from monitor.forecast.rolling_origin import ForecastSettings, _fit_forecast, forecast_series
from monitor.forecast.series import prepare
from monitor.kit.timebox import ChildError, FitPool, TimeBoxExceeded
from monitor.pipeline.forecaster import FIT_MODULES

pytestmark = pytest.mark.live  # starts processes

HOUR = 3600.0


def daily(days=4, seed=3):
    i = np.arange(days * 24)
    y = 30 * (1 + 0.5 * np.sin(2 * np.pi * i / 24)) * np.random.default_rng(seed).normal(1, 0.05, len(i))
    return pd.Series(y, index=1_700_000_000.0 + HOUR * i)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.fixture
def pool():
    p = FitPool(60.0, preload=FIT_MODULES)
    yield p
    p.close()


def test_a_fit_in_a_worker_equals_the_same_fit_here_and_the_worker_is_reused(pool):
    prep = prepare(daily())
    here = _fit_forecast("ets", prep, 24)
    there = pool(_fit_forecast, ("ets", prep, 24))
    assert np.array_equal(there.mean, here.mean)
    assert all(np.array_equal(there.bands[k][1], here.bands[k][1]) for k in here.bands)
    assert pool(os.getpid, ()) == pool(os.getpid, ())  # one worker, fit after fit


def test_workers_come_from_the_fork_server_with_the_forecast_modules_loaded(pool):
    parent = pool(os.getppid, ())
    assert parent != os.getpid()  # not a fork of this (threaded) process
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        assert b"multiprocessing.forkserver" in f.read()
    with open(f"/proc/{parent}/maps") as f:  # statsmodels' compiled parts are loaded in the server
        assert "/statsmodels/tsa/" in f.read()


def test_a_call_over_its_box_is_abandoned_and_its_worker_killed():
    pool = FitPool(1.0)
    try:
        first = pool(os.getpid, ())
        t0 = time.monotonic()
        with pytest.raises(TimeBoxExceeded, match="abandoned after 1 s"):
            pool(time.sleep, (60,))
        assert time.monotonic() - t0 < 30  # not the 60 s the call asked for
        wait_for(lambda: alive(first), cond=lambda a: not a, timeout=10, what=f"worker {first} gone")
        second = pool(os.getpid, ())
        assert second != first and alive(second)  # the next call has a new worker
    finally:
        pool.close()
    wait_for(lambda: alive(second), cond=lambda a: not a, timeout=10, what="the idle worker stopped by close()")


def test_a_failure_names_its_type_and_a_dead_worker_is_reported(pool):
    with pytest.raises(ChildError) as err:
        pool(math.sqrt, (-1.0,))
    assert err.value.kind == "ValueError" and "math domain error" in err.value.message
    with pytest.raises(ChildError, match="ChildDied: fit process exited with code 3"):
        pool(os._exit, (3,))
    assert pool(sum, ([1, 2, 3],)) == 6  # and the next call works
    with pytest.raises(Exception, match="pickle"):  # a function that cannot go to a worker fails here
        pool(lambda: 1, ())


def test_forecast_series_through_the_pool_selects_and_forecasts_as_inline(pool):
    prep = prepare(daily(5))
    settings = ForecastSettings(models=("ets", "snaive_day"), folds=1, max_folds=1)
    inline = forecast_series(prep, 24, settings)
    boxed = forecast_series(prep, 24, ForecastSettings(models=("ets", "snaive_day"), folds=1, max_folds=1,
                                                       runner=pool))
    assert boxed.defined and boxed.model == inline.model and not boxed.errors.get("ets")
    assert np.array_equal(boxed.forecast.mean, inline.forecast.mean)


def test_a_worker_is_replaced_after_max_fits_and_close_stops_the_idle_one():
    pool = FitPool(60.0, max_fits=2)
    try:
        pids = [pool(os.getpid, ()) for _ in range(3)]
    finally:
        pool.close()
    assert pids[0] == pids[1] != pids[2]  # the first worker did its 2 fits and was stopped
    wait_for(lambda: alive(pids[0]) or alive(pids[2]), cond=lambda a: not a, timeout=10, what="both workers gone")
    with pytest.raises(ChildError, match="closed"):
        pool(os.getpid, ())
