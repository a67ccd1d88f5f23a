"""Live KV tokens from a block-granular gauge: an estimate inside a band that holds the truth.

vLLM reports KV use in blocks (`kv_cache_usage_perc` = used blocks / blocks), so usage x capacity
counts every running request's last block as full. A request holding `t` tokens holds
ceil(t / block_size) blocks, so its last block wastes between 0 and block_size - 1 slots:

    high = usage x capacity                              (what block usage implies: an upper bound)
    low  = max(0, high - running x (block_size - 1))     (every last block holding one token)

The truth lies in [low, high] whatever the request lengths (a request's KV fills whole blocks
except its last one). The estimate:
- half a block per running request off `high` (the last block's fill taken as even over
  1..block_size: a waste of (block_size - 1) / 2 on average), the method whenever requests span
  several blocks (their lengths then fall anywhere within a block);
- when the window's prompt and generated token counts say a running request holds fewer tokens
  than one block on average (`tokens_per_request`: mean prompt + half the mean generation, from the
  engine's request_prompt_tokens / request_generation_tokens histograms), every request sits in one
  partly filled block and the half-block rule says nothing: running x tokens_per_request, kept in
  the band.
Without a block size (SGLang counts tokens, not blocks) or a running count, low = estimate = high.

Hybrid KV (sliding-window or mamba layers beside full attention; monitor/sources/vllm_tiers.py
`gpu_kv`): vLLM's `block_size` label is the smallest block size over the KV-cache groups, not the
unit a request's last block is allocated in (vllm #51163: "4" with --block-size 256). Its low edge
would be far too high (a band too narrow to hold the truth). There the unit is taken as the largest
the labels name (`unit_max`: the full-attention or mamba block size): low = high - running x
(unit_max - 1), the estimate half a unit per running request off `high`, and the method says
"hybrid" - a wider band, flagged: with mamba or sliding-window groups a request's blocks are not
proportional to its tokens (state blocks are held whatever its length), so even that low edge is a
bound on the last blocks' waste only.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from ..model import ReplicaReading
from .counters import histogram_increase


class KvBand(NamedTuple):
    estimate: Optional[float]
    low: Optional[float]
    high: Optional[float]
    method: str  # "half_block", "tokens_per_request", "hybrid" (unit unknown: wider band), "exact", "unknown"


def kv_band(high: Optional[float], running: Optional[float], block_size: Optional[int],
            tokens_per_request: Optional[float] = None, unit_max: Optional[int] = None) -> KvBand:
    """The band and estimate of live KV tokens for one replica (see the module docstring);
    `unit_max`: given when `block_size` is only a lower bound of the allocation unit (hybrid KV)."""
    if high is None:
        return KvBand(None, None, None, "unknown")
    if unit_max is not None and running is not None:
        unit, n = max(unit_max, block_size or 1), max(0.0, running)
        low = max(0.0, high - n * (unit - 1))
        return KvBand(max(low, high - n * (unit - 1) / 2.0), low, high, "hybrid")
    if not block_size or block_size <= 1 or running is None:
        return KvBand(high, high, high, "exact")
    n = max(0.0, running)
    low = max(0.0, high - n * (block_size - 1))
    if n and tokens_per_request is not None and 0 < tokens_per_request < block_size:
        est = min(high, max(low, n * tokens_per_request))
        return KvBand(est, low, high, "tokens_per_request")
    est = max(low, high - n * (block_size - 1) / 2.0)
    return KvBand(est, low, high, "half_block")


def tokens_per_running_request(prompt_mean: Optional[float], generation_mean: Optional[float]
                               ) -> Optional[float]:
    """Tokens a running request holds on average: its prompt and, generation being spread evenly
    over its time in the batch, half of what it generates. None when either mean is unknown."""
    if prompt_mean is None or generation_mean is None:
        return None
    return prompt_mean + generation_mean / 2.0


def _mean_increase(new: ReplicaReading, old: ReplicaReading, key: str) -> Optional[float]:
    d = histogram_increase(new.histograms.get(key), old.histograms.get(key))
    return d.sum / d.count if d is not None and d.count > 0 else None


def tokens_per_request_between(old: Optional[ReplicaReading], new: ReplicaReading) -> Optional[float]:
    """`tokens_per_running_request` from the requests that finished between two readings of one
    replica (the increase of request_prompt_tokens and request_generation_tokens); None without
    an older reading or a finished request."""
    if old is None or old is new:
        return None
    return tokens_per_running_request(_mean_increase(new, old, "prompt_len"),
                                      _mean_increase(new, old, "generation_len"))


def sum_bands(bands: list[KvBand]) -> KvBand:
    """A pool's band: the replicas' bands summed over the replicas whose live KV is known."""
    # a band is known whole or not at all (kv_band): estimate, low and high are None together
    known = [(b.estimate, b.low, b.high, b.method) for b in bands
             if b.estimate is not None and b.low is not None and b.high is not None]
    if not known:
        return KvBand(None, None, None, "unknown")
    methods = {method for *_, method in known}
    return KvBand(sum(k[0] for k in known), sum(k[1] for k in known), sum(k[2] for k in known),
                  methods.pop() if len(methods) == 1 else "mixed")
