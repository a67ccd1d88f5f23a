"""Plain data shared by every layer. No I/O here, no clocks.

    replica_reading.py  a replica's reading and what it is made of: ReplicaReading, Histogram, Quantiles, the names
    capacity.py   what the capacity layer says of a pool: Capacity, Scenarios, Limits, PoolTasks, TaskStats, PoolSlo
    spare_data.py  spare capacity for deferrable work: Spare, SpareWindow
    snapshot.py   a cycle's result: ReplicaSnapshot, PoolSnapshot, Snapshot, SourceStatus, Alert, RefitResult
    readings.py   what the cycle reads from gateways, routers and DCGM, typed (imported by its own name)
    schema.py     the history schema: the series, the bucket rule, HistorySource (imported by its own name)
    catalogue.py  THE list of exported metrics (`python -m monitor.model.catalogue > docs/metrics.md`)
    shard.py      which pools a shard owns;  poolkey.py  a pool's identity, its key and back
"""
from .capacity import Capacity, Limits, PoolSlo, PoolTasks, Scenarios, TaskStats
from .replica_reading import COUNTERS, HISTOGRAMS, SHED_REASONS, Histogram, KvTier, LoraSlots, Quantiles, ReplicaReading
from .snapshot import Alert, PoolForecastLike, PoolSnapshot, RefitResult, ReplicaSnapshot, Snapshot, SourceStatus
from .spare_data import Spare, SpareWindow

__all__ = [
    "Capacity", "Limits", "PoolSlo", "PoolTasks", "Scenarios", "TaskStats",
    "Alert", "PoolForecastLike", "PoolSnapshot", "RefitResult", "ReplicaSnapshot", "Snapshot", "SourceStatus",
    "Spare", "SpareWindow",
    "COUNTERS", "HISTOGRAMS", "SHED_REASONS", "Histogram", "KvTier", "LoraSlots", "Quantiles", "ReplicaReading",
]
