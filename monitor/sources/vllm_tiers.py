"""The edges of a vLLM scrape: KV capacity per tier and what the block size means, prefix-cache hits
by tier, speculative decoding, LoRA adapter slots, and LMCache beside the engine.

Read from the engines' own definitions (vLLM 0.34.0 wheel, LMCache 0.5.6 wheel; provenance in
tests/fixtures/vllm-edges/SOURCES.md):

GPU tier (`gpu_kv`, from `vllm:cache_config_info`): capacity is `kv_cache_size_tokens` (group-aware,
>= 0.26); else `num_gpu_blocks x block_size`, only while the labels show one KV-cache group - on a
hybrid model that product is wrong, so the capacity is unknown. The `block_size` label is the
smallest block size over the KV-cache groups (vllm/v1/engine/core.py: `block_size = min(...)`; vllm
#51163 shows `block_size="4"` with `--block-size 256`), so it is the allocation unit only when the
labels show one group: no `mamba_block_size`, no `sliding_window`, and `effective_attention_block_size`
(the full-attention block size, >= 0.33) absent or equal to it. Otherwise it is a lower bound of the
unit (`exact` False) and `unit_max` is the largest unit the labels name; the live-KV band is widened
with it and flagged (monitor/derive/kv_band.py, method "hybrid").

CPU offload tier: `vllm:kv_offload_config_info{cpu_kv_cache_size_tokens, cpu_kv_cache_size_bytes}`
(0.34; one series per engine, per tier with the tiering spec); before it, `cache_config_info`'s
`kv_offloading_size` (GiB, summed over TP ranks) gives the bytes only. `vllm:kv_offload_cpu_cache_usage_perc`
is not read: it is the space pinned by transfers in flight (an idle full tier reads ~0), not
occupancy. `vllm:kv_offload_allocation_failure_total` counts stores refused for want of room: the
tier is full (counter `kv_offload_allocation_failures`).

Counters (summed over engines, keyed into `ReplicaReading.counters`):
    cached:<source>         vllm:prompt_tokens_cached_by_source_total{source} (device, host, p2p, disk,
                            external_unspecified), >= 0.32; they sum to the prefix and external hits
    spec_drafts, spec_draft_tokens, spec_accepted_tokens
                            vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total
    spec_accepted_pos:<i>   vllm:spec_decode_num_accepted_tokens_per_pos_total{position}
    lmcache_requested_tokens, lmcache_hit_tokens
                            lmcache:num_{requested,hit}_tokens_total (LMCache's `*_hit_rate` gauges
                            restart at each log interval: the counters are read instead)

LoRA (`vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}`, no model or
engine label, value the time of the last update): the newest series. Adapter lists are comma-joined
names. With data-parallel engines every engine writes the same series (vLLM warns the metric is
misleading there): `max_lora` is counted once per engine, the adapters are the last writer's.

LMCache (its series carry `model_name` = the model path, `served_model_name`, `worker_id`, `role`):
bytes held, `lmcache:local_cache_usage` (CPU), `local_storage_usage` (local disk),
`remote_cache_usage`; no capacity gauge (a capacity is what the configuration says:
pools.<pool>.lmcache_cpu_bytes_per_replica).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from monitor.kit.exposition import ParsedScrape

from ..model import KvTier, LoraSlots, ReplicaReading
from .engine_values import MAX_COUNT, MAX_TOKENS, _engine, _model_of, _num, checked

P = "vllm:"
L = "lmcache:"
OFFLOAD_INFO = P + "kv_offload_config_info"
LORA_INFO = P + "lora_requests_info"
GIB = 2.0 ** 30
MAX_BYTES = 1e16  # bytes of one replica's tier (10 PB): past it a value is refused

# counter key -> sample name (the label `by`, when given, extends the key: "cached:host")
COUNTERS: dict[str, tuple[str, Optional[str]]] = {
    "cached": (P + "prompt_tokens_cached_by_source_total", "source"),
    "spec_drafts": (P + "spec_decode_num_drafts_total", None),
    "spec_draft_tokens": (P + "spec_decode_num_draft_tokens_total", None),
    "spec_accepted_tokens": (P + "spec_decode_num_accepted_tokens_total", None),
    "spec_accepted_pos": (P + "spec_decode_num_accepted_tokens_per_pos_total", "position"),
    "kv_offload_allocation_failures": (P + "kv_offload_allocation_failure_total", None),
    "lmcache_requested_tokens": (L + "num_requested_tokens_total", None),
    "lmcache_hit_tokens": (L + "num_hit_tokens_total", None),
}
LMCACHE_BYTES = {"lmcache_cpu": L + "local_cache_usage", "lmcache_disk": L + "local_storage_usage",
                 "lmcache_remote": L + "remote_cache_usage"}

WANTED = frozenset([OFFLOAD_INFO, LORA_INFO, *(n for n, _ in COUNTERS.values()), *LMCACHE_BYTES.values()])


class GpuKv(NamedTuple):
    """A `cache_config_info` series read: capacity and what its block size means."""

    tokens: Optional[float]
    block_size: Optional[int]
    blocks: Optional[int]
    source: Optional[str]  # "kv_cache_size_tokens" | "blocks_x_block_size" | None
    exact: bool  # the block_size label is the allocation unit
    unit_max: Optional[int]  # the largest allocation unit the labels name (== block_size when exact)


# the cache_config_info labels gpu_kv reads (Prometheus mode asks for these, not all ~35)
GPU_KV_LABELS = ("block_size", "num_gpu_blocks", "kv_cache_size_tokens", "effective_attention_block_size",
                 "mamba_block_size", "sliding_window")


def gpu_kv(labels: dict[str, str]) -> GpuKv:
    """One engine's GPU KV capacity and allocation unit (see the module docstring)."""
    block = _num(labels.get("block_size"))
    blocks = _num(labels.get("num_gpu_blocks"))
    attention = _num(labels.get("effective_attention_block_size"))
    mamba = _num(labels.get("mamba_block_size"))
    window = _num(labels.get("sliding_window"))
    exact = mamba is None and window is None and (attention is None or attention == block)
    units = [int(u) for u in (block, attention, mamba) if u]
    tokens = _num(labels.get("kv_cache_size_tokens"))
    source: Optional[str] = "kv_cache_size_tokens"
    window_only = mamba is None and window is not None and (attention is None or attention == block)
    if tokens is None and block and blocks and (exact or window_only):
        # a sliding window alone (older vLLM, no kv_cache_size_tokens: Mistral-7B v0.1's uniform
        # window is one KV group) gives blocks x block_size too, flagged approximate: a hybrid
        # full + sliding model's block_size is only a lower bound of its unit
        tokens, source = block * blocks, "blocks_x_block_size" if exact else "blocks_x_block_size_approx"
    elif tokens is None:
        source = None
    return GpuKv(tokens, int(block) if block else None, int(blocks) if blocks else None, source, exact,
                 max(units) if units else None)


def read_edges(scrape: ParsedScrape, readings: list[ReplicaReading]) -> None:
    """Attach the tiers, edge counters, LoRA slots and LMCache bytes of one scrape to its readings
    (one per model; series of a model not read are left out)."""
    by_model = {r.model: r for r in readings}
    if not by_model:
        return
    _offload_tiers(scrape, by_model)
    _counters(scrape, by_model)
    _lmcache_bytes(scrape, by_model)
    lora = _lora(scrape)
    if lora is not None:
        for r in readings:
            r.lora = LoraSlots(lora.max_loras * max(1, r.engines), lora.running, lora.waiting)


def _offload_tiers(scrape: ParsedScrape, by_model: dict[str, ReplicaReading]) -> None:
    seen: set[tuple[str, str]] = set()
    for labels, _ in scrape.get(OFFLOAD_INFO):
        r = by_model.get(_model_of(labels) or "")
        tokens = _bounded(scrape, _num(labels.get("cpu_kv_cache_size_tokens")), MAX_TOKENS)
        size = _bounded(scrape, _num(labels.get("cpu_kv_cache_size_bytes")), MAX_BYTES)
        key = (_model_of(labels) or "", _engine(labels))
        if r is None or (tokens is None and size is None) or key in seen:
            continue  # a secondary tier's series (its own keys only), or the same engine twice
        seen.add(key)
        _add_tier(r, "cpu", KvTier(tokens, size, None, "kv_offload_config_info"))
    if any(r.kv_tiers.get("cpu") for r in by_model.values()):
        return
    for labels, _ in scrape.get(P + "cache_config_info"):  # before 0.34: the configured size, bytes only
        gib = _bounded(scrape, _num(labels.get("kv_offloading_size")), MAX_BYTES / GIB)
        r = by_model.get(_model_of(labels) or "") or (next(iter(by_model.values())) if len(by_model) == 1 else None)
        if gib and r is not None:
            _add_tier(r, "cpu", KvTier(None, gib * GIB, None, "kv_offloading_size"))


def _add_tier(r: ReplicaReading, tier: str, add: KvTier) -> None:
    old = r.kv_tiers.get(tier)
    r.kv_tiers[tier] = add if old is None else old.plus(add)


def _bounded(scrape: ParsedScrape, value: Optional[float], high: float) -> Optional[float]:
    return None if value is None else checked(scrape, value, high)


def _counters(scrape: ParsedScrape, by_model: dict[str, ReplicaReading]) -> None:
    for key, (name, by) in COUNTERS.items():
        lmcache = name.startswith(L)
        for labels, value in scrape.get(name):
            r = _lmcache_reading(labels, by_model) if lmcache else by_model.get(_model_of(labels) or "")
            if r is None or checked(scrape, value, MAX_COUNT) is None:
                continue
            k = f"{key}:{labels.get(by, '')}" if by else key
            r.counters[k] = r.counters.get(k, 0.0) + value


def _lmcache_reading(labels: dict[str, str], by_model: dict[str, ReplicaReading]) -> Optional[ReplicaReading]:
    """The reading an LMCache series belongs to: its served model name, else its model path, else
    the one model of the scrape."""
    for name in (labels.get("served_model_name"), labels.get("model_name")):
        if name and name in by_model:
            return by_model[name]
    return next(iter(by_model.values())) if len(by_model) == 1 else None


def _lmcache_bytes(scrape: ParsedScrape, by_model: dict[str, ReplicaReading]) -> None:
    for tier, name in LMCACHE_BYTES.items():
        for labels, value in scrape.get(name):
            r = _lmcache_reading(labels, by_model)
            if r is not None and checked(scrape, value, MAX_BYTES) is not None:
                _add_tier(r, tier, KvTier(None, None, value, name))


def _lora(scrape: ParsedScrape) -> Optional[LoraSlots]:
    """The newest `lora_requests_info` series (the largest value: the time it was last set)."""
    rows = [(value, labels) for labels, value in scrape.get(LORA_INFO)]
    if not rows:
        return None
    _, labels = max(rows, key=lambda row: row[0])
    most = _num(labels.get("max_lora"))
    if most is None or not 0 < most <= 1e6:
        scrape.anomaly("out_of_range")
        return None
    running = _adapters(labels.get("running_lora_adapters"))
    # an adapter is listed as waiting whenever a request of it waits, for any reason (KV, slots):
    # only adapters waiting that are not running wait for an adapter slot
    waiting = _adapters(labels.get("waiting_lora_adapters")) - running
    return LoraSlots(most, float(len(running)), float(len(waiting)))


def _adapters(joined: Optional[str]) -> set[str]:
    return {a.strip() for a in (joined or "").split(",") if a.strip()}
