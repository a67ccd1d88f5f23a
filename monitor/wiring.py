"""Wires the optional layers (capacity, tasks, forecasts, web security) into the daemon.

Kept apart from cycle.py so the pipeline stays small and each layer can be absent.
"""
from __future__ import annotations

import logging

from .config import Config
from .export.webconfig import web_security  # noqa: F401  (run.py and demo.py import it from here)

log = logging.getLogger(__name__)


def default_enrichers(cfg: Config) -> list:
    enrichers = []
    try:
        from .capacity.enrich import make_enricher  # noqa: PLC0415
    except ImportError:
        make_enricher = None
    if make_enricher is not None:
        enrichers.append(make_enricher(cfg))
    return enrichers


def extra_samples(daemon) -> list[tuple[str, dict[str, str], float]]:
    p = daemon.pipeline
    out = [("headroom_cycles", {}, float(p.cycles))]
    for what, v in sorted(p.dropped.items()):
        out.append(("headroom_dropped_series", {"what": what}, v))
    for kind, v in sorted(p.anomalies.items()):
        out.append(("headroom_input_anomalies", {"kind": kind}, v))
    stats = getattr(daemon.state, "web_stats", None)
    if stats is not None:
        for event, v in stats.as_dict().items():
            if event in stats.COUNTERS:
                out.append(("headroom_web_events", {"event": event}, float(v)))
        out.append(("headroom_web_open_connections", {}, float(stats.open_connections)))
    for hook in getattr(daemon, "sample_hooks", []):
        out.extend(hook())
    return out


# ---- history store and forecasts ------------------------------------------------------------

def history_points(snapshot) -> list[tuple[str, str, float, float]]:
    """What each cycle adds to the embedded history store, per fresh pool (pure).

    active_requests is the concurrency the knee is about (active + queued); arrival_rate is the
    completion rate over the rate window (equal to arrivals on average); task_arrivals:<type> come
    from the gateway / application task metrics.
    """
    out = []
    t = snapshot.timestamp
    for p in snapshot.pools:
        if p.stale or p.replicas == 0:
            continue
        out.append((p.pool, "active_requests", t, float(p.active_requests + p.queued_requests)))
        out.append((p.pool, "queued_requests", t, float(p.queued_requests)))
        if p.kv_tokens_live is not None:
            out.append((p.pool, "kv_tokens", t, float(p.kv_tokens_live)))
        if p.completion_rate is not None:
            out.append((p.pool, "arrival_rate", t, float(p.completion_rate)))
        sessions = (p.capacity or {}).get("sessions")
        if sessions is not None:
            out.append((p.pool, "sessions", t, float(sessions)))
        for task_type, d in (p.tasks or {}).items():
            if isinstance(d, dict) and d.get("arrival_rate") is not None:
                out.append((p.pool, "task_arrivals:" + task_type, t, float(d["arrival_rate"])))
    return out


def capacity_at_knee(snapshot) -> dict[str, float]:
    """Pool -> concurrent requests at the knee (the effective capacity) for the exhaustion time."""
    out = {}
    for p in (snapshot.pools if snapshot else []):
        cap = p.capacity or {}
        effective = (cap.get("capacity_requests") or {}).get("effective") if isinstance(
            cap.get("capacity_requests"), dict) else None
        value = effective if effective is not None else cap.get("knee_requests")
        if value is not None:
            out[p.pool] = float(value)
    return out


def attach_history_and_forecasts(daemon, history_days: float = 35.0, step: float = 300.0) -> None:
    """Persist each snapshot's pool series and refit forecasts on a schedule (never in a scrape)."""
    cfg = daemon.cfg
    if not cfg.store_path:
        return
    from .forecast.pool import metric_samples, valid_series_name  # noqa: PLC0415
    from .forecast.scheduler import ForecastScheduler  # noqa: PLC0415
    from .forecast.store import HistoryStore  # noqa: PLC0415

    store = HistoryStore(cfg.store_path, retention_seconds=cfg.store_retention)
    daemon.store = store
    now = daemon.pipeline.clock()
    for pool, series in store.series_keys():  # the landing chart starts with the stored hours
        if series == "active_requests":
            since = now - daemon.state.trends.keep
            total = store.query(pool, series, since, now, step=300, agg="mean")
            queued = store.query(pool, "queued_requests", since, now, step=300, agg="mean")
            daemon.state.trends.seed(pool, [(float(t), float(v) - float(queued.get(t, 0.0)),
                                             float(queued.get(t, 0.0)), 0.0) for t, v in total.items()])

    def persist(snapshot) -> None:
        try:
            store.append(history_points(snapshot))
        except Exception:
            log.exception("history store append failed")
    daemon.pipeline.on_snapshot(persist)

    def load_history() -> dict:
        now = daemon.pipeline.clock()
        out: dict = {}
        for pool, series in store.series_keys():
            if not valid_series_name(series):
                continue  # kept for the landing page and the digest, not forecast
            if cfg.shard is not None:
                from .shard import owns  # noqa: PLC0415
                if not owns(pool, cfg.shard):
                    continue
            out.setdefault(pool, {})[series] = store.query(pool, series, now - history_days * 86400, now,
                                                           step=step, agg="max")
        return out

    from .forecast.backtest import ForecastSettings  # noqa: PLC0415
    from .forecast.pool import PoolSettings  # noqa: PLC0415
    fc = cfg.forecast  # typed and validated at load (monitor/config/headroom.py Forecast)
    interval = fc.refit_minutes
    settings = PoolSettings(forecast=ForecastSettings(fit_timeout_seconds=fc.fit_timeout_seconds))
    forecaster = ForecastScheduler(load_history, lambda: capacity_at_knee(daemon.pipeline.latest), settings,
                                   interval_minutes=interval, clock=daemon.pipeline.clock)
    daemon.forecaster = forecaster

    def samples() -> list:
        res = forecaster.latest.get()
        if res is None:
            return []
        out = [("headroom_forecast_last_fit_timestamp_seconds", {}, float(res.finished))]
        for pool, result in sorted(res.pools.items()):
            out.extend(metric_samples(pool, result))
        return out
    daemon.sample_hooks.append(samples)

    def start_jobs(d) -> None:
        forecaster.start()
        d.scheduler.add_job(lambda: store.maintain(d.pipeline.clock()), "interval", hours=1,
                            id="store-maintenance", max_instances=1, coalesce=True)
    daemon.extra_jobs.append(start_jobs)
    daemon.on_stop.append(lambda: (forecaster.shutdown(wait=False), store.close()))
