"""A pool's edges, from its replicas' readings (monitor/sources/vllm_tiers.py reads them):

    kv_tiers             per tier, the replicas' capacities summed: "gpu" (headroom_kv_capacity_tokens,
                         its source `kv_cache_size_tokens` or `blocks_x_block_size`), "cpu" (the
                         offload tier), "lmcache_cpu" / "lmcache_disk" / "lmcache_remote" (bytes held)
    prefix_hit_rates     per source tier (device, host, p2p, disk, external_unspecified), cached prompt
                         tokens per second: the sum over replicas of increase / seconds over the window
    prefix_hit_shares    the same increase over the increase of prompt tokens (which count cached ones):
                         the share of prompt tokens each tier supplied, so the KV a session needs to
                         compute (1 - the shares summed) and where it came from
    spec_acceptance_ratio   increase(accepted tokens) / increase(draft tokens), every replica's summed
    spec_acceptance_length  1 + increase(accepted tokens) / increase(drafts): tokens per decode step
                         (vllm/v1/spec_decode/metrics.py's definitions)
    spec_acceptance_by_position  per draft position, increase(accepted there) / increase(drafts)
    lora                 LoRA adapter slots summed over the replicas' newest readings
    lmcache_hit_ratio    increase(lmcache hit tokens) / increase(lmcache requested tokens)
    kv_offload_allocation_failure_rate   stores the CPU tier refused for want of room, per second

Counters go through `increase` (a reset's increase is the new value); a replica without two readings
in the window adds nothing to a rate. Pure: plain data in, fields set on the pool snapshot.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..model import KvTier, LoraSlots, PoolSnapshot, ReplicaReading
from .counters import increase

# the window's (oldest, newest) readings of one replica, or None (derive.core.window_pair)
PairOf = Callable[[list[ReplicaReading]], Optional[tuple[ReplicaReading, ReplicaReading]]]


def derive_edges(snap: PoolSnapshot, fresh: list[list[ReplicaReading]], pair_of: PairOf) -> None:
    """Set the pool's edge fields (see the module docstring); `pair_of(readings)` is the window's
    (oldest, newest) pair of one replica, or None."""
    newest = {rs[-1].target: rs[-1] for rs in fresh}
    for rd in snap.replica_detail:
        r = newest.get(rd.replica)
        if r is not None:
            rd.kv_tiers = replica_tiers(r)
    tiers: dict[str, KvTier] = {}
    lora: Optional[LoraSlots] = None
    for r in newest.values():
        for tier, t in replica_tiers(r).items():
            tiers[tier] = t if tier not in tiers else tiers[tier].plus(t)
        if r.lora is not None:
            lora = r.lora if lora is None else lora.plus(r.lora)
    snap.kv_tiers, snap.lora = tiers, lora
    deltas, rates = _increases(fresh, pair_of)
    prompt = deltas.get("prompt_tokens")
    for key, rate in rates.items():
        if key.startswith("cached:"):
            tier = key.split(":", 1)[1]
            snap.prefix_hit_rates[tier] = rate
            if prompt:
                snap.prefix_hit_shares[tier] = deltas[key] / prompt
    snap.spec_acceptance_ratio = _ratio(deltas, "spec_accepted_tokens", "spec_draft_tokens")
    per_draft = _ratio(deltas, "spec_accepted_tokens", "spec_drafts")
    snap.spec_acceptance_length = 1.0 + per_draft if per_draft is not None else None
    drafts = deltas.get("spec_drafts")
    if drafts:
        snap.spec_acceptance_by_position = {k.split(":", 1)[1]: v / drafts for k, v in deltas.items()
                                            if k.startswith("spec_accepted_pos:")}
    snap.lmcache_hit_ratio = _ratio(deltas, "lmcache_hit_tokens", "lmcache_requested_tokens")
    snap.kv_offload_allocation_failure_rate = rates.get("kv_offload_allocation_failures")


def replica_tiers(r: ReplicaReading) -> dict[str, KvTier]:
    """One replica's tiers: its GPU capacity and the offload and LMCache tiers it reports."""
    out = dict(r.kv_tiers)
    if r.kv_capacity_tokens is not None:
        out["gpu"] = KvTier(r.kv_capacity_tokens, None, None, r.kv_capacity_source or "")
    return out


EDGE_KEYS = ("prompt_tokens", "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
             "lmcache_requested_tokens", "lmcache_hit_tokens", "kv_offload_allocation_failures")


def _increases(fresh: list[list[ReplicaReading]], pair_of: PairOf) -> tuple[dict[str, float], dict[str, float]]:
    """Per counter key: the increase summed over replicas, and the sum of each replica's per second."""
    deltas: dict[str, float] = {}
    rates: dict[str, float] = {}
    for rs in fresh:
        pair = pair_of(rs)
        if pair is None:
            continue
        old, new = pair
        dt = new.timestamp - old.timestamp
        for key in new.counters:
            if key not in EDGE_KEYS and not key.startswith(("cached:", "spec_accepted_pos:")):
                continue
            d = increase(new.counters.get(key), old.counters.get(key))
            if d is None:
                continue
            deltas[key] = deltas.get(key, 0.0) + d
            rates[key] = rates.get(key, 0.0) + d / dt
    return deltas, rates


def _ratio(deltas: dict[str, float], top: str, bottom: str) -> Optional[float]:
    b = deltas.get(bottom)
    return deltas.get(top, 0.0) / b if b else None
