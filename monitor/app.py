"""The one place that builds headroom: its components, in order, on one scheduler.

    sources + cycle (Pipeline)  ->  history store  ->  forecaster  ->  digest  ->  web server

`build(cfg, listen_address=...)` is the daemon (`headroom run`, `headroom demo`); `build(cfg)`
without an address is `headroom once`: the same sources, cycle and forecaster, the store opened only
if it exists and never written, no digest, no web server. Each component is built in that order (a
later one may use an earlier one: the web server shows the digest's status, the forecaster reads
the store) and has `start(scheduler)` and `stop()`. `App.start()` lets every component add its jobs
to the one scheduler (monitor/kit/ticker.py: a monotonic cadence, so no wall-clock step freezes it),
then starts it; `App.stop()` stops the
scheduler, then the components in reverse order, so the web server goes first and the cycle's
sources last. `headroom digest` reads its history through `monitor/config/inputs.py digest_history`
(`monitor/digest/schedule.py history_build_fn`), as the digest component does here.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
from typing import Callable, Optional

from .capacity.enrich import CapacityState
from .config import Config
from .config.inputs import capacity_inputs
from .cycle import Pipeline
from monitor.kit.ticker import Ticker

log = logging.getLogger(__name__)

STOP_GRACE = 2.0  # seconds the running cycle may take to publish after its sources are cut off
STORE_MAINTENANCE_HOURS = 1
REFIT_STOP_WAIT = 3.0  # seconds a stop waits for a forecast refit to end (it ends before its next pool)
# seconds a cycle's store write waits for a lock held elsewhere before it is skipped (its points kept)
STORE_WRITE_WAIT = 0.5
STORE_BACKLOG_POINTS = 200_000  # points of skipped appends kept for the next one (oldest dropped past it)
GC_YOUNG_EVERY = 200_000  # net container allocations between two young collections (Python's default: 700)


class Component:
    """A part of the application: `start` adds its jobs to the shared scheduler, `stop` releases
    what it holds. Neither may raise past App (failures are logged)."""
    name = "component"

    def start(self, scheduler) -> None:
        pass

    def stop(self) -> None:
        pass


class Cycle(Component):
    """The sources and the collection cycle: one cycle every `interval`, the first at once."""
    name = "cycle"

    def __init__(self, cfg: Config):
        self.pipeline = Pipeline(cfg, capacity=CapacityState(capacity_inputs(cfg)))  # ValueError naming a bad key

    def start(self, scheduler) -> None:
        scheduler.every("cycle", self.pipeline.config.interval, self.pipeline.run_cycle)

    def stop(self) -> None:
        self.pipeline.close(wait=STOP_GRACE)  # requests in flight broken; the cycle publishes what it has


class GarbageCollector(Component):
    """Python's cyclic garbage collector set for a process that runs one large cycle again and again
    (global.tune_gc; issue 42). A cycle at 1,000 replicas makes hundreds of thousands of container
    objects that live until it ends (the readings of 2,000 bodies, or Prometheus' JSON answers); at
    Python's default every 700 of them start a young collection that walks all that survived the last
    one, and every few hundred thousand a full collection walks everything the process holds (the
    numeric stack's modules included). So:
    - at start, the youngest generation is collected every GC_YOUNG_EVERY net allocations (the older
      two keep their ratios): most of a cycle's objects are freed by their reference counts before
      any collection looks at them;
    - after the first cycle (config, imports, components and the warm state a cycle keeps are in
      memory) one full collection, then `gc.freeze()`: what survived it is left out of every later
      collection. Cycles among later objects are still collected, only later (a few MB at most).
    Measured at 1,000 replicas, the same code with it on and off (benchmarks/direct_cycle_ab.py --gc
    on,off; prometheus_mode_bench.py --gc-off): a direct cycle 1.10 -> 0.98 s CPU (the collector 0.11 ->
    0.01 s; at 50,000, and 200,000 a little less again), a Prometheus-mode one 0.58 -> 0.41 s (0.20 ->
    0 s); in 100 direct cycles the collector found no reference cycle to free, and RSS is the same.
    `stop()` puts Python's settings back (tests build many daemons in one process). The benchmarks
    that build a Pipeline themselves apply it through `garbage_collector`, as `build` does."""
    name = "gc"

    def __init__(self, pipeline: Pipeline):
        self.previous: Optional[tuple[int, ...]] = None
        self.frozen = False
        pipeline.on_snapshot(self.first_cycle_done)

    def start(self, scheduler) -> None:
        self.previous = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_EVERY, *self.previous[1:])

    def first_cycle_done(self, snapshot) -> None:
        if not self.frozen:
            self.frozen = True
            gc.collect()
            gc.freeze()

    def stop(self) -> None:
        if self.previous is not None:
            gc.set_threshold(*self.previous)
            self.previous = None
        if self.frozen:
            gc.unfreeze()
            self.frozen = False


def garbage_collector(cfg: Config, pipeline: Pipeline) -> Optional[GarbageCollector]:
    """The daemon's garbage-collector settings for `pipeline`, or None when global.tune_gc is false."""
    return GarbageCollector(pipeline) if cfg.tune_gc else None


class Store(Component):
    """The embedded history store: each snapshot's pool series appended (unless read-only), expired
    and downsampled hourly. Optional at run time (it only feeds the forecasts): a corrupt file is moved
    aside and a fresh store started, one that cannot be written is read only, one that cannot be read
    is not used; each said in one log line and as headroom_store_errors_total{operation="open"}.
    Never on the live path: the cycle publishes first (the web server renders before the store is
    written), and a write waits STORE_WRITE_WAIT for a lock held elsewhere (another process, this
    one's maintenance), then is skipped and counted; its points are written with the next append that
    gets the lock (at most STORE_BACKLOG_POINTS kept, the oldest dropped past it)."""
    name = "store"

    def __init__(self, cfg: Config, pipeline: Pipeline, writable: bool):
        from .history.store import open_store  # noqa: PLC0415
        self.clock = pipeline.clock
        opened = open_store(cfg.store_path, writable=writable, now=self.clock(), retention_seconds=cfg.store_retention,
                            write_timeout=STORE_WRITE_WAIT)
        self.store = opened.store
        self.writable = opened.writable
        # failures by operation (headroom_store_errors_total): the first is logged with its traceback,
        # the rest as one line each, so a full disk does not fill the log with tracebacks
        self.errors = {"open": 0.0, "append": 0.0, "maintain": 0.0, "restore": 0.0} if writable else {}
        self._lock = threading.Lock()  # a persist or maintenance in flight finishes before stop() closes
        self._closed = False
        self._backlog: list = []  # points of appends skipped because the store was locked
        self._busy = False  # the store was locked at the last write (said when it starts and ends)
        if opened.problem:
            self.errors["open"] = 1.0
            log.warning("history store %s: %s; %s", cfg.store_path, opened.problem, _store_fallback(opened))
        if self.writable:
            pipeline.on_snapshot(self.persist)
            pipeline.on_clock_step(self.clock_stepped)

    def guarded(self, operation: str, fn, wait: Optional[float] = None) -> bool:
        """Run the store operation `fn`, counted and logged when it fails; `wait`: seconds to wait for
        a store operation in flight (an append: STORE_WRITE_WAIT). True when `fn` ran and succeeded."""
        from .history.sqlite_store import StoreBusy  # noqa: PLC0415
        if wait is None and operation == "append":
            wait = STORE_WRITE_WAIT
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            self._failed(operation, StoreBusy(f"history store busy with another operation for over {wait:g} s"))
            return False
        try:
            if self._closed:  # a cycle that ends after stop(): its points are not written
                return False
            fn()
        except Exception as exc:
            self._failed(operation, exc)
            return False
        finally:
            self._lock.release()
        if self._busy and operation == "append":
            self._busy = False
            log.info("history store writable again: the skipped cycles' points are written")
        return True

    def _failed(self, operation: str, exc: Exception) -> None:
        from .history.sqlite_store import StoreBusy  # noqa: PLC0415
        first = not any(v for k, v in self.errors.items() if k not in ("open", "restore"))
        self.errors[operation] = self.errors.get(operation, 0.0) + 1
        if isinstance(exc, StoreBusy):  # not the store's fault: said once while it lasts, no traceback
            if not self._busy:
                log.warning("history store %s skipped: %s; the cycles go on, their points are kept for the next "
                            "append (headroom_store_errors_total counts the skipped ones)", operation, exc)
            self._busy = True
        elif first:
            log.exception("history store %s failed (headroom_store_errors_total counts them)", operation,
                          exc_info=exc)
        else:
            log.warning("history store %s failed: %s: %s", operation, type(exc).__name__, exc)

    def count_skipped(self, operation: str, n: int) -> None:
        """`n` items an operation left out (badly typed rows at restore): counted, never fatal."""
        self.errors[operation] = self.errors.get(operation, 0.0) + n

    def persist(self, snapshot) -> None:
        from .history.store import points_from_snapshot  # noqa: PLC0415
        points = self._backlog + points_from_snapshot(snapshot)
        self._backlog = points[-STORE_BACKLOG_POINTS:]  # until written: a locked store loses no point
        if self.guarded("append", lambda: self.store.append(points)) or not self._busy:
            self._backlog = []  # written, or failed for another reason (a full disk: history has a gap)

    def clock_stepped(self, seconds: float, now: float) -> None:
        """After a step back, points stamped after the new now are dropped: no future stamp is kept."""
        if seconds < 0:
            self.guarded("maintain", lambda: log.warning(
                "history store: %d points stamped after the stepped-back clock dropped", self.store.drop_after(now)))

    def start(self, scheduler) -> None:
        if self.writable:
            hours = STORE_MAINTENANCE_HOURS * 3600.0
            scheduler.every("store-maintenance", hours, lambda: self.guarded(
                "maintain", lambda: self.store.maintain(self.clock())), first_delay=hours)

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            if self.store is not None:
                self.store.close()

    def seed_trends(self, trends) -> None:
        """The landing chart starts with the stored hours (active and queued apart)."""
        if self.store is None:
            return
        now = self.clock()
        since = now - trends.keep
        for pool, series in self.store.series_keys():
            if series == "active_requests":
                active = self.store.query(pool, "active_requests", since, now, step=300, agg="mean")
                queued = self.store.query(pool, "queued_requests", since, now, step=300, agg="mean")
                trends.seed(pool, [(float(t), float(v), float(queued.get(t, 0.0)), 0.0) for t, v in active.items()])


def _store_fallback(opened) -> str:
    """What the daemon does instead of writing the configured store."""
    if opened.moved_to:
        return f"a fresh store was started (the old file is kept as {opened.moved_to})"
    if opened.store is not None:
        return "it is used read-only: the forecasts read it, no new history is written"
    return "it is not used: live numbers only, no forecasts from the store"


class Forecasts(Component):
    """The forecaster over a history source (Prometheus in Prometheus mode, else the store); the
    pipeline reads its latest refit at each cycle. Refits run on the schedule, off the scrape path."""
    name = "forecaster"

    def __init__(self, cfg: Config, pipeline: Pipeline, source, history_days: float = 35.0,
                 step: float = 300.0):
        from .forecaster import FIT_MODULES  # noqa: PLC0415
        from monitor.kit.timebox import FitPool  # noqa: PLC0415
        self.source = source
        # every fit in a worker of the fork server's (never a fork of this threaded process), time-boxed
        self.pool = FitPool(cfg.forecast.fit_timeout_seconds, preload=FIT_MODULES)
        self.forecaster = store_forecaster(cfg, source, pipeline.clock, lambda: capacity_at_knee(pipeline.latest),
                                           history_days, step, runner=self.pool)
        pipeline.forecasts = self.forecaster.latest.get
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


class Digest(Component):
    """The weekly digest: its cron job and the outbox retries; the outbox's state on /metrics."""
    name = "digest"

    def __init__(self, cfg: Config, store, pipeline: Optional[Pipeline] = None):
        from .digest.knee import knees_from_snapshot  # noqa: PLC0415
        from .config.inputs import digest_history  # noqa: PLC0415
        from .digest.schedule import open_outbox  # noqa: PLC0415
        self.settings = cfg.digest  # read and checked with the whole file
        knees = (lambda: knees_from_snapshot(pipeline.latest)) if pipeline is not None else None
        self.build_fn = digest_history(cfg, self.settings, store, knees)  # the knee the daemon learned
        self.outbox = open_outbox(self.settings)

    def start(self, scheduler) -> None:
        from .digest.schedule import schedule_digest  # noqa: PLC0415
        schedule_digest(scheduler, self.settings, self.build_fn, self.outbox)

    def stop(self) -> None:
        self.outbox.close()


class Web(Component):
    """/metrics, /api/v1/snapshot, the landing page and the probes. Listens when built, so a port in
    use or a bad web config fails before anything starts."""
    name = "web"

    def __init__(self, cfg: Config, pipeline: Pipeline, listen_address: str, web_config_file, status):
        from .export.collector import Exposition  # noqa: PLC0415
        from .export.landing import Trends  # noqa: PLC0415
        from .export.samples import Cadence  # noqa: PLC0415
        from .export.server import WebState, serve  # noqa: PLC0415
        from monitor.kit.web.webconfig import web_security  # noqa: PLC0415

        def cadence() -> Cadence:
            return Cadence(pipeline.cycle_age(), float(cfg.interval))
        self.state = WebState(Exposition(status=status, cadence=cadence), Trends(), links=tuple(cfg.web_links.items()),
                              has_alerts_source=cfg.alerts is not None, digest_dir=digest_directory(cfg))
        self.state.authorize, ssl_context = web_security(web_config_file or cfg.web_config_file)
        # every snapshot rendered once, for every endpoint, before any other listener (the store) runs
        pipeline.on_snapshot(self.state.publish, first=True)
        pipeline.on_clock_step(lambda seconds, now: self.state.trends.shift_time(seconds))
        self.server, _ = serve(self.state, listen_address, ssl_context)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class App:
    """The built application. `components` in build order; the named ones for callers and tests."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.scheduler = Ticker()
        self.components: list[Component] = []
        self.cycle: Optional[Cycle] = None
        self.store_component: Optional[Store] = None
        self.forecasts: Optional[Forecasts] = None
        self.digest: Optional[Digest] = None
        self.web: Optional[Web] = None
        self.stopped = threading.Event()

    def add(self, component: Component) -> Component:
        self.components.append(component)
        return component

    @property
    def pipeline(self) -> Pipeline:
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
        return self.web.server.server_address[1]

    def status(self):
        """What /metrics shows besides the cycle's snapshot: the web server's counters, the digest."""
        from .digest.metrics import digest_status  # noqa: PLC0415
        from .export.samples import ProcessStatus  # noqa: PLC0415
        stats = self.web.state.web_stats if self.web else None
        events, open_connections = {}, None
        if stats is not None:
            events = {e: float(v) for e, v in stats.as_dict().items() if e in stats.COUNTERS}
            open_connections = float(stats.open_connections)
        store = self.store_component
        return ProcessStatus(events, open_connections, digest_status(self.digest_outbox),
                             dict(store.errors) if store is not None else {}, shard=self.cfg.shard or (0, 1))

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
    app = App(cfg)
    try:
        app.cycle = app.add(Cycle(cfg))
        collector = garbage_collector(cfg, app.pipeline) if daemon else None
        if collector is not None:
            app.add(collector)
        if cfg.store_path and (daemon or os.path.exists(cfg.store_path)):
            app.store_component = app.add(Store(cfg, app.pipeline, writable=daemon))
        store = app.store_component
        if store is not None and store.store is not None and app.pipeline.state.capacity is not None:
            from .history.slo import keep_windows  # noqa: PLC0415  (the SLO windows' history in the store)
            save = keep_windows(app.pipeline.state.capacity.tracker, store.store, writable=daemon and store.writable,
                                guard=store.guarded, skipped=lambda n: store.count_skipped("restore", n))
            if save is not None:
                app.pipeline.on_snapshot(save)
        if daemon and (cfg.prometheus is not None or app.store is not None):
            app.forecasts = app.add(Forecasts(cfg, app.pipeline, history_source(cfg, app.store)))
        elif app.store is not None:  # once: one refit from the store it found (monitor/commands/once.py)
            from .history.store import StoreHistory  # noqa: PLC0415
            app.forecasts = app.add(Forecasts(cfg, app.pipeline, StoreHistory(app.store)))
        if daemon and cfg.digest is not None:
            app.digest = app.add(Digest(cfg, app.store, app.pipeline))
        if daemon:
            app.web = app.add(Web(cfg, app.pipeline, listen_address, web_config_file, app.status))
            if app.store_component is not None:
                app.store_component.seed_trends(app.web.state.trends)
    except BaseException:
        app.stop()
        raise
    return app


def digest_directory(cfg: Config) -> Optional[str]:
    """The digest's first directory destination (where /digest finds the newest week), or None."""
    if cfg.digest is None:
        return None
    return next((d.path for d in cfg.digest.destinations if d.type == "directory"), None)


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
        from .history.prometheus import PrometheusHistory  # noqa: PLC0415
        return PrometheusHistory.from_config(cfg.prometheus, pool_by=cfg.pool_by)
    from .history.store import StoreHistory  # noqa: PLC0415
    return StoreHistory(store)


def _has_days(section) -> bool:
    """A calendar that names any non-working day besides the weekend."""
    return bool(section.country or section.non_working or section.recurring)


def store_forecaster(cfg: Config, source, clock: Callable[[], float], capacity: Callable[[], dict],
                     history_days: float = 35.0, step: float = 300.0, runner: Optional[Callable] = None):
    """The `ForecastScheduler` over a history source (monitor/history). `capacity()`: pool ->
    concurrent requests at the knee; `runner`: how each fit runs (monitor/kit/timebox.py `FitPool`)."""
    from .forecast.backtest import ForecastSettings  # noqa: PLC0415
    from .history.forecasts import forecast_history  # noqa: PLC0415
    from .forecast.pool import PoolSettings  # noqa: PLC0415
    from .forecaster import ForecastScheduler  # noqa: PLC0415

    def load_history() -> dict:
        hist = forecast_history(source, clock(), days=history_days, step=step)
        if cfg.shard is not None:
            from .shard import owns  # noqa: PLC0415
            hist = {pool: series for pool, series in hist.items() if owns(pool, cfg.shard)}
        return hist

    fc = cfg.forecast  # typed and validated at load (monitor/config/headroom.py Forecast)
    calendar = cfg.calendar.calendar()
    settings = PoolSettings(forecast=ForecastSettings(runner=runner,
                                                      calendar=calendar if _has_days(cfg.calendar) else None))
    return ForecastScheduler(load_history, capacity, settings, interval_minutes=fc.refit_minutes, clock=clock)
