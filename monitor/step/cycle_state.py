"""What the cycle's pure step reads and keeps (monitor/step/cycle_step.py `step`).

    StepSettings   what `step` reads of the configuration (built by monitor/config/inputs.py `step_settings`)
    CycleInputs    what one cycle read from its sources, parsed (monitor/pipeline/cycle.py `collect` builds it)
    CycleState     what a cycle leaves to the next one
    count_into     adds counts into a dict of counts (errors, anomalies, what was cut)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from ..capacity.enrich import CapacityState
from ..capacity.inputs import settings_of
from ..capacity.settings import PoolSettings
from ..capacity.spare_pool import SpareSettings
from ..derive.lead_time import LeadTimes
from ..model import Alert, RefitResult, ReplicaReading, SourceStatus
from ..model.readings import DcgmReading, GatewayScrape


@dataclass(frozen=True)
class StepSettings:
    """What `step` reads of the configuration: the `global:` keys below, each gateway's pool map
    (sources.gateways[i].pools), the spare-capacity keys of `capacity:` and the pools' settings.
    The application builds it from its Config (monitor/config/inputs.py `step_settings`)."""

    pool_by: tuple[str, ...] = ("model_name",)
    gateway_pools: tuple[Mapping[str, str], ...] = ()  # per gateway: its pool label -> headroom pool
    forget_after: float = 3600.0
    max_models_per_target: int = 64
    max_series: int = 100_000
    history_keep: float = 3600.0
    latency_window: float = 300.0
    stall_window: float = 60.0
    shard: Optional[tuple[int, int]] = None
    spare: SpareSettings = field(default_factory=SpareSettings)  # capacity.spare_* (monitor/capacity/spare_pool.py)
    pools: Mapping[str, PoolSettings] = field(default_factory=dict)  # pools: (name or *) -> settings

    def pool_settings(self, pool: str) -> PoolSettings:
        return settings_of(self.pools, pool)


@dataclass
class CycleInputs:
    """Everything one cycle read from its sources, parsed (plain data: monitor/model/, monitor/model/readings.py)."""

    readings: list[ReplicaReading]
    statuses: list[SourceStatus]
    gateways: list[GatewayScrape] = field(default_factory=list)  # one per configured gateway, in order
    dcgm: list[DcgmReading] = field(default_factory=list)  # the DCGM exporters that answered and parsed
    anomalies: dict[str, float] = field(default_factory=dict)  # malformed-but-usable input this cycle
    forecast: Optional[RefitResult] = None  # the forecaster's latest result (None: no forecaster yet)
    alerts: Optional[list[Alert]] = None  # headroom's alerts from sources.alerts (None: not read this cycle)
    alerts_ui: Optional[str] = None  # that source's alerts page
    # Prometheus mode: the SLO burn windows read from Prometheus (monitor/history/slo_history.py); None: not read
    slo_windows: Optional[dict] = None
    # Prometheus mode (monitor/sources/prometheus_reader.py PrometheusRead): per pool, the latency histograms
    # the query layer summed over the window and cumulative (read at `pool_totals_at`, the `now` of the
    # cycle they answered in: a reused answer is never a new point of a pool SLO); the age of each part's values
    pool_histograms: Optional[dict] = None
    pool_totals: Optional[dict] = None
    pool_totals_at: Optional[float] = None
    stale_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class CycleState:
    """What a cycle leaves to the next one."""

    settings: StepSettings
    capacity: Optional[CapacityState] = None  # None: the pipeline has no capacity layer
    history: dict[str, deque[ReplicaReading]] = field(default_factory=dict)  # "target|model" -> readings
    errors: dict[tuple[str, str], float] = field(default_factory=dict)  # (source, reason) -> count
    slow: dict[tuple[str, str], float] = field(default_factory=dict)  # (source, target) -> cycles slow
    dropped: dict[str, float] = field(default_factory=dict)  # what the cardinality cap cut
    anomalies: dict[str, float] = field(default_factory=dict)  # malformed-but-usable input, by kind
    cycles: int = 0
    last_success: Optional[float] = None
    last_fresh: dict[str, float] = field(default_factory=dict)  # pool -> last time it was not stale
    down: dict[tuple[str, str], str] = field(default_factory=dict)  # (source, target) -> its error, while down
    down_seen: dict[tuple[str, str], float] = field(default_factory=dict)  # (source, target) -> last time down
    lead_times: LeadTimes = field(default_factory=LeadTimes)  # new replicas' time to their first completion
    # (pool, replica) -> (KV capacity in tokens, when last read); a change is counted and logged once
    kv_capacity: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    kv_capacity_changes: dict[tuple[str, str], float] = field(default_factory=dict)
    slow_since: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, replica) -> ratio high since
    slow_named: set[tuple[str, str]] = field(default_factory=set)  # named slow (logged once)
    # (pool, model) of every pool of the last cycle, this shard's or not: a gateway's scope is taken
    # over the whole fleet, so two shards never both take a reading that two pools answer to
    fleet: list[tuple[str, str]] = field(default_factory=list)

    def shift_time(self, seconds: float) -> None:
        """Move every time kept onto a wall clock that stepped by `seconds` (monitor/pipeline/cycle.py), so
        windows and rates keep measuring the true time between readings."""
        for key, dq in self.history.items():
            self.history[key] = deque(replace(r, timestamp=r.timestamp + seconds) for r in dq)
        if self.last_success is not None:
            self.last_success += seconds
        self.last_fresh = {pool: t + seconds for pool, t in self.last_fresh.items()}
        self.down_seen = {key: t + seconds for key, t in self.down_seen.items()}
        self.kv_capacity = {key: (cap, t + seconds) for key, (cap, t) in self.kv_capacity.items()}
        self.slow_since = {key: t + seconds for key, t in self.slow_since.items()}
        self.lead_times.shift_time(seconds)
        if self.capacity is not None:
            self.capacity.shift_time(seconds)


def count_into(counts: dict, more: dict) -> None:
    for key, n in more.items():
        counts[key] = counts.get(key, 0.0) + n
