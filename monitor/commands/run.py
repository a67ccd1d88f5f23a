"""`headroom run`: the daemon (monitor/app `build`). Collects on a fixed interval, serves /metrics and the landing page."""
from __future__ import annotations

import logging
import signal
import sys

from monitor.kit.process import exit_if_stuck

from ..config import ConfigError, Override, load
from ..export.server import parse_listen_address
from .cli import listen_address, seconds

log = logging.getLogger("headroom")

EXIT_GRACE = 8.0  # seconds from the stop to a forced exit, should a thread still hold the process


def add_arguments(p) -> None:
    p.add_argument("--config.file", dest="config_file", required=True, help="configuration file (YAML)")
    p.add_argument("--web.listen-address", dest="listen_address", type=listen_address, default=None,
                   help="address to serve /metrics on (default :9880, or web.listen_address in the file)")
    p.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="TLS and basic-auth settings for headroom's own endpoints (exporter-toolkit style)")
    p.add_argument("--shard", default=None, metavar="I/N", help="own only the pools of shard I of N")
    p.add_argument("--duration", type=seconds, default=None, help="stop after this many seconds (scripts, tests)")


def run(args) -> int:
    try:
        overrides = [Override("global.shard", args.shard, f"--shard {args.shard}")] if args.shard else []
        cfg = load(args.config_file, overrides)
        listen = args.listen_address or cfg.listen_address
        parse_listen_address(listen)
    except (ConfigError, ValueError) as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return 2
    try:
        from ..app import build  # noqa: PLC0415 - the numeric stack, only when it runs
        daemon = build(cfg, listen, args.web_config_file)
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
