"""The load-test task mix: `headroom plan`'s mix format, extended (docs/loadtest.md).

Plan keys keep their meaning (`task_types.<name>.tasks_per_second|tasks_per_hour`, `calls_per_task`,
`margin`, ...). The load test adds, per task type: `class` (interactive|batch), `prompt_tokens` and
`output_tokens` (lognormal: mean, cv, min, max), `tool_wait_seconds` (exponential mean, or
{mean, cv=1}), `retries` {max, backoff_seconds}, `api` (completions|chat), `priority` (the engine priority the
mixed pattern's priority case sends); and at the top: `slo`,
`request` and `load`. Each key is declared once below and read by the configuration's reader
(monitor/kit/settings/reader.py): every error is `file: key.path: problem`.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Optional

from monitor.kit.settings.kinds import Choice, Flag, Int, Kind, Number, Raw
from monitor.kit.settings.reader import ConfigError, Reader, key, read_yaml
from monitor.kit.settings.shapes import MapOf, Sub

APIS = ("completions", "chat")
CLASSES = ("interactive", "batch", "deferrable")  # deferrable: another name for batch
# the priority sent in the mixed pattern's priority case when a task type names none: vLLM runs lower
# values first (`--scheduling-policy priority`)
DEFAULT_PRIORITY = {"interactive": 0, "batch": 10}


class MixError(ConfigError):
    """A bad mix file: `key` is the dotted path of the offending key, `where` the file."""

    @property
    def where(self) -> str:
        return self.file


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Dist:
    """Lognormal integer token count with the given mean and coefficient of variation, clipped."""

    SHORTHAND: ClassVar[str] = "a token count (always that many)"
    mean: float = key(Number(ge=1), required=True, help="mean token count")
    cv: float = key(Number(ge=0), 0.0, help="coefficient of variation (0: always the mean)")
    min: int = key(Int(ge=1), 1, help="smallest count")
    max: Optional[int] = key(Int(ge=1), help="largest count (default: 8 x mean + 1)")

    def __post_init__(self) -> None:
        if self.max is None:
            object.__setattr__(self, "max", max(self.min, int(self.mean * 8) + 1))

    @staticmethod
    def shorthand(value: Any) -> dict:
        if _number(value):
            return {"mean": value, "cv": 0}
        raise ValueError(f"expected a token count or {{mean, cv, min, max}}, got {value!r}")

    def check(self, r: Reader, at: str) -> None:
        if self.max < self.min:
            raise r.fail(f"{at}.max", f"must be >= min ({self.min}), got {self.max}")

    def sample(self, rng: random.Random) -> int:
        if self.cv <= 0:
            v = self.mean
        else:
            sigma = math.sqrt(math.log1p(self.cv ** 2))
            v = rng.lognormvariate(math.log(self.mean) - sigma ** 2 / 2, sigma)
        return int(min(self.max, max(self.min, round(v))))


@dataclass(frozen=True)
class Wait:
    """Tool wait between model calls: mean seconds; cv 1 = exponential, 0 = fixed."""

    SHORTHAND: ClassVar[str] = "mean seconds (exponential)"
    mean: float = key(Number(ge=0), 0.0, help="mean seconds")
    cv: float = key(Number(ge=0), 1.0, help="coefficient of variation (1: exponential, 0: fixed)")

    @staticmethod
    def shorthand(value: Any) -> dict:
        if _number(value):
            return {"mean": value}
        raise ValueError(f"expected seconds or {{mean, cv}}, got {value!r}")

    def sample(self, rng: random.Random) -> float:
        if self.mean <= 0:
            return 0.0
        if self.cv <= 0:
            return self.mean
        if abs(self.cv - 1.0) < 1e-9:
            return rng.expovariate(1.0 / self.mean)
        sigma = math.sqrt(math.log1p(self.cv ** 2))
        return rng.lognormvariate(math.log(self.mean) - sigma ** 2 / 2, sigma)


_PLAN_ONLY = "headroom plan key (docs/capacity.md): checked, not used by the load test"
_PLAN_KEY = "headroom plan key (docs/capacity.md): read by headroom plan, not by the load test"


@dataclass(frozen=True)
class TaskType:
    name: str = ""  # its key under task_types
    klass: str = key(Choice(CLASSES), "interactive", path="class",
                     help="call class (deferrable is read as batch: work that can wait)")
    tasks_per_second: Optional[float] = key(Number(ge=0), help="arrival rate (sustained, reduced-capacity)")
    weight: Optional[float] = key(Number(ge=0), help="share of tasks when sessions pick task types (ramp, "
                                                     "burst; default: the rate, else 1)")
    calls_per_task: int = key(Int(ge=1, whole=True), 1, help="model calls per task (each call is one request)")
    prompt: Dist = key(Sub(Dist), Dist(256.0, 0.0, 1, 2048), path="prompt_tokens",
                       help="prompt tokens per call")
    output: Dist = key(Sub(Dist), Dist(64.0, 0.0, 1, 512), path="output_tokens",
                       help="output tokens per call")
    tool_wait: Wait = key(Sub(Wait), Wait(), path="tool_wait_seconds",
                          help="tool wait between calls")
    max_retries: int = key(Int(ge=0, le=10), 0, path="retries.max", help="retries of a failed call")
    backoff_seconds: float = key(Number(ge=0, le=300), 0.5, path="retries.backoff_seconds",
                                 help="first retry's wait (doubled each time)")
    api: Optional[str] = key(Choice(APIS), help="overrides request.api")
    tasks_per_hour: Optional[float] = key(Number(ge=0), help="the arrival rate per hour (instead of per second)")
    priority: Optional[int] = key(Int(ge=-1_000_000, le=1_000_000), help=(
        "engine priority sent in the request body by --pattern mixed's priority case (vLLM: lower runs "
        "first; default interactive 0, batch 10; SGLang's order depends on its flags)"))
    seconds_per_call: Optional[float] = key(Number(ge=0), help=_PLAN_ONLY)
    kv_tokens_per_call: Optional[float] = key(Number(ge=0), help=_PLAN_ONLY)

    def check(self, r: Reader, at: str) -> "TaskType":
        if self.tasks_per_second is not None and self.tasks_per_hour is not None:
            raise r.fail(at, "give at most one of tasks_per_second or tasks_per_hour")
        rate = self.tasks_per_hour / 3600.0 if self.tasks_per_hour is not None else (self.tasks_per_second or 0.0)
        weight = self.weight if self.weight is not None else (rate if rate > 0 else 1.0)
        klass = "batch" if self.klass == "deferrable" else self.klass
        priority = DEFAULT_PRIORITY[klass] if self.priority is None else self.priority
        return replace(self, tasks_per_second=rate, weight=weight, klass=klass, priority=priority)


@dataclass(frozen=True)
class Slo:
    quantile: float = key(Number(gt=0, lt=1), 0.95, help="SLOs are judged on this quantile")
    ttft_seconds: Optional[float] = key(Number(gt=0), help="time to first token, per call")
    call_seconds: Optional[float] = key(Number(gt=0), help="whole call")
    task_seconds: Optional[float] = key(Number(gt=0), help="whole agent task, tool waits included")
    max_error_ratio: float = key(Number(ge=0, le=1), 0.01, help="share of failed calls allowed")


class TokenIdRange(Kind):
    name = "[lowest, highest]"

    def parse(self, v: Any) -> tuple[int, int]:
        if (not isinstance(v, (list, tuple)) or len(v) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in v) or not 0 <= v[0] < v[1]):
            raise ValueError(f"expected [lowest, highest] token ids, lowest < highest, got {v!r}")
        return int(v[0]), int(v[1])


@dataclass(frozen=True)
class RequestSettings:
    api: str = key(Choice(APIS), "completions", help="OpenAI-compatible API the calls use")
    prompt_mode: str = key(Choice(("text", "token_ids")), "text",
                           help="text (words), or token_ids (vLLM completions: exact prompt lengths)")
    token_id_range: tuple[int, int] = key(TokenIdRange(), (4, 500), help="token ids a token_ids prompt draws from")
    ignore_eos: bool = key(Flag(), False, help="vLLM extension: generate exactly max_tokens")
    timeout_seconds: float = key(Number(gt=0, le=3600), 60.0, help="time box of one call")
    temperature: float = key(Number(ge=0), 0.0, help="sampling temperature")

    def check(self, r: Reader, at: str) -> None:
        if self.prompt_mode == "token_ids" and self.api == "chat":
            raise r.fail(f"{at}.prompt_mode", "token_ids works with api: completions only (chat sends text)")


@dataclass(frozen=True)
class Ramp:
    start: int = key(Int(ge=1), 1, help="sessions at the first step")
    step: int = key(Int(ge=1), 1, help="sessions added per step")
    max: int = key(Int(ge=1), 16, help="sessions at the last step")
    step_seconds: Optional[float] = key(Number(gt=0), help="length of a step (default: duration / steps)")

    def check(self, r: Reader, at: str) -> None:
        if self.max < self.start:
            raise r.fail(f"{at}.max", f"must be >= load.ramp.start ({self.start}), got {self.max}")


@dataclass(frozen=True)
class BurstSettings:
    sessions: Optional[int] = key(Int(ge=1), help="tasks per wave (default: load.sessions)")
    every_seconds: float = key(Number(ge=0), 0.0, help="seconds between waves (0: one wave at the start)")
    tasks_per_session: int = key(Int(ge=1), 1, help="tasks each session runs one after the other")


@dataclass(frozen=True)
class MixedSettings:
    deferrable_concurrency: int = key(Int(ge=1, le=1024), 4, help=(
        "deferrable (batch) sessions looping side by side: the deferrable max concurrency"))
    budget_interval_seconds: float = key(Number(gt=0, le=300), 2.0, help="seconds between budget reads (budget case)")
    pause_seconds: float = key(Number(ge=0, le=600), 3.0, help="idle pause between two cases")


@dataclass(frozen=True)
class Load:
    sessions: int = key(Int(ge=1), 8, help="concurrent sessions (sustained: the cap of open sessions)")
    rate_scale: float = key(Number(gt=0), 1.0, help="sustained / reduced-capacity: x the task rates")
    ramp: Ramp = key(Sub(Ramp), Ramp(), help="--pattern ramp")
    burst: BurstSettings = key(Sub(BurstSettings), BurstSettings(), help="--pattern burst")
    mixed: MixedSettings = key(Sub(MixedSettings), MixedSettings(), help="--pattern mixed")
    max_sessions: int = key(Int(ge=1, le=4096), 256, help="hard cap on sessions")
    max_calls: int = key(Int(ge=1), 20_000, help="hard cap on calls sent")
    drain_seconds: Optional[float] = key(Number(ge=0), help="wait for calls in flight at the end "
                                                            "(default: request.timeout_seconds)")
    window_seconds: float = key(Number(gt=0), 5.0, help="analysis window")


@dataclass(frozen=True)
class LoadMix:
    task_types: dict[str, TaskType] = key(MapOf(Sub(TaskType), name_field="name", names="task type"), {},
                                          help="the task types and their numbers")
    slo: Slo = key(Sub(Slo), Slo(), help="what the experience must stay within")
    request: RequestSettings = key(Sub(RequestSettings), RequestSettings(), help="how calls are sent")
    load: Load = key(Sub(Load), Load(), help="sessions and limits of each pattern")
    margin: float = key(Number(ge=0, lt=1), 0.2, help="share of the knee kept free: operating point = "
                                                      "knee x (1 - margin)")
    digest: str = ""  # sha256 of the validated content: two runs of the same mix share it
    source: str = "mix"
    pool: Any = key(Raw(), help=_PLAN_KEY)
    replicas: Any = key(Raw(), help=_PLAN_KEY)
    knee_requests_per_replica: Any = key(Raw(), help=_PLAN_KEY)
    kv_capacity_tokens_per_replica: Any = key(Raw(), help=_PLAN_KEY)
    busy_period: Any = key(Raw(), help=_PLAN_KEY)
    what_if: Any = key(Raw(), help=_PLAN_KEY)

    def api_of(self, tt: TaskType) -> str:
        return tt.api or self.request.api

    def check(self, r: Reader, at: str) -> None:
        if not self.task_types:
            raise r.fail("task_types", "must map at least one task type to its numbers")
        if not any(t.weight > 0 for t in self.task_types.values()):
            raise r.fail("task_types", "every task type has weight 0 and tasks_per_second 0: nothing to send")
        for t in self.task_types.values():
            if self.request.prompt_mode == "token_ids" and t.api == "chat":
                raise r.fail(f"task_types.{t.name}.api", "chat cannot send request.prompt_mode token_ids")


def parse_mix(data: Any, where: str = "mix") -> LoadMix:
    """Validate a load-test mix mapping (from YAML)."""
    mix = Reader(where, MixError).section(LoadMix, data, "")
    canon = json.dumps(data, sort_keys=True, default=str).encode()
    return replace(mix, digest=hashlib.sha256(canon).hexdigest()[:16], source=where)


def load_mix(path: str) -> LoadMix:
    return parse_mix(read_yaml(path, MixError), where=path)
