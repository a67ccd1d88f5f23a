"""The daemon's parts besides the store and the forecasts (monitor/app `build` puts them together):
the cycle, the garbage-collector settings, the digest, the web server and what /metrics shows besides
the cycle's snapshot."""
from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Callable, Optional

from ..capacity.enrich import CapacityState
from ..config import Config
from ..config.inputs import capacity_inputs, pipeline_settings
from ..digest.settings import DirectoryDestination
from ..model import RefitResult
from ..pipeline.cycle import Pipeline
from .component import Component
from .store import Store

if TYPE_CHECKING:
    from ..export.samples import ProcessStatus

log = logging.getLogger(__name__)

STOP_GRACE = 2.0  # seconds the running cycle may take to publish after its sources are cut off
GC_YOUNG_EVERY = 200_000  # net container allocations between two young collections (Python's default: 700)


class Cycle(Component):
    """The sources and the collection cycle: one cycle every `interval`, the first at once."""
    name = "cycle"

    def __init__(self, cfg: Config, forecasts: Optional[Callable[[], Optional[RefitResult]]] = None):
        """`forecasts()`: the forecaster's latest refit, read once per cycle (ForecastLoop.forecast)."""
        self.pipeline = Pipeline(pipeline_settings(cfg),
                                 capacity=CapacityState(capacity_inputs(cfg)),  # ValueError naming a bad key
                                 forecasts=forecasts)

    def start(self, scheduler) -> None:
        scheduler.every("cycle", self.pipeline.settings.interval, self.pipeline.run_cycle)

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


class Digest(Component):
    """The weekly digest: its cron job and the outbox retries; the outbox's state on /metrics."""
    name = "digest"

    def __init__(self, cfg: Config, store, pipeline: Optional[Pipeline] = None):
        from ..config.inputs import digest_history  # noqa: PLC0415
        from ..digest.knee_report import knees_from_snapshot  # noqa: PLC0415
        from ..digest.schedule import open_outbox  # noqa: PLC0415
        assert cfg.digest is not None  # built only when a digest is configured (monitor/app build)
        self.settings = cfg.digest  # read and checked with the whole file
        knees = (lambda: knees_from_snapshot(pipeline.latest)) if pipeline is not None else None
        self.build_fn = digest_history(cfg, self.settings, store, knees)  # the knee the daemon learned
        self.outbox = open_outbox(self.settings)

    def start(self, scheduler) -> None:
        from ..digest.schedule import schedule_digest  # noqa: PLC0415
        schedule_digest(scheduler, self.settings, self.build_fn, self.outbox)

    def stop(self) -> None:
        self.outbox.close()


class Web(Component):
    """/metrics, /api/v1/snapshot, the landing page and the probes. Listens when built, so a port in
    use or a bad web config fails before anything starts."""
    name = "web"

    def __init__(self, cfg: Config, pipeline: Pipeline, listen_address: str, web_config_file, status: "Status"):
        from monitor.kit.web.webconfig import web_security  # noqa: PLC0415

        from ..export.collector import Exposition  # noqa: PLC0415
        from ..export.landing import Trends  # noqa: PLC0415
        from ..export.samples import Cadence  # noqa: PLC0415
        from ..export.server import WebState, WebStats, serve  # noqa: PLC0415

        def cadence() -> Cadence:
            return Cadence(pipeline.cycle_age(), float(cfg.interval))
        authorize, ssl_context = web_security(web_config_file or cfg.web_config_file)
        stats = WebStats()  # the server's counters, shown on /metrics
        exposition = Exposition(status=lambda: status.read(stats), cadence=cadence)
        self.state = WebState(exposition, Trends(), links=tuple(cfg.web_links.items()), authorize=authorize,
                              has_alerts_source=cfg.alerts is not None, digest_dir=digest_directory(cfg), stats=stats)
        # every snapshot rendered once, for every endpoint, before any other listener (the store) runs
        pipeline.on_snapshot(self.state.publish, first=True)
        pipeline.on_clock_step(lambda seconds, now: self.state.trends.shift_time(seconds))
        self.server, _ = serve(self.state, listen_address, ssl_context)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Status:
    """What /metrics shows besides the cycle's snapshot, read from the parts that know it when a snapshot
    is rendered: the web server's counters, the digest's outbox, the store's failures, the shard. The
    exporter is given this at construction (never the App)."""

    def __init__(self, store: Optional[Store], outbox, shard: tuple[int, int]):
        self.store, self.outbox, self.shard = store, outbox, shard

    def read(self, stats) -> "ProcessStatus":
        """`stats`: the web server's counters (the `Web` component's, which its server counts into)."""
        from ..digest.metrics import digest_status  # noqa: PLC0415
        from ..export.samples import ProcessStatus  # noqa: PLC0415
        events, open_connections = {}, None
        if stats is not None:
            events = {e: float(v) for e, v in stats.as_dict().items() if e in stats.COUNTERS}
            open_connections = float(stats.open_connections)
        return ProcessStatus(events, open_connections, digest_status(self.outbox),
                             dict(self.store.errors) if self.store is not None else {}, shard=self.shard)


def digest_directory(cfg: Config) -> Optional[str]:
    """The digest's first directory destination (where /digest finds the newest week), or None."""
    if cfg.digest is None:
        return None
    return next((d.path for d in cfg.digest.destinations if isinstance(d, DirectoryDestination)), None)
