"""The forecasts as a part of the daemon, and the one feedback edge of the wiring.

    loop = ForecastLoop()                                      # built first, handed to both ends
    Pipeline(settings, capacity=..., forecasts=loop.forecast)  # each cycle reads the latest refit
    pipeline.on_snapshot(loop.published)                       # each published snapshot: its knees
    Forecasts(cfg, pipeline, loop, source)                     # each refit reads the knees, publishes into it

The exhaustion time is the forecast load against the knee the cycles learned, and the cycles' snapshot
carries the latest forecast: a loop, kept in this one object so that neither end holds the other.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from ..config import Config
from ..model import RefitResult, Snapshot
from ..pipeline.cycle import Pipeline
from ..pipeline.forecaster import LatestResult
from .component import Component

log = logging.getLogger(__name__)

REFIT_STOP_WAIT = 3.0  # seconds a stop waits for a forecast refit to end (it ends before its next pool)


class ForecastLoop:
    """The feedback edge between the cycle and the forecaster: the cycle's newest snapshot (its knee
    capacity, read by each refit) one way, the forecaster's latest refit (read by each cycle) the other."""

    def __init__(self) -> None:
        self.results = LatestResult()  # the forecaster publishes each refit here
        self._snapshot: Optional[Snapshot] = None

    def published(self, snapshot: Snapshot) -> None:
        """The pipeline's listener: the newest snapshot (a single reference swap)."""
        self._snapshot = snapshot

    def forecast(self) -> Optional[RefitResult]:
        """What the cycle's `collect` reads: the latest refit, None before the first."""
        return self.results.get()

    def capacity(self) -> dict[str, float]:
        """What a refit reads: pool -> concurrent requests at the knee of the newest snapshot."""
        return capacity_at_knee(self._snapshot)


class Forecasts(Component):
    """The forecaster over a history source (Prometheus in Prometheus mode, else the store), reading
    and writing `loop` (its side of the feedback edge). Refits run on the schedule, off the scrape path."""
    name = "forecaster"

    def __init__(self, cfg: Config, pipeline: Pipeline, loop: ForecastLoop, source, history_days: float = 35.0,
                 step: float = 300.0):
        from monitor.kit.timebox import FitPool  # noqa: PLC0415

        from ..pipeline.forecaster import FIT_MODULES  # noqa: PLC0415
        self.source = source
        # every fit in a worker of the fork server's (never a fork of this threaded process), time-boxed
        self.pool = FitPool(cfg.forecast.fit_timeout_seconds, preload=FIT_MODULES)
        self.forecaster = store_forecaster(cfg, source, pipeline.clock, loop.capacity, history_days, step,
                                           runner=self.pool, latest=loop.results)
        self.job = None
        pipeline.on_clock_step(self.clock_stepped)

    def start(self, scheduler) -> None:
        self.job = scheduler.get_job(self.forecaster.schedule(scheduler))

    def clock_stepped(self, seconds: float, now: float) -> None:
        """A refit at once: the forecast paths were made on the old clock."""
        if self.job is not None:
            self.job.run_now()

    def stop(self) -> None:
        # a refit in progress ends before its next pool; the stop waits a little for it, not for minutes
        if not self.forecaster.stop(wait=REFIT_STOP_WAIT):
            log.info("a forecast refit is still ending; not waited for")
        client = getattr(self.source, "client", None)  # Prometheus mode: its own client
        if client is not None and hasattr(client, "close"):
            client.close()
        self.pool.close()  # the idle fit worker exits; one in a refit is stopped when its fit ends


def capacity_at_knee(snapshot) -> dict[str, float]:
    """Pool -> concurrent requests at the knee (the effective capacity) for the exhaustion time."""
    out = {}
    for p in (snapshot.pools if snapshot else []):
        value = p.capacity.exhaustion_requests if p.capacity is not None else None
        if value is not None:
            out[p.pool] = float(value)
    return out


def history_source(cfg: Config, store):
    """Where the forecasts read history: Prometheus in Prometheus mode, else the embedded store."""
    if cfg.prometheus is not None:
        from ..history.query_range import PrometheusHistory  # noqa: PLC0415
        return PrometheusHistory.from_config(cfg.prometheus, pool_by=cfg.pool_by)
    from ..history.store import StoreHistory  # noqa: PLC0415
    return StoreHistory(store)


def _has_days(section) -> bool:
    """A calendar that names any non-working day besides the weekend."""
    return bool(section.country or section.non_working or section.recurring)


def store_forecaster(cfg: Config, source, clock: Callable[[], float], capacity: Callable[[], dict],
                     history_days: float = 35.0, step: float = 300.0, runner: Optional[Callable] = None,
                     latest: Optional[LatestResult] = None):
    """The `ForecastScheduler` over a history source (monitor/history). `capacity()`: pool ->
    concurrent requests at the knee; `runner`: how each fit runs (monitor/kit/timebox.py `FitPool`);
    `latest`: where each refit is published (a `ForecastLoop`'s results)."""
    from ..forecast.pool import PoolSettings  # noqa: PLC0415
    from ..forecast.rolling_origin import ForecastSettings  # noqa: PLC0415
    from ..history.forecast_history import forecast_history  # noqa: PLC0415
    from ..pipeline.forecaster import ForecastScheduler  # noqa: PLC0415

    def load_history() -> dict:
        hist = forecast_history(source, clock(), days=history_days, step=step)
        if cfg.shard is not None:
            from ..model.shard import owns  # noqa: PLC0415
            hist = {pool: series for pool, series in hist.items() if owns(pool, cfg.shard)}
        return hist

    fc = cfg.forecast  # typed and validated at load (monitor/config/headroom_yml.py Forecast)
    calendar = cfg.calendar.calendar()
    settings = PoolSettings(forecast=ForecastSettings(runner=runner,
                                                      calendar=calendar if _has_days(cfg.calendar) else None))
    return ForecastScheduler(load_history, capacity, settings, interval_minutes=fc.refit_minutes, clock=clock,
                             latest=latest)
