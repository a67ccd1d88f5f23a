"""A pool's edges as samples (monitor/derive/edges.py): KV tiers, prefix hits by tier, speculative
decoding, LoRA slots, LMCache. `out` is the render's `Rows` (monitor/export/samples.py), which checks
every sample against the catalogue."""
from __future__ import annotations

from ..model import PoolSnapshot


def edge_samples(out, p: PoolSnapshot) -> None:
    """The pool's KV tiers, prefix hits by tier, speculative acceptance, LoRA slots, LMCache
    (monitor/derive/edges.py)."""
    pl = {"pool": p.pool}
    if p.kv_tokens_method:
        out.add("headroom_kv_tokens_method_info", {**pl, "method": p.kv_tokens_method}, 1.0)
    for tier, t in sorted(p.kv_tiers.items()):
        out.add("headroom_kv_tier_capacity_tokens", {**pl, "tier": tier, "source": t.source}, t.tokens)
        out.add("headroom_kv_tier_capacity_bytes", {**pl, "tier": tier, "source": t.source}, t.capacity_bytes)
        out.add("headroom_kv_tier_used_bytes", {**pl, "tier": tier}, t.used_bytes)
    out.add("headroom_kv_offload_allocation_failures_rate", pl, p.kv_offload_allocation_failure_rate)
    for tier, v in sorted(p.prefix_hit_rates.items()):
        out.add("headroom_prefix_cache_hit_tokens_rate", {**pl, "tier": tier}, v)
    for tier, v in sorted(p.prefix_hit_shares.items()):
        out.add("headroom_prefix_cache_hit_share_ratio", {**pl, "tier": tier}, v)
    out.add("headroom_lmcache_hit_ratio", pl, p.lmcache_hit_ratio)
    out.add("headroom_spec_decode_acceptance_ratio", pl, p.spec_acceptance_ratio)
    out.add("headroom_spec_decode_acceptance_length", pl, p.spec_acceptance_length)
    for position, v in sorted(p.spec_acceptance_by_position.items()):
        out.add("headroom_spec_decode_position_acceptance_ratio", {**pl, "position": position}, v)
    if p.lora is not None:
        for state in ("max_loras", "running", "waiting"):
            out.add("headroom_lora_adapters", {**pl, "state": state.replace("_loras", "")}, getattr(p.lora, state))
