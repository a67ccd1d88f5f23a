"""Agent workload: task types, arrival-rate profiles, token distributions, trace replay.

A *task* is one agent session (its id becomes the gateway's ``session_id``). Tasks of each type
arrive as a non-homogeneous Poisson process whose rate is ``rate_per_s`` x profile(t): an
hour-of-day shape for weekdays, a weekend factor and optional bursts (start of the workday, a
scheduled batch run). Inside a task the model calls are closed-loop: a *step* issues ``calls``
model calls at once (``calls > 1`` = overlapping calls); the next step starts when every call of
the step has finished plus a tool wait. A failed call (gateway error with probability
``error_rate``, or a replica that went away) is retried after ``backoff_s`` up to
``max_retries`` times; after that the task fails.

A task type may instead have a closed population (``sessions: N``, ``think_s``): N sessions
each run the task back to back, pausing ``think_s`` (exponential mean) in between, so at most N
calls per step are in flight (scenario levels and profiles do not change N).

The open-loop replay (:class:`TraceReplay`) sends one single-call task per row of a real trace
(Azure LLM inference trace 2023, code; see data/ATTRIBUTION.md) at its recorded offsets.
"""
from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

from monitor.kit.settings.reader import read_yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MIX = os.path.join(HERE, "default_mix.yaml")
DATA_DIR = os.path.join(HERE, "data")

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _err(where: str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}")


@dataclass
class TokenDist:
    """Lognormal token count with the given mean and coefficient of variation, clipped."""

    mean: float
    cv: float = 0.5
    min: int = 1
    max: int = 8192

    def __post_init__(self):
        self.sigma = math.sqrt(math.log1p(self.cv ** 2)) if self.cv > 0 else 0.0
        self.mu = math.log(self.mean) - self.sigma ** 2 / 2

    def sample(self, rng: random.Random) -> int:
        if self.sigma == 0:
            v = self.mean
        else:
            v = rng.lognormvariate(self.mu, self.sigma)
        return int(min(self.max, max(self.min, round(v))))

    @classmethod
    def parse(cls, where: str, d: Any) -> "TokenDist":
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            d = {"mean": d, "cv": 0.0}
        if not isinstance(d, dict) or "mean" not in d:
            raise _err(where, f"expected a number or a mapping with 'mean' (and 'cv', 'min', "
                              f"'max'), got {d!r}")
        unknown = set(d) - {"mean", "cv", "min", "max"}
        if unknown:
            raise _err(where, f"unknown key(s) {sorted(unknown)}")
        mean = d["mean"]
        if not isinstance(mean, (int, float)) or mean < 1:
            raise _err(where, f"mean must be a number >= 1, got {mean!r}")
        cv = d.get("cv", 0.5)
        if not isinstance(cv, (int, float)) or cv < 0:
            raise _err(where, f"cv must be a number >= 0, got {cv!r}")
        return cls(float(mean), float(cv), int(d.get("min", 1)), int(d.get("max", 8192)))


@dataclass
class Step:
    calls: int
    prompt: TokenDist
    output: TokenDist
    tool_wait_s: float = 0.0  # mean wait after this step (exponential), before the next one


@dataclass
class Burst:
    days: tuple[int, ...]  # weekday indexes 0=Mon
    start_hour: float
    duration_hours: float
    multiplier: float


@dataclass
class Profile:
    """Relative arrival rate by hour of day (weekday shape), weekend factor, bursts."""

    name: str
    hourly: tuple[float, ...] = (1.0,) * 24
    weekend_factor: float = 1.0
    bursts: tuple[Burst, ...] = ()
    weekend_hourly: Optional[tuple[float, ...]] = None

    def value(self, weekday: int, hour: float) -> float:
        h = int(hour) % 24
        frac = hour - int(hour)
        shape = self.weekend_hourly if (weekday >= 5 and self.weekend_hourly) else self.hourly
        # linear interpolation between hour points keeps the rate continuous
        v = shape[h] * (1 - frac) + shape[(h + 1) % 24] * frac
        if weekday >= 5 and not self.weekend_hourly:
            v *= self.weekend_factor
        for b in self.bursts:
            if weekday in b.days and b.start_hour <= hour < b.start_hour + b.duration_hours:
                v *= b.multiplier
        return v

    def mean_value(self) -> float:
        tot = 0.0
        for d in range(7):
            for h in range(24):
                for q in (0.0, 0.25, 0.5, 0.75):
                    tot += self.value(d, h + q)
        return tot / (7 * 24 * 4)

    @classmethod
    def parse(cls, name: str, d: Any) -> "Profile":
        where = f"profile {name!r}"
        if not isinstance(d, dict):
            raise _err(where, "expected a mapping")
        hourly = d.get("hourly", [1.0] * 24)
        if not isinstance(hourly, list) or len(hourly) != 24 or \
                not all(isinstance(x, (int, float)) and x >= 0 for x in hourly):
            raise _err(where, "hourly must be a list of 24 numbers >= 0")
        wh = d.get("weekend_hourly")
        if wh is not None and (not isinstance(wh, list) or len(wh) != 24):
            raise _err(where, "weekend_hourly must be a list of 24 numbers")
        bursts = []
        for i, b in enumerate(d.get("bursts", []) or []):
            bw = f"{where} burst {i}"
            if not isinstance(b, dict):
                raise _err(bw, "expected a mapping")
            days = b.get("days", ["mon", "tue", "wed", "thu", "fri"])
            try:
                di = tuple(WEEKDAYS.index(str(x).lower()[:3]) for x in days)
            except ValueError:
                raise _err(bw, f"days must be weekday names (mon..sun), got {days!r}") from None
            at = str(b.get("at", "09:00"))
            try:
                hh, mm = at.split(":")
                start = int(hh) + int(mm) / 60
            except ValueError:
                raise _err(bw, f"at must be HH:MM, got {at!r}") from None
            dur = float(b.get("duration_min", 30)) / 60
            mult = float(b.get("multiplier", 2.0))
            bursts.append(Burst(di, start, dur, mult))
        return cls(name, tuple(float(x) for x in hourly), float(d.get("weekend_factor", 1.0)),
                   tuple(bursts), tuple(float(x) for x in wh) if wh else None)


@dataclass
class TaskType:
    name: str
    pool: str
    rate_per_s: float  # tasks per second at profile value 1.0
    profile: Profile
    steps: list[Step]
    klass: str = "interactive"
    prefix_key: Optional[str] = None
    prefix_tokens: int = 0
    error_rate: float = 0.0
    max_retries: int = 2
    backoff_s: float = 1.0
    max_tokens_factor: float = 2.0
    sessions: int = 0  # > 0: closed population of sessions running this task back to back
    think_s: float = 0.0  # closed population: mean pause between a session's tasks

    @property
    def calls_per_task(self) -> int:
        return sum(s.calls for s in self.steps)


@dataclass
class Mix:
    task_types: dict[str, TaskType]
    profiles: dict[str, Profile] = field(default_factory=dict)
    utc_offset_hours: float = 0.0

    def pool_token_means(self, pool: str, samples: int = 4000, seed: int = 7) -> dict[str, float]:
        """Token statistics of the calls routed to ``pool``, weighted by mean call rate.

        ``prompt``/``output``: call-weighted means (after clipping). ``kv_footprint``: the KV
        tokens a running call holds on average over time, i.e. weighted by residence (which is
        proportional to the output length): E[prompt*output + output^2/2] / E[output]."""
        wsum = p_sum = o_sum = po_sum = oo_sum = 0.0
        rng = random.Random(seed)
        for tt in self.task_types.values():
            if tt.pool != pool:
                continue
            # closed populations: weight by sessions (one call in flight per session and step)
            task_rate = tt.rate_per_s * tt.profile.mean_value() if not tt.sessions \
                else float(tt.sessions) / len(tt.steps)
            for s in tt.steps:
                w = task_rate * s.calls
                ps = [s.prompt.sample(rng) for _ in range(samples)]
                os_ = [s.output.sample(rng) for _ in range(samples)]
                wsum += w
                p_sum += w * sum(ps) / samples
                o_sum += w * sum(os_) / samples
                po_sum += w * sum(a * b for a, b in zip(ps, os_)) / samples
                oo_sum += w * sum(b * b for b in os_) / samples
        if wsum == 0:
            raise ValueError(f"no task type routes calls to pool {pool!r}")
        return {"prompt": p_sum / wsum, "output": o_sum / wsum, "call_rate": wsum,
                "kv_footprint": (po_sum + oo_sum / 2.0) / o_sum}


def _parse_task_type(name: str, d: Any, profiles: dict[str, Profile]) -> TaskType:
    where = f"task type {name!r}"
    if not isinstance(d, dict):
        raise _err(where, "expected a mapping")
    for key in ("pool", "steps"):
        if key not in d:
            raise _err(where, f"missing required key {key!r}")
    sessions = d.get("sessions", 0)
    if not isinstance(sessions, int) or isinstance(sessions, bool) or sessions < 0:
        raise _err(where, f"sessions must be an integer >= 0, got {sessions!r}")
    if sessions and "rate_per_s" in d:
        raise _err(where, "give either rate_per_s (open arrivals) or sessions (closed "
                          "population), not both")
    if not sessions and "rate_per_s" not in d:
        raise _err(where, "missing required key 'rate_per_s' (or 'sessions')")
    rate = d.get("rate_per_s", 0.0)
    if not isinstance(rate, (int, float)) or rate < 0:
        raise _err(where, f"rate_per_s must be a number >= 0, got {rate!r}")
    think = d.get("think_s", 0.0)
    if not isinstance(think, (int, float)) or think < 0:
        raise _err(where, f"think_s must be a number >= 0, got {think!r}")
    prof_name = d.get("profile", "flat")
    if isinstance(prof_name, dict):
        profile = Profile.parse(f"{name}.profile", prof_name)
    elif prof_name == "flat":
        profile = profiles.get("flat", Profile("flat"))
    elif prof_name in profiles:
        profile = profiles[prof_name]
    else:
        raise _err(where, f"unknown profile {prof_name!r} (known: {sorted(profiles)})")
    steps_raw = d["steps"]
    if not isinstance(steps_raw, list) or not steps_raw:
        raise _err(where, "steps must be a non-empty list")
    steps = []
    for i, s in enumerate(steps_raw):
        sw = f"{where} step {i}"
        if not isinstance(s, dict):
            raise _err(sw, "expected a mapping")
        unknown = set(s) - {"calls", "prompt", "output", "tool_wait_s", "repeat"}
        if unknown:
            raise _err(sw, f"unknown key(s) {sorted(unknown)}")
        calls = s.get("calls", 1)
        if not isinstance(calls, int) or calls < 1:
            raise _err(sw, f"calls must be an integer >= 1, got {calls!r}")
        if "prompt" not in s or "output" not in s:
            raise _err(sw, "needs 'prompt' and 'output' token distributions")
        wait = s.get("tool_wait_s", 0.0)
        if not isinstance(wait, (int, float)) or wait < 0:
            raise _err(sw, f"tool_wait_s must be a number >= 0, got {wait!r}")
        step = Step(calls, TokenDist.parse(f"{sw} prompt", s["prompt"]),
                    TokenDist.parse(f"{sw} output", s["output"]), float(wait))
        for _ in range(int(s.get("repeat", 1))):
            steps.append(step)
    klass = d.get("class", "interactive")
    if klass not in ("interactive", "batch"):
        raise _err(where, f"class must be 'interactive' or 'batch', got {klass!r}")
    retries = d.get("retries", {}) or {}
    prefix = d.get("prefix") or {}
    return TaskType(
        name=name, pool=str(d["pool"]), rate_per_s=float(rate), profile=profile, steps=steps,
        klass=klass, prefix_key=prefix.get("key", f"{name}-system") if prefix else None,
        prefix_tokens=int(prefix.get("tokens", 0)) if prefix else 0,
        error_rate=float(retries.get("error_rate", 0.0)),
        max_retries=int(retries.get("max_retries", 2)),
        backoff_s=float(retries.get("backoff_s", 1.0)),
        max_tokens_factor=float(d.get("max_tokens_factor", 2.0)),
        sessions=sessions, think_s=float(think),
    )


def parse_mix(data: Any, where: str = "mix") -> Mix:
    if not isinstance(data, dict):
        raise _err(where, "expected a mapping with 'task_types'")
    profiles = {"flat": Profile("flat")}
    for name, p in (data.get("profiles") or {}).items():
        profiles[name] = Profile.parse(name, p)
    tts = data.get("task_types")
    if not isinstance(tts, dict) or not tts:
        raise _err(where, "'task_types' must be a non-empty mapping")
    task_types = {name: _parse_task_type(name, d, profiles) for name, d in tts.items()}
    return Mix(task_types, profiles, float(data.get("utc_offset_hours", 0.0)))


def load_mix(path: Optional[str] = None) -> Mix:
    path = path or DEFAULT_MIX
    return parse_mix(read_yaml(path), where=path)  # ConfigError (a ValueError) naming the file


def profile_clock(t: float, start: float, day_seconds: float, utc_offset_hours: float = 0.0):
    """(weekday 0=Mon, hour of day) seen by the profiles at simulated time t.

    ``day_seconds`` < 86400 compresses days (a demo can show a whole day in minutes)."""
    pc = start + (t - start) * (86400.0 / day_seconds) + utc_offset_hours * 3600.0
    days = math.floor(pc / 86400.0)
    weekday = (days + 3) % 7  # 1970-01-01 was a Thursday
    hour = (pc - days * 86400.0) / 3600.0
    return weekday, hour


# ---------------------------------------------------------------------------- trace replay
DEFAULT_TRACE = os.path.join(DATA_DIR, "azure_llm_2023_code_slice.csv")


@dataclass
class TraceRow:
    offset_s: float
    prompt: int
    output: int


def load_trace(path: str = DEFAULT_TRACE) -> list[TraceRow]:
    """Rows of an Azure-2023-format CSV (TIMESTAMP, ContextTokens, GeneratedTokens) as offsets."""
    rows: list[TraceRow] = []
    try:
        f = open(path, encoding="utf-8", newline="")
    except FileNotFoundError:
        raise ValueError(f"trace file not found: {path}") from None
    with f:
        reader = csv.DictReader(f)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            raise ValueError(f"trace {path}: expected columns {sorted(need)}, "
                             f"got {reader.fieldnames}")
        t0 = None
        for i, row in enumerate(reader, start=2):
            try:
                ts = datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f")
                p, o = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (ValueError, TypeError) as exc:
                raise ValueError(f"trace {path} line {i}: {exc}") from None
            sec = ts.timestamp()
            if t0 is None:
                t0 = sec
            rows.append(TraceRow(sec - t0, max(1, p), max(1, o)))
    if not rows:
        raise ValueError(f"trace {path} has no rows")
    return rows


@dataclass
class TraceReplay:
    """Open-loop replay settings: rows are sent at offset/speed, looping when ``loop``."""

    pool: str
    path: str = DEFAULT_TRACE
    speed: float = 1.0
    loop: bool = True
    task_type: str = "trace_replay"
    max_model_len: Optional[int] = None
    rows: list[TraceRow] = field(default_factory=list)

    def load(self) -> "TraceReplay":
        if self.speed <= 0:
            raise ValueError(f"trace replay speed must be > 0, got {self.speed}")
        self.rows = load_trace(self.path)
        return self

    @property
    def span_s(self) -> float:
        return self.rows[-1].offset_s + 1.0
