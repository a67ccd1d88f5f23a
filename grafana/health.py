"""The "headroom itself" rows of the fleet dashboard (grafana/build.py): headroom's own health."""
from __future__ import annotations

from blocks import HA_LABELS, P, row, stat, target, timeseries


def self_health() -> list[dict]:
    """The "headroom itself" rows of the fleet dashboard: sources, cycles, clock, store, web, shards, digest."""
    def per_s(metric: str, by: str) -> str:  # a counter's rate, one copy of an HA pair's
        return f"sum by ({by}) (max without ({HA_LABELS}) (rate({metric}[$__rate_interval])))"

    return [
        row("headroom itself"),
        timeseries("Sources up", [
            # every pod of every shard reads every source: one line per source target, up if any pod reaches it
            target(f"max without ({HA_LABELS}, headroom_shard) (headroom_source_up)", "{{source}} {{target}}",
                   dedup_ha=False),
        ], min_=0, description="1 when some headroom pod reached and parsed the source in the last cycle "
                               "(HeadroomSourceDown).", w=8),
        stat("Seconds since the last successful cycle",
             [target("time() - headroom_last_success_timestamp_seconds", "since last success")], unit="s",
             thresholds=[(None, "green"), (120, "orange"), (300, "red")], w=4, h=8,
             description="HeadroomDataStale fires above 5 minutes."),
        timeseries("Stale pools and stale query-layer parts", [
            target(f"headroom_pool_stale{{{P}}}", "{{pool}}"),
            target("headroom_source_stale_seconds", "{{source}} {{part}} stale (s)"),
        ], min_=0, w=6, description="1 while a pool's values are withheld (HeadroomPoolStale); in Prometheus "
                                    "mode, how old the values kept from a query-layer part that failed are."),
        timeseries("Cycle duration and source errors", [
            target("headroom_cycle_duration_seconds", "cycle duration (s)"),
            target(f"sum by (source, reason) (max without ({HA_LABELS}) "
                   "(rate(headroom_source_errors_total[$__rate_interval])))",
                   "{{source}} {{reason}} errors/s", dedup_ha=False),
            target(f"sum by (what) (max without ({HA_LABELS}) (rate(headroom_dropped_series_total[$__rate_interval])))",
                   "dropped {{what}}/s", dedup_ha=False),
            target(f"max without ({HA_LABELS}, headroom_shard) (headroom_source_duration_seconds)",
                   "{{source}} {{target}} request (s)", dedup_ha=False),
            target(f"sum by (source, target) (max without ({HA_LABELS}, headroom_shard) "
                   "(rate(headroom_source_slow_total[$__rate_interval])))", "{{source}} {{target}} slow/s",
                   dedup_ha=False),
        ], w=6, description="A gateway slow under load is slow, not down (headroom_source_slow_total, up stays 1); "
                            "request (s) is each source's last request time."),
        row("headroom itself: cycles, store, web, digest"),
        timeseries("Cycle age vs interval", [
            target("headroom_last_cycle_age_seconds", "since the last cycle (s)"),
            target("3 * headroom_cycle_interval_seconds", "3 x interval (HeadroomCyclesStopped)"),
            target(per_s("headroom_cycles_total", "job"), "cycles/s", dedup_ha=False),
        ], min_=0, w=8, description="Seconds since the last cycle on the monotonic clock; HeadroomCyclesStopped "
                                    "fires above 3 collection intervals."),
        timeseries("Clock steps, input anomalies, store and render errors", [
            target(per_s("headroom_clock_steps_total", "direction"), "clock step {{direction}}/s", dedup_ha=False),
            target(per_s("headroom_input_anomalies_total", "kind"), "anomaly {{kind}}/s", dedup_ha=False),
            target(per_s("headroom_store_errors_total", "operation"), "store error {{operation}}/s", dedup_ha=False),
            target(per_s("headroom_render_errors_total", "family"), "render error {{family}}/s", dedup_ha=False),
        ], unit="reqps", min_=0, w=8, description="Wall-clock steps, malformed input seen and dropped (never fatal), "
                                                  "history store failures (HeadroomHistoryStoreFailing) and parts "
                                                  "of /metrics dropped by a render failure (HeadroomRenderErrors)."),
        timeseries("Pool freshness and headroom in requests", [
            target(f"time() - headroom_pool_last_fresh_timestamp_seconds{{{P}}}", "{{pool}} seconds since fresh"),
            target(f"headroom_headroom_requests{{{P}}}", "{{pool}} requests left before the knee ({{scenario}})"),
        ], w=8, description="How old each pool's values are, and further concurrent requests that fit before the "
                            "knee (current, N-1)."),
        timeseries("headroom web server", [
            target(per_s("headroom_web_events_total", "event"), "{{event}}/s", dedup_ha=False),
            target("headroom_web_open_connections", "open connections"),
        ], min_=0, w=8, description="headroom's own /metrics and landing page server: connections, timeouts, "
                                    "overload (503)."),
        timeseries("Shards exporting vs configured", [
            target(f"count(max without ({HA_LABELS}, headroom_shard) (headroom_shards))", "exporting", dedup_ha=False),
            target("max(headroom_shards)", "configured"),
        ], min_=0, w=8, description="Shards that export headroom_shards against how many there should be "
                                    "(HeadroomShardDown)."),
        timeseries("Weekly digest", [
            target("time() - headroom_digest_last_success_timestamp_seconds", "seconds since delivered"),
            target("headroom_digest_pending_deliveries", "pending deliveries"),
        ], min_=0, w=8, description="Since the digest last reached every destination, and deliveries waiting."),
    ]
