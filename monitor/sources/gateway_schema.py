"""What headroom reads from a gateway: per gateway kind its metric families and the
application-side task convention (docs/capacity.md).

Plain data only; monitor/sources/gateway.py parses a scrape with these. The kinds' default labels,
the reader's settings (`GatewayConfig`) and what one reading holds (`TaskCumulative` per task type,
`GatewayReading`) are the pure core's input types, in monitor/model/readings.py (re-exported here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from monitor.model.readings import (  # noqa: F401  (re-exported: the names every gateway reader uses)
    DEFAULT_LABELS,
    UNATTRIBUTED,
    UNSET_VALUES,
    GatewayConfig,
    GatewayReading,
    TaskCumulative,
)
from monitor.model.readings import GATEWAY_KINDS as KINDS  # noqa: F401  (the gateway kinds, re-exported)


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
# model calls the application gave up on before their answer (its own timeout, a user's cancel):
# demand turned away that no gateway may see (LiteLLM records a call abandoned mid-stream as a 200)
APP_CALLS_ABANDONED = "agent_calls_abandoned_total"
APP_TASK_LABEL = "task_type"


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
