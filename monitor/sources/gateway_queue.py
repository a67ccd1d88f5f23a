"""Requests waiting in front of the engines, read from one router / gateway body.

Pure given the text: `read_gateway_queues(text, kind)` turns one scrape of an llm-d router (EPP) /
Gateway API Inference Extension EPP (kind "llm-d") or of an NVIDIA Dynamo frontend (kind "dynamo")
into `GatewayQueues` (monitor/model/readings.py): one `GatewayQueue` per (gateway pool label, model), plus
what was dropped. A value the body did not carry is None (unknown), never 0. Which headroom pool a
row waits for is the pure core's (monitor/derive/gateway_queues.py).

llm-d (llm-d/llm-d-router pkg/epp/metrics; GIE <= v1.5.0 pkg/epp/metrics/metrics.go): the flow-control
gauges `*_flow_control_queue_size` / `_queue_bytes` {fairness_id, priority, inference_pool,
model_name, target_model_name}, summed over fairness_id and priority, and `*_flow_control_pool_saturation`
{inference_pool[, stage]} (stage "effective" = max(prefill, decode) is the gating value; GIE has no
stage). llm-d-router emits every one of them twice, `llm_d_epp_*` and the deprecated
`inference_extension_*`: the new spelling is read and the old one only when the new is absent. A
request is counted from `EnqueueAndWait` until it is dispatched, rejected or evicted
(pkg/epp/flowcontrol/controller/controller.go), before scheduling picks an endpoint: not yet in any
engine's waiting gauge. The row's model is target_model_name, else model_name. Flow control is off by
default (feature gate `flowControl`); then these families are absent.

Dynamo (ai-dynamo/dynamo lib/llm/src/kv_router/metrics.rs, lib/runtime/src/metrics/frontend_perf.rs,
lib/llm/src/http/service/metrics.rs): queued = `dynamo_frontend_router_queue_pending_requests`
{model, worker_type, policy_class} summed (the KV router's scheduler queue); without it, on a
frontend serving one model, the `dynamo_frontend_stage_requests` {stage, phase} of the stages before
dispatch ("preprocess", "route"; "dispatch" is handed to a worker, awaiting its first response). The
stage gauge has no model label: `GatewayQueues.stages` keeps it frontend-wide. active =
`dynamo_frontend_active_requests` {model}, else the deprecated `dynamo_frontend_inflight_requests`
(same value). `dynamo_frontend_queued_requests` {model} counts requests until their first token,
prefill at the engine included, so it is `awaiting_first_token`, never `queued`.

Bad values (NaN, +-Inf, negative) are dropped and counted in `anomalies` ("<reason>:<sample name>").
A sum of finite values that overflows (two rows of 1.7e308) is unknown (None), counted as
`overflow:<sample name>`, never +Inf.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Union

from monitor.model.readings import GatewayQueue, GatewayQueues
from monitor.sources.aux_samples import BodySamples, iter_samples, read_samples, too_large

KINDS = ("llm-d", "dynamo")

# (new name, legacy name): the first present one is read
EPP_QUEUE_SIZE = ("llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size")
EPP_QUEUE_BYTES = ("llm_d_epp_flow_control_queue_bytes", "inference_extension_flow_control_queue_bytes")
EPP_POOL_SATURATION = ("llm_d_epp_flow_control_pool_saturation",
                       "inference_extension_flow_control_pool_saturation")
EPP_OVERFLOW_LABEL = "other"  # llm-d-router pkg/epp/metrics/cardinality.go: capped label values

DYNAMO_ROUTER_QUEUE = "dynamo_frontend_router_queue_pending_requests"
DYNAMO_STAGE_REQUESTS = "dynamo_frontend_stage_requests"
DYNAMO_ACTIVE = ("dynamo_frontend_active_requests", "dynamo_frontend_inflight_requests")
DYNAMO_AWAITING_FIRST_TOKEN = "dynamo_frontend_queued_requests"
DYNAMO_PRE_ENGINE_STAGES = ("preprocess", "route")

QUEUE_SAMPLE_NAMES: dict[str, frozenset] = {
    "llm-d": frozenset(EPP_QUEUE_SIZE + EPP_QUEUE_BYTES + EPP_POOL_SATURATION),
    "dynamo": frozenset((DYNAMO_ROUTER_QUEUE, DYNAMO_STAGE_REQUESTS, DYNAMO_AWAITING_FIRST_TOKEN)
                        + DYNAMO_ACTIVE),
}
_ALL_NAMES = frozenset().union(*QUEUE_SAMPLE_NAMES.values())

Sample = tuple[str, dict, float]


def read_gateway_queues(text: str, kind: str) -> GatewayQueues:
    """One router / gateway body -> its queues. Raises ValueError when the body does not parse."""
    if kind not in KINDS:
        raise ValueError(f"gateway queue kind {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(text, str):
        raise TypeError("read_gateway_queues needs the exposition text as str")
    if too_large(text, "router"):
        raise ValueError(too_large(text, "router"))
    return queues_from_samples(iter_samples(text, set(QUEUE_SAMPLE_NAMES[kind])), kind)


def queue_samples(text: str, kind: str) -> BodySamples:
    """The samples of a router body its queues need (at most AUX_MAX_ROWS: `cut` past them); raises
    ValueError for an unknown kind, a body over the byte cap or one that does not parse."""
    if kind not in KINDS:
        raise ValueError(f"gateway queue kind {kind!r} is not one of {', '.join(KINDS)}")
    if too_large(text, "router"):
        raise ValueError(too_large(text, "router"))
    return read_samples(text, set(QUEUE_SAMPLE_NAMES[kind]))


def queues_from_samples(samples: Iterable[Sample], kind: str) -> GatewayQueues:
    """`read_gateway_queues` on samples parsed already (their wanted set must hold QUEUE_SAMPLE_NAMES)."""
    if kind not in KINDS:
        raise ValueError(f"gateway queue kind {kind!r} is not one of {', '.join(KINDS)}")
    wanted = QUEUE_SAMPLE_NAMES[kind]
    good: dict[str, list[tuple[dict, float]]] = {}
    seen: set[str] = set()
    anomalies: dict[str, int] = {}
    for name, labels, value in samples:
        if name not in wanted:
            continue
        seen.add(name)
        reason = _bad(value)
        if reason:
            anomalies[f"{reason}:{name}"] = anomalies.get(f"{reason}:{name}", 0) + 1
            continue
        good.setdefault(name, []).append((labels, float(value)))
    reader = _read_llmd if kind == "llm-d" else _read_dynamo
    rows, stages = reader(good, seen, anomalies)
    _unknown_if_overflowed(rows, stages, anomalies)
    order = sorted(rows, key=lambda k: tuple((v is None, v or "") for v in k))
    queues = tuple(GatewayQueue(kind, pool, model, **rows[pool, model]) for pool, model in order)
    return GatewayQueues(kind, queues, anomalies, stages, frozenset(seen))


def queue_families_present(body: Union[str, Iterable[Sample]]) -> frozenset:
    """The kinds ("llm-d", "dynamo") whose queue families the body (text or samples) carries."""
    samples = iter_samples(body, set(_ALL_NAMES)) if isinstance(body, str) else body
    names = {name for name, _labels, _value in samples if name in _ALL_NAMES}
    return frozenset(k for k in KINDS if names & QUEUE_SAMPLE_NAMES[k])


# ---------------------------------------------------------------- per kind

Rows = dict[tuple[Optional[str], Optional[str]], dict]


def _read_llmd(good, seen, anomalies) -> tuple[Rows, dict[str, float]]:
    rows: Rows = {}
    for names, field_name in ((EPP_QUEUE_SIZE, "queued"), (EPP_QUEUE_BYTES, "queued_bytes")):
        name = _first(names, seen)
        for labels, value in good.get(name, ()) if name else ():
            model = labels.get("target_model_name") or labels.get("model_name") or None
            if model == EPP_OVERFLOW_LABEL:
                anomalies[f"label_overflow:{name}"] = anomalies.get(f"label_overflow:{name}", 0) + 1
            row = rows.setdefault((labels.get("inference_pool") or None, model), {})
            row[field_name] = row.get(field_name, 0.0) + value
            if field_name == "queued":
                row["queued_source"] = name
    saturation: dict[Optional[str], dict[str, float]] = {}
    name = _first(EPP_POOL_SATURATION, seen)
    for labels, value in good.get(name, ()) if name else ():
        stages = saturation.setdefault(labels.get("inference_pool") or None, {})
        stage = labels.get("stage", "")
        stages[stage] = max(stages.get(stage, value), value)
    for pool, stages in saturation.items():
        value = stages["effective"] if "effective" in stages else max(stages.values())
        keys = [k for k in rows if k[0] == pool] or [(pool, None)]
        for key in keys:
            rows.setdefault(key, {})["saturation"] = value
    return rows, {}


def _read_dynamo(good, seen, anomalies) -> tuple[Rows, dict[str, float]]:
    rows: Rows = {}

    def add(name: Optional[str], field_name: str) -> None:
        for labels, value in good.get(name, ()) if name else ():
            row = rows.setdefault((None, labels.get("model") or None), {})
            row[field_name] = row.get(field_name, 0.0) + value

    add(_first(DYNAMO_ACTIVE, seen), "active")
    add(DYNAMO_AWAITING_FIRST_TOKEN, "awaiting_first_token")
    add(DYNAMO_ROUTER_QUEUE, "queued")
    stages: dict[str, float] = {}
    for labels, value in good.get(DYNAMO_STAGE_REQUESTS, ()):
        stage = labels.get("stage", "")
        stages[stage] = stages.get(stage, 0.0) + value
    if DYNAMO_ROUTER_QUEUE in seen:
        for row in rows.values():
            if "queued" in row:
                row["queued_source"] = DYNAMO_ROUTER_QUEUE
    elif DYNAMO_STAGE_REQUESTS in good and len(rows) <= 1:
        # one model (or none named): the frontend-wide stage counts are that model's
        key = next(iter(rows), (None, None))
        rows.setdefault(key, {}).update(
            queued=sum(stages.get(s, 0.0) for s in DYNAMO_PRE_ENGINE_STAGES),
            queued_source=DYNAMO_STAGE_REQUESTS)
    return rows, stages


# ---------------------------------------------------------------- helpers

def _bad(value: float) -> Optional[str]:
    return "nan" if math.isnan(value) else "infinite" if math.isinf(value) else "negative" if value < 0 else None


def _first(names: tuple[str, ...], seen: set[str]) -> Optional[str]:
    return next((n for n in names if n in seen), None)


def _unknown_if_overflowed(rows: Rows, stages: dict[str, float], anomalies: dict) -> None:
    """A row's or stage's sum of finite values that overflowed is unknown (None / left out), counted."""
    for row in rows.values():
        for field_name, value in list(row.items()):
            if isinstance(value, float) and not math.isfinite(value):
                row[field_name] = None
                source = row.get("queued_source") if field_name == "queued" else field_name
                anomalies[f"overflow:{source}"] = anomalies.get(f"overflow:{source}", 0) + 1
    for stage in [k for k, v in stages.items() if not math.isfinite(v)]:
        del stages[stage]
        anomalies[f"overflow:{DYNAMO_STAGE_REQUESTS}"] = anomalies.get(f"overflow:{DYNAMO_STAGE_REQUESTS}", 0) + 1
