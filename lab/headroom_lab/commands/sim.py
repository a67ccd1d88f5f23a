"""`headroom sim`: run the simulated vLLM fleet (replicas, gateway, app, DCGM) on its own."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from headroom_lab.sim.fleet import SCENARIO_DEFAULTS, load_config, theoretical_knee
from headroom_lab.sim.server import start_fleet


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="steady", choices=sorted(SCENARIO_DEFAULTS),
                   help="workload scenario (default steady)")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds of wall time (0 = until Ctrl-C)")
    p.add_argument("--config", dest="sim_config", default=None,
                   help="fleet YAML (default: headroom_lab/sim/default_fleet.yaml)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the config)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--base-port", type=int, default=0,
                   help="first port (replicas, then gateway, app, DCGM); 0 = free ports")
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated seconds per wall-clock second (default 1)")
    p.add_argument("--day-seconds", type=float, default=None,
                   help="diurnal scenario: length of a simulated day in seconds (compresses days)")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="simulated seconds to fast-forward before serving (default 60)")
    p.add_argument("--start-hour", type=float, default=None,
                   help="diurnal scenario: profile hour of day (weekday) when serving starts, "
                        "instead of the real clock")
    p.add_argument("--legacy-names", action="store_true",
                   help="serve V0-style vLLM names (no engine label, gpu_cache_usage_perc, ...)")
    p.add_argument("--underscore-names", action="store_true",
                   help="spell vLLM metrics vllm_ instead of vllm:")
    p.add_argument("--session-label", action="store_true",
                   help="gateway: add the high-cardinality session_id label")
    p.add_argument("--status-every", type=float, default=10.0,
                   help="print pool state every N seconds (0 = never)")


def run(args: argparse.Namespace) -> int:
    if args.duration < 0:
        print("headroom sim: --duration must be >= 0", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.sim_config)
    except ValueError as exc:
        print(f"headroom sim: {exc}", file=sys.stderr)
        return 2
    if args.session_label:
        cfg.gateway.session_label = True
    overrides = {}
    if args.day_seconds is not None:
        if args.scenario != "diurnal":
            print("headroom sim: --day-seconds only applies to --scenario diurnal", file=sys.stderr)
            return 2
        if args.day_seconds <= 0:
            print("headroom sim: --day-seconds must be > 0", file=sys.stderr)
            return 2
        overrides["day_seconds"] = args.day_seconds
    if args.start_hour is not None:
        if args.scenario != "diurnal":
            print("headroom sim: --start-hour only applies to --scenario diurnal", file=sys.stderr)
            return 2
        if not 0 <= args.start_hour < 24:
            print("headroom sim: --start-hour must be in [0, 24)", file=sys.stderr)
            return 2
        overrides["start_hour"] = args.start_hour
    try:
        handle = start_fleet(cfg, args.scenario, host=args.host, base_port=args.base_port,
                             seed=args.seed, speed=args.speed, legacy_names=args.legacy_names,
                             underscore_names=args.underscore_names,
                             scenario_overrides=overrides or None, record_truth=False,
                             warmup_s=max(0.0, args.warmup), scenario_from_serving=True)
    except (ValueError, OSError) as exc:
        print(f"headroom sim: {exc}", file=sys.stderr)
        return 2
    knees = {p.name: round(theoretical_knee(p, cfg.mix)["pool"], 1) for p in cfg.pools}
    print(json.dumps({"scenario": args.scenario, "replicas": handle.replica_urls,
                      "gateway": handle.gateway_url, "app": handle.app_url,
                      "dcgm": handle.dcgm_url, "theoretical_knee": knees}, indent=2), flush=True)
    stop = threading.Event()

    def on_signal(_signum, _frame):
        stop.set()

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, on_signal) if main_thread else None
    t_end = time.time() + args.duration if args.duration > 0 else None
    next_status = time.time() + args.status_every if args.status_every > 0 else None
    try:
        while not stop.is_set():
            now = time.time()
            if t_end is not None and now >= t_end:
                break
            if handle.error is not None:
                print(f"headroom sim: simulation failed: {handle.error}", file=sys.stderr)
                return 1
            if next_status is not None and now >= next_status:
                with handle.lock:
                    state = {p: handle.fleet.pool_state(p) for p in handle.fleet.pools}
                print(json.dumps({"t": round(handle.fleet.t - handle.fleet.origin, 1),
                                  "pools": state}), flush=True)
                next_status = now + args.status_every
            stop.wait(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
        if main_thread:
            signal.signal(signal.SIGTERM, old)
    return 0
