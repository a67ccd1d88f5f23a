"""What the capacity layer reads of the configuration: one frozen, typed value.

    inputs = CapacityInputs(capacity=..., slos=..., pools=..., pool_by=..., latency_window=..., ...)
    state = CapacityState(inputs)            # monitor/capacity/enrich.py

The application builds it from its `Config` (monitor/config/inputs.py `capacity_inputs`); the capacity
layer never sees the whole configuration. `slos` are the merged targets: the `slos:` section's and each
pool's `pools.<name>.slo`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from monitor.capacity.settings import Capacity, PoolSettings
from monitor.capacity.slo import SloSettings
from monitor.model.poolkey import name_of


@dataclass(frozen=True)
class CapacityInputs:
    """The `capacity:` section, the merged SLO targets, the pools' settings and labels, the windows."""

    capacity: Capacity = field(default_factory=Capacity)
    slos: SloSettings = field(default_factory=SloSettings)  # slos: and pools.<name>.slo, merged
    pools: Mapping[str, PoolSettings] = field(default_factory=dict)  # name or * -> settings (a copy of the file's)
    pool_by: tuple[str, ...] = ("model_name",)  # global.pool_by: the labels that key a pool
    latency_window: float = 300.0  # global.latency_window: the load and latency window
    interval: float = 0.0  # global.interval: the SLO windows' tolerance
    dcgm_replica_label: Optional[str] = "Hostname"  # sources.dcgm.replica_label: matched to a replica first

    def pool_settings(self, pool: str) -> PoolSettings:
        return settings_of(self.pools, pool)


def settings_of(pools: Mapping[str, PoolSettings], pool: str) -> PoolSettings:
    """A pool's settings (pools:): by its key, its name, else `*`, else the defaults."""
    return pools.get(pool) or pools.get(name_of(pool)) or pools.get("*") or PoolSettings()
