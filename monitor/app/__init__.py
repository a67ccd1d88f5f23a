"""The one place that builds headroom: its components, in order, on one scheduler.

    sources + cycle (Pipeline)  ->  history store  ->  forecaster  ->  digest  ->  web server

`build(cfg, listen_address=...)` is the daemon (`headroom run`, `headroom demo`); `build(cfg)`
without an address is `headroom once`: the same sources, cycle and forecaster, the store opened only
if it exists and never written, no digest, no web server. Each component is built in that order and
gets what it needs at construction (a later one may use an earlier one: the web server shows the
store's failures and the digest's outbox, the forecaster reads the store); `build` below is the
whole wiring. The one loop, the forecaster reading the cycle's knees while the cycle reads the
forecaster's latest refit, is one object handed to both, `ForecastLoop` (monitor/app/forecasts.py).

Each published snapshot goes to the listeners in this order: the web server (/metrics, the JSON and
the page rendered at once: never behind the store's fsync), the garbage-collector settings, the
store's append, the SLO windows' save, the forecast loop. Each component has `start(scheduler)` and
`stop()`. `App.start()` lets every component add its jobs to the one scheduler (monitor/kit/ticker.py:
a monotonic cadence, so no wall-clock step freezes it), then starts it; `App.stop()` stops the
scheduler, then the components in reverse order, so the web server goes first and the cycle's
sources last. `headroom digest` reads its history through `monitor/config/inputs.py digest_history`
(`monitor/digest/schedule.py history_build_fn`), as the digest component does here.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Optional

from monitor.kit.ticker import Ticker

from ..config import Config
from ..pipeline.cycle import Pipeline
from .component import Component
from .forecasts import REFIT_STOP_WAIT, ForecastLoop, Forecasts, capacity_at_knee, history_source, store_forecaster
from .parts import (
    GC_YOUNG_EVERY,
    STOP_GRACE,
    Cycle,
    Digest,
    GarbageCollector,
    Status,
    Web,
    digest_directory,
    garbage_collector,
)
from .store import STORE_BACKLOG_POINTS, STORE_MAINTENANCE_HOURS, STORE_WRITE_WAIT, Store

__all__ = ["App", "Component", "Cycle", "Digest", "ForecastLoop", "Forecasts", "GC_YOUNG_EVERY", "GarbageCollector",
           "REFIT_STOP_WAIT", "STOP_GRACE", "STORE_BACKLOG_POINTS", "STORE_MAINTENANCE_HOURS", "STORE_WRITE_WAIT",
           "Status", "Store", "Web", "build", "capacity_at_knee", "digest_directory", "garbage_collector",
           "history_source", "store_forecaster"]

log = logging.getLogger(__name__)


class App:
    """The built application. `components` in build order; the named ones for callers and tests."""

    def __init__(self, cfg: Config, components: list[Component], *, cycle: Optional[Cycle] = None,
                 store: Optional[Store] = None, forecasts: Optional[Forecasts] = None,
                 digest: Optional[Digest] = None, web: Optional[Web] = None):
        self.cfg = cfg
        self.scheduler = Ticker()
        self.components = list(components)
        self.cycle, self.store_component, self.forecasts, self.digest, self.web = cycle, store, forecasts, digest, web
        self.stopped = threading.Event()

    @property
    def pipeline(self) -> Pipeline:
        assert self.cycle is not None  # every built App has one (`App(cfg, built)` is only ever stopped)
        return self.cycle.pipeline

    @property
    def store(self):
        return self.store_component.store if self.store_component else None

    @property
    def forecaster(self):
        return self.forecasts.forecaster if self.forecasts else None

    @property
    def digest_outbox(self):
        return self.digest.outbox if self.digest else None

    @property
    def port(self) -> int:
        assert self.web is not None, "only the daemon (build with a listen address) serves a port"
        return self.web.server.server_address[1]

    def start(self) -> None:
        for c in self.components:
            c.start(self.scheduler)
        self.scheduler.start()

    def stop(self) -> None:
        """Stops within a few seconds whatever a source is doing: no new jobs, then each component in
        reverse order (the web server first, the cycle's sources last)."""
        self.scheduler.shutdown()
        for c in reversed(self.components):
            try:
                c.stop()
            except Exception:
                log.exception("stopping the %s failed", c.name)
        self.stopped.set()


def build(cfg: Config, listen_address: Optional[str] = None, web_config_file=None) -> App:
    """The application for `cfg`. With `listen_address`: the daemon (store written, digest, web
    server). Without: `headroom once` (a store only if it exists, read-only, and the forecasts from it;
    no digest, no web).
    Raises ConfigError / ValueError naming the setting, OSError when the address cannot be bound;
    whatever was built before the failure is stopped."""
    daemon = listen_address is not None
    built: list[Component] = []

    def add(component):
        built.append(component)
        return component
    try:
        loop = ForecastLoop()
        cycle = add(Cycle(cfg, forecasts=loop.forecast))
        pipeline = cycle.pipeline
        collector = garbage_collector(cfg, pipeline) if daemon else None
        if collector is not None:
            add(collector)
        store = None
        if cfg.store_path and (daemon or os.path.exists(cfg.store_path)):
            store = add(Store(cfg, pipeline, writable=daemon))
        history = store.store if store is not None else None  # None: the store could not be read
        _keep_slo_windows(pipeline, store, writable=daemon)
        pipeline.on_snapshot(loop.published)
        forecasts = None
        if daemon and (cfg.prometheus is not None or history is not None):
            forecasts = add(Forecasts(cfg, pipeline, loop, history_source(cfg, history)))
        elif history is not None:  # once: one refit from the store it found (monitor/commands/once.py)
            from ..history.store import StoreHistory  # noqa: PLC0415
            forecasts = add(Forecasts(cfg, pipeline, loop, StoreHistory(history)))
        digest = add(Digest(cfg, history, pipeline)) if daemon and cfg.digest is not None else None
        web = None
        if listen_address is not None:  # the daemon
            status = Status(store, digest.outbox if digest is not None else None, cfg.shard or (0, 1))
            web = add(Web(cfg, pipeline, listen_address, web_config_file, status))
            if store is not None:
                store.seed_trends(web.state.trends)
    except BaseException:
        App(cfg, built).stop()
        raise
    return App(cfg, built, cycle=cycle, store=store, forecasts=forecasts, digest=digest, web=web)


def _keep_slo_windows(pipeline: Pipeline, store: Optional[Store], writable: bool) -> None:
    """The SLO windows' tracker restored from the store and, when the store is written, saved after
    each cycle (monitor/history/slo_history.py keep_windows); Prometheus mode's windows are the pipeline's own."""
    capacity = pipeline.state.capacity
    if store is None or store.store is None or capacity is None:
        return
    from ..history.slo_history import keep_windows  # noqa: PLC0415
    save = keep_windows(capacity.tracker, store.store, writable=writable and store.writable, guard=store.guarded,
                        skipped=lambda n: store.count_skipped("restore", n))
    if save is not None:
        pipeline.on_snapshot(save)
