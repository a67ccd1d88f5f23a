"""A cycle's result: per replica, per pool (with its capacity, tasks and forecast), the whole snapshot."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from monitor.model.poolkey import extras_of, name_of

from .capacity import Capacity, PoolTasks
from .replica_reading import Histogram, KvTier, LoraSlots, Quantiles
from .spare_data import Spare


@dataclass
class ReplicaSnapshot:
    replica: str
    pool: str
    up: bool
    active_requests: Optional[float] = None
    queued_requests: Optional[float] = None
    kv_tokens_live: Optional[float] = None  # the estimate, partial last blocks corrected (derive/kv_band.py)
    kv_tokens_capacity: Optional[float] = None
    kv_usage_ratio: Optional[float] = None  # the engine's block usage
    power_watts: Optional[float] = None
    stalled: bool = False  # work running or waiting, nothing completed over global.stall_window
    kv_tokens_live_low: Optional[float] = None  # every running request's last block holding one token
    kv_tokens_live_high: Optional[float] = None  # what block usage implies (usage x capacity)
    kv_tokens_method: Optional[str] = None  # derive/kv_band.py KvBand.method
    kv_capacity_changes: float = 0.0  # KV capacity changes seen on this replica (counter)
    latency_ratio: Optional[float] = None  # its inter-token latency over its peers' (derive/slow.py)
    slow: bool = False  # the ratio stayed >= SLOW_RATIO for SLOW_HOLD seconds (monitor/step/cycle_step.py)
    kv_tiers: dict[str, KvTier] = field(default_factory=dict)  # tier -> its capacity (derive/edges.py)


class PoolForecastLike(Protocol):
    """What the lower floors read of one pool's forecast. The forecast core makes it
    (monitor/forecast/pool.py `PoolForecast`, which imports pandas); the model only names its shape."""

    # read-only (properties): the forecast core's is a frozen dataclass
    @property
    def last_fit_timestamp(self) -> float: ...
    @property
    def series(self) -> dict[str, Any]: ...  # series name -> its outlook (model, skill, horizons, or why undefined)
    @property
    def horizons(self) -> dict[str, Any]: ...  # horizon ("1h", "1d", "1w") -> its capacity series' summary, or None
    @property
    def exhaustion_seconds(self) -> Optional[float]: ...
    @property
    def capacity_requests(self) -> Optional[float]: ...
    @property
    def path(self) -> Any: ...  # the capacity series' forecast path (timestamps, mean, upper, lower) or None

    def as_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RefitResult:
    """One refit of every pool's forecasts (monitor/pipeline/forecaster.py publishes it; each cycle reads it)."""

    pools: dict[str, PoolForecastLike] = field(default_factory=dict)  # pool -> forecast_pool(...)
    started: float = 0.0  # Unix time the refit began (the `now` given to the models)
    finished: float = 0.0
    duration_seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)  # pool (or "history") -> error text
    runs: int = 0


@dataclass
class PoolSnapshot:
    pool: str
    model: str
    replicas: int  # replicas that answered this cycle
    replicas_configured: int = 0
    stalled_replicas: int = 0  # of those, replicas holding work without completing any (not capacity)
    stalled_kv_tokens_capacity: float = 0.0  # their KV capacity, left out of the pool's by the capacity layer
    # the engines' own gauges, summed; None when no replica exposed the family (unknown, never 0)
    active_requests: Optional[float] = 0.0
    queued_requests: Optional[float] = 0.0
    queued_by_reason: dict[str, float] = field(default_factory=dict)
    # the engines' running and queued requests by scheduling priority (SGLang priority scheduling),
    # summed over the replicas that report them: a breakdown of active / queued, never added to them
    active_by_priority: dict[str, float] = field(default_factory=dict)
    queued_by_priority: dict[str, float] = field(default_factory=dict)
    # hybrid models' KV pools ("full", "swa", "mamba"): pool -> used over capacity, summed over the
    # replicas that have the pool; the fullest one bounds how many requests fit
    kv_pool_usage: dict[str, float] = field(default_factory=dict)
    # requests waiting in front of the engines, in a router's or gateway's queue (llm-d / inference
    # gateway flow control, Dynamo's router), by gateway; {}: no gateway reports a queue for the pool
    gateway_queued: dict[str, float] = field(default_factory=dict)
    # how each gateway's figure was found: "queue" (its own queue gauge), "in_flight" (its requests in
    # flight beyond what the engines hold), "estimate" (its arrival rate x its latency beyond the engines')
    gateway_queued_source: dict[str, str] = field(default_factory=dict)
    # the gateway's added latency: its call latency quantiles less the engines' end-to-end ones over
    # the task window (monitor/capacity/gateway_latency.py); None: no gateway latency for the pool
    gateway_added_latency: Optional[Quantiles] = None
    engines: tuple[str, ...] = ()  # the engine kinds serving the pool: "vllm", "sglang"
    kv_tokens_live: Optional[float] = None  # the estimate: partial last blocks corrected (derive/kv_band.py)
    kv_tokens_live_low: Optional[float] = None
    kv_tokens_live_high: Optional[float] = None  # what block usage implies (usage x capacity)
    kv_tokens_method: Optional[str] = None
    kv_tokens_capacity: Optional[float] = None
    kv_usage_ratio: Optional[float] = None  # the engines' block usage (high / capacity)
    # requests in chat templating / tokenisation before admission (vLLM 0.34 render histogram:
    # rate x mean duration = the increase of its _sum per second); None without the family
    rendering_requests: Optional[float] = None
    # requests per second turned away over the rate window, by reason (SHED_REASONS); {}: no source
    # reports any (unknown, not 0)
    shed_rates: dict[str, float] = field(default_factory=dict)
    queue_growth_rate: Optional[float] = None  # engine queue's change per second over the rate window
    # replicas' capacity lost to slowness: sum over slow replicas of 1 - 1 / latency ratio (monitor/step/cycle_step.py)
    slow_capacity_lost: float = 0.0
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
    # Prometheus mode: the pool's cumulative latency histograms as the query layer summed them (for
    # pool SLOs); None: summed here from the replicas' (direct mode)
    latency_totals: Optional[dict[str, Histogram]] = None
    latency_totals_at: Optional[float] = None  # when those were read (None: this cycle)
    capacity: Optional[Capacity] = None  # monitor.capacity (knee, headroom, sessions, power)
    tasks: Optional[PoolTasks] = None  # monitor.capacity.tasks, from gateway / application metrics
    forecast: Optional[PoolForecastLike] = None  # the forecaster's latest result for this pool
    # horizon -> fewest replicas whose knee capacity with one lost holds the forecast's 95 % peak
    recommended_replicas: dict[str, int] = field(default_factory=dict)
    replica_lead_time_seconds: Optional[float] = None  # a new replica's start-up: configured, else measured
    replica_lead_time_source: Optional[str] = None  # "configured" (pools.<pool>.replica_lead_time) | "measured"
    # the edges (monitor/derive/edges.py): KV capacity per tier ("gpu", "cpu", "lmcache_cpu", ...),
    # prefix-cache hit tokens per second and their share of prompt tokens by the tier that supplied
    # them, speculative decoding's acceptance, LoRA adapter slots, LMCache's hit ratio, offload
    # allocation failures per second; {} / None when no replica reports them
    kv_tiers: dict[str, KvTier] = field(default_factory=dict)
    prefix_hit_rates: dict[str, float] = field(default_factory=dict)
    prefix_hit_shares: dict[str, float] = field(default_factory=dict)
    spec_acceptance_ratio: Optional[float] = None  # accepted / draft tokens over the rate window
    spec_acceptance_length: Optional[float] = None  # 1 + accepted / drafts: tokens per decode step
    spec_acceptance_by_position: dict[str, float] = field(default_factory=dict)  # position -> accepted / drafts
    lora: Optional[LoraSlots] = None
    lmcache_hit_ratio: Optional[float] = None  # LMCache hit / requested tokens over the rate window
    kv_offload_allocation_failure_rate: Optional[float] = None  # per second: the CPU tier was full
    spare: Optional[Spare] = None  # spare capacity for deferrable work until the next peak (capacity/spare.py)

    @property
    def gateway_queued_requests(self) -> Optional[float]:
        return sum(self.gateway_queued.values()) if self.gateway_queued else None

    @property
    def name(self) -> str:
        """The `pool` label: the pool's name without the labels its key carries (monitor/model/poolkey.py)."""
        return name_of(self.pool)

    @property
    def extra_labels(self) -> dict[str, str]:
        """The pool_by labels carried beside `pool` (e.g. {"cluster": "a"}); {} with one pool_by label."""
        return extras_of(self.pool)

    @property
    def shed_rate(self) -> Optional[float]:
        """Requests per second turned away; None when no source reports any. The engines' and the
        application's reasons (rejected, aborted, abandoned: give-ups beyond the aborts) and the
        gateways' (gateway_*) are not added: a gateway in front of the engines relays their
        rejections and sees its clients' give-ups as errors or timeouts, so the larger of the two
        sums is taken."""
        if not self.shed_rates:
            return None
        gateway = sum(v for k, v in self.shed_rates.items() if k.startswith("gateway_"))
        engine = sum(v for k, v in self.shed_rates.items() if not k.startswith("gateway_"))
        return max(gateway, engine)

    @property
    def offered_requests(self) -> Optional[float]:
        """The load offered to the pool in concurrent requests: the served active requests plus
        the arrivals not served, each holding a mean service time (by Little's law, what they would
        have held): the shed ones (`shed_rate`) and the queue's growth over the window (arrivals
        the engines have not caught up with, counted until they are served or shed). The service
        time is the window's mean end-to-end latency less its mean queue time. A steady queue adds
        nothing: its requests are served in turn (in `active_requests`) or shed. None when no
        source reports shed requests, or some arrivals were not served and no latency is known."""
        active, shed = self.active_requests, self.shed_rate
        if active is None or shed is None:
            return None
        unserved = shed + max(0.0, self.queue_growth_rate or 0.0)
        if unserved <= 0:
            return active
        e2e, queue = self.latency.get("e2e"), self.latency.get("queue")
        if e2e is None or e2e.mean is None:
            return None
        service = e2e.mean - (queue.mean if queue is not None and queue.mean is not None else 0.0)
        return active + unserved * max(0.0, service)

    @property
    def load_requests(self) -> Optional[float]:
        """What headroom, utilisation and the forecasts count: active + engine queued + gateway
        queued. Unknown (None) when the engines' active or queued count is."""
        if self.active_requests is None or self.queued_requests is None:
            return None
        return self.active_requests + self.queued_requests + (self.gateway_queued_requests or 0.0)


@dataclass(frozen=True)
class Alert:
    """One of headroom's alerts as the configured Prometheus or Alertmanager shows it."""

    name: str
    state: str  # "firing" | "pending" (Prometheus: its `for:` has not elapsed yet)
    severity: str = ""
    pool: Optional[str] = None
    summary: str = ""
    since: Optional[float] = None  # epoch seconds it became active
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"alertname": self.name, "state": self.state, "severity": self.severity, "pool": self.pool,
                "summary": self.summary, "since": self.since}


@dataclass
class SourceStatus:
    source: str  # "vllm", "prometheus", "gateway", "dcgm"
    target: str
    up: bool
    error: Optional[str] = None  # reason: "timeout", "connect", "http_5xx", "parse", ...
    detail: Optional[str] = None
    duration_seconds: Optional[float] = None
    attempted: bool = True  # False while a failing target waits out its backoff (not a new error)
    missing: tuple[str, ...] = ()  # families of the metric contract the target did not expose (monitor/sources/vllm.py)
    slow: bool = False  # up, but slow: answered after global.scrape_timeout or the cycle deadline, or
    # missed this cycle while its last reading is kept (a gateway under load: monitor/sources/auxiliary.py)


@dataclass
class Snapshot:
    timestamp: float
    pools: list[PoolSnapshot] = field(default_factory=list)
    sources: list[SourceStatus] = field(default_factory=list)
    cycle_duration_seconds: Optional[float] = None
    last_success_timestamp: Optional[float] = None
    errors: dict[str, float] = field(default_factory=dict)  # counters by reason, cumulative
    # the pipeline's own counters, cumulative: cycles run, series cut by the cardinality cap (by
    # what), malformed-but-usable input (by kind)
    cycles: int = 0
    dropped: dict[str, float] = field(default_factory=dict)
    anomalies: dict[str, float] = field(default_factory=dict)
    # the forecaster's latest refit as the cycle found it (every pool it forecast, also pools not in
    # this cycle); each pool's own result is also on PoolSnapshot.forecast
    forecast: Optional[RefitResult] = None
    # headroom's alerts from sources.alerts (None: no alerts source, or it did not answer this cycle)
    alerts: Optional[list[Alert]] = None
    alerts_ui: Optional[str] = None  # the alerts page of that source, for the landing page's link
    clock_steps: dict[str, float] = field(default_factory=dict)  # wall-clock steps found, by direction (cumulative)
    query_clock_steps: dict[str, float] = field(default_factory=dict)  # Prometheus mode: the query layer's clock's
    # Prometheus mode: per part of the read (replicas, histograms) the age of the values in use; 0 fresh
    source_stale_seconds: dict[str, float] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)  # "source|target" -> cycles it was slow (cumulative)
