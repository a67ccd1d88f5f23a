"""The `sources:` sections of headroom.yml, declared next to the readers that use them.

Secrets are never held here: the file names a file (`*_file`) or an environment variable (`*_env`);
both are checked when the file is loaded and read again when used, so a rotated secret is picked up.
The whole file is assembled by monitor/config (the app floor).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from monitor.kit.settings.kinds import (
    Choice,
    Duration,
    File,
    Flag,
    Int,
    Labels,
    SecretEnv,
    SecretFile,
    Selector,
    Text,
    Url,
)
from monitor.kit.settings.reader import ConfigError, Reader, join, key
from monitor.kit.settings.shapes import MapOf, Sub, group
from monitor.kit.settings.values import read_secret_env, read_secret_file, redact
from monitor.model.readings import GATEWAY_KINDS


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
        raise ConfigError(path or "environment", "" if path else (env or ""), str(exc)) from None
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
        where = at if self.value is not None else join(at, "file" if self.file is not None else "env")
        try:
            self.resolve()
        except ConfigError:
            raise
        except ValueError as exc:  # a character HTTP cannot carry: every query would fail
            raise r.fail(where, str(exc)) from None

    def resolve(self) -> str:
        """The value as it is now (a file or variable is read on every use, so a rotation is picked up);
        ValueError when it holds a character beyond Latin-1, which an HTTP header cannot carry."""
        value = self.value if self.value is not None else (_secret(self.file, self.env) or "")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise ValueError(f"a header value must be Latin-1 text (ISO-8859-1; a tenant id is usually ASCII): "
                             f"character {exc.start + 1} is U+{ord(value[exc.start]):04X}, which HTTP cannot send "
                             "(the value is not shown)") from None
        return value


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
    labels: dict[str, str] = key(Labels(), {},
                                 help="where the gateway sits: the extra global.pool_by labels of the pools it "
                                      "serves, e.g. {cluster: a}; it feeds only those pools. Without labels it "
                                      "feeds a model's pool only when one pool serves that model (two clusters "
                                      "serving it: not attributed, counted as gateway_unattributed)")
    timeout: Optional[float] = key(Duration(gt=0, le=3600),
                                   help="how long a request to this gateway's /metrics may take; default the "
                                        "larger of global.scrape_timeout and 60% of global.interval (9 s at 15 s: "
                                        "LiteLLM's /metrics took 2.5 s on average under load and often over 5 s). "
                                        "An answer after global.scrape_timeout is slow, not down; the cycle waits "
                                        "for it up to 90% of the interval (monitor/sources/gateway_pace.py)")
    auth: HttpAuth = group(HttpAuth)


def check_gateway_labels(gateways: list[GatewaySource], extra: tuple[str, ...], r: Reader) -> None:
    """Each gateway's `labels` name extra pool_by labels only (`extra`: every pool_by label but the
    last); a ConfigError names the gateway and the key otherwise."""
    for i, gw in enumerate(gateways):
        for label in gw.labels:
            if label not in extra:
                allowed = f"one of {', '.join(extra)}" if extra else "none: global.pool_by has a single label"
                raise r.fail(f"sources.gateways[{i}].labels.{label}",
                             f"gateway {redact(gw.url)}: {label!r} is not an extra global.pool_by label (allowed: {allowed}; "
                             f"the last pool_by label names the pool and cannot place a gateway)")


@dataclass
class AlertsSource:
    url: str = key(Url(), required=True, help="base URL of the Prometheus or Alertmanager whose alerts the landing "
                                              "page shows (headroom's own, names Headroom*)")
    kind: str = key(Choice(("prometheus", "alertmanager")), "prometheus",
                    help="prometheus reads /api/v1/alerts (firing and pending), alertmanager /api/v2/alerts")
    match: dict[str, str] = key(Labels(), {},
                                help="this daemon's own target labels, e.g. {job: headroom}: an alert carrying one "
                                     "of these labels with another value is another job's (another headroom "
                                     "watching the same pools) and is not shown; alerts without the label (the "
                                     "vLLM rules') are kept. Default: every Headroom* alert")
    auth: HttpAuth = group(HttpAuth)
