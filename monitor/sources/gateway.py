"""Task and session attribution from gateway metrics and the application-side task convention.

Pure given the exposition text: `read_gateway(text, config, timestamp)` turns one scrape of a
LiteLLM proxy, an Envoy AI Gateway ext-proc, an llm-d router (EPP), or an application exposing
headroom's `agent_*` task metrics into one `GatewayReading` of cumulative values per task type.
Rates and windows are derived later (monitor.capacity.tasks) from two readings.

Which label names the task type and which the session is configuration; the defaults per gateway are
in DEFAULT_LABELS and docs/capacity.md. Series without the task label are counted under
UNATTRIBUTED.

Cardinality: a session label repeats every histogram per session (a 30-session LiteLLM scrape is
1.86 MB). Lines of families headroom does not read are dropped before parsing, sessions beyond
`max_sessions` per task type are not tracked (counted in `GatewayReading.dropped_sessions`), and
calls per task come from the application's task counters whenever they are present.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from prometheus_client.parser import text_string_to_metric_families

from monitor.model import Histogram

UNATTRIBUTED = "unattributed"
KINDS = ("litellm", "envoy", "llm-d", "app")

# kind -> (task label, session label, model label)
DEFAULT_LABELS: dict[str, tuple[Optional[str], Optional[str], Optional[str]]] = {
    # custom_prometheus_metadata_labels: ["metadata.task_type", "metadata.session_id"]
    "litellm": ("metadata_task_type", "metadata_session_id", "requested_model"),
    # metricsRequestHeaderAttributes: "x-task-type:task_type,agent-session-id:session.id"
    "envoy": ("task_type", "session_id", "gen_ai_request_model"),
    # header x-llm-d-inference-fairness-id carries the task type; there is no session label
    "llm-d": ("fairness_id", None, "model_name"),
    "app": ("task_type", None, None),
}


@dataclass(frozen=True)
class Families:
    calls: tuple[str, ...] = ()  # counters of calls (sample names, with _total)
    failures: tuple[str, ...] = ()  # counters of failed calls
    call_latency: tuple[str, ...] = ()  # histogram base names: end-to-end per call at the gateway
    upstream_latency: tuple[str, ...] = ()  # histogram: the model server's part
    ttft: tuple[str, ...] = ()
    tpot: tuple[str, ...] = ()
    input_tokens: tuple[str, ...] = ()  # counters or histogram _sum sample names
    output_tokens: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()  # gauges of requests in flight at the gateway
    calls_from_latency_count: bool = False  # Envoy has no request counter


GATEWAY_FAMILIES: dict[str, Families] = {
    "litellm": Families(
        calls=("litellm_proxy_total_requests_metric_total",),
        failures=("litellm_proxy_failed_requests_metric_total",),
        call_latency=("litellm_request_total_latency_metric",),
        upstream_latency=("litellm_llm_api_latency_metric",),
        ttft=("litellm_llm_api_time_to_first_token_metric",),
        input_tokens=("litellm_input_tokens_metric_total",),
        output_tokens=("litellm_output_tokens_metric_total",),
        in_flight=("litellm_in_flight_requests",),
    ),
    "envoy": Families(
        call_latency=("gen_ai_server_request_duration_seconds",),
        ttft=("gen_ai_server_time_to_first_token_seconds",),
        tpot=("gen_ai_server_time_per_output_token_seconds",),
        calls_from_latency_count=True,
    ),
    "llm-d": Families(
        calls=("llm_d_epp_request_total",),
        failures=("llm_d_epp_request_error_total",),
        call_latency=("llm_d_epp_request_duration_seconds",),
        ttft=("llm_d_epp_request_ttft_seconds",),
        tpot=("llm_d_epp_request_ntpot_seconds",),
        input_tokens=("llm_d_epp_request_input_tokens_sum",),
        output_tokens=("llm_d_epp_request_output_tokens_sum",),
        in_flight=("llm_d_epp_request_running",),
    ),
    "app": Families(),
}

# Envoy token usage is one histogram split by gen_ai_token_type (<=v0.4 had the unit in the name).
ENVOY_TOKENS = ("gen_ai_client_token_usage_sum", "gen_ai_client_token_usage_token_sum")

# The application-side convention (docs/capacity.md); label task_type.
APP_TASK_DURATION = "agent_task_duration_seconds"
APP_TASKS_STARTED = "agent_tasks_started_total"
APP_MODEL_CALLS = "agent_task_model_calls_total"
APP_SESSIONS_ACTIVE = "agent_sessions_active"
APP_TASK_LABEL = "task_type"


@dataclass(frozen=True)
class GatewayConfig:
    kind: str = "litellm"
    task_label: Optional[str] = None  # None: the kind's default
    session_label: Optional[str] = None  # None: the kind's default; "" for none
    task_id_label: Optional[str] = None  # a label naming one task (counts tasks by distinct values)
    class_label: Optional[str] = None  # a label naming the call class (interactive / batch)
    task_classes: dict = field(default_factory=dict)  # task type -> class, when no class label
    default_class: str = "interactive"
    models: tuple[str, ...] = ()  # only series of these models (empty: all)
    model_label: Optional[str] = None
    max_sessions: int = 10000  # per task type

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"gateway kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.max_sessions < 0:
            raise ValueError(f"gateway max_sessions must be >= 0, got {self.max_sessions}")

    @property
    def task(self) -> Optional[str]:
        return self.task_label if self.task_label is not None else DEFAULT_LABELS[self.kind][0]

    @property
    def session(self) -> Optional[str]:
        if self.session_label is not None:
            return self.session_label or None
        return DEFAULT_LABELS[self.kind][1]

    @property
    def model(self) -> Optional[str]:
        return self.model_label if self.model_label is not None else DEFAULT_LABELS[self.kind][2]

    def class_of(self, task_type: str, labels: dict) -> str:
        if self.class_label and labels.get(self.class_label):
            return labels[self.class_label]
        return self.task_classes.get(task_type, self.default_class)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "GatewayConfig":
        """From the `gateway:` section of the configuration (keys as the field names)."""
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown gateway setting(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "models" in d:
            d["models"] = tuple(d["models"] or ())
        return cls(**d)


@dataclass
class TaskCumulative:
    """Cumulative values of one task type at one scrape (counters as exposed, never rates)."""

    task_type: str
    calls: float = 0.0  # model calls seen by the gateway
    failed_calls: float = 0.0
    input_tokens: Optional[float] = None
    output_tokens: Optional[float] = None
    call_latency: Optional[Histogram] = None
    call_latency_by_class: dict[str, Histogram] = field(default_factory=dict)
    upstream_latency: Optional[Histogram] = None
    ttft: Optional[Histogram] = None
    tpot: Optional[Histogram] = None
    session_calls: dict[str, float] = field(default_factory=dict)  # session id -> calls
    task_ids: set = field(default_factory=set)
    # application-side convention
    tasks_started: Optional[float] = None
    app_model_calls: Optional[float] = None
    task_duration: Optional[Histogram] = None
    sessions_active: Optional[float] = None

    @property
    def sessions_seen(self) -> int:
        return len(self.session_calls)

    @property
    def tasks(self) -> Optional[float]:
        """Tasks so far: the app counter, else distinct task ids, else distinct sessions."""
        if self.tasks_started is not None:
            return self.tasks_started
        if self.task_ids:
            return float(len(self.task_ids))
        if self.session_calls:
            return float(len(self.session_calls))
        return None

    @property
    def tasks_source(self) -> Optional[str]:
        if self.tasks_started is not None:
            return "app"
        if self.task_ids:
            return "task_id_label"
        if self.session_calls:
            return "session_label"
        return None

    @property
    def model_calls(self) -> float:
        """Model calls: the app counter when present, else the gateway's."""
        return self.app_model_calls if self.app_model_calls is not None else self.calls


@dataclass
class GatewayReading:
    kind: str
    timestamp: float
    tasks: dict[str, TaskCumulative] = field(default_factory=dict)
    in_flight: Optional[float] = None
    samples_read: int = 0
    dropped_sessions: int = 0


# ---------------------------------------------------------------- parsing helpers

_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


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
    names.update({APP_TASKS_STARTED, APP_MODEL_CALLS, APP_SESSIONS_ACTIVE})
    return names


def prefilter(text: str, sample_names: set[str]) -> str:
    """Keep only sample lines (and their # lines) of the wanted sample names; saves most parse time."""
    bases = {re.sub(r"(_bucket|_sum|_count|_total)$", "", n) for n in sample_names}
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and (
                parts[2] in sample_names or parts[2] in bases
            ):
                keep.append(line)
            continue
        m = _NAME.match(line)
        if m and m.group(1) in sample_names:
            keep.append(line)
    return "\n".join(keep) + "\n"


def iter_samples(text: str, sample_names: Optional[set[str]] = None) -> Iterator[tuple[str, dict, float]]:
    """(sample name, labels, value) for every wanted sample of the text.

    A thin adapter: the project's fast parser (monitor.sources.exposition) when present, else
    prometheus_client's parser after a line pre-filter.
    """
    try:
        from monitor.sources import exposition
    except ImportError:  # pragma: no cover - the lead's parser is part of the tree
        exposition = None
    try:
        if exposition is not None:
            parsed = exposition.parse(text, wanted=sample_names)
            for name, items in parsed.samples.items():
                for labels, value in items:
                    yield name, labels, float(value)
            return
        if sample_names is not None:
            text = prefilter(text, sample_names)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                yield s.name, s.labels, float(s.value)
    except ValueError as exc:
        raise ValueError(f"gateway exposition does not parse: {exc}") from exc


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
    fam = GATEWAY_FAMILIES[config.kind]
    wanted = _wanted_bases(config)
    task_label, session_label, model_label = config.task, config.session, config.model
    reading = GatewayReading(kind=config.kind, timestamp=timestamp)
    hists: dict[tuple[str, str, str], _HistAcc] = {}  # (role, task type, class) -> acc
    hist_roles = {
        "call_latency": fam.call_latency, "upstream_latency": fam.upstream_latency,
        "ttft": fam.ttft, "tpot": fam.tpot, "task_duration": (APP_TASK_DURATION,),
    }
    models = set(config.models)
    in_flight: Optional[float] = None

    def task_of(labels: dict, label: Optional[str]) -> TaskCumulative:
        tt = (labels.get(label) if label else None) or UNATTRIBUTED
        if tt not in reading.tasks:
            reading.tasks[tt] = TaskCumulative(task_type=tt)
        return reading.tasks[tt]

    def add_opt(old: Optional[float], value: float) -> float:
        return value if old is None else old + value

    for name, labels, value in iter_samples(text, wanted):
        reading.samples_read += 1
        if math.isnan(value):
            continue
        is_app = name.startswith("agent_")
        if not is_app and models and model_label and labels.get(model_label) not in models:
            continue
        label = APP_TASK_LABEL if is_app else task_label
        if name in fam.in_flight:
            in_flight = add_opt(in_flight, value)
            continue
        if name == APP_TASKS_STARTED:
            t = task_of(labels, label)
            t.tasks_started = add_opt(t.tasks_started, value)
            continue
        if name == APP_MODEL_CALLS:
            t = task_of(labels, label)
            t.app_model_calls = add_opt(t.app_model_calls, value)
            continue
        if name == APP_SESSIONS_ACTIVE:
            t = task_of(labels, label)
            t.sessions_active = add_opt(t.sessions_active, value)
            continue
        if name in fam.calls:
            t = task_of(labels, label)
            t.calls += value
            _track_ids(t, labels, value, session_label, config, reading)
            continue
        if name in fam.failures:
            task_of(labels, label).failed_calls += value
            continue
        if name in fam.input_tokens:
            t = task_of(labels, label)
            t.input_tokens = add_opt(t.input_tokens, value)
            continue
        if name in fam.output_tokens:
            t = task_of(labels, label)
            t.output_tokens = add_opt(t.output_tokens, value)
            continue
        if config.kind == "envoy" and name in ENVOY_TOKENS:
            t = task_of(labels, label)
            kind = labels.get("gen_ai_token_type")
            if kind == "input":
                t.input_tokens = add_opt(t.input_tokens, value)
            elif kind == "output":
                t.output_tokens = add_opt(t.output_tokens, value)
            continue
        for role, bases in hist_roles.items():
            hit = _split_hist(name, bases)
            if hit is None:
                continue
            t = task_of(labels, label)
            cls = config.class_of(t.task_type, labels) if role == "call_latency" else ""
            hists.setdefault((role, t.task_type, cls), _HistAcc()).add(hit[1], labels, value)
            if role == "call_latency" and hit[1] == "_count":
                if fam.calls_from_latency_count:
                    t.calls += value
                    _track_ids(t, labels, value, session_label, config, reading)
                    if labels.get("error_type"):
                        t.failed_calls += value
            break

    for (role, tt, cls), acc in hists.items():
        h = acc.histogram()
        if h is None:
            continue
        t = reading.tasks[tt]
        if role == "call_latency":
            t.call_latency_by_class[cls] = h
            t.call_latency = h if t.call_latency is None else (t.call_latency.plus(h) or t.call_latency)
        else:
            setattr(t, role, h)
    reading.in_flight = in_flight
    return reading


def _track_ids(t: TaskCumulative, labels: dict, value: float, session_label: Optional[str],
               config: GatewayConfig, reading: GatewayReading) -> None:
    if config.task_id_label and labels.get(config.task_id_label) and value > 0:
        t.task_ids.add(labels[config.task_id_label])
    if session_label:
        sid = labels.get(session_label)
        if sid and sid != "None":
            if sid in t.session_calls or len(t.session_calls) < config.max_sessions:
                t.session_calls[sid] = t.session_calls.get(sid, 0.0) + value
            else:
                reading.dropped_sessions += 1
