"""Arrival patterns as plain, seeded plans (pure: no I/O, no clock).

Every pattern is a list of sessions. A session starts at an offset from the run start and runs agent
tasks one after another (closed loop: the next call of a task goes out when the previous one has
answered plus the tool wait; the next task when the previous task is done) until it has run
`max_tasks` tasks or the run's duration is over.

  sustained         tasks arrive as a Poisson process at the mix's tasks_per_second x rate_scale;
                    each arrival is a session of one task (sessions overlap freely)
  burst             waves of `burst.sessions` sessions starting at the SAME instant (offset 0, then
                    every `burst.every_seconds`), `burst.tasks_per_session` tasks each
  ramp              `ramp.start` looping sessions, `ramp.step` more every `step_seconds`, up to
                    `ramp.max`: concurrency steps up to find the knee
  reduced-capacity  the sustained plan (same seed, same arrivals) against fewer replicas
  mixed             interactive tasks arrive as in sustained (the interactive task types' rates),
                    beside `mixed.deferrable_concurrency` deferrable (batch) sessions that loop from
                    the start: a backlog worked by a pool of workers (mixed.py runs it as four cases)

What a session sends is a function of (seed, session index, task number) only, so two runs with the
same mix and seed send the same prompts in the same order, whatever the target answers.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from .mix import LoadMix

PATTERNS = ("burst", "sustained", "ramp", "reduced-capacity", "mixed")


@dataclass(frozen=True)
class SessionPlan:
    index: int
    start: float  # seconds after the run start
    max_tasks: Optional[int]  # None: loop until the duration is over
    step: int = 0  # ramp step (or burst wave) the session joined in
    klass: Optional[str] = None  # mixed: the session runs task types of this class only


@dataclass(frozen=True)
class CallPlan:
    prompt_tokens: int
    output_tokens: int
    wait_after: float  # tool wait before the next call of the task (0 after the last)


@dataclass(frozen=True)
class TaskPlan:
    task_type: str
    klass: str
    calls: tuple[CallPlan, ...]
    text_seed: int  # seeds the prompt content


@dataclass(frozen=True)
class Window:
    index: int
    start: float
    end: float
    sessions: Optional[int] = None  # ramp: sessions planned during the step


@dataclass(frozen=True)
class Plan:
    pattern: str
    duration: float
    sessions: tuple[SessionPlan, ...]
    windows: tuple[Window, ...]
    weights: dict


def _rng(seed: int, *parts) -> random.Random:
    return random.Random(":".join(str(p) for p in (seed,) + parts))


def ramp_levels(mix: LoadMix, duration: float) -> list[tuple[float, float, int]]:
    """(start, end, sessions) of each ramp step."""
    r = mix.load.ramp
    levels = list(range(r.start, r.max + 1, r.step))
    if levels[-1] != r.max:
        levels.append(r.max)
    step_s = r.step_seconds or duration / len(levels)
    n = max(1, min(len(levels), int(math.floor(duration / step_s + 1e-9))))
    return [(i * step_s, (i + 1) * step_s if i < n - 1 else duration, levels[i]) for i in range(n)]


def build_plan(mix: LoadMix, pattern: str, duration: float, seed: int,
               sessions_override: Optional[int] = None) -> Plan:
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    if not duration > 0:
        raise ValueError(f"duration must be > 0, got {duration}")
    ld = mix.load
    if pattern in ("sustained", "reduced-capacity", "mixed") and sessions_override:
        raise ValueError(f"--sessions applies to burst and ramp; {pattern} follows the mix's task rates "
                         "(scale them with load.rate_scale)")
    weights = {n: t.weight for n, t in mix.task_types.items()}
    sessions: list[SessionPlan] = []
    windows: list[Window] = []
    if pattern == "mixed":
        return _mixed_plan(mix, duration, seed)
    if pattern in ("sustained", "reduced-capacity"):
        rates = {n: t.tasks_per_second * ld.rate_scale for n, t in mix.task_types.items()}
        total = sum(rates.values())
        if total <= 0:
            raise ValueError(f"{mix.source}: task_types: pattern {pattern} sends tasks at the mix's "
                             "tasks_per_second (or tasks_per_hour); every rate is 0")
        weights = rates
        rng = _rng(seed, "arrivals")
        t = rng.expovariate(total)
        i = 0
        while t < duration and i < ld.max_calls:
            sessions.append(SessionPlan(i, t, 1))
            i += 1
            t += rng.expovariate(total)
    elif pattern == "burst":
        n = sessions_override or ld.burst.sessions or ld.sessions
        every = ld.burst.every_seconds
        waves = 1 if every <= 0 else max(1, int(math.ceil(duration / every - 1e-9)))
        for w in range(waves):
            for k in range(n):
                sessions.append(SessionPlan(w * n + k, w * every if every > 0 else 0.0,
                                            ld.burst.tasks_per_session, w))
    else:  # ramp
        levels = ramp_levels(mix, duration)
        have = 0
        for step, (start, end, level) in enumerate(levels):
            windows.append(Window(step, start, end, level))
            while have < level:
                sessions.append(SessionPlan(have, start, None, step))
                have += 1
    if pattern != "ramp":
        windows = _windows(mix, duration)
    return Plan(pattern, duration, tuple(sessions), tuple(windows), weights)


def _windows(mix: LoadMix, duration: float) -> list[Window]:
    w = mix.load.window_seconds
    n = max(1, int(math.ceil(duration / w - 1e-9)))
    return [Window(i, i * w, min(duration, (i + 1) * w)) for i in range(n)]


def _mixed_plan(mix: LoadMix, duration: float, seed: int) -> Plan:
    """Interactive arrivals (Poisson at the interactive rates x rate_scale, one task each) and the
    deferrable sessions (looping from 0). The interactive arrivals are those of the same seed
    whatever the deferrable side does, so the cases of a mixed run send the same interactive work."""
    ld = mix.load
    inter = {n: t.tasks_per_second * ld.rate_scale for n, t in mix.task_types.items() if t.klass == "interactive"}
    batch = {n: t.weight for n, t in mix.task_types.items() if t.klass == "batch"}
    if sum(inter.values()) <= 0:
        raise ValueError(f"{mix.source}: task_types: pattern mixed needs an interactive task type with "
                         "tasks_per_second (or tasks_per_hour) > 0")
    if sum(batch.values()) <= 0:
        raise ValueError(f"{mix.source}: task_types: pattern mixed needs a task type of class deferrable "
                         "(or batch) with a weight > 0")
    total = sum(inter.values())
    rng = _rng(seed, "arrivals")
    sessions: list[SessionPlan] = []
    t = rng.expovariate(total)
    while t < duration and len(sessions) < ld.max_calls:
        sessions.append(SessionPlan(len(sessions), t, 1, klass="interactive"))
        t += rng.expovariate(total)
    first = len(sessions)
    sessions = [SessionPlan(first + k, 0.0, None, klass="batch") for k in range(ld.mixed.deferrable_concurrency)] \
        + sessions
    return Plan("mixed", duration, tuple(sessions), tuple(_windows(mix, duration)), {**inter, **batch})


def class_weights(mix: LoadMix, weights: dict, klass: Optional[str]) -> dict:
    """The plan's weights, restricted to the task types of `klass` (None: all)."""
    if klass is None:
        return weights
    return {n: w for n, w in weights.items() if mix.task_types[n].klass == klass}


def task_plan(mix: LoadMix, weights: dict, seed: int, session: int, number: int) -> TaskPlan:
    """What session `session` sends in its `number`-th task: a function of the seed only."""
    rng = _rng(seed, "task", session, number)
    names = [n for n in mix.task_types if weights.get(n, 0) > 0]
    name = rng.choices(names, weights=[weights[n] for n in names])[0]
    tt = mix.task_types[name]
    calls = []
    for c in range(tt.calls_per_task):
        wait = tt.tool_wait.sample(rng) if c < tt.calls_per_task - 1 else 0.0
        calls.append(CallPlan(tt.prompt.sample(rng), tt.output.sample(rng), wait))
    return TaskPlan(name, tt.klass, tuple(calls), rng.randrange(2 ** 31))
