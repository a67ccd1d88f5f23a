"""An SGLang engine's KV pools and LoRA slots, read honestly for hybrid models (monitor/sources/sglang.py
reads the gauges; this turns one model's per-engine values into its ReplicaReading's KV fields).

What SGLang's scheduler reports (sgl-project/sglang, python/sglang/srt/observability/metrics_collector.py
`SchedulerStats` and `emit_constants` at 016d8605e45876180312e29d6988e1de06562472, and the pool
statistics its scheduler fills; tests/fixtures/sglang/SOURCES.md):
- Each pool's used = size - available - evictable, usage = used / size. The full-attention pool:
  `kv_used_tokens`, `kv_available_tokens`, `kv_evictable_tokens`, `full_token_usage`, its size
  `max_total_num_tokens`. A hybrid sliding-window model adds the SWA pool (`swa_used_tokens`,
  `swa_available_tokens`, `swa_evictable_tokens`, `swa_token_usage`, size `max_total_num_tokens_swa`);
  a hybrid SSM model the mamba state pool (`mamba_*_tokens`, `mamba_usage`: state slots, one per
  request, not tokens; no size gauge, so its size is used + available + evictable). A pool the
  model lacks reads 0.
- `token_usage` is max(full, swa, mamba): the fullest pool, not the KV tokens' share, and
  `num_used_tokens` is max(full used, swa used): on a hybrid SWA model it mixes two pools.

So the replica's KV tokens are the full-attention pool's (every token of context has a slot
there): live from `kv_used_tokens`, else `full_token_usage` x size; `num_used_tokens` only when the
engine has no SWA pool and `token_usage` x size only when it has no second pool at all (older
SGLang without the per-pool gauges: else unknown, never a mix). A hybrid engine's pools go to
`kv_pools` (pool -> (used, size)), so their usage can be read side by side.

LoRA (`--enable-lora`): `lora_pool_slots_used` counts the distinct adapters in the running batch,
`lora_pool_slots_total` is max_loras_per_batch (the most one batch may hold).
"""
from __future__ import annotations

from typing import Optional

from ..model import LoraSlots, ReplicaReading

Values = dict[str, Optional[float]]  # gauge field (sglang.GAUGES) -> one engine's checked value


def _pool(v: Values, prefix: str, size: Optional[float]) -> Optional[tuple[float, float]]:
    """(used, size) of the engine's SWA or mamba pool, or None when it has none or it is unusable."""
    used, available, evictable = v.get(prefix + "_used"), v.get(prefix + "_available"), v.get(prefix + "_evictable")
    if size is None and used is not None and available is not None and evictable is not None:
        size = used + available + evictable
    if not size:
        return None  # the model has no such pool (its gauges read 0), or its size is unknown
    usage = v.get(prefix + "_usage")
    if used is None and usage is not None:
        used = usage * size
    return (used, size) if used is not None and used <= size else None


def _has_pool(v: Values, prefix: str) -> bool:
    return any(v.get(prefix + suffix) for suffix in ("_used", "_available", "_evictable", "_usage"))


def engine_kv(v: Values, anomaly) -> tuple[Optional[float], Optional[float], Optional[float], dict]:
    """One engine's (full-pool size, full-pool live tokens, full-pool usage, its pools if hybrid)."""
    size = v.get("capacity")
    if size is not None and not size > 0:
        anomaly("out_of_range")  # a KV capacity of 0: unknown
        size = None
    swa_size = v.get("swa_capacity") or None
    swa, mamba = _pool(v, "swa", swa_size), _pool(v, "mamba", None)
    has_swa = swa is not None or swa_size is not None or _has_pool(v, "swa")
    hybrid = has_swa or mamba is not None or _has_pool(v, "mamba")
    live, full_usage, token_usage = v.get("kv_used"), v.get("full_usage"), v.get("token_usage")
    if live is None and full_usage is not None and size is not None:
        live = full_usage * size
    if live is None and not has_swa:
        live = v.get("used_tokens")
    if live is None and not hybrid and token_usage is not None and size is not None:
        live = token_usage * size
    if live is not None and size is not None and live > size:
        anomaly("out_of_range")
        live = None
    usage: Optional[float]
    if live is not None and size:
        usage = live / size
    else:
        usage = full_usage if hybrid else token_usage
    pools = {}
    if hybrid and live is not None and size:
        pools = {"full": (live, size), **({"swa": swa} if swa else {}), **({"mamba": mamba} if mamba else {})}
    return size, live, usage, pools


def _total(values: list[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) if values and len(known) == len(values) else None


def read_kv(r: ReplicaReading, engines: list[Values], anomaly) -> None:
    """Set the reading's KV and LoRA fields from its engines' values (DP engines summed; a value
    unusable on one engine makes the replica's unknown, not a partial sum)."""
    per = [engine_kv(v, anomaly) for v in engines]
    r.kv_capacity_tokens = _total([p[0] for p in per])
    r.kv_live_tokens = _total([p[1] for p in per])
    if r.kv_capacity_tokens and r.kv_live_tokens is not None:
        r.kv_usage = r.kv_live_tokens / r.kv_capacity_tokens
    elif len(per) == 1:
        r.kv_usage = per[0][2]  # one engine without a capacity: its own fraction
    names = set().union(*(p[3] for p in per))
    r.kv_pools = {name: (sum(p[3][name][0] for p in per), sum(p[3][name][1] for p in per))
                  for name in sorted(names) if all(name in p[3] for p in per)}
    page = [p for v in engines if (p := v.get("page_size"))]
    r.block_size = int(page[0]) if page else None
    pages = _total([v.get("num_pages") for v in engines])
    r.num_gpu_blocks = int(pages) if pages else None
    used, total = _total([v.get("lora_used") for v in engines]), _total([v.get("lora_total") for v in engines])
    if used is not None and total:
        r.lora = LoraSlots(max_loras=total, running=used, waiting=None)  # SGLang does not say which wait
