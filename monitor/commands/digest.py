"""`headroom digest`: build the weekly forecast digest on demand and deliver it through the outbox.

    headroom digest --config.file headroom.yaml            history from the store / Prometheus
    headroom digest --demo --out DIR                        from a simulated three weeks, files only
                                                            (--demo: headroom-lab's input, lab/)
    headroom digest --demo --config.file f.yaml             simulated history, configured destinations
    headroom digest --config.file f.yaml --drain-only       retry what is pending in the outbox
    ... --wait 10m                                          keep retrying (with backoff) until delivered

Prints one JSON line (week, queued keys, outcomes, pending). Exit 0 when nothing is left pending,
1 when a delivery is still pending or gave up, 2 on bad configuration or input.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import datetime, timezone

from monitor.config import ConfigError, parse_duration
from monitor.kit import addons

log = logging.getLogger("monitor.digest")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config.file", dest="config_file", default=None,
                   help="headroom configuration (its digest: section; history from store.path or "
                        "sources.prometheus)")
    p.add_argument("--demo", action="store_true",
                   help="use a simulated history instead of the store (needs headroom-lab: pip install ./lab)")
    p.add_argument("--out", default=None, help="also write digest.md/.html/.json and the charts here")
    p.add_argument("--week-end", dest="week_end", default=None,
                   help="end of the reported week: ISO date/time (UTC unless given) or Unix seconds; "
                        "default: now (demo: the last Monday 00:00 UTC)")
    p.add_argument("--days", type=float, default=21.0, help="demo: days of simulated history (>= 8)")
    p.add_argument("--seed", type=int, default=1, help="demo: random seed")
    p.add_argument("--level", type=float, default=0.8, help="demo: load level of the simulated fleet")
    p.add_argument("--drain-only", dest="drain_only", action="store_true",
                   help="do not build: only retry the deliveries pending in the outbox")
    p.add_argument("--no-deliver", dest="no_deliver", action="store_true",
                   help="queue the digest but do not send it now")
    p.add_argument("--wait", default="0s",
                   help="keep retrying pending deliveries (exponential backoff) for up to this long, e.g. 10m")


def parse_when(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        d = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--week-end: {text!r} is neither Unix seconds nor an ISO date/time") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()


def _settings(args):
    from monitor.digest.settings import from_dict  # noqa: PLC0415
    cfg = None
    if args.config_file:
        from monitor import config as config_mod  # noqa: PLC0415
        cfg = config_mod.load(args.config_file)
        settings = cfg.digest if cfg.digest is not None else from_dict({}, cfg.file, cfg.slos)
        if args.demo:
            settings = addons.digest_demo().demo_settings(settings)
    elif args.demo:
        settings = addons.digest_demo().demo_settings()
    else:
        raise ValueError("give --config.file (or --demo for a simulated history)")
    return cfg, settings


def _build_fn(args, cfg, settings):
    if args.demo:
        demo_input = addons.digest_demo().demo_input

        def build(week_end):
            return demo_input(week_end, days=args.days, seed=args.seed, level=args.level)[0]
        return build
    from monitor.config.inputs import digest_history  # noqa: PLC0415 (numpy and pandas only when a digest runs)
    return digest_history(cfg, settings)


def _versioned(out: str, files: dict) -> str:
    """--out, or its next free version when it holds another digest (said on stderr): never rewritten."""
    from monitor.digest.deliver import free_dir  # noqa: PLC0415
    path = free_dir(out, files)
    if path != out:
        print(f"headroom digest: {out} holds another digest (an earlier run); kept it, writing this one to {path}",
              file=sys.stderr)
    return path


def run(args) -> int:
    from monitor.digest.content import DigestError, build_digest  # noqa: PLC0415
    from monitor.digest.deliver import render_files, write_dir  # noqa: PLC0415
    from monitor.digest.schedule import drain, open_outbox, run_digest, week_end_for  # noqa: PLC0415
    try:
        cfg, settings = _settings(args)
        wait = parse_duration(args.wait)
        now = time.time()
        if args.week_end:
            week_end = parse_when(args.week_end)
        else:
            week_end = addons.digest_demo().last_monday(now) if args.demo else week_end_for(now)
        build_fn = _build_fn(args, cfg, settings)
    except (ConfigError, ValueError, addons.MissingAddOn) as exc:
        print(f"headroom digest: {exc}", file=sys.stderr)
        return 2
    result: dict = {}
    try:
        if cfg is None:  # --demo --out without a configuration: files only
            if not args.out:
                print("headroom digest: --demo without --config.file needs --out DIR", file=sys.stderr)
                return 2
            digest = build_digest(build_fn(week_end), settings, generated_at=week_end)
            files = render_files(digest)
            out = _versioned(args.out, files)
            written = write_dir(out, files)
            print(json.dumps({"week": digest["iso_week"], "out": out, "files": written}))
            return 0
        outbox = open_outbox(settings)
        try:
            if args.drain_only:
                result = {"outcomes": drain(settings, outbox)}
            else:
                result = run_digest(settings, build_fn, week_end, outbox, deliver=not args.no_deliver)
                if args.out:
                    payload = outbox.payload(result["week"])
                    result["out"] = _versioned(args.out, payload)
                    write_dir(result["out"], payload)
            deadline = time.monotonic() + wait
            while wait > 0 and outbox.pending_count() and time.monotonic() < deadline:
                due = outbox.next_due()
                pause = max(0.0, min((due or time.time()) - time.time(), deadline - time.monotonic()))
                time.sleep(pause)
                result.setdefault("retries", []).append(drain(settings, outbox))
            result["pending"] = outbox.pending_count()
            failed = len(outbox.deliveries("failed"))
            result["failed"] = failed
        finally:
            outbox.close()
    except (DigestError, ValueError, OSError) as exc:
        print(f"headroom digest: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, default=str))
    return 1 if (result.get("pending") or result.get("failed")) else 0
