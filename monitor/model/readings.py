"""What the cycle reads from gateways, routers and DCGM exporters, typed: the pure core's input.

monitor/sources/ parses the bodies into these (monitor/sources/gateway.py, gateway_queue.py,
dcgm.py); monitor/pipeline/cycle.py `collect` hands them to the pure step in `CycleInputs` (monitor/step/cycle_state.py);
monitor/derive/ and monitor/capacity/ read them and import nothing from monitor/sources/.

    GatewayConfig      how one gateway body is read (labels, classes, the models kept)
    GatewayReading     one gateway scrape: cumulative values per task type (`TaskCumulative`)
    GatewayQueues      what waits in front of the engines, one `GatewayQueue` row per pool label and model
    GatewayScrape      one configured gateway in one cycle: its reading, its per-model readings, its queues
    DcgmReading        one DCGM exporter's GPU power series

Plain data, no I/O, no clock (the model floor, whose other modules it uses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from monitor.model import Histogram

# ---------------------------------------------------------------- gateways: tasks

UNATTRIBUTED = "unattributed"
# label values that name no task type: missing, empty, or what a gateway writes for an absent
# value (LiteLLM puts str(None) = "None" in a metadata label the request did not carry)
UNSET_VALUES = frozenset({"", "None", "none", "null", "NULL"})
GATEWAY_KINDS = ("litellm", "envoy", "llm-d", "dynamo", "app")

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
class GatewayConfig:
    kind: str = "litellm"
    task_label: Optional[str] = None  # None: the kind's default
    session_label: Optional[str] = None  # None: the kind's default (none); "" for none; opt-in, unbounded
    task_id_label: Optional[str] = None  # a label naming one task (counts tasks by distinct values)
    class_label: Optional[str] = None  # a label naming the call class (interactive / batch)
    task_classes: dict[str, str] = field(default_factory=dict)  # task type -> class, when no class label
    default_class: str = "interactive"
    models: tuple[str, ...] = ()  # only series of these models (empty: all)
    model_label: Optional[str] = None
    max_sessions: int = 10000  # per task type

    def __post_init__(self) -> None:
        if self.kind not in GATEWAY_KINDS:
            raise ValueError(f"gateway kind {self.kind!r} is not one of {', '.join(GATEWAY_KINDS)}")
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

    def class_of(self, task_type: str, labels: Mapping[str, str]) -> str:
        if self.class_label and labels.get(self.class_label):
            return str(labels[self.class_label])
        return str(self.task_classes.get(task_type, self.default_class))


@dataclass
class TaskCumulative:
    """Cumulative values of one task type at one scrape (counters as exposed, never rates)."""

    task_type: str
    calls: float = 0.0  # model calls seen by the gateway
    calls_seen: bool = False  # a gateway call series of this task type was read (calls may still be 0)
    failed_calls: float = 0.0
    # failed calls that were demand turned away, by shed reason (sources/gateway_schema.py shed_reason): cumulative
    failed_by_reason: dict[str, float] = field(default_factory=dict)
    input_tokens: Optional[float] = None
    output_tokens: Optional[float] = None
    call_latency: Optional[Histogram] = None
    call_latency_by_class: dict[str, Histogram] = field(default_factory=dict)
    upstream_latency: Optional[Histogram] = None
    ttft: Optional[Histogram] = None
    tpot: Optional[Histogram] = None
    session_calls: dict[str, float] = field(default_factory=dict)  # session id -> calls
    task_ids: set[str] = field(default_factory=set)
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


# ---------------------------------------------------------------- gateways: queues


@dataclass(frozen=True)
class GatewayQueue:
    """One gateway pool label and model: requests held in front of the engines, and around them."""

    kind: str
    pool_label: Optional[str]  # llm-d: inference_pool; Dynamo: None (the frontend has no pool label)
    model: Optional[str]
    queued: Optional[float] = None  # waiting at the gateway, not yet sent to an engine
    queued_bytes: Optional[float] = None  # llm-d: request bytes held in the flow-control queue
    active: Optional[float] = None  # Dynamo: every request the frontend holds (queued included)
    saturation: Optional[float] = None  # llm-d: the pool's gating saturation (1.0 = set point)
    awaiting_first_token: Optional[float] = None  # Dynamo: queued_requests (overlaps the engine)
    queued_source: Optional[str] = None  # the family `queued` was read from


@dataclass(frozen=True)
class GatewayQueues:
    kind: str
    queues: tuple[GatewayQueue, ...] = ()
    anomalies: dict[str, int] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)  # Dynamo: requests per frontend stage
    families: frozenset[str] = frozenset()  # queue sample names the body had

    def __iter__(self) -> Iterator[GatewayQueue]:
        return iter(self.queues)

    def __len__(self) -> int:
        return len(self.queues)

    def queued_by_pool_label(self) -> dict[Optional[str], float]:
        return _sum_queued(self.queues, lambda q: q.pool_label)

    def queued_by_model(self) -> dict[Optional[str], float]:
        return _sum_queued(self.queues, lambda q: q.model)


def _sum_queued(queues: Iterable[GatewayQueue], key: Callable[[GatewayQueue], Optional[str]]
                ) -> dict[Optional[str], float]:
    out: dict[Optional[str], float] = {}
    for q in queues:
        if q.queued is not None:
            out[key(q)] = out.get(key(q), 0.0) + q.queued
    return finite_only(out, None)


def finite_only(sums: dict[Any, float], anomalies: Optional[dict[str, float]]) -> dict[Any, float]:
    """`sums` without the ones that overflowed to +Inf (their inputs were finite: unknown, not +Inf);
    how many were left out is counted into `anomalies` as `overflow:queued`."""
    over = [k for k, v in sums.items() if not math.isfinite(v)]
    for k in over:
        del sums[k]
    if over and anomalies is not None:
        anomalies["overflow:queued"] = anomalies.get("overflow:queued", 0) + len(over)
    return sums


# ---------------------------------------------------------------- one gateway in one cycle


@dataclass(frozen=True)
class GatewayScrape:
    """One configured gateway in one cycle, read (monitor/sources/gateway.py `read_gateway_scrape`).

    `reading` covers every series of the body. `by_model[m]` reads only the series of model `m` (and
    the application's, which carry no model): for a gateway in front of several pools, `collect`
    reads one per model the cycle's replicas serve (monitor/pipeline/cycle.py). Without a body this cycle
    (down, late) or when it did not parse, `reading` is None and `error` says why."""

    index: int  # position in sources.gateways: the key of its previous reading
    url: str
    pool: Optional[str]  # sources.gateways[i].pool: every task of it belongs to that pool
    config: GatewayConfig
    timestamp: float
    reading: Optional[GatewayReading] = None
    error: Optional[str] = None
    queues: Optional[GatewayQueues] = None  # llm-d / Dynamo: what waits in front of the engines
    by_model: Mapping[str, GatewayReading] = field(default_factory=dict)
    # sources.gateways[i].labels: the extra pool_by labels of the pools it serves ({}: every pool)
    labels: Mapping[str, str] = field(default_factory=dict)
    # a slow gateway's earlier reading kept through a missed cycle (monitor/sources/gateway_pace.py):
    # its task counters carry the task windows on; its gauges (in flight, queues) are not this cycle's
    kept: bool = False

    def for_model(self, model: str) -> Optional[GatewayReading]:
        """The reading of model `model`'s series; None when the cycle did not read that model."""
        return self.by_model.get(model)

    def model_config(self, model: str) -> GatewayConfig:
        """How the series of one model are read (`config` keeping that model only)."""
        return replace(self.config, models=(model,))


# ---------------------------------------------------------------- DCGM

# DCGM_FI_DEV_POWER_USAGE (watts, gauge); dcgm_power_usage in 1.x-compatible exporters
POWER_NAMES = ("DCGM_FI_DEV_POWER_USAGE", "dcgm_power_usage")


@dataclass(frozen=True)
class DcgmReading:
    target: str
    samples: tuple[tuple[str, dict[str, str], float], ...]  # (sample name, labels, watts) of each GPU series
