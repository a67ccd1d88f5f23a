"""The load-test task mix: `headroom plan`'s mix format, extended (docs/loadtest.md).

Plan keys keep their meaning (`task_types.<name>.tasks_per_second|tasks_per_hour`, `calls_per_task`,
`margin`, ...). The load test adds, per task type: `class` (interactive|batch), `prompt_tokens` and
`output_tokens` (lognormal: mean, cv, min, max), `tool_wait_seconds` (exponential mean, or
{mean, cv=1}), `retries` {max, backoff_seconds}, `api` (completions|chat); and at the top: `slo`,
`request` and `load`. Every error names the key path (`task_types.q.prompt_tokens.mean: ...`).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

TOP_KEYS = {"pool", "replicas", "knee_requests_per_replica", "kv_capacity_tokens_per_replica", "margin",
            "busy_period", "what_if", "task_types", "slo", "request", "load"}
TASK_KEYS = {"tasks_per_second", "tasks_per_hour", "weight", "calls_per_task", "seconds_per_call",
             "kv_tokens_per_call", "class", "prompt_tokens", "output_tokens", "tool_wait_seconds", "retries",
             "api"}
DIST_KEYS = {"mean", "cv", "min", "max"}
SLO_KEYS = {"quantile", "ttft_seconds", "call_seconds", "task_seconds", "max_error_ratio"}
REQUEST_KEYS = {"api", "prompt_mode", "token_id_range", "ignore_eos", "timeout_seconds", "temperature"}
LOAD_KEYS = {"sessions", "rate_scale", "ramp", "burst", "max_sessions", "max_calls",
             "drain_seconds", "window_seconds"}
RAMP_KEYS = {"start", "step", "max", "step_seconds"}
BURST_KEYS = {"sessions", "every_seconds", "tasks_per_session"}
RETRY_KEYS = {"max", "backoff_seconds"}
APIS = ("completions", "chat")


class MixError(ValueError):
    """A bad mix file: `key` is the dotted path of the offending key."""

    def __init__(self, where: str, key: str, problem: str):
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")
        self.where, self.key, self.problem = where, key, problem


@dataclass(frozen=True)
class Dist:
    """Lognormal integer token count with the given mean and coefficient of variation, clipped."""

    mean: float
    cv: float = 0.0
    min: int = 1
    max: int = 1_000_000

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

    mean: float = 0.0
    cv: float = 1.0

    def sample(self, rng: random.Random) -> float:
        if self.mean <= 0:
            return 0.0
        if self.cv <= 0:
            return self.mean
        if abs(self.cv - 1.0) < 1e-9:
            return rng.expovariate(1.0 / self.mean)
        sigma = math.sqrt(math.log1p(self.cv ** 2))
        return rng.lognormvariate(math.log(self.mean) - sigma ** 2 / 2, sigma)


@dataclass(frozen=True)
class TaskType:
    name: str
    klass: str  # interactive | batch
    tasks_per_second: float  # arrival rate (sustained / reduced-capacity); weight elsewhere
    weight: float  # share of tasks when sessions pick task types (ramp, burst)
    calls_per_task: int
    prompt: Dist
    output: Dist
    tool_wait: Wait
    max_retries: int = 0
    backoff_seconds: float = 0.5
    api: Optional[str] = None  # overrides request.api


@dataclass(frozen=True)
class Slo:
    quantile: float = 0.95
    ttft_seconds: Optional[float] = None
    call_seconds: Optional[float] = None
    task_seconds: Optional[float] = None
    max_error_ratio: float = 0.01


@dataclass(frozen=True)
class RequestSettings:
    api: str = "completions"
    prompt_mode: str = "text"  # text | token_ids (vLLM completions accept a list of token ids)
    token_id_range: tuple[int, int] = (4, 500)
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens
    timeout_seconds: float = 60.0
    temperature: float = 0.0


@dataclass(frozen=True)
class Ramp:
    start: int = 1
    step: int = 1
    max: int = 16
    step_seconds: Optional[float] = None  # default: duration / number of steps


@dataclass(frozen=True)
class BurstSettings:
    sessions: Optional[int] = None  # default: load.sessions
    every_seconds: float = 0.0  # 0: one wave at the start
    tasks_per_session: int = 1


@dataclass(frozen=True)
class Load:
    sessions: int = 8
    rate_scale: float = 1.0
    ramp: Ramp = field(default_factory=Ramp)
    burst: BurstSettings = field(default_factory=BurstSettings)
    max_sessions: int = 256
    max_calls: int = 20_000
    drain_seconds: Optional[float] = None  # default: request.timeout_seconds
    window_seconds: float = 5.0


@dataclass(frozen=True)
class LoadMix:
    task_types: dict[str, TaskType]
    slo: Slo
    request: RequestSettings
    load: Load
    margin: float = 0.2
    digest: str = ""  # sha256 of the validated content: two runs of the same mix share it
    source: str = "mix"

    def api_of(self, tt: TaskType) -> str:
        return tt.api or self.request.api


# ---- validation helpers --------------------------------------------------------------------

class _V:
    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, problem: str) -> MixError:
        return MixError(self.where, key, problem)

    def mapping(self, v: Any, key: str, allowed: set[str]) -> dict:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.fail(key, f"expected a mapping, got {type(v).__name__}")
        for k in v:
            if k not in allowed:
                raise self.fail(f"{key}.{k}" if key else str(k),
                                f"unknown key (known: {', '.join(sorted(allowed))})")
        return v

    def num(self, d: dict, name: str, key: str, default=None, *, minimum: Optional[float] = None,
            above: Optional[float] = None, maximum: Optional[float] = None, integer: bool = False):
        path = f"{key}.{name}" if key else name
        if name not in d or d[name] is None:
            return default
        v = d[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise self.fail(path, f"expected {'an integer' if integer else 'a number'}, got {v!r}")
        if not math.isfinite(v):
            raise self.fail(path, f"must be finite, got {v!r}")
        if minimum is not None and v < minimum:
            raise self.fail(path, f"must be >= {minimum:g}, got {v!r}")
        if above is not None and not v > above:
            raise self.fail(path, f"must be > {above:g}, got {v!r}")
        if maximum is not None and v > maximum:
            raise self.fail(path, f"must be <= {maximum:g}, got {v!r}")
        return int(v) if integer else float(v)

    def choice(self, d: dict, name: str, key: str, options: tuple, default):
        path = f"{key}.{name}" if key else name
        v = d.get(name, default)
        if v not in options:
            raise self.fail(path, f"must be one of {', '.join(options)}, got {v!r}")
        return v

    def dist(self, v: Any, key: str, default: Dist) -> Dist:
        if v is None:
            return default
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = {"mean": v, "cv": 0}
        d = self.mapping(v, key, DIST_KEYS)
        if "mean" not in d:
            raise self.fail(f"{key}.mean", "is required (a token distribution needs its mean)")
        mean = self.num(d, "mean", key, minimum=1)
        cv = self.num(d, "cv", key, 0.0, minimum=0)
        lo = self.num(d, "min", key, 1, minimum=1, integer=True)
        hi = self.num(d, "max", key, max(lo, int(mean * 8) + 1), minimum=1, integer=True)
        if hi < lo:
            raise self.fail(f"{key}.max", f"must be >= min ({lo}), got {hi}")
        return Dist(mean, cv, lo, hi)


def _task(v: _V, name: str, d: Any) -> TaskType:
    key = f"task_types.{name}"
    d = v.mapping(d, key, TASK_KEYS)
    if "tasks_per_second" in d and "tasks_per_hour" in d:
        raise v.fail(key, "give at most one of tasks_per_second or tasks_per_hour")
    if "tasks_per_hour" in d:
        rate = v.num(d, "tasks_per_hour", key, minimum=0) / 3600.0
    else:
        rate = v.num(d, "tasks_per_second", key, 0.0, minimum=0)
    weight = v.num(d, "weight", key, rate if rate > 0 else 1.0, minimum=0)
    calls = d.get("calls_per_task", 1)
    if isinstance(calls, float) and calls.is_integer():
        calls = int(calls)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise v.fail(f"{key}.calls_per_task", f"must be a whole number >= 1 (each call is one request), got {calls!r}")
    klass = v.choice(d, "class", key, ("interactive", "batch"), "interactive")
    prompt = v.dist(d.get("prompt_tokens"), f"{key}.prompt_tokens", Dist(256.0, 0.0, 1, 2048))
    output = v.dist(d.get("output_tokens"), f"{key}.output_tokens", Dist(64.0, 0.0, 1, 512))
    tw = d.get("tool_wait_seconds", 0.0)
    if isinstance(tw, dict):
        tw = v.mapping(tw, f"{key}.tool_wait_seconds", {"mean", "cv"})
        wait = Wait(v.num(tw, "mean", f"{key}.tool_wait_seconds", 0.0, minimum=0),
                    v.num(tw, "cv", f"{key}.tool_wait_seconds", 1.0, minimum=0))
    else:
        wait = Wait(v.num(d, "tool_wait_seconds", key, 0.0, minimum=0), 1.0)
    rt = v.mapping(d.get("retries"), f"{key}.retries", RETRY_KEYS)
    retries = v.num(rt, "max", f"{key}.retries", 0, minimum=0, maximum=10, integer=True)
    backoff = v.num(rt, "backoff_seconds", f"{key}.retries", 0.5, minimum=0, maximum=300)
    api = d.get("api")
    if api is not None and api not in APIS:
        raise v.fail(f"{key}.api", f"must be one of {', '.join(APIS)}, got {api!r}")
    v.num(d, "seconds_per_call", key, minimum=0)  # plan keys: validated, not used here
    v.num(d, "kv_tokens_per_call", key, minimum=0)
    return TaskType(name, klass, rate, weight, calls, prompt, output, wait, retries, backoff, api)


def parse_mix(data: Any, where: str = "mix") -> LoadMix:
    """Validate a load-test mix mapping (from YAML)."""
    v = _V(where)
    if not isinstance(data, dict):
        raise v.fail("", f"expected a mapping at the top, got {type(data).__name__}")
    v.mapping(data, "", TOP_KEYS)
    tts = data.get("task_types")
    if not isinstance(tts, dict) or not tts:
        raise v.fail("task_types", "must map at least one task type to its numbers")
    tasks = {str(k): _task(v, str(k), t) for k, t in tts.items()}
    if not any(t.weight > 0 for t in tasks.values()):
        raise v.fail("task_types", "every task type has weight 0 and tasks_per_second 0: nothing to send")
    margin = v.num(data, "margin", "", 0.2, minimum=0)
    if margin >= 1:
        raise v.fail("margin", f"must be below 1 (the share of the knee kept free), got {margin}")

    s = v.mapping(data.get("slo"), "slo", SLO_KEYS)
    q = v.num(s, "quantile", "slo", 0.95, above=0)
    if q >= 1:
        raise v.fail("slo.quantile", f"must be within (0, 1), got {q}")
    slo = Slo(q, v.num(s, "ttft_seconds", "slo", above=0), v.num(s, "call_seconds", "slo", above=0),
              v.num(s, "task_seconds", "slo", above=0), v.num(s, "max_error_ratio", "slo", 0.01, minimum=0, maximum=1))

    r = v.mapping(data.get("request"), "request", REQUEST_KEYS)
    api = v.choice(r, "api", "request", APIS, "completions")
    mode = v.choice(r, "prompt_mode", "request", ("text", "token_ids"), "text")
    rng_ = r.get("token_id_range", [4, 500])
    if (not isinstance(rng_, (list, tuple)) or len(rng_) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in rng_) or not 0 <= rng_[0] < rng_[1]):
        raise v.fail("request.token_id_range", f"expected [lowest, highest] token ids, lowest < highest, got {rng_!r}")
    ignore_eos = r.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise v.fail("request.ignore_eos", f"expected true or false, got {ignore_eos!r}")
    if mode == "token_ids" and api == "chat":
        raise v.fail("request.prompt_mode", "token_ids works with api: completions only (chat sends text)")
    for t in tasks.values():
        if mode == "token_ids" and t.api == "chat":
            raise v.fail(f"task_types.{t.name}.api", "chat cannot send request.prompt_mode token_ids")
    req = RequestSettings(api, mode, (int(rng_[0]), int(rng_[1])), ignore_eos,
                          v.num(r, "timeout_seconds", "request", 60.0, above=0, maximum=3600),
                          v.num(r, "temperature", "request", 0.0, minimum=0))

    ld = v.mapping(data.get("load"), "load", LOAD_KEYS)
    rp = v.mapping(ld.get("ramp"), "load.ramp", RAMP_KEYS)
    ramp = Ramp(v.num(rp, "start", "load.ramp", 1, minimum=1, integer=True),
                v.num(rp, "step", "load.ramp", 1, minimum=1, integer=True),
                v.num(rp, "max", "load.ramp", 16, minimum=1, integer=True),
                v.num(rp, "step_seconds", "load.ramp", above=0))
    if ramp.max < ramp.start:
        raise v.fail("load.ramp.max", f"must be >= load.ramp.start ({ramp.start}), got {ramp.max}")
    bp = v.mapping(ld.get("burst"), "load.burst", BURST_KEYS)
    burst = BurstSettings(v.num(bp, "sessions", "load.burst", None, minimum=1, integer=True),
                          v.num(bp, "every_seconds", "load.burst", 0.0, minimum=0),
                          v.num(bp, "tasks_per_session", "load.burst", 1, minimum=1, integer=True))
    load = Load(v.num(ld, "sessions", "load", 8, minimum=1, integer=True),
                v.num(ld, "rate_scale", "load", 1.0, above=0),
                ramp, burst,
                v.num(ld, "max_sessions", "load", 256, minimum=1, maximum=4096, integer=True),
                v.num(ld, "max_calls", "load", 20_000, minimum=1, integer=True),
                v.num(ld, "drain_seconds", "load", None, minimum=0),
                v.num(ld, "window_seconds", "load", 5.0, above=0))
    canon = json.dumps(data, sort_keys=True, default=str).encode()
    return LoadMix(tasks, slo, req, load, margin, hashlib.sha256(canon).hexdigest()[:16], where)


def load_mix(path: str) -> LoadMix:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise MixError(path, "", "mix file not found") from None
    except yaml.YAMLError as exc:
        raise MixError(path, "", f"not valid YAML: {exc}") from None
    return parse_mix(data, where=path)
