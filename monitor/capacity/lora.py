"""The LoRA adapter-slot limit of a pool (pure): `headroom_capacity_requests{limit="lora"}`.

An engine serving LoRA adapters holds at most so many distinct adapters in one running batch
(SGLang `--max-loras-per-batch`, `sglang:lora_pool_slots_total`; vLLM `--max-loras`, `max_lora` of
`vllm:lora_requests_info`); a request for an adapter not in the batch waits for a free slot. In
concurrent requests, at today's mix of requests per adapter:

    lora capacity = running requests x slots / adapters in use

over the replicas that report LoRA slots (`PoolSnapshot.lora_slots`: adapters in use, slots,
their running requests). With every slot in use it equals the running requests: more load fits
only as requests for adapters already in the batch. Known only where adapters are in use (none in
use: no requests per adapter to scale, and the slots limit nothing yet). Requests of the base model
hold no slot but are counted in the running requests, so the figure leans high when they are many.
"""
from __future__ import annotations

from typing import Optional

from monitor.model import PoolSnapshot


def lora_limit(pool: PoolSnapshot) -> Optional[float]:
    """The pool's concurrent requests within its LoRA adapter slots, or None (see the module)."""
    if pool.lora_slots is None:
        return None
    used, slots, running = pool.lora_slots
    if not used > 0 or not slots > 0:
        return None
    return running * slots / used
