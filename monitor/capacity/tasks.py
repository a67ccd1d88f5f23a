"""Per task type: arrival rate, calls per task, latency quantiles, sessions, SLO share (pure).

Input: two `GatewayReading`s of the same source (older may be None: then everything is "since the
source started", and rates are None). Output: {task_type: `TaskStats`} (monitor/model/), plus
`call_latency_by_class(...)` -> {class: Quantiles} for headroom_call_latency_seconds.

The window: a task spans several calls of several seconds each, so task counts, calls per task and
sessions are only meaningful over many task durations (over one 5 s cycle a fixed 3-call task read
1 to 9 calls per task). `TaskWindow` keeps one source's readings and gives the one at the window's
start (capacity.task_window, default global.latency_window); until the readings cover the window,
`derive_tasks(..., covered=False)` leaves the counts unknown (None) and gives the latency quantiles
of what there is.

Counter and histogram increases follow the one rule of monitor/derive/counters.py (PromQL's: the
increase across a reset is the new value).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from monitor.capacity.slo import SloSettings, violation_ratio
from monitor.derive import histogram as histo
from monitor.derive.counters import histogram_increase, increase
from monitor.model import Histogram, TaskStats
from monitor.model.readings import GatewayConfig, GatewayReading, TaskCumulative


def _delta(new: Optional[float], old: Optional[float]) -> Optional[float]:
    """The counter's increase since the older reading; all of it without one (since the start)."""
    return new if old is None else increase(new, old)


def _hdelta(new: Optional[Histogram], old: Optional[Histogram]) -> Optional[Histogram]:
    return new if old is None else histogram_increase(new, old)


def _tasks_delta(new: TaskCumulative, old: Optional[TaskCumulative]) -> Optional[float]:
    if new.tasks_started is not None:
        return _delta(new.tasks_started, old.tasks_started if old else None)
    if new.task_ids:
        return float(len(new.task_ids - (old.task_ids if old else set())))
    if new.session_calls:
        return float(len(set(new.session_calls) - set(old.session_calls if old else {})))
    return None


# a reading this much less than the window old still starts it (cycles drift by a little)
WINDOW_SLACK = 0.01


class TaskWindow:
    """The readings of one gateway (one pool's view of it) over one window, oldest first.

    `add` takes each cycle's reading; `start()` is the newest reading at least the window before the
    newest one (less WINDOW_SLACK of it), None until the readings cover the window. Older readings
    are dropped, and readings closer together than window/MAX_READINGS are thinned (the newest always
    kept), so memory stays bounded whatever the interval."""

    MAX_READINGS = 256

    def __init__(self, window: float) -> None:
        if not window > 0:
            raise ValueError(f"task window must be > 0 seconds, got {window!r}")
        self.window = float(window)
        self.readings: list[GatewayReading] = []

    def add(self, reading: GatewayReading) -> None:
        rs = self.readings
        if rs and reading.timestamp <= rs[-1].timestamp:
            if reading.timestamp == rs[-1].timestamp:
                rs[-1] = reading  # the same instant read again: the newer body wins
                return
            rs.clear()  # time went back: what was kept describes another timeline
        spacing = self.window / self.MAX_READINGS
        if len(rs) >= 2 and rs[-1].timestamp - rs[-2].timestamp < spacing:
            rs[-1] = reading  # the last kept one is too close to the one before: the newer takes its place
        else:
            rs.append(reading)
        first = self._start_index()
        if first:
            del rs[:first]

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds` (monitor/pipeline/cycle.py): the readings move with it."""
        self.readings = [replace(r, timestamp=r.timestamp + seconds) for r in self.readings]

    def _start_index(self) -> Optional[int]:
        rs = self.readings
        if len(rs) < 2:
            return None
        limit = rs[-1].timestamp - self.window * (1.0 - WINDOW_SLACK)
        for i in range(len(rs) - 2, -1, -1):
            if rs[i].timestamp <= limit:
                return i
        return None

    def start(self) -> Optional[GatewayReading]:
        """The reading at the window's start; None while the window is not covered."""
        i = self._start_index()
        return self.readings[i] if i is not None else None

    def older(self) -> tuple[Optional[GatewayReading], bool]:
        """(the reading deltas are taken against, whether it covers the window): the window's start,
        else the oldest kept (a partial window), else None (one reading so far)."""
        start = self.start()
        if start is not None:
            return start, True
        return (self.readings[0] if len(self.readings) >= 2 else None), False


def _sessions_in_window(new: TaskCumulative, old: Optional[TaskCumulative]) -> Optional[float]:
    """Sessions whose call count moved in the window (an opt-in session label; app gauge preferred)."""
    if not new.session_calls:
        return None
    before = old.session_calls if old else {}
    return float(sum(1 for sid, n in new.session_calls.items() if n > before.get(sid, 0.0)))


def _calls_per_task_source(t: TaskCumulative) -> Optional[str]:
    if t.app_model_calls is not None and (t.task_duration is not None or t.tasks_started is not None):
        return "app"
    if t.tasks_started is not None:
        return "gateway_calls/app_tasks"
    if t.tasks_source is not None:
        return f"gateway/{t.tasks_source}"
    return None


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if (num is not None and den) else None


def _quantiles(h: Optional[Histogram]):
    return histo.quantiles(h) if h is not None else None


def derive_tasks(newer: GatewayReading, older: Optional[GatewayReading], config: GatewayConfig,
                 slo: Optional[SloSettings] = None, covered: bool = True) -> dict[str, TaskStats]:
    """Per task type between `older` and `newer`. `covered=False`: `older` is not a whole window
    back (TaskWindow.older), so tasks, calls, rates, calls per task and window sessions are None."""
    if older is not None and newer.timestamp <= older.timestamp:
        raise ValueError(f"gateway readings out of order: {newer.timestamp} <= {older.timestamp}")
    window = (newer.timestamp - older.timestamp) if older is not None else None
    slo = slo or SloSettings()
    out: dict[str, TaskStats] = {}
    for tt, t in sorted(newer.tasks.items()):
        o = older.tasks.get(tt) if older is not None else None
        tasks, calls, per_task_tasks = _counts(t, o) if covered else (None, None, None)
        source = _calls_per_task_source(t)
        duration = _hdelta(t.task_duration, o.task_duration if o else None)
        call_h = _hdelta(t.call_latency, o.call_latency if o else None)
        ttft_h = _hdelta(t.ttft, o.ttft if o else None)
        gw_calls = _delta(t.calls, o.calls if o else None)
        done = _delta(t.task_duration.count, o.task_duration.count if (o and o.task_duration) else None) \
            if (covered and t.task_duration is not None) else None
        sessions: Optional[float]
        sessions_source: Optional[str]
        if t.sessions_active is not None:
            sessions, sessions_source = t.sessions_active, "app"
        else:
            sessions = _sessions_in_window(t, o) if (older is not None and covered) else None
            sessions_source = "gateway_window" if sessions is not None else None
        target = slo.task_target(tt)
        violation = None
        if target is not None:
            h = duration if target.signal == "task" else (ttft_h if target.signal == "ttft" else call_h)
            violation = violation_ratio(h, target) if h is not None else None
        out[tt] = TaskStats(
            task_type=tt, tasks=tasks, calls=calls,
            arrival_rate=(tasks / window) if (window and tasks is not None) else None,
            call_rate=(calls / window) if (window and calls is not None) else None,
            completed_tasks=per_task_tasks if source == "app" else None,
            completion_rate=(done / window) if (window and done is not None) else None,
            calls_per_task=_ratio(calls, per_task_tasks), calls_per_task_source=source,
            task_latency=_quantiles(duration), call_latency=_quantiles(call_h), ttft=_quantiles(ttft_h),
            sessions=sessions, sessions_source=sessions_source, call_class=config.class_of(tt, {}),
            input_tokens_per_call=_ratio(_delta(t.input_tokens, o.input_tokens if o else None), gw_calls),
            output_tokens_per_call=_ratio(_delta(t.output_tokens, o.output_tokens if o else None), gw_calls),
            slo_target_seconds=target.seconds if target else None,
            slo_objective=target.objective if target else None, slo_violation_ratio=violation)
    return out


def _counts(t: TaskCumulative, o: Optional[TaskCumulative]
            ) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(tasks started, model calls, the tasks calls per task divides by) between the readings."""
    tasks = _tasks_delta(t, o)
    calls = _delta(t.model_calls, o.model_calls if o else None)
    if t.app_model_calls is not None and t.task_duration is not None:
        # the convention: the calls of a task are added to agent_task_model_calls_total when it
        # completes, and agent_task_duration_seconds observes it then: calls / completed tasks
        return tasks, calls, _delta(t.task_duration.count, o.task_duration.count if (o and o.task_duration) else None)
    return tasks, calls, tasks


APP_TASK_SOURCES = ("app", "gateway_calls/app_tasks")  # the body carried the application's task counter


def join_sources(a: TaskStats, b: TaskStats) -> TaskStats:
    """One task type of one pool seen by two sources, usually the gateway and the application
    (separate scrapes): the application's tasks, task latency and sessions; its calls per task when
    it counts calls itself (`app`), else the gateway's call rate over the application's task rate
    (`gateway_calls/app_tasks`: the two windows may differ by a cycle, rates do not); the gateway's
    per-call latency and tokens. Two sources of the same kind: the application's numbers, else `b`."""
    a_app, b_app = a.calls_per_task_source in APP_TASK_SOURCES, b.calls_per_task_source in APP_TASK_SOURCES
    if a_app == b_app:
        return a if a.calls_per_task_source == "app" else b
    app, gw = (a, b) if a_app else (b, a)
    out = replace(app, call_latency=app.call_latency or gw.call_latency, ttft=app.ttft or gw.ttft,
                  input_tokens_per_call=_first(app.input_tokens_per_call, gw.input_tokens_per_call),
                  output_tokens_per_call=_first(app.output_tokens_per_call, gw.output_tokens_per_call))
    if app.sessions is None and gw.sessions is not None:
        out = replace(out, sessions=gw.sessions, sessions_source=gw.sessions_source)
    if app.slo_violation_ratio is None and gw.slo_violation_ratio is not None:
        out = replace(out, slo_violation_ratio=gw.slo_violation_ratio, slo_window_seconds=gw.slo_window_seconds,
                      slo_burn_rate=gw.slo_burn_rate)
    if app.calls_per_task_source != "app" and app.calls is None:
        out = replace(out, calls=gw.calls, call_rate=gw.call_rate,
                      calls_per_task=_ratio(gw.call_rate, app.arrival_rate))
    return out


def _first(*values: Optional[float]) -> Optional[float]:
    return next((v for v in values if v is not None), None)


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
