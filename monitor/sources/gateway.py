"""Task and session attribution from gateway metrics and the application-side task convention.

Pure given the exposition text: `read_gateway(text, config, timestamp)` turns one scrape of a
LiteLLM proxy, an Envoy AI Gateway ext-proc, an llm-d router (EPP), or an application exposing
headroom's `agent_*` task metrics into one `GatewayReading` of cumulative values per task type.
The cycle parses each body once with `read_gateway_scrape` (monitor/pipeline/cycle.py `collect`) into a
`GatewayScrape`, with a reading per model when the gateway fronts several pools; rates and windows
are derived later (monitor.capacity.tasks) from two readings. The tables of what each kind exposes
are in monitor/sources/gateway_schema.py; the reading types, the pure core's input, in
monitor/model/readings.py.

Which label names the task type and which the session is configuration; the defaults per gateway are
in DEFAULT_LABELS and docs/capacity.md. Series without the task label, or with an empty one or one
a gateway writes for "no value" ("None", "null": UNSET_VALUES) are counted under UNATTRIBUTED.

Cardinality: no kind reads a session label by default. A session label is one series per session
and histogram (a 30-session LiteLLM scrape is 1.86 MB; after ~260 sessions LiteLLM's /metrics took
over 30 s); sessions come from the application's `agent_sessions_active` gauge instead. When one is
configured anyway, lines of families headroom does not read are dropped before parsing, sessions
beyond `max_sessions` per task type are not tracked (counted in `GatewayReading.dropped_sessions`),
and calls per task come from the application's task counters whenever they are present.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable, Optional, Union

from monitor.model import Histogram
from monitor.model.readings import GatewayScrape
from monitor.sources.aux_samples import AUX_MAX_BODY_BYTES, BodySamples, iter_samples, read_samples, too_large  # noqa: F401  (re-exported)
from monitor.sources.gateway_schema import (  # noqa: F401  (re-exported: the names every reader uses)
    APP_CALLS_ABANDONED,
    APP_MODEL_CALLS,
    APP_SESSIONS_ACTIVE,
    APP_TASK_DURATION,
    APP_TASK_LABEL,
    APP_TASKS_STARTED,
    DEFAULT_LABELS,
    ENVOY_TOKENS,
    GATEWAY_FAMILIES,
    KINDS,
    UNATTRIBUTED,
    UNSET_VALUES,
    Families,
    GatewayConfig,
    GatewayReading,
    TaskCumulative,
    shed_reason,
)

# ---------------------------------------------------------------- parsing helpers

def _wanted_bases(config: GatewayConfig) -> set[str]:
    fam = GATEWAY_FAMILIES[config.kind]
    names: set[str] = set()
    for group in (fam.calls, fam.failures, fam.input_tokens, fam.output_tokens, fam.in_flight):
        names.update(group)
    for group in (fam.call_latency, fam.upstream_latency, fam.ttft, fam.tpot):
        for base in group:
            names.update({base + "_bucket", base + "_sum", base + "_count"})
    if config.kind == "envoy":
        names.update(ENVOY_TOKENS)
    names.update({APP_TASK_DURATION + s for s in ("_bucket", "_sum", "_count")})
    names.update({APP_TASKS_STARTED, APP_MODEL_CALLS, APP_SESSIONS_ACTIVE, APP_CALLS_ABANDONED})
    return names


class _HistAcc:
    """Sums histogram series (bucket by bucket) that share a key."""

    def __init__(self) -> None:
        self.buckets: dict[float, float] = {}
        self.sum = 0.0
        self.count = 0.0

    def add(self, suffix: str, labels: dict, value: float) -> None:
        if suffix == "_bucket":
            le = labels.get("le")
            if le is None:
                raise ValueError("histogram bucket sample without an le label")
            bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
            self.buckets[bound] = self.buckets.get(bound, 0.0) + value
        elif suffix == "_sum":
            self.sum += value
        elif suffix == "_count":
            self.count += value

    def histogram(self) -> Optional[Histogram]:
        if not self.buckets:
            return None
        bounds = tuple(sorted(self.buckets))
        return Histogram(bounds, tuple(self.buckets[b] for b in bounds), self.sum, self.count)


def _split_hist(name: str, bases: Iterable[str]) -> Optional[tuple[str, str]]:
    for base in bases:
        if name.startswith(base):
            suffix = name[len(base):]
            if suffix in ("_bucket", "_sum", "_count"):
                return base, suffix
    return None


def read_gateway(text: str, config: GatewayConfig, timestamp: float) -> GatewayReading:
    """One scrape of a gateway (or an application) -> cumulative values per task type."""
    if not isinstance(text, str):
        raise TypeError("read_gateway needs the exposition text as str")
    return reading_from_samples(iter_samples(text, _wanted_bases(config)), config, timestamp)


def reading_from_samples(samples: Iterable[tuple[str, dict, float]], config: GatewayConfig,
                         timestamp: float) -> GatewayReading:
    """`read_gateway` on samples parsed already: with `config.models`, only the application's
    series and the series of those models are read."""
    acc = _Accumulator(config, timestamp)
    for name, labels, value in samples:
        acc.add(name, labels, value)
    return acc.finish()


def gateway_samples(text: str, config: GatewayConfig) -> BodySamples:
    """The samples of a gateway body its reading needs (at most AUX_MAX_ROWS: `cut` past them).
    Raises ValueError for a body over the byte cap (`too_large: ...`) or one that does not parse."""
    problem = too_large(text, "gateway")
    if problem:
        raise ValueError(problem)
    return read_samples(text, _wanted_bases(config))


def read_gateway_scrape(text: Optional[str], config: GatewayConfig, timestamp: float, index: int = 0,
                        url: str = "", pool: Optional[str] = None, models: Iterable[str] = ()) -> GatewayScrape:
    """Parse one gateway body of the cycle (None: no body) into a `GatewayScrape`: its reading of
    every series and, for each of `models`, the reading of that model's series (`by_model`). A body
    that does not parse gives a scrape without a reading, its error kept (the cycle logs it; the
    gateway stays up)."""
    if text is None:
        return GatewayScrape(index, url, pool, config, timestamp)
    try:
        samples: Union[BodySamples, str] = gateway_samples(text, config)
    except ValueError as exc:
        samples = str(exc)
    return scrape_from_samples(samples, config, timestamp, index, url, pool, models)


def scrape_from_samples(samples: Union[BodySamples, str, None], config: GatewayConfig, timestamp: float,
                        index: int = 0, url: str = "", pool: Optional[str] = None,
                        models: Iterable[str] = ()) -> GatewayScrape:
    """`read_gateway_scrape` of samples parsed already (`gateway_samples`); a str is the parse's error,
    None no body."""
    scrape = GatewayScrape(index, url, pool, config, timestamp)
    if samples is None:
        return scrape
    if isinstance(samples, str):
        return replace(scrape, error=samples)
    by_model = {m: reading_from_samples(samples, scrape.model_config(m), timestamp) for m in models}
    return replace(scrape, reading=reading_from_samples(samples, config, timestamp), by_model=by_model)


class _Accumulator:
    """Cumulative values per task type, one sample at a time (the body of `read_gateway`)."""

    def __init__(self, config: GatewayConfig, timestamp: float) -> None:
        self.config = config
        self.fam = GATEWAY_FAMILIES[config.kind]
        self.task_label, self.session_label, self.model_label = config.task, config.session, config.model
        self.models = set(config.models)
        self.reading = GatewayReading(kind=config.kind, timestamp=timestamp)
        self.hists: dict[tuple[str, str, str], _HistAcc] = {}  # (role, task type, class) -> acc
        self.hist_roles = {
            "call_latency": self.fam.call_latency, "upstream_latency": self.fam.upstream_latency,
            "ttft": self.fam.ttft, "tpot": self.fam.tpot, "task_duration": (APP_TASK_DURATION,),
        }
        self.in_flight: Optional[float] = None

    def task_of(self, labels: dict, label: Optional[str]) -> TaskCumulative:
        tt = attributed(labels.get(label) if label else None) or UNATTRIBUTED
        tasks = self.reading.tasks
        if tt not in tasks:
            tasks[tt] = TaskCumulative(task_type=tt)
        return tasks[tt]

    def add(self, name: str, labels: dict, value: float) -> None:
        self.reading.samples_read += 1
        if math.isnan(value):
            return
        is_app = name.startswith("agent_")
        if not is_app and self.models and self.model_label and labels.get(self.model_label) not in self.models:
            return
        if name in self.fam.in_flight:
            self.in_flight = _add_opt(self.in_flight, value)
            return
        label = APP_TASK_LABEL if is_app else self.task_label
        if not (self._app(name, labels, label, value) or self._counter(name, labels, label, value)):
            self._histogram(name, labels, label, value)

    def _app(self, name: str, labels: dict, label: Optional[str], value: float) -> bool:
        if name == APP_CALLS_ABANDONED:  # given up by the application: a shed reason, not a gateway failure
            t = self.task_of(labels, label)
            t.failed_by_reason["abandoned"] = t.failed_by_reason.get("abandoned", 0.0) + value
            return True
        field_name = _APP_FIELDS.get(name)
        if field_name is None:
            return False
        t = self.task_of(labels, label)
        setattr(t, field_name, _add_opt(getattr(t, field_name), value))
        return True

    def _counter(self, name: str, labels: dict, label: Optional[str], value: float) -> bool:
        fam = self.fam
        envoy_tokens = self.config.kind == "envoy" and name in ENVOY_TOKENS
        if not (envoy_tokens or name in fam.calls or name in fam.failures or name in fam.input_tokens
                or name in fam.output_tokens):
            return False
        t = self.task_of(labels, label)
        if name in fam.calls:
            t.calls += value
            t.calls_seen = True
            _track_ids(t, labels, value, self.session_label, self.config, self.reading)
        elif name in fam.failures:
            t.failed_calls += value
            _shed(t, labels, value)
        elif name in fam.input_tokens:
            t.input_tokens = _add_opt(t.input_tokens, value)
        elif name in fam.output_tokens:
            t.output_tokens = _add_opt(t.output_tokens, value)
        elif labels.get("gen_ai_token_type") == "input":
            t.input_tokens = _add_opt(t.input_tokens, value)
        elif labels.get("gen_ai_token_type") == "output":
            t.output_tokens = _add_opt(t.output_tokens, value)
        return True

    def _histogram(self, name: str, labels: dict, label: Optional[str], value: float) -> None:
        for role, bases in self.hist_roles.items():
            hit = _split_hist(name, bases)
            if hit is None:
                continue
            t = self.task_of(labels, label)
            cls = self.config.class_of(t.task_type, labels) if role == "call_latency" else ""
            self.hists.setdefault((role, t.task_type, cls), _HistAcc()).add(hit[1], labels, value)
            if role == "call_latency" and hit[1] == "_count" and self.fam.calls_from_latency_count:
                t.calls += value
                t.calls_seen = True
                _track_ids(t, labels, value, self.session_label, self.config, self.reading)
                if labels.get("error_type"):
                    t.failed_calls += value
                    _shed(t, labels, value)
            return

    def finish(self) -> GatewayReading:
        for (role, tt, cls), acc in self.hists.items():
            h = acc.histogram()
            if h is None:
                continue
            t = self.reading.tasks[tt]
            if role == "call_latency":
                t.call_latency_by_class[cls] = h
                t.call_latency = h if t.call_latency is None else (t.call_latency.plus(h) or t.call_latency)
            else:
                setattr(t, role, h)
        self.reading.in_flight = self.in_flight
        return self.reading


_APP_FIELDS = {APP_TASKS_STARTED: "tasks_started", APP_MODEL_CALLS: "app_model_calls",
               APP_SESSIONS_ACTIVE: "sessions_active"}


def _shed(t: TaskCumulative, labels: dict, value: float) -> None:
    reason = shed_reason(labels)
    if reason is not None:
        t.failed_by_reason[reason] = t.failed_by_reason.get(reason, 0.0) + value


def _add_opt(old: Optional[float], value: float) -> float:
    return value if old is None else old + value


def attributed(value: Optional[str]) -> Optional[str]:
    """A label value that names something (a task type, a task, a session), else None: missing,
    blank, or a gateway's spelling of "no value" (UNSET_VALUES)."""
    if value is None:
        return None
    value = value.strip()
    return None if value in UNSET_VALUES else value


def _track_ids(t: TaskCumulative, labels: dict, value: float, session_label: Optional[str],
               config: GatewayConfig, reading: GatewayReading) -> None:
    tid = attributed(labels.get(config.task_id_label)) if config.task_id_label else None
    if tid and value > 0:
        t.task_ids.add(tid)
    if session_label:
        sid = attributed(labels.get(session_label))
        if sid:
            if sid in t.session_calls or len(t.session_calls) < config.max_sessions:
                t.session_calls[sid] = t.session_calls.get(sid, 0.0) + value
            else:
                reading.dropped_sessions += 1
