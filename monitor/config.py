"""Configuration: one YAML file, validated whole before anything starts.

A bad file gives one `ConfigError` naming the file, the key path and the problem; the daemon never
starts half-configured. Secrets are never stored here in clear: the file names a file or an
environment variable that holds them (`*_file`, `*_env`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from urllib.parse import urlparse

import yaml


class ConfigError(ValueError):
    def __init__(self, file: str, key: str, problem: str):
        super().__init__(f"{file}: {key}: {problem}" if key else f"{file}: {problem}")
        self.file, self.key, self.problem = file, key, problem


_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> float:
    """'15s', '5m', '1.5h', '2d', '1w', or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 15s, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value.strip())
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ValueError(f"expected a duration like 15s, 5m or 1h, got {value!r}")


def check_url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a URL string, got {type(value).__name__}")
    u = urlparse(value)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"not an http(s) URL: {value!r}")
    return value


@dataclass
class Target:
    url: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class HttpAuth:
    """Outgoing credentials: each secret comes from a file or an environment variable."""

    bearer_token_file: Optional[str] = None
    bearer_token_env: Optional[str] = None
    username: Optional[str] = None
    password_file: Optional[str] = None
    password_env: Optional[str] = None
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    insecure_skip_verify: bool = False

    def bearer_token(self) -> Optional[str]:
        return _secret(self.bearer_token_file, self.bearer_token_env)

    def password(self) -> Optional[str]:
        return _secret(self.password_file, self.password_env)


def _secret(path: Optional[str], env: Optional[str]) -> Optional[str]:
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    if env:
        value = os.environ.get(env)
        if value is None:
            raise ConfigError("environment", env, "variable named for a secret is not set")
        return value.strip()
    return None


@dataclass
class PrometheusSource:
    url: str
    selector: str = ""  # extra matchers, e.g. 'job="vllm"'
    instance_label: str = "instance"
    timeout: float = 10.0
    retries: int = 3
    auth: HttpAuth = field(default_factory=HttpAuth)


@dataclass
class GatewaySource:
    kind: str  # litellm | envoy | llm-d | app
    url: str
    task_label: Optional[str] = None
    session_label: Optional[str] = None
    pool: Optional[str] = None
    auth: HttpAuth = field(default_factory=HttpAuth)


@dataclass
class PoolSettings:
    max_num_seqs: Optional[int] = None
    watts_per_replica: Optional[float] = None
    knee_margin: float = 0.1
    slo: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    file: str = "<defaults>"
    interval: float = 15.0
    latency_window: float = 300.0
    scrape_timeout: float = 5.0
    scrape_concurrency: int = 32
    pool_by: str = "model_name"
    history_keep: float = 3600.0  # readings kept in memory per target (seconds)
    vllm_targets: list[Target] = field(default_factory=list)
    vllm_auth: HttpAuth = field(default_factory=HttpAuth)
    prometheus: Optional[PrometheusSource] = None
    gateways: list[GatewaySource] = field(default_factory=list)
    dcgm_targets: list[Target] = field(default_factory=list)
    dcgm_replica_label: str = "Hostname"
    pools: dict[str, PoolSettings] = field(default_factory=dict)
    listen_address: str = ":9880"
    web_config_file: Optional[str] = None
    store_path: Optional[str] = None
    store_retention: float = 35 * 86400.0
    shard: Optional[tuple[int, int]] = None
    max_series: int = 100_000
    # sections owned by other modules, validated by them
    capacity: dict[str, Any] = field(default_factory=dict)
    forecast: dict[str, Any] = field(default_factory=dict)
    digest: dict[str, Any] = field(default_factory=dict)
    slos: dict[str, Any] = field(default_factory=dict)

    def pool_settings(self, pool: str) -> PoolSettings:
        return self.pools.get(pool) or self.pools.get("*") or PoolSettings()


# ---- validation -----------------------------------------------------------------------------

class _Reader:
    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.file, key, problem)

    def mapping(self, value: Any, key: str, allowed: set[str]) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if k not in allowed:
                hint = ", ".join(sorted(allowed))
                raise self.fail(f"{key}.{k}" if key else str(k), f"unknown key (allowed: {hint})")
        return value

    def open_mapping(self, value: Any, key: str) -> dict:
        """A mapping whose keys are the user's own names (pools, SLO names, free-form sections)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        return value

    def get(self, d: dict, name: str, key: str, conv: Callable[[Any], Any], default: Any = None) -> Any:
        if name not in d or d[name] is None:
            return default
        try:
            return conv(d[name])
        except (ValueError, TypeError) as exc:
            raise self.fail(f"{key}.{name}" if key else name, str(exc)) from None


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an integer, got {v!r}")
    return v


def _pos_int(v: Any) -> int:
    v = _int(v)
    if v < 1:
        raise ValueError(f"must be at least 1, got {v}")
    return v


def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {type(v).__name__}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _labels(v: Any) -> dict[str, str]:
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise ValueError("expected a mapping of label names to string values")
    return dict(v)


_AUTH_KEYS = {"bearer_token_file", "bearer_token_env", "basic_auth", "tls"}


def _auth(r: _Reader, d: dict, key: str) -> HttpAuth:
    auth = HttpAuth(
        bearer_token_file=r.get(d, "bearer_token_file", key, _str),
        bearer_token_env=r.get(d, "bearer_token_env", key, _str),
    )
    basic = r.mapping(d.get("basic_auth"), f"{key}.basic_auth", {"username", "password_file", "password_env"})
    auth.username = r.get(basic, "username", f"{key}.basic_auth", _str)
    auth.password_file = r.get(basic, "password_file", f"{key}.basic_auth", _str)
    auth.password_env = r.get(basic, "password_env", f"{key}.basic_auth", _str)
    if basic and not auth.username:
        raise r.fail(f"{key}.basic_auth.username", "required with basic_auth")
    tls = r.mapping(d.get("tls"), f"{key}.tls", {"ca_file", "cert_file", "key_file", "insecure_skip_verify"})
    auth.ca_file = r.get(tls, "ca_file", f"{key}.tls", _str)
    auth.cert_file = r.get(tls, "cert_file", f"{key}.tls", _str)
    auth.key_file = r.get(tls, "key_file", f"{key}.tls", _str)
    auth.insecure_skip_verify = r.get(tls, "insecure_skip_verify", f"{key}.tls", _bool, False)
    if auth.bearer_token_file and auth.username:
        raise r.fail(key, "give either a bearer token or basic_auth, not both")
    for name in ("bearer_token_file", "ca_file", "cert_file", "key_file"):
        path = getattr(auth, name)
        if path and not os.path.isfile(path):
            raise r.fail(f"{key}.{name if name == 'bearer_token_file' else 'tls.' + name}", f"file not found: {path}")
    if auth.password_file and not os.path.isfile(auth.password_file):
        raise r.fail(f"{key}.basic_auth.password_file", f"file not found: {auth.password_file}")
    return auth


def _targets(r: _Reader, value: Any, key: str) -> list[Target]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise r.fail(key, "expected a list of URLs")
    out = []
    for i, item in enumerate(value):
        k = f"{key}[{i}]"
        if isinstance(item, str):
            try:
                out.append(Target(check_url(item)))
            except ValueError as exc:
                raise r.fail(k, str(exc)) from None
        elif isinstance(item, dict):
            item = r.mapping(item, k, {"url", "labels"})
            if "url" not in item:
                raise r.fail(f"{k}.url", "required")
            out.append(Target(r.get(item, "url", k, check_url), r.get(item, "labels", k, _labels, {})))
        else:
            raise r.fail(k, f"expected a URL or a mapping with url, got {type(item).__name__}")
    return out


TOP_KEYS = {"global", "sources", "pools", "web", "store", "capacity", "forecast", "digest", "slos"}


def from_dict(data: Any, file: str = "<config>") -> Config:
    r = _Reader(file)
    data = r.mapping(data, "", TOP_KEYS)
    cfg = Config(file=file)
    g = r.mapping(data.get("global"), "global",
                  {"interval", "latency_window", "scrape_timeout", "scrape_concurrency", "pool_by",
                   "history_keep", "max_series", "shard"})
    cfg.interval = r.get(g, "interval", "global", parse_duration, cfg.interval)
    if cfg.interval <= 0:
        raise r.fail("global.interval", "must be positive")
    cfg.latency_window = r.get(g, "latency_window", "global", parse_duration, cfg.latency_window)
    cfg.scrape_timeout = r.get(g, "scrape_timeout", "global", parse_duration, cfg.scrape_timeout)
    cfg.scrape_concurrency = r.get(g, "scrape_concurrency", "global", _pos_int, cfg.scrape_concurrency)
    cfg.pool_by = r.get(g, "pool_by", "global", _str, cfg.pool_by)
    cfg.history_keep = max(r.get(g, "history_keep", "global", parse_duration, cfg.history_keep),
                           cfg.latency_window * 2)
    cfg.max_series = r.get(g, "max_series", "global", _pos_int, cfg.max_series)
    if "shard" in g:
        from .shard import parse_shard  # noqa: PLC0415 - optional module
        try:
            cfg.shard = parse_shard(_str(g["shard"]))
        except ValueError as exc:
            raise r.fail("global.shard", str(exc)) from None

    src = r.mapping(data.get("sources"), "sources", {"vllm", "prometheus", "gateways", "dcgm"})
    v = r.mapping(src.get("vllm"), "sources.vllm", {"targets"} | _AUTH_KEYS)
    cfg.vllm_targets = _targets(r, v.get("targets"), "sources.vllm.targets")
    cfg.vllm_auth = _auth(r, v, "sources.vllm")
    if src.get("prometheus") is not None:
        p = r.mapping(src["prometheus"], "sources.prometheus",
                      {"url", "selector", "instance_label", "timeout", "retries"} | _AUTH_KEYS)
        if "url" not in p:
            raise r.fail("sources.prometheus.url", "required")
        cfg.prometheus = PrometheusSource(
            url=r.get(p, "url", "sources.prometheus", check_url),
            selector=r.get(p, "selector", "sources.prometheus", _str, ""),
            instance_label=r.get(p, "instance_label", "sources.prometheus", _str, "instance"),
            timeout=r.get(p, "timeout", "sources.prometheus", parse_duration, 10.0),
            retries=r.get(p, "retries", "sources.prometheus", _int, 3),
            auth=_auth(r, p, "sources.prometheus"),
        )
    if cfg.prometheus and cfg.vllm_targets:
        raise r.fail("sources", "configure either sources.vllm (direct scrape) or sources.prometheus, not both")
    gws = src.get("gateways") or []
    if not isinstance(gws, list):
        raise r.fail("sources.gateways", "expected a list")
    for i, gw in enumerate(gws):
        k = f"sources.gateways[{i}]"
        gw = r.mapping(gw, k, {"kind", "url", "task_label", "session_label", "pool"} | _AUTH_KEYS)
        kind = r.get(gw, "kind", k, _str)
        if kind not in ("litellm", "envoy", "llm-d", "app"):
            raise r.fail(f"{k}.kind", f"must be one of litellm, envoy, llm-d, app; got {kind!r}")
        if "url" not in gw:
            raise r.fail(f"{k}.url", "required")
        cfg.gateways.append(GatewaySource(
            kind=kind, url=r.get(gw, "url", k, check_url),
            task_label=r.get(gw, "task_label", k, _str), session_label=r.get(gw, "session_label", k, _str),
            pool=r.get(gw, "pool", k, _str), auth=_auth(r, gw, k)))
    d = r.mapping(src.get("dcgm"), "sources.dcgm", {"targets", "replica_label"})
    cfg.dcgm_targets = _targets(r, d.get("targets"), "sources.dcgm.targets")
    cfg.dcgm_replica_label = r.get(d, "replica_label", "sources.dcgm", _str, cfg.dcgm_replica_label)

    pools = r.open_mapping(data.get("pools"), "pools")
    for name, settings in pools.items():
        k = f"pools.{name}"
        settings = r.mapping(settings, k, {"max_num_seqs", "watts_per_replica", "knee_margin", "slo"})
        ps = PoolSettings(
            max_num_seqs=r.get(settings, "max_num_seqs", k, _pos_int),
            watts_per_replica=r.get(settings, "watts_per_replica", k, _num),
            knee_margin=r.get(settings, "knee_margin", k, _num, 0.1),
            slo=r.open_mapping(settings.get("slo"), f"{k}.slo"),
        )
        if not 0 <= ps.knee_margin < 1:
            raise r.fail(f"{k}.knee_margin", "must be within 0 and 1")
        cfg.pools[str(name)] = ps

    w = r.mapping(data.get("web"), "web", {"listen_address", "config_file"})
    cfg.listen_address = r.get(w, "listen_address", "web", _str, cfg.listen_address)
    cfg.web_config_file = r.get(w, "config_file", "web", _str)
    s = r.mapping(data.get("store"), "store", {"path", "retention"})
    cfg.store_path = r.get(s, "path", "store", _str)
    cfg.store_retention = r.get(s, "retention", "store", parse_duration, cfg.store_retention)
    for section in ("capacity", "forecast", "digest", "slos"):
        setattr(cfg, section, r.open_mapping(data.get(section), section))
    if not (cfg.vllm_targets or cfg.prometheus):
        raise r.fail("sources", "no source: give sources.vllm.targets or sources.prometheus.url")
    return cfg


def load(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(path, "", f"not valid YAML: {where}{getattr(exc, 'problem', exc)}") from None
    return from_dict(data, path)
