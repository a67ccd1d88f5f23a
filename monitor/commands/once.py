"""`headroom once`: one collection cycle, the snapshot as JSON on stdout.

Counter rates and latency windows need two readings: `--interval` seconds apart (default 5). With
`--interval 0` they are reported as null, never invented. Each reading waits for its sources at
most the cycle deadline (a little over `scrape_timeout`); a source that has not answered by then is
reported down with reason `deadline`.

With a history store (store.path, as `headroom run` keeps it) the pools' forecasts are refitted
once from it, read-only, while the interval passes (after it, when the refit takes longer), and the
last reading carries them: the "forecast" of each pool is what `headroom run` would export for the
same history. With `--interval 0` the refit comes first, before any capacity is known, so there is
no time to exhaustion.

`--fit N` answers "where would N more agent sessions fit?" instead: every pool (with its cluster,
or whatever other `global.pool_by` labels it carries) with its spare sessions (whole sessions,
rounded down), most first, those that take N marked; exit 0 when at least one pool takes them, 3
when none does (every pool's answer known), 4 when the answer is unknown: no pool with a known
answer takes them and some pool's headroom or session size is not known (an idle fleet has no
measured session size), each such pool named with why.
"""
from __future__ import annotations

import json
import sys
import threading
import time

from monitor.kit.settings.reader import read_yaml
from monitor.kit.text import for_terminal

from ..config import Config, ConfigError, Override, from_dict


def add_arguments(p) -> None:
    p.add_argument("--config.file", dest="config_file", help="configuration file (YAML)")
    p.add_argument("--vllm", action="append", default=[], metavar="URL",
                   help="a vLLM /metrics URL (repeatable); instead of --config.file")
    p.add_argument("--target", action="append", default=[], metavar="URL",
                   help="an engine's /metrics URL, vLLM or SGLang told apart by its families (repeatable)")
    p.add_argument("--interval", type=float, default=5.0,
                   help="seconds between the two readings used for rates and latency windows (0: one reading)")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON (the default output)")
    p.add_argument("--fit", type=float, metavar="N", default=None,
                   help="print where N more agent sessions fit (spare sessions per cluster and pool, whole "
                        "sessions rounded down, most first) instead of the snapshot; exit 0 when a pool takes "
                        "them, 3 when no pool does (every pool known), 4 when unknown (some pool's headroom "
                        "or session size is not known, e.g. an idle fleet: no sessions measured)")


def config_from_args(args) -> Config:
    """The file, or the targets given on the command line, read with the overrides of `--interval`:
    every value through the reader, so `Config.check` holds for what `once` runs with."""
    if args.config_file:
        data, file, overrides = read_yaml(args.config_file), args.config_file, []
    elif args.vllm or args.target:
        flag = "/".join(f for f, urls in (("--vllm", args.vllm), ("--target", args.target)) if urls)
        targets = [{"url": u, "kind": "vllm"} for u in args.vllm] + list(args.target)  # URL alone: kind auto
        data, file, overrides = {}, "<command line>", [Override("sources.vllm.targets", targets, flag)]
    else:
        raise ConfigError("<command line>", "", "give --config.file FILE or at least one --target (or --vllm) URL")
    cfg = from_dict(data, file, overrides)
    more = interval_overrides(cfg, args.interval)
    return from_dict(data, file, overrides + more) if more else cfg


def interval_overrides(cfg: Config, interval: float) -> list[Override]:
    """Two readings `interval` apart: the latency window spans at least both (twice the interval),
    and tasks and calls per task are counted over the interval between them."""
    flag = f"--interval {interval:g}"
    out = []
    if interval * 2 > cfg.latency_window:
        out.append(Override("global.latency_window", interval * 2, flag))
    if interval > 0:
        out.append(Override("capacity.task_window", interval, flag))
    return out


def run(args) -> int:
    if not args.interval >= 0:  # NaN too
        print(f"headroom: --interval must be a number of seconds, not negative (got {args.interval:g})", file=sys.stderr)
        return 2
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return 2
    if args.fit is not None and not (args.fit > 0 and args.fit < float("inf")):
        print(f"headroom: --fit must be a positive number of sessions, got {args.fit:g}", file=sys.stderr)
        return 2
    try:
        from ..app import build  # noqa: PLC0415 - the numeric stack, only when it runs
        app = build(cfg)  # the daemon's sources, cycle and forecaster; no web server, nothing written
    except (ConfigError, ValueError) as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return 2
    try:  # each cycle ends by its deadline (monitor/pipeline/cycle.py), whatever a source does
        snap = _readings(app, args.interval)
    except KeyboardInterrupt:
        print("headroom: interrupted", file=sys.stderr)
        return 130
    finally:
        app.stop()
    if args.fit is not None:
        return print_fit(snap, args.fit, sys.stdout)
    from ..export.snapshot_json import snapshot_to_dict  # noqa: PLC0415
    json.dump(snapshot_to_dict(snap), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
    return 0 if any(s.up for s in snap.sources) else 1


def _readings(app, interval: float):
    """One reading, or two `interval` apart; with a store, one forecast refit for the last one."""
    pipeline, forecaster = app.pipeline, app.forecaster
    if interval <= 0:
        if forecaster is not None:
            forecaster.refit_now()
        return pipeline.run_cycle()
    pipeline.run_cycle()
    refit = threading.Thread(target=forecaster.refit_now, name="forecast-refit", daemon=True) \
        if forecaster is not None else None
    if refit is not None:
        refit.start()
    time.sleep(interval)
    if refit is not None:
        refit.join()
    return pipeline.run_cycle()


FIT_NONE, FIT_UNKNOWN = 3, 4  # `once --fit` exit codes: fits in no pool; not known


def print_fit(snap, sessions: float, out) -> int:
    """The fit view as text: one line per pool, most spare first, then the pools whose answer is
    unknown and why. 0 if some pool takes `sessions`; 3 if none does and every pool is known; 4 if
    none with a known answer does and some pool's answer is unknown."""
    from ..capacity.fit import fleet_fit, unknown, where_fits  # noqa: PLC0415
    fits = fleet_fit(snap.pools)
    takers = where_fits(fits, sessions)
    left_out = unknown(snap.pools)
    if takers:
        out.write(f"{sessions:g} more sessions fit in {len(takers)} of {len(fits)} pools:\n")
    elif left_out:
        out.write(f"{sessions:g} more sessions: unknown ({len(left_out)} of {len(fits) + len(left_out)} pools "
                  f"without a known headroom or session size; none of the other {len(fits)} takes them)\n")
    else:
        out.write(f"{sessions:g} more sessions fit in no pool (of {len(fits)} with a known headroom)\n")
    for f in fits:  # label values as data: control characters escaped before the terminal sees them
        where = " ".join(f"{k}={for_terminal(v)}" for k, v in f.labels)
        n1 = "unknown" if f.spare_sessions_n_minus_1 is None else f"{f.spare_sessions_n_minus_1:g}"
        mark = "fits" if f in takers else "    "
        out.write(f"  {mark}  {(where + ' ') if where else ''}pool={for_terminal(f.pool)}  spare_sessions={f.spare_sessions:g}"
                  f"  with_one_replica_lost={n1}\n")
    for name, labels, why in left_out:
        where = " ".join(f"{k}={v}" for k, v in labels)
        out.write(f"  ?     {(where + ' ') if where else ''}pool={name}  unknown: {why}\n")
    if takers:
        return 0
    return FIT_UNKNOWN if left_out else FIT_NONE
