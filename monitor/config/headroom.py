"""The sections of headroom.yml, each key declared once: kind (type and bounds), default, help.

`Config` is the flat view the daemon reads (`cfg.interval`, `cfg.vllm_targets`); each field names
the key it comes from (`path="global.interval"`). Secrets are never held here: the file names a
file (`*_file`) or an environment variable (`*_env`); both are checked when the file is loaded and
read again when used, so a rotated secret is picked up.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Optional

from monitor.capacity.slo import SloSettings

from .kinds import (Choice, Duration, File, Flag, Int, Labels, ListenAddress, Mapping, Number, SecretEnv,
                    SecretFile, Selector, Shard, StorePath, Text, Url)
from .reader import ConfigError, Reader, group, join, key
from .shapes import ListOf, MapOf, Sub
from .calendar import CalendarSection
from .slo import PoolTargets, SloSection
from .values import DAY, read_secret_env, read_secret_file

GATEWAY_KINDS = ("litellm", "envoy", "llm-d", "dynamo", "app")
KNEE_SIGNALS = ("queue", "ttft", "e2e_per_token", "e2e", "itl")


@dataclass
class Target:
    SHORTHAND: ClassVar[str] = "a URL"
    url: str = key(Url(metrics=True), required=True, help="the /metrics URL")
    labels: dict[str, str] = key(Labels(), {}, help="labels added to the target's series (e.g. pool)")

    @staticmethod
    def shorthand(value: Any) -> dict:
        if isinstance(value, str):
            return {"url": value}
        raise ValueError(f"expected a URL or a mapping with url, got {type(value).__name__}")


@dataclass
class EngineTarget(Target):
    """An inference engine's /metrics: a vLLM or an SGLang replica."""
    kind: str = key(Choice(("auto", "vllm", "sglang")), "auto",
                    help="the engine behind the URL; auto tells vLLM and SGLang apart by the families they expose")


def _secret(path: Optional[str], env: Optional[str]) -> Optional[str]:
    """The secret as it is now (read on every use); ConfigError naming the file or variable, never the value."""
    try:
        if path:
            return read_secret_file(path)
        if env:
            return read_secret_env(env)
    except ValueError as exc:
        raise ConfigError(path or "environment", "" if path else env, str(exc)) from None
    return None


@dataclass
class HttpAuth:
    """Outgoing credentials: each secret comes from a file or an environment variable."""

    bearer_token_file: Optional[str] = key(SecretFile(), help="file holding a bearer token")
    bearer_token_env: Optional[str] = key(SecretEnv(), help="environment variable holding a bearer token")
    username: Optional[str] = key(Text(), path="basic_auth.username", help="basic-auth user name")
    password_file: Optional[str] = key(SecretFile(), path="basic_auth.password_file",
                                       help="file holding the basic-auth password")
    password_env: Optional[str] = key(SecretEnv(), path="basic_auth.password_env",
                                      help="environment variable holding the basic-auth password")
    ca_file: Optional[str] = key(File(), path="tls.ca_file", help="CA bundle to verify the server (default: system)")
    cert_file: Optional[str] = key(File(), path="tls.cert_file", help="client certificate (mutual TLS)")
    key_file: Optional[str] = key(File(), path="tls.key_file", help="client certificate's key")
    insecure_skip_verify: bool = key(Flag(), False, path="tls.insecure_skip_verify",
                                     help="do not verify the server's certificate (tests only)")

    def bearer_token(self) -> Optional[str]:
        return _secret(self.bearer_token_file, self.bearer_token_env)

    def password(self) -> Optional[str]:
        return _secret(self.password_file, self.password_env)

    def check(self, r: Reader, at: str) -> None:
        if (self.password_file or self.password_env) and not self.username:
            raise r.fail(f"{at}.basic_auth.username" if at else "basic_auth.username", "required with basic_auth")
        if (self.bearer_token_file or self.bearer_token_env) and self.username:
            raise r.fail(at, "give either a bearer token or basic_auth, not both")
        if self.bearer_token_file and self.bearer_token_env:
            raise r.fail(at, "give either bearer_token_file or bearer_token_env, not both")
        if self.password_file and self.password_env:
            raise r.fail(f"{at}.basic_auth", "give either password_file or password_env, not both")
        self._check_tls(r, join(at, "tls"))

    def _check_tls(self, r: Reader, at: str) -> None:
        """The files load as a CA bundle and a certificate chain now, not at the first request."""
        import ssl  # noqa: PLC0415
        if self.key_file and not self.cert_file:
            raise r.fail(f"{at}.key_file", "needs tls.cert_file (the certificate it is the key of)")
        try:
            if self.ca_file:
                ssl.create_default_context(cafile=self.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise r.fail(f"{at}.ca_file", f"not a CA bundle: {getattr(exc, 'reason', None) or exc}") from None
        try:
            if self.cert_file:
                ssl.create_default_context().load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise r.fail(f"{at}.cert_file", f"cannot load the certificate and its key (PEM files?): "
                                            f"{getattr(exc, 'strerror', None) or exc}") from None


@dataclass
class HeaderValue:
    """One extra request header's value: given inline, or (a secret) from a file or a variable."""

    SHORTHAND: ClassVar[str] = "a string"
    value: Optional[str] = key(Text(), help="the value itself (a tenant id is often not secret)")
    file: Optional[str] = key(SecretFile(), help="file holding the value")
    env: Optional[str] = key(SecretEnv(), help="environment variable holding the value")

    @staticmethod
    def shorthand(value: Any) -> dict:
        if isinstance(value, str):
            return {"value": value}
        raise ValueError(f"expected a string or a mapping with value, file or env, got {type(value).__name__}")

    def check(self, r: Reader, at: str) -> None:
        if sum(x is not None for x in (self.value, self.file, self.env)) != 1:
            raise r.fail(at, "give exactly one of value, file or env")
        if self.value is not None and any(ord(c) < 32 or ord(c) == 127 for c in self.value):
            raise r.fail(at, "a header value may not hold control characters (the value is not shown)")

    def resolve(self) -> str:
        """The value as it is now (a file or variable is read on every use, so a rotation is picked up)."""
        return self.value if self.value is not None else (_secret(self.file, self.env) or "")


RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "accept",
                              "accept-encoding", "connection", "transfer-encoding"})


@dataclass
class PrometheusSource:
    url: str = key(Url(), required=True, help="query API base URL (Prometheus, VictoriaMetrics, Thanos, Mimir)")
    selector: str = key(Selector(), "", help="extra matchers for every query, e.g. 'job=\"vllm\"'")
    instance_label: str = key(Text(), "instance", help="the label naming a replica")
    timeout: float = key(Duration(gt=0, le=3600), 10.0, help="time box of one query")
    retries: int = key(Int(ge=0, le=10), 3, help="retries of a failed query (exponential backoff)")
    recording_rules: bool = key(Flag(), True, help="read the pools' latency buckets from headroom's bundled recording "
                                                   "rules when they are loaded (latency_window 5m, pool_by model_name; "
                                                   "they sum every job's vLLM series, as the dashboards do)")
    headers: dict[str, HeaderValue] = key(MapOf(Sub(HeaderValue), names="header name"), {},
                                          help="extra headers on every query, e.g. X-Scope-OrgID for Mimir, Cortex "
                                               "or multi-tenant Thanos; never logged")
    auth: HttpAuth = group(HttpAuth)

    def check(self, r: Reader, at: str) -> None:
        for name in self.headers:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                raise r.fail(f"{at}.headers.{name}", "not an HTTP header name")
            if name.lower() in RESERVED_HEADERS:
                raise r.fail(f"{at}.headers.{name}", "set by headroom (credentials: bearer_token_file or basic_auth)")

    def header_values(self) -> dict[str, str]:
        return {name: h.resolve() for name, h in self.headers.items()}


@dataclass
class GatewaySource:
    kind: str = key(Choice(GATEWAY_KINDS), required=True, help="which gateway's metrics the URL serves")
    url: str = key(Url(metrics=True), required=True, help="the gateway's /metrics URL")
    task_label: Optional[str] = key(Text(), help="label naming the task type (default per kind)")
    session_label: Optional[str] = key(Text(), help="label naming the session; none by default: a session id "
                                                    "label is one series per session (unbounded), for tests only; "
                                                    "sessions come from the app's agent_sessions_active")
    pool: Optional[str] = key(Text(), help="the pool this gateway feeds (default: by model label)")
    pools: dict[str, str] = key(MapOf(Text(), names="gateway pool"), {},
                                help="the gateway's pool label (llm-d inference_pool) -> headroom pool, for its "
                                     "queue; default: a queue belongs to the pool serving its model")
    auth: HttpAuth = group(HttpAuth)


@dataclass
class AlertsSource:
    url: str = key(Url(), required=True, help="base URL of the Prometheus or Alertmanager whose alerts the landing "
                                              "page shows (headroom's own, names Headroom*)")
    kind: str = key(Choice(("prometheus", "alertmanager")), "prometheus",
                    help="prometheus reads /api/v1/alerts (firing and pending), alertmanager /api/v2/alerts")
    auth: HttpAuth = group(HttpAuth)


@dataclass
class PoolSettings:
    REMOVED: ClassVar[dict] = {"knee_margin": "removed: it was read but never used (the knee is learned "
                                             "from the data; the alert thresholds keep headroom free); delete it"}
    max_num_seqs: Optional[int] = key(Int(ge=1, le=1_000_000), help="vLLM --max-num-seqs per replica: the slots limit")
    watts_per_replica: Optional[float] = key(Number(gt=0, le=1e6), help="power per replica when DCGM gives none")
    replica_lead_time: Optional[float] = key(Duration(gt=0, le=DAY), help="how long a new replica takes to serve "
                                             "(scheduling, image pull, model load); alerts compare it with "
                                             "the time to exhaustion")
    slo: list = key(PoolTargets(), [], help="pool latency targets like {ttft_p95_seconds: 0.5} (docs/capacity.md)")


@dataclass(frozen=True)
class Capacity:
    """The capacity enricher's knobs (monitor/capacity/enrich.py)."""

    knee_signal: str = key(Choice(KNEE_SIGNALS), "queue", help="latency signal the knee is found on")
    knee_min_span_seconds: float = key(Number(gt=0, le=DAY), 30.0, help="Little's-law window of one knee observation")
    min_confidence: float = key(Number(ge=0, le=1), 0.6, help="a learned knee is published above this confidence")
    min_change: float = key(Number(ge=0, le=10), 0.10, help="relative change needed to move a published knee")
    confirmations: int = key(Int(ge=1, le=1000), 3, help="fits in a row that must agree before the knee moves")
    min_observations: int = key(Int(ge=10, le=1_000_000), 60, help="observations before a knee is fitted")
    kv_tokens_per_request: Optional[float] = key(Number(gt=0, le=1e8),
                                                 help="KV tokens per request when none is running")
    active_requests_per_session: Optional[float] = key(Number(gt=0, le=1e6), help="session size when the pool is idle")
    task_pools: dict[str, str] = key(MapOf(Text(), names="task type"), {},
                                     help="task type -> pool (application metrics carry no pool)")
    task_classes: dict[str, str] = key(MapOf(Choice(("interactive", "batch")), names="task type"), {},
                                       help="task type -> call class (default interactive)")
    task_window: Optional[float] = key(Duration(gt=0, le=DAY), help="task arrival rates, calls per task and "
                                       "sessions are counted over this window (default global.latency_window); "
                                       "make it several task durations long: unknown until covered")


@dataclass(frozen=True)
class Forecast:
    refit_minutes: float = key(Number(gt=0, le=10080), 15.0, help="refit every pool's forecasts every N minutes")
    fit_timeout_seconds: float = key(Number(gt=0, le=3600), 30.0, help="time box of one model fit")


def _digest_section() -> type:
    from monitor.digest.settings import DigestSettings  # noqa: PLC0415
    return DigestSettings


@dataclass
class Config:
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
                                 help="MiB of response bodies all sources may hold at once beyond 1 MiB each; "
                                      "a body past it fails too_large")
    pool_by: str = key(Text(), "model_name", path="global.pool_by", help="target label that names the pool")
    stall_window: float = key(Duration(ge=0, le=DAY), 60.0, path="global.stall_window",
                              help="a replica holding work that completes nothing for this long is stalled "
                                   "(not counted as capacity); 0 turns the check off")
    history_keep: float = key(Duration(gt=0, le=7 * DAY), 3600.0, path="global.history_keep",
                              help="readings kept in memory per target (at least twice latency_window)")
    forget_after: float = key(Duration(gt=0, le=7 * DAY), 3600.0, path="global.forget_after",
                              help="what is kept per replica, instance, pool or gateway (knee estimators, SLO "
                                   "windows, lead times, down sources, last fresh times) is forgotten after "
                                   "this long unseen, so replica churn cannot grow memory")
    max_models_per_target: int = key(Int(ge=1, le=100_000), 64, path="global.max_models_per_target",
                                     help="models read from one target (or one instance in Prometheus mode); "
                                          "the rest are dropped and counted, so one runaway target cannot "
                                          "fill global.max_series")
    max_series: int = key(Int(ge=1, le=100_000_000), 100_000, path="global.max_series",
                          help="cardinality cap; what is dropped is counted")
    shard: Optional[tuple[int, int]] = key(Shard(), path="global.shard",
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
    store_path: Optional[str] = key(StorePath("history.sqlite"), path="store.path",
                                    help="embedded history for the forecasts (direct mode)")
    store_retention: float = key(Duration(gt=0), 35 * DAY, path="store.retention", help="history kept")
    capacity: Capacity = key(Sub(Capacity), Capacity(), help="knee and capacity knobs")
    forecast: Forecast = key(Sub(Forecast), Forecast(), help="forecast refits")
    calendar: CalendarSection = key(Sub(CalendarSection), CalendarSection(),
                                    help="non-working days: holidays are forecast as such (README, Calendars)")
    digest: dict[str, Any] = key(Mapping(_digest_section), {},
                                 help="weekly digest: schedule, destinations, prices (docs/digest.md)")
    slos: SloSettings = key(SloSection(), SloSettings(),
                            help="task latency targets, burn-rate windows (docs/capacity.md)")

    def pool_settings(self, pool: str) -> PoolSettings:
        return self.pools.get(pool) or self.pools.get("*") or PoolSettings()

    def check(self, r: Reader, at: str) -> "Config":
        if self.prometheus and self.vllm_targets:
            raise r.fail("sources", "configure either sources.vllm (direct scrape) or sources.prometheus, not both")
        if not (self.vllm_targets or self.prometheus):
            raise r.fail("sources", "no source: give sources.vllm.targets or sources.prometheus.url")
        if self.digest:
            self._check_digest(r)
        return replace(self, history_keep=max(self.history_keep, 2 * self.latency_window))

    def _check_digest(self, r: Reader) -> None:
        from monitor.digest.settings import from_dict  # noqa: PLC0415
        source = from_dict(self.digest, self.file, self.slos).history_source
        if source == "store" and not self.store_path:
            raise r.fail("store.path", "digest.history.source is store but no store is configured")
        if source == "prometheus" and not self.prometheus:
            raise r.fail("sources.prometheus", "digest.history.source is prometheus but none is configured")
        if source == "auto" and not (self.store_path or self.prometheus):
            raise r.fail("digest.history", "no history: configure store.path or sources.prometheus")

