"""`headroom loadtest`: closed-loop agent-task load test against an OpenAI-compatible endpoint."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from headroom_lab.loadtest.analyze import KNEE_MIN_CONFIDENCE, analyze
from headroom_lab.loadtest.client import TargetError, api_base
from headroom_lab.loadtest.follower import HttpBudget
from headroom_lab.loadtest.mix import MixError, load_mix
from headroom_lab.loadtest.mixed import CASES, Setup, run_mixed, summary_lines
from headroom_lab.loadtest.report import write
from headroom_lab.loadtest.runner import Runner, detect_model, terminal_progress
from headroom_lab.loadtest.schedule import PATTERNS, build_plan
from headroom_lab.loadtest.tags import Tags, is_secret, parse_headers, parse_metadata
from monitor.config import parse_duration


def _duration(v: str) -> float:
    try:
        d = parse_duration(v if not v.replace(".", "", 1).isdigit() else float(v))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if d <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {v!r}")
    return d


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", required=True, metavar="URL",
                   help="OpenAI-compatible base URL (http://host:port or .../v1); repeat for the replicas of a pool "
                        "(calls go to the target with the fewest calls in flight)")
    p.add_argument("--mix", required=True, metavar="FILE", help="task mix YAML (docs/loadtest.md)")
    p.add_argument("--pattern", choices=PATTERNS, default="sustained", help="arrival pattern (default sustained)")
    p.add_argument("--duration", type=_duration, required=True, help="load duration: 30s, 5m, or seconds")
    p.add_argument("--metrics", action="append", default=[], metavar="URL",
                   help="vLLM /metrics URL read every --scrape-interval while the load runs; repeatable")
    p.add_argument("--out", default=None, metavar="DIR", help="report directory (default ./loadtest-<time>)")
    p.add_argument("--api-key-file", default=None, metavar="F", help="file holding the target's API key")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the API key")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--seed", type=int, default=1, help="seed of prompts, lengths, waits and arrivals (default 1)")
    p.add_argument("--sessions", type=int, default=None, help="burst: sessions per wave (overrides the mix)")
    p.add_argument("--replicas", type=int, default=None,
                   help="reduced-capacity: use the first N --target URLs (default: all but one)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between metric reads (default 1)")
    p.add_argument("--probes", type=int, default=3,
                   help="unloaded sequential calls before the load, for the unloaded TTFT (default 3)")
    p.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                   help="put KEY: VALUE in every request body's metadata (LiteLLM reads metadata.KEY); VALUE may "
                        "hold {task_type}, {task}, {session}, {call}, e.g. session_id={task}; repeatable")
    p.add_argument("--cases", default=",".join(CASES), metavar="LIST",
                   help="mixed: the cases to run, in order, from " + ",".join(CASES) + " (default all)")
    p.add_argument("--priority-target", action="append", default=[], metavar="URL",
                   help="mixed: the engine(s) started with priority scheduling (vLLM --scheduling-policy "
                        "priority) for the priority case (default: --target); repeatable")
    p.add_argument("--budget-url", default=None, metavar="URL",
                   help="mixed: where the budget case reads headroom_deferrable_budget_ratio: a headroom "
                        "/metrics URL, or a Prometheus .../api/v1/query URL")
    p.add_argument("--budget-pool", default=None, metavar="POOL", help="mixed: the pool label of the budget")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="send this HTTP header on every request (placeholders as --metadata; values of "
                        "credential-like headers such as Authorization are never printed); repeatable")


def _api_key(args) -> tuple[str | None, str]:
    if args.api_key_file and args.api_key_env:
        raise ValueError("give one of --api-key-file or --api-key-env, not both")
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as exc:
            raise ValueError(f"--api-key-file {args.api_key_file}: cannot read ({exc.strerror})") from None
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file}: the file is empty")
        return key, "from file"
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "").strip()
        if not key:
            raise ValueError(f"--api-key-env {args.api_key_env}: the variable is not set or empty")
        return key, f"from ${args.api_key_env}"
    return None, "none"


def run(args) -> int:
    err = sys.stderr
    try:
        mix = load_mix(args.mix)
        targets = list(args.target)
        for t in targets:
            api_base(t)
        for m in args.metrics:
            api_base(m)  # same URL checks (scheme, host, no credentials)
        key, key_source = _api_key(args)
        metrics = list(args.metrics)
        reduced = None
        if args.pattern == "reduced-capacity":
            n = len(targets)
            keep = args.replicas if args.replicas is not None else max(1, n - 1)
            if not 1 <= keep <= n:
                raise ValueError(f"--replicas must be within 1..{n} (the --target URLs given), got {keep}")
            if len(metrics) == n:
                metrics = metrics[:keep]
            reduced = {"replicas_given": n, "replicas_used": keep,
                       "note": ("first %d of %d targets" % (keep, n)) if keep < n else
                       "one target given: it is taken to be the reduced pool (point --target at it)"}
            targets = targets[:keep]
        elif args.replicas is not None:
            raise ValueError("--replicas applies to --pattern reduced-capacity only")
        if args.sessions is not None and args.sessions < 1:
            raise ValueError(f"--sessions must be >= 1, got {args.sessions}")
        if args.scrape_interval <= 0:
            raise ValueError("--scrape-interval must be > 0")
        mixed = args.pattern == "mixed"
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
        if mixed and (not cases or any(c not in CASES for c in cases)):
            raise ValueError(f"--cases must be a comma-separated list of {', '.join(CASES)}, got {args.cases!r}")
        budget = HttpBudget(args.budget_url, args.budget_pool) if (mixed and args.budget_url) else None
        if mixed and "budget" in cases and budget is None:
            raise ValueError("the budget case needs --budget-url (or leave it out of --cases)")
        if not mixed and (args.priority_target or args.budget_url or args.budget_pool):
            raise ValueError("--priority-target, --budget-url and --budget-pool apply to --pattern mixed only")
        for t in args.priority_target:
            api_base(t)
        plan = build_plan(mix, args.pattern, args.duration, args.seed, args.sessions)
        tags = Tags(parse_metadata(args.metadata), parse_headers(args.header))
        if key and any(h.lower() == "authorization" for h in tags.headers):
            raise ValueError("give the key with --api-key-file/--api-key-env or an Authorization --header, not both")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        headers.update({k: v for k, v in tags.headers.items() if is_secret(k) or "{" not in v})
        model = args.model or detect_model(api_base(targets[0]), headers)
    except (MixError, TargetError, ValueError, ConnectionError) as exc:
        err.write(f"headroom loadtest: {exc}\n")
        return 2
    out = args.out or f"loadtest-{time.strftime('%Y%m%d-%H%M%S')}"
    if mixed:
        setup = Setup(targets, model, args.seed, metrics, args.priority_target or None, None, budget,
                      budget.label if budget else "", key, args.scrape_interval, args.probes, tags)
        return _mixed(mix, setup, args.duration, cases, out)
    runner = Runner(mix, plan, targets, model, args.seed, api_key=key, metrics=metrics,
                    scrape_interval=args.scrape_interval, probes=args.probes, progress=terminal_progress(err),
                    tags=tags)
    res = runner.run()
    meta = {"targets": targets, "metrics": metrics, "seed": args.seed, "mix_file": os.path.basename(args.mix),
            "api_key": key_source, "reduced_capacity": reduced, **tags.shown()}
    rep = analyze(mix, plan, res, meta)
    paths = write(rep, out)
    for line in summary(rep):
        print(line)
    print(f"report: {paths['html']} and {paths['json']}")
    c = rep["counts"]
    return 0 if c["succeeded"] > 0 else 1


def _mixed(mix, setup, duration: float, cases: list, out: str) -> int:
    try:
        rep = run_mixed(mix, setup, duration, cases, progress=terminal_progress(sys.stderr),
                        on_case=lambda name, _s: sys.stderr.write(f"case {name}: done\n"))
    except ValueError as exc:
        sys.stderr.write(f"headroom loadtest: {exc}\n")
        return 2
    os.makedirs(out, exist_ok=True)
    for name, case_rep in rep.pop("reports").items():
        write(case_rep, os.path.join(out, name))
    path = os.path.join(out, "mixed.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1, allow_nan=False)
    for line in summary_lines(rep):
        print(line)
    print(f"report: {path} (each case's full report in {out}/<case>/)")
    ok = sum(c["interactive"]["succeeded"] for c in rep["cases"].values())
    return 0 if ok > 0 else 1


def _n(v, digits: int = 2) -> str:
    """A figure for the terminal: rounded, thousands separated; '-' when unknown."""
    if v is None:
        return "-"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:,.{digits}f}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2g}"
    return str(v)


def summary(rep: dict) -> list[str]:
    """The lines printed after a run: counts, the knee (or why none was taken), capacity, agreement."""
    c, k, fit, op, u = rep["counts"], rep["knee"], rep.get("knee_fit"), rep["operating_point"], rep["usable_capacity"]
    lines = [f"calls {c['calls']} ok {c['succeeded']} failed {c['failed']} (timed out {c['timed_out']}); "
             f"tasks {c['tasks']} completed {c['tasks_completed']}"]
    if k:
        lines.append(f"knee: {_n(k['concurrency'], 1)} calls in flight (confidence {_n(k['confidence'])})")
    elif fit:
        lines.append(f"knee: not found (confidence {_n(fit['confidence'])} < {_n(KNEE_MIN_CONFIDENCE)}; the fit at "
                     f"{_n(fit['concurrency'], 1)} calls in flight is not used)")
    else:
        lines.append("knee: not found (too few load levels to fit)")
    lines.append(f"usable capacity at the SLO: {_n(u.get('concurrency'), 1)} calls in flight, "
                 f"{_n(u.get('calls_per_second'))} calls/s")
    if op.get("concurrency") is not None:
        lines.append(f"recommended operating point: {_n(op['concurrency'], 1)} calls in flight ({op['basis']}, "
                     f"margin {op['margin']:.0%})")
    if rep.get("agreement"):
        a = rep["agreement"]
        q = a["queue_mean_seconds"]
        lines.append(f"client vs server: succeeded {a['succeeded']['client']} vs {a['succeeded']['server']}; mean queue "
                     f"{_n(q['client_estimate'], 3)} vs {_n(q['server'], 3)} s")
    return lines
