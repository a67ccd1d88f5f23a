"""`headroom plan`: capacity plan from a task mix file, or from the mix measured in Prometheus."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Callable, Optional

from monitor.capacity.mix import parse_mix
from monitor.capacity.task_plan import plan, render_table
from monitor.config import ConfigError
from monitor.digest.knee_report import copy_labels, copy_name
from monitor.kit.redact import redact_urls
from monitor.kit.settings.reader import read_yaml
from monitor.kit.settings.values import parse_duration
from monitor.sources.gateway import (
    APP_MODEL_CALLS,
    APP_TASKS_STARTED,
    DEFAULT_LABELS,
    ENVOY_TOKENS,
    GATEWAY_FAMILIES,
    KINDS,
    UNATTRIBUTED,
    UNSET_VALUES,
)

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
    p.add_argument("--task-id-label", dest="task_id_label", default=None,
                   help="gateway label naming one task (e.g. metadata_session_id when a session is one task): "
                        "without the application counters, tasks are counted as its distinct values")
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


def _by_task(result: list, label: str) -> dict[str, float]:
    """{task label value: value}. The values a gateway writes for "no value" ("None", "null") are one
    `unattributed` entry (their sum), never a task type of their own; a series without the label
    (absent in Prometheus) is left out, as a series of another kind."""
    out: dict[str, float] = {}
    for labels, value in result:
        key = labels.get(label, "")
        if not key or not math.isfinite(value):
            continue
        key = UNATTRIBUTED if key in UNSET_VALUES else key
        out[key] = out.get(key, 0.0) + value
    return out


def _window_seconds(window: str) -> float:
    try:
        return float(parse_duration(window))
    except ValueError as exc:
        raise ValueError(f"--window {window!r}: {exc}") from None


def _gateway(query: QueryFn, kind: str, label: str, w: str) -> dict[str, dict[str, float]]:
    """The gateway's per-call series by `label`: calls/s, latency _sum and _count rates, tokens/s."""
    fam = GATEWAY_FAMILIES[kind]
    out: dict[str, dict[str, float]] = {"calls": {}, "lat_sum": {}, "lat_count": {}, "tok_in": {}, "tok_out": {}}
    if fam.calls:
        out["calls"] = _by_task(query(f"sum by ({label}) (rate({fam.calls[0]}[{w}]))"), label)
    if fam.call_latency:
        base = fam.call_latency[0]
        out["lat_sum"] = _by_task(query(f"sum by ({label}) (rate({base}_sum[{w}]))"), label)
        out["lat_count"] = _by_task(query(f"sum by ({label}) (rate({base}_count[{w}]))"), label)
        if not out["calls"]:
            out["calls"] = out["lat_count"]
    if fam.input_tokens:
        out["tok_in"] = _by_task(query(f"sum by ({label}) (rate({fam.input_tokens[0]}[{w}]))"), label)
        out["tok_out"] = _by_task(query(f"sum by ({label}) (rate({fam.output_tokens[0]}[{w}]))"), label)
    elif kind == "envoy":
        for key, typ in (("tok_in", "input"), ("tok_out", "output")):
            sel = f'{ENVOY_TOKENS[0]}{{gen_ai_token_type="{typ}"}}'
            out[key] = _by_task(query(f"sum by ({label}) (rate({sel}[{w}]))"), label)
    return out


def _distinct_tasks(query: QueryFn, kind: str, label: str, id_label: str, w: str) -> dict[str, float]:
    """Tasks per task type in the window: distinct values of `id_label` whose calls grew in it."""
    fam = GATEWAY_FAMILIES[kind]
    calls = fam.calls[0] if fam.calls else f"{fam.call_latency[0]}_count"
    return _by_task(query(f"count by ({label}) (count by ({label}, {id_label}) (increase({calls}[{w}]) > 0))"), label)


def _per_call(tt: str, rate: float, calls: float, gw: dict, kind: str, label: str) -> dict:
    lat_count = gw["lat_count"].get(tt)
    if not lat_count:
        raise ValueError(f"{tt}: no per-call latency from the {kind} gateway (label {label})")
    entry = {"tasks_per_second": rate, "calls_per_task": calls / rate,
             "seconds_per_call": gw["lat_sum"].get(tt, 0.0) / lat_count}
    gw_calls = gw["calls"].get(tt)
    if tt in gw["tok_in"] and gw_calls:
        entry["kv_tokens_per_call"] = (gw["tok_in"][tt] + 0.5 * gw["tok_out"].get(tt, 0.0)) / gw_calls
    return entry


def measure_mix(query: QueryFn, window: str, kind: str = "litellm", task_label: Optional[str] = None,
                task_id_label: Optional[str] = None, known_calls: Optional[dict] = None) -> tuple[dict, list[str]]:
    """Task types measured in Prometheus -> (the `task_types` mapping of a mix, notes on how).

    Seconds and KV tokens per call always come from the gateway's per-call latency histogram and
    token counters by task label (KV tokens per call = input + output / 2: a call's KV grows through
    decode; this is its average over the call). Tasks/s and calls per task, first that applies:
      1. the application convention (agent_tasks_started_total, agent_task_model_calls_total);
      2. `task_id_label`: tasks = distinct values of that gateway label whose calls grew in the window;
      3. `known_calls` (task type -> calls per task, from the mix file): tasks/s = calls/s / that;
      4. else one call per task (tasks/s = the gateway's calls/s), said in the notes.
    The gateway's task label defaults to the kind's; when no series carries it (a proxy without
    metadata labels), task types are the gateway's models (its model label), said in the notes.
    """
    label = task_label or DEFAULT_LABELS[kind][0]
    if label is None:  # a gateway read for its queue only (dynamo) has no task label of its own
        raise ValueError(f"the {kind} gateway has no task label: name the one its series carry with --task-label")
    w, notes = window, []
    gw = _gateway(query, kind, label, w)
    arrivals = _by_task(query(f"sum by (task_type) (rate({APP_TASKS_STARTED}[{w}]))"), "task_type")
    model_label = DEFAULT_LABELS[kind][2]
    if not arrivals and not gw["calls"] and model_label:
        fallback = _gateway(query, kind, model_label, w)
        if fallback["calls"]:
            notes.append(f"no {kind} series carry the task label {label}: task types are the models "
                         f"(label {model_label})")
            label, gw = model_label, fallback
    if arrivals:
        untyped = arrivals.pop(UNATTRIBUTED, None)  # tasks the application counted without a type
        app_calls = _by_task(query(f"sum by (task_type) (rate({APP_MODEL_CALLS}[{w}]))"), "task_type")
        calls = {tt: app_calls.get(tt, gw["calls"].get(tt)) for tt in arrivals}
        notes += _app_sources(arrivals, app_calls, gw, kind, label)
        if untyped:
            notes.append(f"{APP_TASKS_STARTED} without a task type ({untyped:.3g} tasks/s): not planned")
    else:
        arrivals, calls = _gateway_arrivals(query, kind, label, w, gw, task_id_label, known_calls or {}, notes)
    return _assemble(arrivals, calls, gw, kind, label), notes


def _app_sources(arrivals: dict, app_calls: dict, gw: dict, kind: str, label: str) -> list[str]:
    """Which series the application-counter path actually read, and the gateway's calls it left out."""
    fam = GATEWAY_FAMILIES[kind]
    gw_series = fam.calls[0] if fam.calls else f"{fam.call_latency[0]}_count"
    from_app = sorted(tt for tt in arrivals if tt in app_calls)
    from_gw = sorted(tt for tt in arrivals if tt not in app_calls and tt in gw["calls"])
    parts = []
    if from_app:
        parts.append(f"from {APP_MODEL_CALLS} for {', '.join(from_app)}")
    if from_gw:
        parts.append(f"from the {kind} gateway's {gw_series} (label {label}) for {', '.join(from_gw)}")
    notes = [f"tasks/s from {APP_TASKS_STARTED}; calls per task " + ("; ".join(parts) or "not found")]
    left = {tt: v for tt, v in gw["calls"].items() if tt not in arrivals and v > 0}
    if left:
        notes.append("gateway calls without application tasks, not planned: " +
                     ", ".join(f"{tt} {v:.3g} calls/s" for tt, v in sorted(left.items())))
    return notes


def _gateway_arrivals(query: QueryFn, kind: str, label: str, w: str, gw: dict, task_id_label: Optional[str],
                      known_calls: dict, notes: list[str]) -> tuple[dict, dict]:
    """Tasks/s per task type from the gateway alone (no application counters)."""
    if not gw["calls"]:
        raise ValueError(f"Prometheus has neither {APP_TASKS_STARTED} nor {kind} gateway call series by "
                         f"label {label} in the window (--gateway, --task-label)")
    calls = dict(gw["calls"])
    how = f"no {APP_TASKS_STARTED}: task types from the {kind} gateway's label {label}"
    if task_id_label:
        tasks = _distinct_tasks(query, kind, label, task_id_label, w)
        if not tasks:
            raise ValueError(f"no {kind} call series carry both the task label {label} and the "
                             f"--task-id-label {task_id_label} in the window")
        seconds = _window_seconds(w)
        notes.append(f"{how}; tasks counted as distinct {task_id_label} values in the {w} window")
        return {tt: n / seconds for tt, n in tasks.items() if tt in calls}, calls
    arrivals, assumed = {}, []
    for tt, rate in calls.items():
        per_task = known_calls.get(tt)
        if per_task is None:
            assumed.append(tt)
        arrivals[tt] = rate / (per_task or 1.0)
    known = sorted(set(calls) - set(assumed))
    notes.append(how + (f"; calls per task from the mix file for {', '.join(known)}" if known else ""))
    if assumed:
        notes.append(f"calls per task = 1 ASSUMED for {', '.join(sorted(assumed))} (not measured: give "
                     f"--task-id-label, the application counters, or calls_per_task in the mix file)")
    return arrivals, calls


def _assemble(arrivals: dict, calls: dict, gw: dict, kind: str, label: str) -> dict:
    tasks: dict[str, dict] = {}
    missing = []
    for tt, rate in sorted(arrivals.items()):
        calls_rate = calls.get(tt)
        if not rate:
            continue
        if calls_rate is None:
            missing.append(f"{tt}: no model-call counter")
            continue
        try:
            tasks[tt] = _per_call(tt, rate, calls_rate, gw, kind, label)
        except ValueError as exc:
            missing.append(str(exc))
    if missing:
        raise ValueError("cannot measure the mix for every task type: " + "; ".join(missing))
    if not tasks:
        raise ValueError("no task type started in the window")
    return tasks


def read_pool(query: QueryFn, pool: str) -> tuple[dict, list[str]]:
    """Knee per replica and replicas of a pool from headroom's own metrics, and a note on where from.

    Copies of headroom (HA replicas of the daemon, a direct-mode and a Prometheus-mode daemon) export
    the same pool's knee, told apart by their target labels (`instance`, `pod`, `job`): the
    pessimistic copy decides (docs/runbook.md), the lowest knee per replica, each copy's knee over
    its own replicas, and the note names the copy and its source (learned or prior)."""
    knees = _by_copy(query(f'headroom_knee_requests{{pool="{pool}"}}'))
    reps = _by_copy(query(f'headroom_replicas{{pool="{pool}"}}'))
    sources = {copy_labels(labels): labels.get("source", "") for labels, _ in
               query(f'headroom_knee_info{{pool="{pool}"}}')}
    per_copy = {c: (k / reps[c], int(reps[c])) for c, k in knees.items() if reps.get(c)}
    if not per_copy:
        return {}, []
    copy, (per_rep, n) = min(per_copy.items(), key=lambda kv: (kv[1][0], kv[0]))
    source = sources.get(copy) or "source unknown"
    note = f"knee {per_rep:.2f} per replica x {n} replicas from headroom_knee_requests ({source})"
    if len(per_copy) > 1:
        others = "; ".join(f"{copy_name(c) or 'no labels'}: {v[0]:.2f}" for c, v in sorted(per_copy.items()) if c != copy)
        note += (f" of the copy {copy_name(copy) or 'without target labels'}, the lowest of {len(per_copy)} "
                 f"copies of headroom (the pessimistic copy decides; others {others})")
    return {"knee_requests_per_replica": per_rep, "replicas": n}, [note]


def _by_copy(result: list) -> dict:
    """{copy's labels: value} of one pool's series, finite values only."""
    return {copy_labels(labels): value for labels, value in result if math.isfinite(value)}


def _known_calls(data) -> dict[str, float]:
    """Calls per task the mix file states per task type (used only when Prometheus cannot measure it)."""
    types = data.get("task_types") if isinstance(data, dict) else None
    if not isinstance(types, dict):
        return {}
    return {str(name): float(t["calls_per_task"]) for name, t in types.items()
            if isinstance(t, dict) and isinstance(t.get("calls_per_task"), (int, float))
            and not isinstance(t["calls_per_task"], bool) and t["calls_per_task"] > 0}


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
    notes: list[str] = []
    try:
        if args.from_prometheus:
            query = _query_fn(args.from_prometheus, args.at if args.at is not None else time.time())
            overrides["task_types"], notes = measure_mix(query, args.window, args.gateway_kind, args.task_label,
                                                         args.task_id_label, _known_calls(data))
            if args.pool:
                measured, pool_notes = read_pool(query, args.pool)
                if "knee_requests_per_replica" not in data:
                    notes += pool_notes
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
        if notes:
            result["measured"] = notes
    except ValueError as exc:
        print(f"headroom plan: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - Prometheus unreachable etc.
        text = str(exc) if getattr(exc, "reason", None) else f"{type(exc).__name__}: {exc}"
        print(f"headroom plan: cannot measure the mix from {redact_urls(args.from_prometheus)}: {redact_urls(text)}",
              file=sys.stderr)
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
    if isinstance(o, float):
        return o + 0.0  # never -0.0
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o
