"""`headroom run`: the daemon. Collects on a fixed interval, serves /metrics and the landing page."""
from __future__ import annotations

import logging
import signal
import sys
import threading

from apscheduler.schedulers.background import BackgroundScheduler

from ..cli import seconds
from ..config import ConfigError, load
from ..cycle import Pipeline
from ..export.collector import Exposition
from ..export.landing import Trends
from ..export.server import WebState, parse_listen_address, serve
from ..process import exit_if_stuck
from ..digest.metrics import digest_status
from ..export.samples import ProcessStatus
from ..wiring import attach_history_and_forecasts, capacity_state, web_security

log = logging.getLogger("headroom")

STOP_GRACE = 2.0  # seconds stop() lets the running cycle publish after its sources are cut off
EXIT_GRACE = 8.0  # seconds from the stop to a forced exit, should a thread still hold the process


def add_arguments(p) -> None:
    p.add_argument("--config.file", dest="config_file", required=True, help="configuration file (YAML)")
    p.add_argument("--web.listen-address", dest="listen_address", default=None,
                   help="address to serve /metrics on (default :9880, or web.listen_address in the file)")
    p.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="TLS and basic-auth settings for headroom's own endpoints (exporter-toolkit style)")
    p.add_argument("--shard", default=None, metavar="I/N", help="own only the pools of shard I of N")
    p.add_argument("--duration", type=seconds, default=None, help="stop after this many seconds (scripts, tests)")


class Daemon:
    def __init__(self, cfg, listen_address: str, web_config_file=None):
        self.cfg = cfg
        self.pipeline = Pipeline(cfg, capacity=capacity_state(cfg))
        # every snapshot is rendered once, for /metrics, /api/v1/snapshot and / alike
        self.state = WebState(Exposition(status=self.status), Trends())
        self.state.authorize, ssl_context = web_security(web_config_file or cfg.web_config_file)
        self.pipeline.on_snapshot(self.state.publish)
        self.server, _ = serve(self.state, listen_address, ssl_context)
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.stopped = threading.Event()
        self.extra_jobs = []  # f(daemon) run at start(): schedule more jobs
        self.on_stop = []
        self.store = None
        self.forecaster = None
        self.digest_outbox = None
        attach_history_and_forecasts(self)  # the pipeline reads the forecaster's latest result
        from ..digest.schedule import attach_to_daemon  # noqa: PLC0415
        self.digest_outbox = attach_to_daemon(self)  # weekly digest: cron + outbox retries

    def status(self) -> ProcessStatus:
        """What /metrics shows besides the cycle's snapshot: the web server's counters, the digest."""
        stats = self.state.web_stats
        events, open_connections = {}, None
        if stats is not None:
            events = {e: float(v) for e, v in stats.as_dict().items() if e in stats.COUNTERS}
            open_connections = float(stats.open_connections)
        return ProcessStatus(events, open_connections, digest_status(self.digest_outbox))

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        from datetime import datetime, timezone
        self.scheduler.add_job(self.pipeline.run_cycle, "interval", seconds=self.cfg.interval,
                               id="cycle", max_instances=1, coalesce=True,
                               next_run_time=datetime.now(timezone.utc))
        for job in self.extra_jobs:
            job(self)
        self.scheduler.start()

    def stop(self) -> None:
        """Stops within a few seconds whatever a source is doing: no new cycles, requests in flight
        broken (the running cycle publishes what it has), then the stop hooks and the web server."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        self.pipeline.close(wait=STOP_GRACE)
        for hook in self.on_stop:
            try:
                hook()
            except Exception:
                log.exception("stop hook failed")
        self.server.shutdown()
        self.server.server_close()
        self.stopped.set()


def run(args) -> int:
    try:
        cfg = load(args.config_file)
        if args.shard:
            from ..shard import parse_shard
            cfg.shard = parse_shard(args.shard)
        listen = args.listen_address or cfg.listen_address
        parse_listen_address(listen)
    except (ConfigError, ValueError) as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return 2
    try:
        daemon = Daemon(cfg, listen, args.web_config_file)
    except (ConfigError, ValueError) as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"headroom: cannot listen on {listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: daemon.stopped.set())
    daemon.start()
    log.info("headroom listening on %s (%s mode, interval %gs)", listen,
             "prometheus" if cfg.prometheus else "direct", cfg.interval)
    daemon.stopped.wait(timeout=args.duration)
    log.info("headroom stopping")
    exit_if_stuck(EXIT_GRACE, code=1)  # backstop: stop() below normally ends everything in well under 1 s
    daemon.stop()
    return 0
