"""Wires the optional layers (capacity, history store, forecasts, web security) into the daemon.

Kept apart from cycle.py so the pipeline stays small and each layer can be absent.
"""
from __future__ import annotations

import logging
from typing import Callable

from .capacity.enrich import CapacityState
from .config import Config
from .export.webconfig import web_security  # noqa: F401  (run.py and demo.py import it from here)

log = logging.getLogger(__name__)


def capacity_state(cfg: Config) -> CapacityState:
    """The capacity layer for a pipeline: its settings checked (ValueError naming the key)."""
    return CapacityState(cfg)


# ---- history store and forecasts ------------------------------------------------------------

def history_points(snapshot) -> list[tuple[str, str, float, float]]:
    """What each cycle adds to the embedded history store, in the history schema's names
    (monitor/history/schema.py: active and queued apart, their sum as `load`)."""
    from .history.store import points_from_snapshot  # noqa: PLC0415
    return points_from_snapshot(snapshot)


def capacity_at_knee(snapshot) -> dict[str, float]:
    """Pool -> concurrent requests at the knee (the effective capacity) for the exhaustion time."""
    out = {}
    for p in (snapshot.pools if snapshot else []):
        cap = p.capacity
        if cap is None:
            continue
        effective = cap.capacity_requests.effective
        value = effective if effective is not None else cap.knee_requests
        if value is not None:
            out[p.pool] = float(value)
    return out


def attach_history_and_forecasts(daemon, history_days: float = 35.0, step: float = 300.0) -> None:
    """Persist each snapshot's pool series (direct mode, or wherever a store is configured) and refit
    forecasts on a schedule (never in a scrape); the pipeline reads the forecaster's latest result at
    each cycle. In Prometheus mode the forecasts read their history from Prometheus itself, so a new
    install forecasts from the history Prometheus already holds; the store is then an optional cache."""
    cfg = daemon.cfg
    if not (cfg.store_path or cfg.prometheus):
        return
    store = None
    if cfg.store_path:
        from .forecast.store import HistoryStore  # noqa: PLC0415

        store = HistoryStore(cfg.store_path, retention_seconds=cfg.store_retention)
        daemon.store = store
        _seed_trends(daemon, store)

        def persist(snapshot) -> None:
            try:
                store.append(history_points(snapshot))
            except Exception:
                log.exception("history store append failed")
        daemon.pipeline.on_snapshot(persist)

    source = history_source(cfg, store)
    client = getattr(source, "client", None)  # Prometheus mode: its own client, closed at stop
    if client is not None and hasattr(client, "close"):
        daemon.on_stop.append(client.close)
    forecaster = store_forecaster(cfg, source, daemon.pipeline.clock,
                                  lambda: capacity_at_knee(daemon.pipeline.latest), history_days, step)
    daemon.forecaster = forecaster
    daemon.pipeline.forecasts = forecaster.latest.get  # each cycle carries the latest refit

    def start_jobs(d) -> None:
        forecaster.start()
        if store is not None:
            d.scheduler.add_job(lambda: store.maintain(d.pipeline.clock()), "interval", hours=1,
                                id="store-maintenance", max_instances=1, coalesce=True)
    daemon.extra_jobs.append(start_jobs)
    daemon.on_stop.append(lambda: (forecaster.shutdown(wait=False), store.close() if store else None))


def _seed_trends(daemon, store) -> None:
    """The landing chart starts with the stored hours (active and queued apart)."""
    now = daemon.pipeline.clock()
    since = now - daemon.state.trends.keep
    for pool, series in store.series_keys():
        if series == "active_requests":
            active = store.query(pool, "active_requests", since, now, step=300, agg="mean")
            queued = store.query(pool, "queued_requests", since, now, step=300, agg="mean")
            daemon.state.trends.seed(pool, [(float(t), float(v), float(queued.get(t, 0.0)), 0.0)
                                            for t, v in active.items()])


def history_source(cfg: Config, store):
    """Where the forecasts read history: Prometheus in Prometheus mode, else the embedded store."""
    if cfg.prometheus is not None:
        from .history.prometheus import PrometheusHistory  # noqa: PLC0415
        return PrometheusHistory.from_config(cfg.prometheus, pool_by=cfg.pool_by)
    from .history.store import StoreHistory  # noqa: PLC0415
    return StoreHistory(store)


def store_forecaster(cfg: Config, source, clock: Callable[[], float], capacity: Callable[[], dict],
                     history_days: float = 35.0, step: float = 300.0):
    """The `ForecastScheduler` over a history source (monitor/history): what the daemon refits on its
    schedule and `headroom once` refits once. `capacity()`: pool -> concurrent requests at the knee."""
    from .forecast.backtest import ForecastSettings  # noqa: PLC0415
    from .forecast.history import forecast_history  # noqa: PLC0415
    from .forecast.pool import PoolSettings  # noqa: PLC0415
    from .forecast.scheduler import ForecastScheduler  # noqa: PLC0415

    def load_history() -> dict:
        hist = forecast_history(source, clock(), days=history_days, step=step)
        if cfg.shard is not None:
            from .shard import owns  # noqa: PLC0415
            hist = {pool: series for pool, series in hist.items() if owns(pool, cfg.shard)}
        return hist

    fc = cfg.forecast  # typed and validated at load (monitor/config/headroom.py Forecast)
    settings = PoolSettings(forecast=ForecastSettings(fit_timeout_seconds=fc.fit_timeout_seconds))
    return ForecastScheduler(load_history, capacity, settings, interval_minutes=fc.refit_minutes, clock=clock)
