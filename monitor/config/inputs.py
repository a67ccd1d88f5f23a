"""The typed inputs of the floors below the application, built from the whole `Config`.

Only the application (monitor/app) and the commands hold a `Config`; each floor below gets the plain,
typed values it reads, built here:

    capacity_inputs(cfg) -> CapacityInputs     the capacity layer (monitor/capacity/inputs.py)
"""
from __future__ import annotations

from dataclasses import replace

from monitor.capacity.inputs import CapacityInputs

from .headroom import Config


def capacity_inputs(cfg: Config) -> CapacityInputs:
    """The capacity layer's settings: pools.<name>.slo targets join the `slos:` section's pool targets."""
    pools = dict(cfg.pools or {})
    slos = replace(cfg.slos, pool_targets={**cfg.slos.pool_targets, **{
        pool: list(ps.slo) for pool, ps in pools.items() if ps.slo}})
    return CapacityInputs(capacity=cfg.capacity, slos=slos, pools=pools, pool_by=cfg.pool_by,
                          latency_window=float(cfg.latency_window), interval=float(cfg.interval),
                          dcgm_replica_label=cfg.dcgm_replica_label)
