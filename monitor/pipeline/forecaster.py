"""Refitting the forecasts on a schedule, off the scrape path (the pipeline floor: it runs jobs
and holds state; the forecast core below it is pure).

`ForecastScheduler.schedule(scheduler)` adds one interval job to the application's scheduler
(monitor/kit/ticker.py: every N minutes on the monotonic clock, the first at once, never two at once,
missed runs coalesced; each run in a daemon thread). Each run asks `load_history()` for {pool: {series: pandas Series}} and `capacity()` for
{pool: concurrent requests at the knee or None}, calls `forecast_pool` per pool with the given
settings (give `ForecastSettings` a `runner`, e.g. monitor/kit/timebox.py `FitPool(seconds, FIT_MODULES)`,
to time-box every fit in a worker process: an overrunning fit is killed, reported in the series' `errors`, and the next
model in the fallback order is used), and publishes the results in a `LatestResult`. The
collection cycle reads `latest.get()` once per cycle (monitor/app/forecasts.py `ForecastLoop`): the
published object (monitor/model/ `RefitResult`), taken under a lock, never a fit; the cycle's snapshot carries it to /metrics,
/api/v1/snapshot and `/`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from monitor.forecast.pool import PoolSettings, forecast_pool
from monitor.model import PoolForecastLike, RefitResult

log = logging.getLogger(__name__)
# what a fit worker imports before its first fit (monitor/kit/timebox.py FitPool `preload`): the models,
# and the statsmodels modules their fits import, so no fit pays for the import
FIT_MODULES = ("monitor.forecast.rolling_origin", "statsmodels.tsa.holtwinters", "statsmodels.tsa.seasonal",
               "statsmodels.tsa.statespace.sarimax")


class LatestResult:
    """Thread-safe holder of the latest refit; readers get the published object, never a partial."""

    def __init__(self):
        self._lock = threading.Lock()
        self._value: Optional[RefitResult] = None

    def set(self, value: RefitResult) -> None:
        with self._lock:
            self._value = value

    def get(self) -> Optional[RefitResult]:
        with self._lock:
            return self._value


class ForecastScheduler:
    def __init__(self, load_history: Callable[[], dict], capacity: Callable[[], dict],
                 settings: PoolSettings = PoolSettings(), interval_minutes: float = 15.0,
                 clock: Callable[[], float] = time.time, latest: Optional[LatestResult] = None):
        if not interval_minutes > 0:
            raise ValueError(f"refit interval must be positive minutes, got {interval_minutes!r}")
        self.load_history, self.capacity = load_history, capacity
        self.settings, self.interval_minutes, self.clock = settings, interval_minutes, clock
        self.latest = latest if latest is not None else LatestResult()  # where refits are published
        self._runs = 0
        self._run_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()

    def refit_now(self) -> RefitResult:
        """One refit of every pool (also what the scheduled job runs). Never raises. Once `stop()` is
        called it fits no further pool and publishes nothing."""
        with self._run_lock:
            started = self.clock()
            t0 = time.perf_counter()
            pools: dict[str, PoolForecastLike] = {}
            errors: dict[str, str] = {}
            try:
                history = self.load_history() or {}
                caps = self.capacity() or {}
            except Exception as exc:  # noqa: BLE001 - the previous result stays published
                log.warning("forecast refit: loading history failed: %s", exc)
                history, caps = {}, {}
                errors["history"] = f"{type(exc).__name__}: {exc}"
            cut = False
            for pool, series in history.items():
                if self._stopping.is_set():
                    cut = True  # stopped: the pools left are not fitted, and this refit is not published
                    break
                try:
                    pools[pool] = forecast_pool(series, caps.get(pool), started, self.settings)
                except Exception as exc:  # noqa: BLE001 - one pool's failed fit is said; the other pools still fit
                    log.warning("forecast refit for pool %s failed: %s", pool, exc)
                    errors[pool] = f"{type(exc).__name__}: {exc}"
            self._runs += 1
            prev = self.latest.get()
            if not pools and prev is not None and errors:
                pools = prev.pools  # keep serving the last good forecasts, report the failure
            result = RefitResult(pools, started, self.clock(), time.perf_counter() - t0, errors,
                                 self._runs)
            if cut:
                return result
            self.latest.set(result)
            defined = sum(o.defined for fc in pools.values() for o in fc.series.values())
            total = sum(len(fc.series) for fc in pools.values())
            log.info("forecast refit %d: %d pools, %d of %d series forecast in %.1f s%s", self._runs, len(pools),
                     defined, total, result.duration_seconds, f"; {len(errors)} failed" if errors else "")
            return result

    def stop(self, wait: float = 0.0) -> bool:
        """No refit starts in the background after this, and one in progress ends before its next
        pool; waits up to `wait` seconds for it. True when no refit thread is left running."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and wait > 0:
            thread.join(wait)
        return thread is None or not thread.is_alive()

    def schedule(self, scheduler) -> str:
        """Add the refit job to the application's one scheduler (monitor/kit/ticker.py `Ticker`, on the
        monotonic clock): every `interval_minutes`, the first at once. Returns the job id."""
        scheduler.every("headroom-forecast-refit", self.interval_minutes * 60.0, self._refit_in_background)
        return "headroom-forecast-refit"

    def _refit_in_background(self) -> None:
        """The scheduled job: a refit in a daemon thread (one at a time), so a stop of the process
        never waits for a refit in progress (a refit of a busy fleet's 35 days takes minutes on a
        starved CPU); the scheduler's own worker returns at once."""
        if self._stopping.is_set():
            return
        if self._run_lock.locked() or (self._thread is not None and self._thread.is_alive()):
            return  # the previous refit is still running: this one is skipped (coalesced)
        self._thread = threading.Thread(target=self.refit_now, name="forecast-refit", daemon=True)
        self._thread.start()
