"""Independent reading of a vLLM /metrics text with prometheus_client's own parser.

This is the yardstick the engine tests hold headroom's parser against: it shares no code with
monitor/sources/*, and it reads only what vLLM itself reports (gauges and counters, engines summed).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


def engine_gauges(text: str) -> dict[str, dict]:
    """Per model_name: running, waiting, kv_usage (capacity-weighted over engines), kv_capacity_tokens,
    kv_live_tokens (usage x capacity), num_gpu_blocks, block_size, engines, request_success (all
    finish reasons), e2e_sum, e2e_count, steps (engine steps taken: iteration_tokens_total count)."""
    out: dict[str, dict] = defaultdict(lambda: {
        "running": 0.0, "waiting": 0.0, "kv_live_tokens": 0.0, "kv_capacity_tokens": 0.0,
        "num_gpu_blocks": 0, "block_size": None, "engines": set(), "request_success": 0.0,
        "e2e_sum": 0.0, "e2e_count": 0.0, "steps": 0.0,
    })
    usage: dict[tuple[str, str], float] = {}
    # cache_config_info carries no model_name label (one model per server): keyed by engine
    capacity: dict[str, tuple[float, int, Optional[int]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            engine = s.labels.get("engine", "0")
            if s.name == "vllm:cache_config_info":
                tokens = s.labels.get("kv_cache_size_tokens")
                blocks = int(s.labels.get("num_gpu_blocks") or 0)
                block_size = int(s.labels.get("block_size") or 0) or None
                capacity[engine] = (float(tokens) if tokens else float(blocks * (block_size or 0)),
                                    blocks, block_size)
                continue
            model = s.labels.get("model_name")
            if model is None:
                continue
            row = out[model]
            if s.name in _GAUGES:
                row[_GAUGES[s.name]] += s.value
                row["engines"].add(engine)
            elif s.name == "vllm:kv_cache_usage_perc":
                usage[(model, engine)] = s.value
            elif s.name == "vllm:request_success_total":
                row["request_success"] += s.value
            elif s.name == "vllm:e2e_request_latency_seconds_sum":
                row["e2e_sum"] += s.value
            elif s.name == "vllm:e2e_request_latency_seconds_count":
                row["e2e_count"] += s.value
            elif s.name == "vllm:iteration_tokens_total_count":
                row["steps"] += s.value  # one observation per engine step
    for (model, engine), u in usage.items():
        cap = capacity.get(engine)
        if cap is None:
            continue  # no capacity known for this engine: no live tokens either (never invented)
        tokens, blocks, block_size = cap
        row = out[model]
        row["kv_capacity_tokens"] += tokens
        row["kv_live_tokens"] += u * tokens
        row["num_gpu_blocks"] += blocks
        row["block_size"] = block_size
    for row in out.values():
        cap = row["kv_capacity_tokens"]
        row["kv_usage"] = row["kv_live_tokens"] / cap if cap else None
        row["engines"] = len(row["engines"]) or 1
    return dict(out)


def histogram_buckets(text: str, family: str, model: str) -> dict[float, float]:
    """Cumulative bucket counts {le: count} of one histogram family (e.g.
    'vllm:e2e_request_latency_seconds') for one model_name, engines summed (prometheus_client's parser)."""
    out: dict[float, float] = defaultdict(float)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family + "_bucket" and s.labels.get("model_name") == model:
                out[float(s.labels["le"])] += s.value
    return dict(out)


def promql_quantile(q: float, buckets: dict[float, float]) -> Optional[float]:
    """histogram_quantile(q, ...) as the Prometheus docs define it, written apart from headroom's
    monitor/derive/histogram.py: linear interpolation inside the bucket holding rank q x total, the
    first bucket starting at 0, a rank in the +Inf bucket answering with the highest finite bound."""
    import numpy as np

    les = np.array(sorted(buckets))
    cum = np.array([buckets[b] for b in les])
    total = cum[-1]
    if total <= 0:
        return None
    rank = q * total
    i = int(np.searchsorted(cum, rank, side="left"))
    i = min(i, len(les) - 1)
    if np.isinf(les[i]):
        return float(les[-2])
    lo_bound = les[i - 1] if i > 0 else 0.0
    lo_count = cum[i - 1] if i > 0 else 0.0
    if cum[i] == lo_count:
        return float(les[i])
    return float(lo_bound + (les[i] - lo_bound) * (rank - lo_count) / (cum[i] - lo_count))
