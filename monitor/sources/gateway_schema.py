"""What headroom reads from a gateway: per gateway kind its task / session / model labels and metric
families, the application-side task convention (docs/capacity.md), the reader's settings
(`GatewayConfig`) and what one reading holds (`TaskCumulative` per task type, `GatewayReading`).

Plain data only; monitor/sources/gateway.py parses a scrape into these (and re-exports them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from monitor.model import Histogram

UNATTRIBUTED = "unattributed"
# label values that name no task type: missing, empty, or what a gateway writes for an absent
# value (LiteLLM puts str(None) = "None" in a metadata label the request did not carry)
UNSET_VALUES = frozenset({"", "None", "none", "null", "NULL"})
KINDS = ("litellm", "envoy", "llm-d", "dynamo", "app")

# kind -> (task label, session label, model label). No kind has a default session label: a session
# id as a label is one series per session and histogram (unbounded; LiteLLM's /metrics took over
# 30 s after ~260 sessions). Sessions come from the application's agent_sessions_active gauge.
DEFAULT_LABELS: dict[str, tuple[Optional[str], Optional[str], Optional[str]]] = {
    # custom_prometheus_metadata_labels: ["metadata.task_type"]
    "litellm": ("metadata_task_type", None, "requested_model"),
    # metricsRequestHeaderAttributes: "x-task-type:task_type"
    "envoy": ("task_type", None, "gen_ai_request_model"),
    # header x-llm-d-inference-fairness-id carries the task type; there is no session label
    "llm-d": ("fairness_id", None, "model_name"),
    # NVIDIA Dynamo's frontend: read for its queue only (monitor/sources/gateway_queue.py)
    "dynamo": (None, None, "model"),
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
    "dynamo": Families(),
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
    session_label: Optional[str] = None  # None: the kind's default (none); "" for none; opt-in, unbounded
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


@dataclass
class TaskCumulative:
    """Cumulative values of one task type at one scrape (counters as exposed, never rates)."""

    task_type: str
    calls: float = 0.0  # model calls seen by the gateway
    calls_seen: bool = False  # a gateway call series of this task type was read (calls may still be 0)
    failed_calls: float = 0.0
    # failed calls that were demand turned away, by shed reason (shed_reason): cumulative
    failed_by_reason: dict[str, float] = field(default_factory=dict)
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
    def model_calls(self) -> Optional[float]:
        """Model calls: the app counter when present, else the gateway's; None when the body has
        neither (an application exposing only its task counter)."""
        if self.app_model_calls is not None:
            return self.app_model_calls
        return self.calls if self.calls_seen else None


@dataclass
class GatewayReading:
    kind: str
    timestamp: float
    tasks: dict[str, TaskCumulative] = field(default_factory=dict)
    in_flight: Optional[float] = None
    samples_read: int = 0
    dropped_sessions: int = 0


# labels a gateway's failure series carries its HTTP status or error class in (LiteLLM:
# exception_status / exception_class; Envoy AI Gateway: error_type; others: status_code, code)
_STATUS_LABELS = ("exception_status", "status_code", "code", "response_code")
_CLASS_LABELS = ("exception_class", "error_type")


def shed_reason(labels: dict) -> Optional[str]:
    """The headroom_shed_requests_rate reason of one failed call: 429 is `gateway_rate_limited`;
    408, 504 or an error class naming a timeout `gateway_timeout`; a 5xx or an unknown status
    `gateway_error`. A client error (another 4xx: a bad request, a bad key) is not demand turned
    away: None."""
    status = next((str(labels[k]).strip() for k in _STATUS_LABELS if labels.get(k)), "")
    cls = next((str(labels[k]) for k in _CLASS_LABELS if labels.get(k)), "").lower()
    if status == "429" or "ratelimit" in cls.replace("_", ""):
        return "gateway_rate_limited"
    if status in ("408", "504") or "timeout" in cls:
        return "gateway_timeout"
    if status.startswith("4") and len(status) == 3:
        return None
    return "gateway_error"
