"""The values a replica's reading is made of: histograms, counter and histogram names, quantiles."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: upper bounds (ascending, last is +Inf) and counts."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("histogram bounds and counts differ in length")

    @property
    def has_inf(self) -> bool:
        return bool(self.bounds) and math.isinf(self.bounds[-1])

    def minus(self, older: "Histogram") -> Optional["Histogram"]:
        """Bucket-wise delta against an older observation; None after a reset or a bound change."""
        if older.bounds != self.bounds or self.count < older.count:
            return None
        if not all(map(operator.ge, self.counts, older.counts)):
            return None  # a bucket went down: the counters were reset
        deltas = tuple(map(operator.sub, self.counts, older.counts))
        return Histogram(self.bounds, deltas, self.sum - older.sum, self.count - older.count)

    def plus(self, other: "Histogram") -> Optional["Histogram"]:
        if other.bounds != self.bounds:
            return None
        return Histogram(self.bounds, tuple(map(operator.add, self.counts, other.counts)),
                         self.sum + other.sum, self.count + other.count)


# Counter keys a ReplicaReading may carry (canonical names, independent of vLLM version).
COUNTERS = (
    "request_success",  # every finished request, all finished_reason values
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "admission_rejections",  # vllm:admission_rejections_total (0.32+): turned away by a queue limit
    "request_aborted",  # vllm:request_success_total{finished_reason="abort"}: given up (mostly while queued)
)

# headroom_shed_requests_rate reasons (the names agreed with the dashboards and alerts)
SHED_REASONS = ("rejected", "aborted", "abandoned", "gateway_rate_limited", "gateway_error", "gateway_timeout")
# `abandoned`: calls the application gave up on (agent_calls_abandoned_total) beyond those the engines
# counted as `aborted` (monitor/capacity/shed.py add_gateway_shed), so a give-up is in one reason only

# Histogram keys a ReplicaReading may carry (canonical names).
HISTOGRAMS = (
    "ttft",  # vllm:time_to_first_token_seconds
    "itl",  # vllm:inter_token_latency_seconds (legacy: time_per_output_token_seconds)
    "e2e",  # vllm:e2e_request_latency_seconds
    "queue",  # vllm:request_queue_time_seconds
    "prefill",  # vllm:request_prefill_time_seconds
    "decode",  # vllm:request_decode_time_seconds
    "prompt_len",  # vllm:request_prompt_tokens
    "generation_len",  # vllm:request_generation_tokens
    "render",  # vllm:request_render_duration_seconds (0.34: templating + tokenisation before admission)
)


@dataclass
class ReplicaReading:
    """What one vLLM replica (one scrape target / Prometheus instance, one model) showed at one time.

    Engines of a data-parallel replica are already summed. Values that the engine did not expose are
    None (never invented).
    """

    target: str  # URL of the scrape, or the Prometheus `instance` label
    model: str  # model_name label
    timestamp: float  # seconds since the epoch, when the reading was taken
    labels: dict[str, str] = field(default_factory=dict)  # extra target labels (for pool_by)
    running: Optional[float] = None
    waiting: Optional[float] = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    kv_usage: Optional[float] = None  # 0..1, capacity-weighted over engines
    kv_capacity_tokens: Optional[float] = None
    kv_live_tokens: Optional[float] = None
    block_size: Optional[int] = None
    num_gpu_blocks: Optional[int] = None
    engines: int = 1
    # priority scheduling (SGLang --enable-priority-scheduling): running / waiting by priority value,
    # the breakdown of `running` / `waiting` (never added to them); {}: the engine gives none
    running_by_priority: dict[str, float] = field(default_factory=dict)
    waiting_by_priority: dict[str, float] = field(default_factory=dict)
    # hybrid models' KV pools (SGLang: "full" attention, "swa" sliding window in tokens, "mamba"
    # state slots): pool -> (used, capacity), summed over engines; {}: one KV pool (kv_* above)
    kv_pools: dict[str, tuple[float, float]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # keys from COUNTERS
    histograms: dict[str, Histogram] = field(default_factory=dict)  # keys from HISTOGRAMS
    naming: str = "v1"  # "v1", "v0" (no engine label) or "legacy-v1" (gpu_cache_usage_perc)
    # the KV edges (monitor/sources/vllm_tiers.py): where the GPU capacity came from, whether the
    # block_size label is the allocation unit (hybrid KV: only a lower bound of it) and the largest
    # unit it may be; capacity per offload tier, bytes held per LMCache tier, LoRA adapter slots
    kv_capacity_source: Optional[str] = None  # "kv_cache_size_tokens" | "blocks_x_block_size" | "..._approx"
    kv_unit_exact: bool = True
    kv_unit_max: Optional[int] = None  # hybrid KV: the largest allocation unit the labels allow
    kv_tiers: dict[str, "KvTier"] = field(default_factory=dict)  # tier ("gpu", "cpu", "lmcache_cpu", ...)
    lora: Optional["LoraSlots"] = None


@dataclass(frozen=True)
class KvTier:
    """One KV-cache tier of a replica (engines summed): its capacity in tokens and bytes where the
    engine says, the bytes it holds where it says (LMCache), and which series said it."""

    tokens: Optional[float] = None
    capacity_bytes: Optional[float] = None
    used_bytes: Optional[float] = None
    source: str = ""

    def plus(self, other: "KvTier") -> "KvTier":
        def add(a: Optional[float], b: Optional[float]) -> Optional[float]:
            return b if a is None else a if b is None else a + b
        return KvTier(add(self.tokens, other.tokens), add(self.capacity_bytes, other.capacity_bytes),
                      add(self.used_bytes, other.used_bytes), self.source or other.source)


@dataclass(frozen=True)
class LoraSlots:
    """LoRA adapter slots: at most `max_loras` adapters in a batch; `running` / `waiting`: adapters
    of the running / waiting requests (vllm:lora_requests_info; SGLang lora_pool_slots_total / _used,
    which do not say which adapters wait: `waiting` None). Summed over replicas."""

    max_loras: float
    running: float
    waiting: Optional[float]

    def plus(self, other: "LoraSlots") -> "LoraSlots":
        waiting = None if self.waiting is None or other.waiting is None else self.waiting + other.waiting
        return LoraSlots(self.max_loras + other.max_loras, self.running + other.running, waiting)


@dataclass
class Quantiles:
    p50: Optional[float] = None
    p90: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    count: float = 0.0  # observations in the window
    # quantile name -> (side, bucket bound) when the value is only a bound of the true quantile:
    # ("upper", first bound): it fell in the first bucket, the true quantile is <= that bound (the
    # value is interpolated from 0); ("lower", last finite bound): it fell in the +Inf bucket, the
    # true quantile is >= that bound (the value is that bound). monitor/derive/histogram.py.
    bounds: dict[str, tuple[str, float]] = field(default_factory=dict)
    # quantile name -> (lower, upper) bound of the bucket it was interpolated in: the truth lies
    # there, wherever the interpolation put the value (a p95 of 14.0 s read in (10, 20] may be 11.3 s)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99,
                "mean": self.mean, "count": self.count,
                "bounds": {k: {"bound": side, "value": v} for k, (side, v) in self.bounds.items()},
                "buckets": {k: list(b) for k, b in self.buckets.items()}}
