"""The `digest:` section of headroom's configuration, validated whole (see docs/digest.md).

Every problem raises `monitor.config.ConfigError` naming the file and the key path. Secrets (SMTP
password, webhook URL or bearer token) are never held in the file: the file names a `*_file` or an
`*_env` that holds them, and they are read only when a delivery is made.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlparse

from monitor.config import ConfigError, parse_duration

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DEST_TYPES = ("directory", "webhook", "smtp")
FORMATS = ("md", "html", "json")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class Schedule:
    day_of_week: str = "mon"
    hour: int = 8
    minute: int = 0
    timezone: str = "UTC"


@dataclass(frozen=True)
class ApiPrice:
    name: str = "managed API"
    input_per_million: float = 3.0
    output_per_million: float = 15.0


@dataclass(frozen=True)
class Prices:
    currency: str = "USD"
    gpu_hour: float = 2.5  # per GPU-hour
    energy_kwh: float = 0.15  # per kWh
    api: ApiPrice = ApiPrice()


@dataclass(frozen=True)
class PoolFacts:
    """What the digest needs to know about a pool that history does not carry."""

    replicas: Optional[int] = None
    gpus_per_replica: int = 1
    knee_requests_per_replica: Optional[float] = None
    max_num_seqs: Optional[int] = None
    kv_capacity_tokens_per_replica: Optional[float] = None
    idle_watts_per_gpu: Optional[float] = None
    max_watts_per_gpu: Optional[float] = None
    input_tokens_per_call: Optional[float] = None
    output_tokens_per_call: Optional[float] = None


@dataclass(frozen=True)
class TaskFacts:
    pool: Optional[str] = None
    calls_per_task: float = 1.0
    input_tokens_per_call: Optional[float] = None
    output_tokens_per_call: Optional[float] = None
    tool_wait_seconds: float = 0.0  # tool time inside one task (for the demo's latency estimate)


@dataclass(frozen=True)
class Destination:
    name: str
    type: str
    # directory
    path: Optional[str] = None
    formats: tuple[str, ...] = FORMATS
    # webhook
    url: Optional[str] = None
    url_file: Optional[str] = None
    url_env: Optional[str] = None
    bearer_token_file: Optional[str] = None
    bearer_token_env: Optional[str] = None
    timeout: float = 10.0
    # smtp
    host: Optional[str] = None
    port: int = 25
    starttls: bool = False
    ssl: bool = False
    username: Optional[str] = None
    password_file: Optional[str] = None
    password_env: Optional[str] = None
    sender: Optional[str] = None
    to: tuple[str, ...] = ()
    ca_file: Optional[str] = None  # CA bundle to verify the SMTP / webhook server (default: system)
    subject_prefix: str = "[headroom]"

    def secret(self, kind: str) -> Optional[str]:
        """Read a secret ("url", "bearer_token", "password") from its file or variable."""
        path, env = getattr(self, f"{kind}_file"), getattr(self, f"{kind}_env")
        if path:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        if env:
            value = os.environ.get(env)
            if value is None:
                raise ValueError(f"destination {self.name}: environment variable {env} "
                                 f"(named for the {kind.replace('_', ' ')}) is not set")
            return value.strip()
        return None

    def webhook_url(self) -> str:
        return self.url or self.secret("url") or ""

    def describe(self) -> str:
        """Where it goes, without any secret (webhook URLs carry tokens: only the host is shown)."""
        if self.type == "directory":
            return f"directory {self.path}"
        if self.type == "webhook":
            host = urlparse(self.url).hostname if self.url else "(url from secret)"
            return f"webhook {host}"
        return f"smtp {self.host}:{self.port} to {', '.join(self.to)}"


@dataclass(frozen=True)
class Retry:
    initial_seconds: float = 30.0
    max_seconds: float = 3600.0
    factor: float = 2.0
    max_attempts: int = 0  # 0: retry until delivered


@dataclass(frozen=True)
class DigestSettings:
    schedule: Schedule = Schedule()
    outbox: str = "headroom-digest-outbox.sqlite"
    work_dir: Optional[str] = None  # where rendered digests are kept (default: next to the outbox)
    title: str = "headroom weekly capacity digest"
    history_source: str = "auto"  # auto | store | prometheus
    history_step: float = 300.0
    forecast_models: tuple[str, ...] = ("mstl", "snaive_week")
    recommend_level: float = 0.95
    prices: Prices = Prices()
    pools: dict[str, PoolFacts] = field(default_factory=dict)
    tasks: dict[str, TaskFacts] = field(default_factory=dict)
    slo_targets: dict[str, float] = field(default_factory=dict)  # task type -> seconds
    slo_objectives: dict[str, float] = field(default_factory=dict)  # task type -> objective
    destinations: tuple[Destination, ...] = ()
    retry: Retry = Retry()
    timezone: str = "UTC"  # for the days and hours the digest names (defaults to the schedule's)


# ---- validation ---------------------------------------------------------------------------------

class _R:
    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.file, key, problem)

    def mapping(self, value: Any, key: str, allowed: Optional[set] = None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        if allowed is not None:
            for k in value:
                if k not in allowed:
                    raise self.fail(f"{key}.{k}", f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def num(self, d: dict, name: str, key: str, default=None, minimum: float = 0.0,
            strict: bool = False, integer: bool = False):
        if d.get(name) is None:
            return default
        v = d[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise self.fail(f"{key}.{name}", f"expected {'an integer' if integer else 'a number'}, got {v!r}")
        if v < minimum or (strict and v == minimum):
            raise self.fail(f"{key}.{name}", f"must be {'>' if strict else '>='} {minimum:g}, got {v!r}")
        return v if integer else float(v)

    def text(self, d: dict, name: str, key: str, default=None) -> Optional[str]:
        if d.get(name) is None:
            return default
        if not isinstance(d[name], str) or not d[name].strip():
            raise self.fail(f"{key}.{name}", f"expected a non-empty string, got {d[name]!r}")
        return d[name]

    def flag(self, d: dict, name: str, key: str, default: bool) -> bool:
        if d.get(name) is None:
            return default
        if not isinstance(d[name], bool):
            raise self.fail(f"{key}.{name}", f"expected true or false, got {d[name]!r}")
        return d[name]

    def duration(self, d: dict, name: str, key: str, default: float) -> float:
        if d.get(name) is None:
            return default
        try:
            v = parse_duration(d[name])
        except ValueError as exc:
            raise self.fail(f"{key}.{name}", str(exc)) from None
        if v <= 0:
            raise self.fail(f"{key}.{name}", "must be positive")
        return v


def _timezone(r: _R, name: str, key: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise r.fail(key, f"unknown time zone {name!r} (use an IANA name like Europe/Berlin)") from None
    return name


def _schedule(r: _R, d: Any) -> Schedule:
    d = r.mapping(d, "digest.schedule", {"day_of_week", "hour", "minute", "timezone"})
    day = str(d.get("day_of_week", "mon")).lower()[:3]
    if day not in DAYS:
        raise r.fail("digest.schedule.day_of_week", f"expected one of {', '.join(DAYS)}, got {d.get('day_of_week')!r}")
    hour = r.num(d, "hour", "digest.schedule", 8, integer=True)
    minute = r.num(d, "minute", "digest.schedule", 0, integer=True)
    if hour > 23:
        raise r.fail("digest.schedule.hour", f"must be 0-23, got {hour}")
    if minute > 59:
        raise r.fail("digest.schedule.minute", f"must be 0-59, got {minute}")
    tz = _timezone(r, r.text(d, "timezone", "digest.schedule", "UTC"), "digest.schedule.timezone")
    return Schedule(day, hour, minute, tz)


def _prices(r: _R, d: Any) -> Prices:
    d = r.mapping(d, "digest.prices", {"currency", "gpu_hour", "energy_kwh", "api"})
    a = r.mapping(d.get("api"), "digest.prices.api", {"name", "input_per_million", "output_per_million"})
    api = ApiPrice(r.text(a, "name", "digest.prices.api", "managed API"),
                   r.num(a, "input_per_million", "digest.prices.api", 3.0),
                   r.num(a, "output_per_million", "digest.prices.api", 15.0))
    return Prices(r.text(d, "currency", "digest.prices", "USD"),
                  r.num(d, "gpu_hour", "digest.prices", 2.5),
                  r.num(d, "energy_kwh", "digest.prices", 0.15), api)


def _pools(r: _R, d: Any) -> dict[str, PoolFacts]:
    out = {}
    fields = set(PoolFacts.__dataclass_fields__)
    for name, spec in r.mapping(d, "digest.pools").items():
        k = f"digest.pools.{name}"
        spec = r.mapping(spec, k, fields)
        kw = {}
        for f in fields:
            integer = f in ("replicas", "gpus_per_replica", "max_num_seqs")
            v = r.num(spec, f, k, None, minimum=1 if integer else 0.0, strict=not integer,
                      integer=integer)
            if v is not None:
                kw[f] = v
        out[str(name)] = PoolFacts(**kw)
    return out


def _tasks(r: _R, d: Any) -> dict[str, TaskFacts]:
    out = {}
    allowed = set(TaskFacts.__dataclass_fields__)
    for name, spec in r.mapping(d, "digest.tasks").items():
        k = f"digest.tasks.{name}"
        spec = r.mapping(spec, k, allowed)
        out[str(name)] = TaskFacts(
            pool=r.text(spec, "pool", k),
            calls_per_task=r.num(spec, "calls_per_task", k, 1.0, strict=True),
            input_tokens_per_call=r.num(spec, "input_tokens_per_call", k),
            output_tokens_per_call=r.num(spec, "output_tokens_per_call", k),
            tool_wait_seconds=r.num(spec, "tool_wait_seconds", k, 0.0))
    return out


def _destination(r: _R, d: Any, i: int, seen: set) -> Destination:
    k = f"digest.destinations[{i}]"
    common = {"name", "type"}
    d = r.mapping(d, k)
    kind = d.get("type")
    if kind not in DEST_TYPES:
        raise r.fail(f"{k}.type", f"expected one of {', '.join(DEST_TYPES)}, got {kind!r}")
    name = r.text(d, "name", k, kind)
    if not _NAME_RE.match(name):
        raise r.fail(f"{k}.name", f"use letters, digits, '.', '_' or '-' (got {name!r})")
    if name in seen:
        raise r.fail(f"{k}.name", f"destination name {name!r} is used twice (it is part of the idempotency key)")
    seen.add(name)
    if kind == "directory":
        d = r.mapping(d, k, common | {"path", "formats"})
        path = r.text(d, "path", k)
        if not path:
            raise r.fail(f"{k}.path", "required for a directory destination")
        formats = tuple(d.get("formats") or FORMATS)
        bad = [f for f in formats if f not in FORMATS]
        if bad:
            raise r.fail(f"{k}.formats", f"unknown format(s) {bad}; known: {', '.join(FORMATS)}")
        return Destination(name, kind, path=path, formats=formats)
    if kind == "webhook":
        d = r.mapping(d, k, common | {"url", "url_file", "url_env", "bearer_token_file",
                                      "bearer_token_env", "timeout"})
        given = [x for x in ("url", "url_file", "url_env") if d.get(x)]
        if len(given) != 1:
            raise r.fail(k, "give exactly one of url, url_file or url_env (a Slack webhook URL is a "
                            "secret: prefer url_file or url_env)")
        url = r.text(d, "url", k)
        if url:
            u = urlparse(url)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise r.fail(f"{k}.url", f"not an http(s) URL: {url!r}")
        for f in ("url_file", "bearer_token_file"):
            if d.get(f) and not os.path.isfile(d[f]):
                raise r.fail(f"{k}.{f}", f"file not found: {d[f]}")
        return Destination(name, kind, url=url, url_file=r.text(d, "url_file", k),
                           url_env=r.text(d, "url_env", k),
                           bearer_token_file=r.text(d, "bearer_token_file", k),
                           bearer_token_env=r.text(d, "bearer_token_env", k),
                           timeout=r.duration(d, "timeout", k, 10.0))
    d = r.mapping(d, k, common | {"host", "port", "starttls", "ssl", "username", "password_file",
                                  "password_env", "from", "to", "subject_prefix", "timeout", "ca_file"})
    if d.get("ca_file") and not os.path.isfile(d["ca_file"]):
        raise r.fail(f"{k}.ca_file", f"file not found: {d['ca_file']}")
    host = r.text(d, "host", k)
    if not host:
        raise r.fail(f"{k}.host", "required for an smtp destination")
    port = r.num(d, "port", k, 25, minimum=1, integer=True)
    if port > 65535:
        raise r.fail(f"{k}.port", f"must be 1-65535, got {port}")
    sender = r.text(d, "from", k)
    if not sender or "@" not in sender:
        raise r.fail(f"{k}.from", f"required: the sender address, got {sender!r}")
    to = d.get("to")
    if isinstance(to, str):
        to = [to]
    if not to or not isinstance(to, list) or not all(isinstance(x, str) and "@" in x for x in to):
        raise r.fail(f"{k}.to", f"expected a list of e-mail addresses, got {d.get('to')!r}")
    starttls, ssl = r.flag(d, "starttls", k, False), r.flag(d, "ssl", k, False)
    if starttls and ssl:
        raise r.fail(k, "starttls and ssl are exclusive (ssl is implicit TLS, usually port 465)")
    username = r.text(d, "username", k)
    if (d.get("password_file") or d.get("password_env")) and not username:
        raise r.fail(f"{k}.username", "required with a password")
    if d.get("password_file") and not os.path.isfile(d["password_file"]):
        raise r.fail(f"{k}.password_file", f"file not found: {d['password_file']}")
    if d.get("password") is not None:
        raise r.fail(f"{k}.password", "not accepted in the file: use password_file or password_env")
    return Destination(name, kind, host=host, port=port, starttls=starttls, ssl=ssl,
                       username=username, password_file=r.text(d, "password_file", k),
                       password_env=r.text(d, "password_env", k), sender=sender, to=tuple(to),
                       subject_prefix=r.text(d, "subject_prefix", k, "[headroom]"),
                       ca_file=r.text(d, "ca_file", k),
                       timeout=r.duration(d, "timeout", k, 30.0))


TOP = {"schedule", "outbox", "work_dir", "title", "history", "forecast", "prices", "pools", "tasks",
       "destinations", "retry", "timezone"}


def from_dict(d: Any, file: str = "<config>", slos: Optional[dict] = None) -> DigestSettings:
    """Validate the `digest:` mapping. `slos` is the top-level `slos:` section: SLO targets are
    referenced from there (monitor.capacity.slo.SloSettings), never repeated here."""
    r = _R(file)
    d = r.mapping(d, "digest", TOP)
    schedule = _schedule(r, d.get("schedule"))
    h = r.mapping(d.get("history"), "digest.history", {"source", "step"})
    source = h.get("source", "auto")
    if source not in ("auto", "store", "prometheus"):
        raise r.fail("digest.history.source", f"expected auto, store or prometheus, got {source!r}")
    f = r.mapping(d.get("forecast"), "digest.forecast", {"models", "recommend_level"})
    models = tuple(f.get("models") or DigestSettings.forecast_models)
    from monitor.forecast.models import MODELS
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise r.fail("digest.forecast.models", f"unknown model(s) {bad}; known: {', '.join(MODELS)}")
    level = f.get("recommend_level", 0.95)
    if level not in (0.8, 0.95):
        raise r.fail("digest.forecast.recommend_level", f"must be 0.8 or 0.95, got {level!r}")
    dests = d.get("destinations") or []
    if not isinstance(dests, list):
        raise r.fail("digest.destinations", "expected a list")
    seen: set = set()
    destinations = tuple(_destination(r, x, i, seen) for i, x in enumerate(dests))
    rt = r.mapping(d.get("retry"), "digest.retry", {"initial", "max", "factor", "max_attempts"})
    retry = Retry(r.duration(rt, "initial", "digest.retry", 30.0), r.duration(rt, "max", "digest.retry", 3600.0),
                  r.num(rt, "factor", "digest.retry", 2.0, minimum=1.0),
                  r.num(rt, "max_attempts", "digest.retry", 0, integer=True))
    targets, objectives = {}, {}
    if slos:
        from monitor.capacity.slo import SloSettings
        try:
            ss = SloSettings.from_dict(slos)
        except ValueError as exc:
            raise r.fail("slos", str(exc)) from None
        for tt, t in ss.task_targets.items():
            targets[tt], objectives[tt] = t.seconds, t.objective
        if ss.default_task_target is not None:
            targets["*"], objectives["*"] = ss.default_task_target.seconds, ss.default_task_target.objective
    tz = d.get("timezone")
    tz = _timezone(r, tz, "digest.timezone") if tz else schedule.timezone
    return DigestSettings(
        schedule=schedule, outbox=r.text(d, "outbox", "digest", DigestSettings.outbox),
        work_dir=r.text(d, "work_dir", "digest"), title=r.text(d, "title", "digest", DigestSettings.title),
        history_source=source, history_step=r.duration(h, "step", "digest.history", 300.0),
        forecast_models=models, recommend_level=float(level), prices=_prices(r, d.get("prices")),
        pools=_pools(r, d.get("pools")), tasks=_tasks(r, d.get("tasks")), slo_targets=targets,
        slo_objectives=objectives, destinations=destinations, retry=retry, timezone=tz)
