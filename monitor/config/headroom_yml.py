"""The assembly of headroom.yml: every section, declared next to its owner, read once into a frozen `Config`.

`Config` is the flat view the app reads (`cfg.interval`, `cfg.vllm_targets`); each field names the key
it comes from (`path="global.interval"`). Only the app floor (build, commands) sees the whole of
it; the floors below take their own section or a typed view built by monitor/config/inputs.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from monitor.capacity.settings import Capacity, PoolSettings
from monitor.capacity.slo import SloSettings
from monitor.capacity.slo_settings import SloSection
from monitor.digest.settings import DigestSettings, with_daemon
from monitor.forecast.settings import CalendarSection, Forecast
from monitor.kit.settings.kinds import Duration, File, Flag, Int, ListenAddress, StorePath, Text, Url
from monitor.kit.settings.reader import Reader, key
from monitor.kit.settings.shapes import ListOf, MapOf, Sub, group
from monitor.kit.settings.values import DAY
from monitor.model.catalogue import own_labels
from monitor.model.poolkey import PoolBySetting, extra_labels, name_of
from monitor.model.shard import ShardSetting
from monitor.sources.settings import (
    AlertsSource,
    EngineTarget,
    GatewaySource,
    HttpAuth,
    PrometheusSource,
    Target,
    check_gateway_labels,
)


def check_pool_by(pool_by: tuple[str, ...], r: Reader) -> None:
    """pool_by's extra labels are exported beside `pool` on every pool series: none may be a label
    headroom itself adds (monitor/model/catalogue.py `own_labels`: `kind`, `reason`, `le`, ...), or a
    series would carry it twice and one of the two values would be lost."""
    own = own_labels()
    for label in extra_labels(pool_by):
        if label in own:
            raise r.fail("global.pool_by", f"{label!r} is a label headroom adds to its own series (e.g. "
                         f"{own[label]}), so it cannot be carried beside the pool; only the last pool_by "
                         f"label may be {label!r}")


@dataclass(frozen=True)
class Config:
    """The whole file, frozen once read. A command that overrides a key (`--shard`, `once --interval`)
    reads the file again with the override (monitor/config `load(path, overrides)`), never
    `dataclasses.replace`, which would skip `check`."""

    file: str = "<defaults>"
    interval: float = key(Duration(gt=0, le=DAY), 15.0, path="global.interval",
                          help="one collection cycle every INTERVAL (cycles never overlap)")
    latency_window: float = key(Duration(gt=0, le=DAY), 300.0, path="global.latency_window",
                                help="histogram-bucket deltas over this window give the quantiles")
    scrape_timeout: float = key(Duration(gt=0, le=3600), 5.0, path="global.scrape_timeout",
                                help="time box of one scrape (connect, headers and body)")
    scrape_concurrency: int = key(Int(ge=1, le=4096), 32, path="global.scrape_concurrency",
                                  help="scrapes in flight at once")
    scrape_memory_mib: int = key(Int(ge=0, le=65536), 96, path="global.scrape_memory_mib",
                                 help="MiB of responses (heads and bodies together) all sources may hold at "
                                      "once beyond 1 MiB each; an answer past it fails too_large")
    pool_by: tuple[str, ...] = key(PoolBySetting(), ("model_name",), path="global.pool_by",
                                   help="target label that names the pool, or a list of labels (pools keyed by all "
                                        "of them): [cluster, model_name] makes the same model in two clusters two "
                                        "pools, each exported with pool= and cluster=; a label carried beside the "
                                        "pool may not be one headroom adds to its own series (kind, reason, le, ...)")
    stall_window: float = key(Duration(ge=0, le=DAY), 60.0, path="global.stall_window",
                              help="a replica holding work that completes nothing for this long is stalled "
                                   "(not counted as capacity); 0 turns the check off")
    history_keep: float = key(Duration(gt=0, le=7 * DAY), 3600.0, path="global.history_keep",
                              help="readings kept in memory per target (at least twice latency_window)")
    forget_after: float = key(Duration(gt=0, le=7 * DAY), 3600.0, path="global.forget_after",
                              help="what is kept per replica, instance, pool or gateway (knee estimators, SLO "
                                   "windows, lead times, down sources, last fresh times) is forgotten after "
                                   "this long unseen, so replica churn cannot grow memory")
    tune_gc: bool = key(Flag(), True, path="global.tune_gc",
                        help="the daemon sets Python's garbage collector for its cycles: what start-up and the "
                             "first cycle leave in memory is frozen out of later collections, and the youngest "
                             "objects are collected far less often (monitor/app/parts.py GarbageCollector: ~10% less "
                             "CPU per direct cycle, ~20% in Prometheus mode); false keeps Python's defaults")
    max_models_per_target: int = key(Int(ge=1, le=100_000), 64, path="global.max_models_per_target",
                                     help="models read from one target (or one instance in Prometheus mode); "
                                          "the rest are dropped and counted, so one runaway target cannot "
                                          "fill global.max_series")
    max_series: int = key(Int(ge=1, le=100_000_000), 100_000, path="global.max_series",
                          help="cardinality cap; what is dropped is counted")
    shard: Optional[tuple[int, int]] = key(ShardSetting(), path="global.shard",
                                           help="own only the pools of shard I of N (as --shard)")
    vllm_targets: list[Target] = key(ListOf(Sub(EngineTarget)), [], path="sources.vllm.targets",
                                     help="direct mode: each replica's /metrics, a URL or {url, labels}")
    vllm_auth: HttpAuth = group(HttpAuth, path="sources.vllm")
    prometheus: Optional[PrometheusSource] = key(Sub(PrometheusSource), path="sources.prometheus",
                                                 help="Prometheus mode (not with sources.vllm)")
    gateways: list[GatewaySource] = key(ListOf(Sub(GatewaySource)), [], path="sources.gateways",
                                        help="gateway and application task metrics")
    alerts: Optional[AlertsSource] = key(Sub(AlertsSource), path="sources.alerts",
                                         help="where the landing page reads firing alerts from")
    dcgm_targets: list[Target] = key(ListOf(Sub(Target)), [], path="sources.dcgm.targets",
                                     help="DCGM exporters (GPU power)")
    dcgm_replica_label: str = key(Text(), "Hostname", path="sources.dcgm.replica_label",
                                  help="DCGM label matched to a replica first")
    pools: dict[str, PoolSettings] = key(MapOf(Sub(PoolSettings), names="pool"), {}, path="pools",
                                         help="per pool (its name, or * for every pool)")
    listen_address: str = key(ListenAddress(), ":9880", path="web.listen_address",
                              help="address /metrics is served on (--web.listen-address wins)")
    web_config_file: Optional[str] = key(File(), path="web.config_file",
                                         help="TLS and basic auth of headroom's endpoints (--web.config.file wins)")
    web_links: dict[str, str] = key(MapOf(Url(), names="link label"), {}, path="web.links",
                                    help="label -> URL shown on the landing page (your Prometheus, Grafana, the digest)")
    store_path: Optional[str] = key(StorePath("history.sqlite", damaged_ok=True), path="store.path",
                                    help="embedded history for the forecasts (direct mode)")
    store_retention: float = key(Duration(gt=0), 35 * DAY, path="store.retention", help="history kept")
    capacity: Capacity = key(Sub(Capacity), Capacity(), help="knee and capacity knobs")
    forecast: Forecast = key(Sub(Forecast), Forecast(), help="forecast refits")
    calendar: CalendarSection = key(Sub(CalendarSection), CalendarSection(),
                                    help="non-working days: holidays are forecast as such (README, Calendars)")
    digest: Optional[DigestSettings] = key(Sub(DigestSettings), help="weekly digest: schedule, destinations, "
                                           "prices (docs/digest.md); read once, with the slos: targets")
    slos: SloSettings = key(SloSection(), SloSettings(),
                            help="task latency targets, burn-rate windows (docs/capacity.md)")

    def pool_settings(self, pool: str) -> PoolSettings:
        return self.pools.get(pool) or self.pools.get(name_of(pool)) or self.pools.get("*") or PoolSettings()

    def check(self, r: Reader, at: str) -> "Config":
        if self.prometheus and self.vllm_targets:
            raise r.fail("sources", "configure either sources.vllm (direct scrape) or sources.prometheus, not both")
        if not (self.vllm_targets or self.prometheus):
            raise r.fail("sources", "no source: give sources.vllm.targets or sources.prometheus.url")
        check_pool_by(self.pool_by, r)
        check_gateway_labels(self.gateways, extra_labels(self.pool_by), r)
        digest = None
        if self.digest is not None:
            self._check_digest(r, self.digest)
            digest = with_daemon(self.digest, self.slos, self.pools, self.capacity.spare_margin)
        return replace(self, history_keep=max(self.history_keep, 2 * self.latency_window), digest=digest)

    def _check_digest(self, r: Reader, digest: DigestSettings) -> None:
        source = digest.history_source
        if source == "store" and not self.store_path:
            raise r.fail("store.path", "digest.history.source is store but no store is configured")
        if source == "prometheus" and not self.prometheus:
            raise r.fail("sources.prometheus", "digest.history.source is prometheus but none is configured")
        if source == "auto" and not (self.store_path or self.prometheus):
            raise r.fail("digest.history", "no history: configure store.path or sources.prometheus")

