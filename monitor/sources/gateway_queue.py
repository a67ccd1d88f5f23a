"""Requests waiting in front of the engines, read from one router / gateway body.

Pure given the text: `read_gateway_queues(text, kind)` turns one scrape of an llm-d router (EPP) /
Gateway API Inference Extension EPP (kind "llm-d") or of an NVIDIA Dynamo frontend (kind "dynamo")
into `GatewayQueues`: one `GatewayQueue` per (gateway pool label, model), plus what was dropped.
A value the body did not carry is None (unknown), never 0.

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
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Optional, Union

from monitor.sources.gateway import iter_samples, too_large

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
    families: frozenset = frozenset()  # queue sample names the body had

    def __iter__(self) -> Iterator[GatewayQueue]:
        return iter(self.queues)

    def __len__(self) -> int:
        return len(self.queues)

    def queued_by_pool_label(self) -> dict[Optional[str], float]:
        return _sum_queued(self.queues, lambda q: q.pool_label)

    def queued_by_model(self) -> dict[Optional[str], float]:
        return _sum_queued(self.queues, lambda q: q.model)


def read_gateway_queues(text: str, kind: str) -> GatewayQueues:
    """One router / gateway body -> its queues. Raises ValueError when the body does not parse."""
    if kind not in KINDS:
        raise ValueError(f"gateway queue kind {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(text, str):
        raise TypeError("read_gateway_queues needs the exposition text as str")
    if too_large(text, "router"):
        raise ValueError(too_large(text, "router"))
    return queues_from_samples(iter_samples(text, set(QUEUE_SAMPLE_NAMES[kind])), kind)


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


def queued_by_pool(queues: Iterable[GatewayQueue],
                   pool_of: Callable[[Optional[str], Optional[str]], Optional[str]],
                   anomalies: Optional[dict] = None) -> dict[str, float]:
    """Queued requests per headroom pool. `pool_of(gateway pool label, model)` names the pool, or None
    (not counted). A pool none of whose rows has a known `queued` is absent, not 0; so is one whose
    sum overflows (counted into `anomalies` as `overflow:queued`)."""
    out: dict[str, float] = {}
    for q in queues:
        if q.queued is None:
            continue
        pool = pool_of(q.pool_label, q.model)
        if pool is not None:
            out[pool] = out.get(pool, 0.0) + q.queued
    return _finite_only(out, anomalies)


def pool_of_served_models(served: Mapping[str, str], gateway_pools: Optional[Mapping[str, str]] = None
                          ) -> Callable[[Optional[str], Optional[str]], Optional[str]]:
    """The default `pool_of`: `served` maps headroom pool -> its served model name, `gateway_pools`
    maps gateway pool label -> headroom pool (checked first). A model served by two pools maps to
    neither (the gateway's count cannot be split)."""
    by_model: dict[str, Optional[str]] = {}
    for pool, model in served.items():
        by_model[model] = None if model in by_model else pool
    labels = dict(gateway_pools or {})

    def pool_of(pool_label: Optional[str], model: Optional[str]) -> Optional[str]:
        if pool_label is not None and pool_label in labels:
            return labels[pool_label]
        return by_model.get(model) if model is not None else None

    return pool_of


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


def _sum_queued(queues: Iterable[GatewayQueue], key: Callable[[GatewayQueue], Optional[str]]
                ) -> dict[Optional[str], float]:
    out: dict[Optional[str], float] = {}
    for q in queues:
        if q.queued is not None:
            out[key(q)] = out.get(key(q), 0.0) + q.queued
    return _finite_only(out, None)


def _finite_only(sums: dict, anomalies: Optional[dict]) -> dict:
    """`sums` without the ones that overflowed to +Inf (their inputs were finite: unknown, not +Inf)."""
    over = [k for k, v in sums.items() if not math.isfinite(v)]
    for k in over:
        del sums[k]
    if over and anomalies is not None:
        anomalies["overflow:queued"] = anomalies.get("overflow:queued", 0) + len(over)
    return sums


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
