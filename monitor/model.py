"""Plain data shared by every layer. No I/O here, no clocks."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Optional


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
)

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
    counters: dict[str, float] = field(default_factory=dict)  # keys from COUNTERS
    histograms: dict[str, Histogram] = field(default_factory=dict)  # keys from HISTOGRAMS
    naming: str = "v1"  # "v1", "v0" (no engine label) or "legacy-v1" (gpu_cache_usage_perc)


@dataclass
class Quantiles:
    p50: Optional[float] = None
    p90: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    count: float = 0.0  # observations in the window

    def as_dict(self) -> dict:
        return {"p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99,
                "mean": self.mean, "count": self.count}


@dataclass
class ReplicaSnapshot:
    replica: str
    pool: str
    up: bool
    active_requests: Optional[float] = None
    queued_requests: Optional[float] = None
    kv_tokens_live: Optional[float] = None
    kv_tokens_capacity: Optional[float] = None
    kv_usage_ratio: Optional[float] = None
    power_watts: Optional[float] = None


@dataclass
class PoolSnapshot:
    pool: str
    model: str
    replicas: int  # replicas that answered this cycle
    replicas_configured: int = 0
    active_requests: float = 0.0
    queued_requests: float = 0.0
    queued_by_reason: dict[str, float] = field(default_factory=dict)
    kv_tokens_live: Optional[float] = None
    kv_tokens_capacity: Optional[float] = None
    kv_usage_ratio: Optional[float] = None
    # rates per second from counter deltas (None until two readings exist)
    completion_rate: Optional[float] = None
    prompt_tokens_rate: Optional[float] = None
    generation_tokens_rate: Optional[float] = None
    prefix_cache_hit_ratio: Optional[float] = None
    preemption_rate: Optional[float] = None
    latency: dict[str, Quantiles] = field(default_factory=dict)  # keys: ttft, itl, e2e, queue
    mean_concurrency: Optional[float] = None  # mean (active + queued) over the rate window
    littles_law_ratio: Optional[float] = None  # completion_rate * mean e2e / mean_concurrency
    window_seconds: Optional[float] = None
    stale: bool = False
    last_fresh_timestamp: Optional[float] = None
    replica_detail: list[ReplicaSnapshot] = field(default_factory=list)
    capacity: dict = field(default_factory=dict)  # filled by monitor.capacity (knee, headroom, ...)
    tasks: dict = field(default_factory=dict)  # filled from gateway metrics, per task type
    forecast: dict = field(default_factory=dict)  # filled by monitor.forecast


@dataclass
class SourceStatus:
    source: str  # "vllm", "prometheus", "gateway", "dcgm"
    target: str
    up: bool
    error: Optional[str] = None  # reason: "timeout", "connect", "http_5xx", "parse", ...
    detail: Optional[str] = None
    duration_seconds: Optional[float] = None
    attempted: bool = True  # False while a failing target waits out its backoff (not a new error)


@dataclass
class Snapshot:
    timestamp: float
    pools: list[PoolSnapshot] = field(default_factory=list)
    sources: list[SourceStatus] = field(default_factory=list)
    cycle_duration_seconds: Optional[float] = None
    last_success_timestamp: Optional[float] = None
    errors: dict[str, float] = field(default_factory=dict)  # counters by reason, cumulative
