"""The `digest:` section of headroom's configuration (see docs/digest.md), declared key by key.

Read by the one configuration reader (monitor/kit/settings/reader.py): every problem is a
`monitor.config.ConfigError` naming the file and the key path. Secrets (SMTP password, webhook URL
or bearer token) are never held in the file: it names a `*_file` or an `*_env` that holds them;
both are checked when the file is loaded and read again only when a delivery is made.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Optional
from urllib.parse import urlparse

from monitor.kit.settings.kinds import (
    Choice,
    Duration,
    File,
    Flag,
    Int,
    Number,
    SecretEnv,
    SecretFile,
    StorePath,
    Subset,
    Text,
    Timezone,
    Url,
)
from monitor.kit.settings.reader import Reader, key
from monitor.kit.settings.shapes import ListOf, MapOf, Sub, Tagged

if TYPE_CHECKING:
    from monitor.capacity.settings import PoolSettings
    from monitor.capacity.slo import SloSettings

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DEST_TYPES = ("directory", "webhook", "smtp")
FORMATS = ("md", "html", "json")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_EMAIL = r"^[^@\s]+@[^@\s]+$"


def _models() -> tuple:
    from monitor.forecast.models import MODELS  # noqa: PLC0415 - numpy, only when a digest is configured
    return tuple(MODELS)


@dataclass(frozen=True)
class Schedule:
    day_of_week: str = key(Choice(DAYS, fold=lambda s: s.lower()[:3]), "mon", help="day the digest is built")
    hour: int = key(Int(ge=0, le=23), 8, help="hour it is built at")
    minute: int = key(Int(ge=0, le=59), 0, help="minute it is built at")
    timezone: str = key(Timezone(), "UTC", help="time zone of day_of_week and hour (IANA name)")


@dataclass(frozen=True)
class ApiPrice:
    name: str = key(Text(), "managed API", help="the managed API compared against")
    input_per_million: float = key(Number(ge=0), 3.0, help="price per million input tokens")
    output_per_million: float = key(Number(ge=0), 15.0, help="price per million output tokens")


@dataclass(frozen=True)
class Prices:
    currency: str = key(Text(), "USD", help="currency the prices are in")
    gpu_hour: float = key(Number(ge=0), 2.5, help="price of one GPU-hour")
    energy_kwh: float = key(Number(ge=0), 0.15, help="price of one kWh")
    api: ApiPrice = key(Sub(ApiPrice), ApiPrice(), help="a managed API's token prices, for comparison")


@dataclass(frozen=True)
class TaskFacts:
    pool: Optional[str] = key(Text(), help="the pool serving the task type")
    calls_per_task: float = key(Number(gt=0), 1.0, help="model calls per task")
    input_tokens_per_call: Optional[float] = key(Number(ge=0), help="mean input tokens per call")
    output_tokens_per_call: Optional[float] = key(Number(ge=0), help="mean output tokens per call")
    tool_wait_seconds: float = key(Number(ge=0), 0.0, help="tool time inside one task (the demo's latency estimate)")


@dataclass(frozen=True)
class Destination:
    """Where a digest goes; one subclass per `type`, each declaring its own keys."""

    name: Optional[str] = key(Text(pattern=_NAME, like="letters, digits, '.', '_' or '-'"),
                              help="unique name (part of the idempotency key; default: the type)")
    type: str = key(Choice(DEST_TYPES), required=True, help="directory, webhook or smtp")
    timeout: float = 10.0  # seconds a delivery may take (the outbox lease is sized from it)

    def secret(self, kind: str) -> Optional[str]:
        """Read a secret ("url", "bearer_token", "password") from its file or variable."""
        path, env = getattr(self, f"{kind}_file", None), getattr(self, f"{kind}_env", None)
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

    def check(self, r: Reader, at: str) -> Optional["Destination"]:
        return replace(self, name=self.type) if self.name is None else None


@dataclass(frozen=True)
class DirectoryDestination(Destination):
    path: Optional[str] = key(Text(), required=True, help="directory; each week is written to PATH/<iso week>/")
    formats: tuple[str, ...] = key(Subset(FORMATS), FORMATS, help="files written")

    def describe(self) -> str:
        return f"directory {self.path}"


@dataclass(frozen=True)
class WebhookDestination(Destination):
    url: Optional[str] = key(Url(secret=True), help="webhook URL (a secret: prefer url_file or url_env)")
    url_file: Optional[str] = key(SecretFile(), help="file holding the webhook URL")
    url_env: Optional[str] = key(SecretEnv(), help="environment variable holding the webhook URL")
    bearer_token_file: Optional[str] = key(SecretFile(), help="file holding a bearer token")
    bearer_token_env: Optional[str] = key(SecretEnv(), help="environment variable holding a bearer token")
    timeout: float = key(Duration(gt=0, le=3600), 10.0, help="time box of one delivery")

    def webhook_url(self) -> str:
        return self.url or self.secret("url") or ""

    def describe(self) -> str:
        """Where it goes, without any secret (webhook URLs carry tokens: only the host is shown)."""
        host = urlparse(self.url).hostname if self.url else "(url from secret)"
        return f"webhook {host}"

    def check(self, r: Reader, at: str) -> Optional[Destination]:
        if sum(1 for x in (self.url, self.url_file, self.url_env) if x) != 1:
            raise r.fail(at, "give exactly one of url, url_file or url_env (a Slack webhook URL is a "
                             "secret: prefer url_file or url_env)")
        if self.bearer_token_file and self.bearer_token_env:
            raise r.fail(at, "give either bearer_token_file or bearer_token_env, not both")
        return super().check(r, at)


@dataclass(frozen=True)
class SmtpDestination(Destination):
    REMOVED: ClassVar[dict] = {"password": "not accepted in the file: use password_file or password_env"}
    host: Optional[str] = key(Text(), required=True, help="SMTP server")
    port: int = key(Int(ge=1, le=65535), 25, help="SMTP port (465 with ssl, 587 with starttls)")
    starttls: bool = key(Flag(), False, help="upgrade the connection with STARTTLS")
    ssl: bool = key(Flag(), False, help="implicit TLS (usually port 465)")
    username: Optional[str] = key(Text(), help="SMTP user (required with a password)")
    password_file: Optional[str] = key(SecretFile(), help="file holding the SMTP password")
    password_env: Optional[str] = key(SecretEnv(), help="environment variable holding the SMTP password")
    sender: Optional[str] = key(Text(pattern=_EMAIL, like="an e-mail address"), path="from", required=True,
                                help="sender address")
    to: tuple[str, ...] = key(ListOf(Text(pattern=_EMAIL, like="an e-mail address"), single=True, as_tuple=True),
                              (), required=True, help="recipients (one address or a list)")
    subject_prefix: str = key(Text(), "[headroom]", help="start of the subject line")
    ca_file: Optional[str] = key(File(), help="CA bundle to verify the server (default: system)")
    timeout: float = key(Duration(gt=0, le=3600), 30.0, help="time box of one delivery")

    def describe(self) -> str:
        return f"smtp {self.host}:{self.port} to {', '.join(self.to)}"

    def check(self, r: Reader, at: str) -> Optional[Destination]:
        if not self.to:
            raise r.fail(f"{at}.to", "give at least one e-mail address")
        if self.starttls and self.ssl:
            raise r.fail(at, "starttls and ssl are exclusive (ssl is implicit TLS, usually port 465)")
        if (self.password_file or self.password_env) and not self.username:
            raise r.fail(f"{at}.username", "required with a password")
        if self.password_file and self.password_env:
            raise r.fail(at, "give either password_file or password_env, not both")
        return super().check(r, at)


@dataclass(frozen=True)
class Retry:
    initial_seconds: float = key(Duration(gt=0), 30.0, path="initial", help="first wait after a failed delivery")
    max_seconds: float = key(Duration(gt=0), 3600.0, path="max", help="longest wait between attempts")
    factor: float = key(Number(ge=1), 2.0, help="each wait is the previous one times this")
    max_attempts: int = key(Int(ge=0), 0, help="give up after this many attempts (0: until delivered)")


_DESTINATIONS = Tagged("type", {"directory": DirectoryDestination, "webhook": WebhookDestination,
                                "smtp": SmtpDestination})


@dataclass(frozen=True)
class DigestSettings:
    REMOVED: ClassVar[dict] = {"pools": "moved: the digest reads pool facts from the top-level pools.<pool> "
                                        "section (replicas, gpus_per_replica, max_num_seqs, ...): move them there"}
    schedule: Schedule = key(Sub(Schedule), Schedule(), help="when the digest is built (weekly)")
    outbox: str = key(StorePath("digest-outbox.sqlite"), "headroom-digest-outbox.sqlite",
                      help="SQLite outbox: one delivery per week and destination, retried")
    work_dir: Optional[str] = key(Text(), help="where rendered digests are kept (default: next to the outbox)")
    title: str = key(Text(), "headroom weekly capacity digest", help="title of the digest")
    history_source: str = key(Choice(("auto", "store", "prometheus")), "auto", path="history.source",
                              help="where history is read (auto: the store, else Prometheus)")
    history_step: float = key(Duration(gt=0, le=86400), 300.0, path="history.step", help="step of the history read")
    forecast_models: tuple[str, ...] = key(Subset(_models), ("mstl", "snaive_week"), path="forecast.models",
                                           help="forecast candidates, in fallback order")
    recommend_level: float = key(Choice((0.8, 0.95)), 0.95, path="forecast.recommend_level",
                                 help="band whose upper bound the recommendation sizes for")
    prices: Prices = key(Sub(Prices), Prices(), help="prices of GPU time, energy and a managed API")
    # pool (or *) -> what history does not carry (replicas, GPUs, watts, a pinned knee, tokens per call):
    # the top-level `pools:` section itself (monitor/capacity/settings.py PoolSettings), never retyped
    pools: dict[str, "PoolSettings"] = field(default_factory=dict)
    tasks: dict[str, TaskFacts] = key(MapOf(Sub(TaskFacts), names="task type"), {}, help="facts per task type")
    slo_targets: dict[str, float] = field(default_factory=dict)  # task type -> seconds, from the top-level `slos:`
    slo_objectives: dict[str, float] = field(default_factory=dict)  # task type -> objective, from `slos:`
    spare_margin: float = 0.2  # from capacity.spare_margin (the week's spare windows), never retyped
    destinations: tuple[Destination, ...] = key(ListOf(_DESTINATIONS, as_tuple=True), (),
                                                help="where the digest goes")
    retry: Retry = key(Sub(Retry), Retry(), help="retries of a failed delivery")
    timezone: Optional[str] = key(Timezone(), help="zone of the days and hours the digest names (default: the schedule's)")

    def __post_init__(self) -> None:
        if self.timezone is None:
            object.__setattr__(self, "timezone", self.schedule.timezone)

    @property
    def zone(self) -> str:
        """The zone the digest names its days and hours in: `timezone`, which defaults to the schedule's."""
        return self.timezone or self.schedule.timezone

    def check(self, r: Reader, at: str) -> None:
        seen: set = set()
        for i, d in enumerate(self.destinations):
            if d.name in seen:
                raise r.fail(f"{at}.destinations[{i}].name",
                             f"destination name {d.name!r} is used twice (it is part of the idempotency key)")
            seen.add(d.name)


def from_dict(d: Any, file: str = "<config>", slos: Optional["SloSettings"] = None,
              pools: Optional[dict[str, "PoolSettings"]] = None) -> DigestSettings:
    """Validate the `digest:` mapping. `slos` and `pools` are the configuration's `slos:` and
    `pools:` sections, already read: SLO targets and pool facts come from there, never repeated here."""
    return with_daemon(Reader(file).section(DigestSettings, d, "digest"), slos, pools)


def with_daemon(settings: DigestSettings, slos: Optional["SloSettings"],
                pools: Optional[dict[str, "PoolSettings"]] = None,
                spare_margin: Optional[float] = None) -> DigestSettings:
    """The digest's task targets and objectives from the `slos:` section, its pools from the
    `pools:` section and the spare margin from `capacity:` (never repeated in `digest:`)."""
    targets, objectives = {}, {}
    if slos is not None:
        for tt, t in slos.task_targets.items():
            targets[tt], objectives[tt] = t.seconds, t.objective
        if slos.default_task_target is not None:
            targets["*"], objectives["*"] = slos.default_task_target.seconds, slos.default_task_target.objective
    margin = settings.spare_margin if spare_margin is None else spare_margin
    return replace(settings, slo_targets=targets, slo_objectives=objectives, pools=dict(pools or {}),
                   spare_margin=margin)
