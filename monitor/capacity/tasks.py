"""Per task type: arrival rate, calls per task, latency quantiles, sessions, SLO share (pure).

Input: two `GatewayReading`s of the same source (older may be None: then everything is "since the
source started", and rates are None). Output: the dict that goes into `PoolSnapshot.tasks`:

    {task_type: {"arrival_rate", "calls_per_task", "calls_per_task_source", "call_rate",
                 "tasks", "calls", "task_latency", "call_latency", "ttft", "sessions",
                 "sessions_source", "class", "input_tokens_per_call", "output_tokens_per_call",
                 "slo_target_seconds", "slo_objective", "slo_violation_ratio"}}

plus `call_latency_by_class(...)` -> {class: Quantiles} for headroom_call_latency_seconds.
"""
from __future__ import annotations

from typing import Optional

from monitor.derive import histogram as histo
from monitor.capacity.slo import SloSettings, violation_ratio
from monitor.model import Histogram
from monitor.sources.gateway import GatewayConfig, GatewayReading, TaskCumulative


def _delta(new: Optional[float], old: Optional[float]) -> Optional[float]:
    """Counter increase; a decrease means a reset, and the new value is the increase since it."""
    if new is None:
        return None
    if old is None:
        return new
    return new - old if new >= old else new


def _hdelta(new: Optional[Histogram], old: Optional[Histogram]) -> Optional[Histogram]:
    if new is None:
        return None
    if old is None:
        return new
    d = new.minus(old)
    return new if d is None else d


def _tasks_delta(new: TaskCumulative, old: Optional[TaskCumulative]) -> Optional[float]:
    if new.tasks_started is not None:
        return _delta(new.tasks_started, old.tasks_started if old else None)
    if new.task_ids:
        return float(len(new.task_ids - (old.task_ids if old else set())))
    if new.session_calls:
        return float(len(set(new.session_calls) - set(old.session_calls if old else {})))
    return None


def _sessions_in_window(new: TaskCumulative, old: Optional[TaskCumulative]) -> Optional[float]:
    """Sessions whose call count moved in the window (gateway view; app gauge preferred)."""
    if not new.session_calls:
        return None
    before = old.session_calls if old else {}
    return float(sum(1 for sid, n in new.session_calls.items() if n > before.get(sid, 0.0)))


def derive_tasks(newer: GatewayReading, older: Optional[GatewayReading], config: GatewayConfig,
                 slo: Optional[SloSettings] = None) -> dict:
    if older is not None and newer.timestamp <= older.timestamp:
        raise ValueError(f"gateway readings out of order: {newer.timestamp} <= {older.timestamp}")
    window = (newer.timestamp - older.timestamp) if older is not None else None
    slo = slo or SloSettings()
    out: dict = {}
    for tt, t in sorted(newer.tasks.items()):
        o = older.tasks.get(tt) if older is not None else None
        tasks = _tasks_delta(t, o)
        calls = _delta(t.model_calls, o.model_calls if o else None)
        per_task_calls, per_task_tasks = calls, tasks
        if t.app_model_calls is not None and t.task_duration is not None:
            # the convention: the calls of a task are added to agent_task_model_calls_total when it
            # completes, and agent_task_duration_seconds observes it then: calls / completed tasks
            per_task_tasks = _delta(t.task_duration.count, o.task_duration.count if (o and o.task_duration) else None)
            source = "app"
        elif t.app_model_calls is not None and t.tasks_started is not None:
            source = "app"
        elif t.tasks_started is not None:
            source = "gateway_calls/app_tasks"
        elif t.tasks_source is not None:
            source = f"gateway/{t.tasks_source}"
        else:
            source = None
        duration = _hdelta(t.task_duration, o.task_duration if o else None)
        call_h = _hdelta(t.call_latency, o.call_latency if o else None)
        ttft_h = _hdelta(t.ttft, o.ttft if o else None)
        gw_calls = _delta(t.calls, o.calls if o else None)
        in_tok = _delta(t.input_tokens, o.input_tokens if o else None)
        out_tok = _delta(t.output_tokens, o.output_tokens if o else None)
        if t.sessions_active is not None:
            sessions, sessions_source = t.sessions_active, "app"
        else:
            sessions = _sessions_in_window(t, o) if o is not None else None
            sessions_source = "gateway_window" if sessions is not None else None
        target = slo.task_target(tt)
        entry = {
            "tasks": tasks,
            "calls": calls,
            "arrival_rate": (tasks / window) if (window and tasks is not None) else None,
            "call_rate": (calls / window) if (window and calls is not None) else None,
            "completed_tasks": per_task_tasks if source == "app" else None,
            "calls_per_task": (per_task_calls / per_task_tasks) if (per_task_tasks and per_task_calls is not None) else None,
            "calls_per_task_source": source,
            "task_latency": histo.quantiles(duration).as_dict() if duration is not None else None,
            "call_latency": histo.quantiles(call_h).as_dict() if call_h is not None else None,
            "ttft": histo.quantiles(ttft_h).as_dict() if ttft_h is not None else None,
            "sessions": sessions,
            "sessions_source": sessions_source,
            "class": config.class_of(tt, {}),
            "input_tokens_per_call": (in_tok / gw_calls) if (in_tok is not None and gw_calls) else None,
            "output_tokens_per_call": (out_tok / gw_calls) if (out_tok is not None and gw_calls) else None,
            "slo_target_seconds": target.seconds if target else None,
            "slo_objective": target.objective if target else None,
            "slo_violation_ratio": None,
        }
        if target is not None:
            h = duration if target.signal == "task" else (ttft_h if target.signal == "ttft" else call_h)
            entry["slo_violation_ratio"] = violation_ratio(h, target) if h is not None else None
        out[tt] = entry
    return out


def call_latency_by_class(newer: GatewayReading, older: Optional[GatewayReading]) -> dict:
    """{class: Quantiles} of per-call latency (gateway end-to-end) over the window."""
    merged: dict[str, Histogram] = {}
    for tt, t in newer.tasks.items():
        o = older.tasks.get(tt) if older is not None else None
        for cls, h in t.call_latency_by_class.items():
            d = _hdelta(h, o.call_latency_by_class.get(cls) if o else None)
            if d is None:
                continue
            if cls in merged:
                m = merged[cls].plus(d)
                if m is None:
                    raise ValueError(f"call latency histograms of class {cls!r} have different buckets")
                merged[cls] = m
            else:
                merged[cls] = d
    return {cls: histo.quantiles(h) for cls, h in sorted(merged.items())}
