"""The typed inputs of the floors below the application, built from the whole `Config`.

Only the application (monitor/app) and the commands hold a `Config`; each floor below gets the plain,
typed values it reads, built here:

    capacity_inputs(cfg) -> CapacityInputs     the capacity layer (monitor/capacity/inputs.py)
    step_settings(cfg) -> StepSettings         the cycle's pure step (monitor/step/cycle_state.py)
    pipeline_settings(cfg) -> PipelineSettings the cycle's sources and deadline (monitor/pipeline/cycle.py)
    digest_history(cfg, settings, ...)         the digest's history reader (monitor/digest/schedule.py)
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from monitor.capacity.inputs import CapacityInputs
from monitor.capacity.slo import Target
from monitor.capacity.spare_pool import SpareSettings
from monitor.digest.settings import DigestSettings
from monitor.pipeline.cycle import PipelineSettings
from monitor.step.cycle_state import StepSettings

from .headroom_yml import Config


def capacity_inputs(cfg: Config) -> CapacityInputs:
    """The capacity layer's settings: pools.<name>.slo targets join the `slos:` section's pool targets."""
    slos = replace(cfg.slos, pool_targets=pool_slo_targets(cfg))
    return CapacityInputs(capacity=cfg.capacity, slos=slos, pools=dict(cfg.pools or {}), pool_by=cfg.pool_by,
                          latency_window=float(cfg.latency_window), interval=float(cfg.interval),
                          dcgm_replica_label=cfg.dcgm_replica_label)


def step_settings(cfg: Config) -> StepSettings:
    """What the cycle's pure step reads: the global keys, the gateways' pool maps, the spare keys, the pools."""
    return StepSettings(pool_by=cfg.pool_by, gateway_pools=tuple(gw.pools for gw in cfg.gateways),
                        forget_after=cfg.forget_after, max_models_per_target=cfg.max_models_per_target,
                        max_series=cfg.max_series, history_keep=cfg.history_keep, latency_window=cfg.latency_window,
                        stall_window=cfg.stall_window, shard=cfg.shard, spare=SpareSettings.of(cfg.capacity),
                        pools=dict(cfg.pools or {}))


def pipeline_settings(cfg: Config) -> PipelineSettings:
    """What the cycle reads besides its step: the sources' sections, the cycle's global keys, the pool SLOs' signals."""
    return PipelineSettings(step=step_settings(cfg), interval=cfg.interval, scrape_timeout=cfg.scrape_timeout,
                            scrape_concurrency=cfg.scrape_concurrency, scrape_memory_mib=cfg.scrape_memory_mib,
                            vllm_targets=tuple(cfg.vllm_targets), vllm_auth=cfg.vllm_auth, prometheus=cfg.prometheus,
                            gateways=tuple(cfg.gateways), dcgm_targets=tuple(cfg.dcgm_targets), alerts=cfg.alerts,
                            slo_signals=pool_slo_signals(cfg), slo_seconds=pool_slo_seconds(cfg),
                            slo_pools=pool_slo_pools(cfg))


def pool_slo_signals(cfg: Config) -> tuple[str, ...]:
    """The latency signals with a pool SLO (slos: pools, pools.<name>.slo): Prometheus mode reads
    their cumulative buckets per pool."""
    return tuple(sorted(pool_slo_seconds(cfg)))


def pool_slo_targets(cfg: Config) -> dict[str, list[Target]]:
    """Each pool with a pool SLO (its name or key, as the `slos:` section and `pools:` name it) -> its
    targets as the capacity layer judges them: pools.<name>.slo in place of the `slos:` section's."""
    return {**cfg.slos.pool_targets, **{pool: list(ps.slo) for pool, ps in (cfg.pools or {}).items() if ps.slo}}


def pool_slo_pools(cfg: Config) -> dict[str, tuple[str, ...]]:
    """Each pool with a pool SLO -> the latency signals of its targets (`pool_slo_targets`)."""
    return {pool: tuple(sorted({t.signal for t in ts})) for pool, ts in sorted(pool_slo_targets(cfg).items()) if ts}


def pool_slo_seconds(cfg: Config) -> dict[str, tuple[float, ...]]:
    """Each latency signal with a pool SLO -> its targets' seconds, every pool's (`pool_slo_targets`):
    Prometheus mode reads only the buckets around them each cycle (monitor/sources/prometheus_pool_totals.py)."""
    out: dict[str, set[float]] = {}
    for t in (t for ts in pool_slo_targets(cfg).values() for t in ts):
        out.setdefault(t.signal, set()).add(float(t.seconds))
    return {signal: tuple(sorted(seconds)) for signal, seconds in sorted(out.items())}


def digest_history(cfg: Config, settings: DigestSettings, store=None, knees: Optional[Callable[[], dict]] = None):
    """`build_fn(week_end)` of the digest over the configured history (monitor/digest/schedule.py
    `history_build_fn`): `store`, else store.path, else sources.prometheus; `global.shard`'s pools."""
    from monitor.digest.schedule import history_build_fn  # noqa: PLC0415  (the digest's modules, when used)
    return history_build_fn(settings, store=store, store_path=cfg.store_path, prometheus=cfg.prometheus,
                            pool_by=cfg.pool_by, shard=cfg.shard, file=cfg.file, knees=knees)
