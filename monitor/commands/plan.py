"""`headroom plan`: capacity plan from a task mix file, or from the mix measured in Prometheus."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Callable, Optional

from monitor.capacity.plan import plan, render_table
from monitor.config import ConfigError
from monitor.config.plan import parse_mix
from monitor.config.reader import read_yaml
from monitor.sources.gateway import GATEWAY_FAMILIES, KINDS, DEFAULT_LABELS

QueryFn = Callable[[str], list]  # PromQL -> [(labels, value)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mix", dest="mix", metavar="FILE", help="task mix YAML (docs/capacity.md)")
    p.add_argument("--from-prometheus", dest="from_prometheus", metavar="URL",
                   help="measure the task mix (arrivals, calls per task, seconds and KV tokens per call) "
                        "from this Prometheus; the mix file, when given, supplies the rest")
    p.add_argument("--window", default="1h", help="rate window for --from-prometheus (PromQL duration)")
    p.add_argument("--at", type=float, default=None, help="evaluation time (Unix seconds) for --from-prometheus")
    p.add_argument("--gateway", dest="gateway_kind", default="litellm", choices=list(KINDS),
                   help="gateway whose per-call latency and tokens to read (--from-prometheus)")
    p.add_argument("--task-label", dest="task_label", default=None,
                   help="gateway label holding the task type (default: the gateway's default)")
    p.add_argument("--pool", default=None,
                   help="pool whose learned knee and replicas to read from headroom's own metrics")
    p.add_argument("--knee", dest="knee", type=float, default=None, help="knee requests per replica (override)")
    p.add_argument("--replicas", type=int, default=None, help="replicas running today (override)")
    p.add_argument("--margin", type=float, default=None, help="share of the knee kept free (override)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _query_fn(url: str, at: Optional[float]) -> QueryFn:
    """Instant queries at `at` through the live source's client (its retries and time box)."""
    from monitor.sources.prometheus import PrometheusClient  # noqa: PLC0415
    client = PrometheusClient(url)
    return lambda q: client.query(q, at)


def _by(result: list, label: str) -> dict[str, float]:
    out = {}
    for labels, value in result:
        key = labels.get(label)
        if key and math.isfinite(value):
            out[key] = value
    return out


def measure_mix(query: QueryFn, window: str, kind: str = "litellm", task_label: Optional[str] = None) -> dict:
    """Task types measured in Prometheus -> the `task_types` mapping of a mix.

    tasks/s and calls per task from the application convention (agent_tasks_started_total,
    agent_task_model_calls_total); seconds per call and KV tokens per call from the gateway's
    per-call latency histogram and token counters by task label. KV tokens per call =
    input + output / 2 (a call's KV grows through decode; this is its average over the call).
    """
    fam = GATEWAY_FAMILIES[kind]
    label = task_label or DEFAULT_LABELS[kind][0]
    w = window
    arrivals = _by(query(f"sum by (task_type) (rate(agent_tasks_started_total[{w}]))"), "task_type")
    if not arrivals:
        raise ValueError("Prometheus has no agent_tasks_started_total series in the window: "
                         "the application-side task counters are needed for --from-prometheus")
    app_calls = _by(query(f"sum by (task_type) (rate(agent_task_model_calls_total[{w}]))"), "task_type")
    gw_calls: dict[str, float] = {}
    if fam.calls:
        gw_calls = _by(query(f"sum by ({label}) (rate({fam.calls[0]}[{w}]))"), label)
    lat_sum = lat_count = {}
    if fam.call_latency:
        base = fam.call_latency[0]
        lat_sum = _by(query(f"sum by ({label}) (rate({base}_sum[{w}]))"), label)
        lat_count = _by(query(f"sum by ({label}) (rate({base}_count[{w}]))"), label)
        if not gw_calls:
            gw_calls = lat_count
    tok_in = tok_out = {}
    if fam.input_tokens:
        tok_in = _by(query(f"sum by ({label}) (rate({fam.input_tokens[0]}[{w}]))"), label)
        tok_out = _by(query(f"sum by ({label}) (rate({fam.output_tokens[0]}[{w}]))"), label)
    elif kind == "envoy":
        tok_in = _by(query(f'sum by ({label}) (rate(gen_ai_client_token_usage_sum{{gen_ai_token_type="input"}}[{w}]))'), label)
        tok_out = _by(query(f'sum by ({label}) (rate(gen_ai_client_token_usage_sum{{gen_ai_token_type="output"}}[{w}]))'), label)
    tasks: dict[str, dict] = {}
    missing = []
    for tt, rate in sorted(arrivals.items()):
        calls_rate = app_calls.get(tt, gw_calls.get(tt))
        if not rate or calls_rate is None:
            if rate:
                missing.append(f"{tt}: no model-call counter")
            continue
        if not lat_count.get(tt):
            missing.append(f"{tt}: no per-call latency from the {kind} gateway (label {label})")
            continue
        entry = {"tasks_per_second": rate, "calls_per_task": calls_rate / rate,
                 "seconds_per_call": lat_sum.get(tt, 0.0) / lat_count[tt]}
        if tt in tok_in and gw_calls.get(tt):
            entry["kv_tokens_per_call"] = (tok_in[tt] + 0.5 * tok_out.get(tt, 0.0)) / gw_calls[tt]
        tasks[tt] = entry
    if missing:
        raise ValueError("cannot measure the mix for every task type: " + "; ".join(missing))
    if not tasks:
        raise ValueError("no task type started in the window")
    return tasks


def read_pool(query: QueryFn, pool: str) -> dict:
    """Knee per replica and replicas of a pool from headroom's own metrics."""
    knee = _by(query(f'headroom_knee_requests{{pool="{pool}"}}'), "pool").get(pool)
    reps = _by(query(f'headroom_replicas{{pool="{pool}"}}'), "pool").get(pool)
    out = {}
    if knee is not None and reps:
        out["knee_requests_per_replica"] = knee / reps
        out["replicas"] = int(reps)
    return out


def run(args: argparse.Namespace) -> int:
    if not args.mix and not args.from_prometheus:
        print("headroom plan: give --mix FILE or --from-prometheus URL (or both)", file=sys.stderr)
        return 2
    data: dict = {}
    if args.mix:
        try:
            data = read_yaml(args.mix) or {}
        except ConfigError as exc:
            print(f"headroom plan: {exc}", file=sys.stderr)
            return 2
    overrides: dict = {}
    try:
        if args.from_prometheus:
            query = _query_fn(args.from_prometheus, args.at if args.at is not None else time.time())
            overrides["task_types"] = measure_mix(query, args.window, args.gateway_kind, args.task_label)
            if args.pool:
                measured = read_pool(query, args.pool)
                for k, v in measured.items():
                    if k not in data:
                        overrides[k] = v
                overrides.setdefault("pool", args.pool)
        if args.knee is not None:
            overrides["knee_requests_per_replica"] = args.knee
        if args.replicas is not None:
            overrides["replicas"] = args.replicas
        if args.margin is not None:
            overrides["margin"] = args.margin
        mix = parse_mix(data, where=args.mix or "mix", overrides=overrides)
        result = plan(mix)
    except ValueError as exc:
        print(f"headroom plan: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Prometheus unreachable etc.
        text = str(exc) if getattr(exc, "reason", None) else f"{type(exc).__name__}: {exc}"
        print(f"headroom plan: cannot measure the mix from {args.from_prometheus}: {text}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_clean(result), indent=2, allow_nan=False))
    else:
        sys.stdout.write(render_table(result))
    return 0


def _clean(o):
    """JSON has no infinities: write them as the strings Prometheus uses (+Inf, -Inf, NaN)."""
    if isinstance(o, float) and not math.isfinite(o):
        return "NaN" if math.isnan(o) else ("+Inf" if o > 0 else "-Inf")
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o
