"""Plain data shared by every layer. No I/O here, no clocks.

    values.py     a replica's reading and what it is made of: ReplicaReading, Histogram, Quantiles, the names
    capacity.py   what the capacity layer says of a pool: Capacity, Scenarios, Limits, PoolTasks, TaskStats, PoolSlo
    spare.py      spare capacity for deferrable work: Spare, SpareWindow
    snapshot.py   a cycle's result: ReplicaSnapshot, PoolSnapshot, Snapshot, SourceStatus, Alert, RefitResult
"""
from .capacity import Capacity, Limits, PoolSlo, PoolTasks, Scenarios, TaskStats
from .snapshot import Alert, PoolForecastLike, PoolSnapshot, RefitResult, ReplicaSnapshot, Snapshot, SourceStatus
from .spare import Spare, SpareWindow
from .values import COUNTERS, HISTOGRAMS, SHED_REASONS, Histogram, KvTier, LoraSlots, Quantiles, ReplicaReading

__all__ = [
    "Capacity",
    "Limits",
    "PoolSlo",
    "PoolTasks",
    "Scenarios",
    "TaskStats",
    "Alert",
    "PoolForecastLike",
    "PoolSnapshot",
    "RefitResult",
    "ReplicaSnapshot",
    "Snapshot",
    "SourceStatus",
    "Spare",
    "SpareWindow",
    "COUNTERS",
    "HISTOGRAMS",
    "SHED_REASONS",
    "Histogram",
    "KvTier",
    "LoraSlots",
    "Quantiles",
    "ReplicaReading",
]
