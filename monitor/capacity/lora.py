"""The LoRA adapter-slot limit of a pool (pure): `headroom_capacity_requests{limit="lora"}`.

An engine serving LoRA adapters holds at most so many distinct adapters in one running batch (vLLM
`--max-loras`, `max_lora` of `vllm:lora_requests_info`; SGLang `--max-loras-per-batch`,
`sglang:lora_pool_slots_total`); a request for an adapter not in the batch waits for a free slot.
The slots limit distinct adapters, not requests: more requests for adapters already in the batch
fit, so the limit binds only while requests wait for an adapter that has no slot.

    binding (vLLM): every slot holds a running adapter and adapters wait that are not running
        (waiting_lora_adapters less running_lora_adapters: vLLM lists an adapter as waiting whenever
        one of its requests waits, for KV as much as for a slot)
        lora capacity = active requests x slots / (adapters running + adapters waiting)
        (the share of today's demand for distinct adapters that the slots hold: below the load, so
        the headroom is negative while adapters queue for slots);
    binding (SGLang, which does not say which adapters wait): every slot in use and requests queued
        lora capacity = active requests (what the slots hold now; none of the queue is known to fit);
    otherwise: no limit (None), whatever the slots in use.

Summed over the pool's replicas (`PoolSnapshot.lora`, monitor/derive/edges.py).
"""
from __future__ import annotations

from typing import Optional

from monitor.model import PoolSnapshot


def lora_limit(pool: PoolSnapshot) -> Optional[float]:
    """The pool's concurrent requests within its LoRA adapter slots while they bind, else None."""
    lora, active = pool.lora, pool.active_requests
    if lora is None or not lora.max_loras > 0 or not lora.running > 0 or not active:
        return None
    if lora.waiting is None:  # SGLang: slots in use and total only
        full = lora.running >= lora.max_loras and (pool.queued_requests or 0.0) > 0
        return float(active) if full else None
    if lora.waiting > 0 and lora.running >= lora.max_loras:
        return active * lora.max_loras / (lora.running + lora.waiting)
    return None
