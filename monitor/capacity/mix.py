"""The `headroom plan` mix file (docs/capacity.md), each key declared once, read into
monitor.capacity.task_plan's `Mix`.

A load-test mix (docs/loadtest.md, lab/headroom_lab/loadtest/mix.py) is also a plan mix: the keys only the
load test reads are accepted here and left to it, as the load test accepts the plan's keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from monitor.capacity.task_plan import BusyPeriod, Mix, TaskMix
from monitor.kit.settings.kinds import Choice, Int, Number, Raw
from monitor.kit.settings.reader import ConfigError, Reader, key
from monitor.kit.settings.shapes import ListOf, MapOf, Sub

_LOADTEST = "load-test key (docs/loadtest.md): read by headroom loadtest, not by the plan"


@dataclass(frozen=True)
class PlanTask:
    name: str = ""
    tasks_per_second: Optional[float] = key(Number(ge=0), help="arrival rate (give this or tasks_per_hour)")
    tasks_per_hour: Optional[float] = key(Number(ge=0), help="arrival rate per hour")
    calls_per_task: float = key(Number(gt=0), required=True, help="model calls per task")
    seconds_per_call: float = key(Number(gt=0), required=True, help="time in service of one call")
    kv_tokens_per_call: Optional[float] = key(Number(gt=0, le=1e8), help="KV tokens one call holds on average")
    weight: Any = key(Raw(), help=_LOADTEST)
    klass: Any = key(Raw(), path="class", help=_LOADTEST)
    prompt_tokens: Any = key(Raw(), help=_LOADTEST)
    output_tokens: Any = key(Raw(), help=_LOADTEST)
    tool_wait_seconds: Any = key(Raw(), help=_LOADTEST)
    retries: Any = key(Raw(), help=_LOADTEST)
    api: Any = key(Raw(), help=_LOADTEST)

    def check(self, r: Reader, at: str) -> None:
        if (self.tasks_per_second is None) == (self.tasks_per_hour is None):
            raise r.fail(at, "give exactly one of tasks_per_second or tasks_per_hour")

    def task(self) -> TaskMix:
        rate = self.tasks_per_second
        if rate is None:
            assert self.tasks_per_hour is not None  # check(): exactly one of the two is given
            rate = self.tasks_per_hour / 3600.0
        return TaskMix(self.name, rate, self.calls_per_task, self.seconds_per_call, self.kv_tokens_per_call)


@dataclass(frozen=True)
class Busy:
    method: str = key(Choice(("poisson", "peak_to_mean")), "poisson",
                      help="poisson: a quantile of Poisson(average); peak_to_mean: a measured factor")
    quantile: float = key(Number(gt=0, lt=1), 0.99, help="poisson: the busy-period quantile")
    peak_to_mean: float = key(Number(ge=1), 2.0, help="peak_to_mean: busy load = factor x average")


@dataclass(frozen=True)
class WhatIf:
    burst: tuple = key(ListOf(Number(gt=0), as_tuple=True), (), help="every arrival rate x k")
    replicas_lost: tuple = key(ListOf(Int(ge=1, whole=True), as_tuple=True), (), help="N replicas lost (needs replicas)")
    growth: dict = key(MapOf(Number(gt=0), names="task type"), {}, help="one task type's rate x k")


@dataclass(frozen=True)
class PlanMix:
    task_types: dict = key(MapOf(Sub(PlanTask), name_field="name", names="task type"), {},
                           help="the task types and their numbers")
    pool: Optional[str] = key(Raw("string"), help="the pool planned (a label in the output)")
    replicas: Optional[int] = key(Int(ge=1, le=1_000_000), help="replicas running today (for the what-ifs)")
    knee_requests_per_replica: Optional[float] = key(Number(gt=0), help="concurrency within the SLO per replica")
    kv_capacity_tokens_per_replica: Optional[float] = key(Number(gt=0, le=1e9), help="KV tokens one replica holds")
    margin: float = key(Number(ge=0, lt=1), 0.2, help="share of the knee kept free")
    busy_period: Busy = key(Sub(Busy), Busy(), help="how the busy-period load is taken from the average")
    what_if: WhatIf = key(Sub(WhatIf), WhatIf(), help="scenarios planned beside the base case")
    slo: Any = key(Raw(), help=_LOADTEST)
    request: Any = key(Raw(), help=_LOADTEST)
    load: Any = key(Raw(), help=_LOADTEST)

    def check(self, r: Reader, at: str) -> None:
        if not self.task_types:
            raise r.fail("task_types", "must map at least one task type to its numbers")
        if self.what_if.replicas_lost and self.replicas is None:
            raise r.fail("what_if.replicas_lost", "needs replicas (the replicas running today)")
        for name in self.what_if.growth:
            if name not in self.task_types:
                raise r.fail(f"what_if.growth.{name}", f"task type {name!r} is not in task_types "
                                                      f"({', '.join(sorted(self.task_types))})")

    def mix(self) -> Mix:
        b = self.busy_period
        return Mix(task_types={n: t.task() for n, t in self.task_types.items()},
                   knee_requests_per_replica=self.knee_requests_per_replica,
                   kv_capacity_tokens_per_replica=self.kv_capacity_tokens_per_replica,
                   replicas=self.replicas, margin=self.margin, busy=BusyPeriod(b.method, b.quantile, b.peak_to_mean),
                   pool=None if self.pool is None else str(self.pool), burst=self.what_if.burst,
                   replicas_lost=self.what_if.replicas_lost, growth=dict(self.what_if.growth))


def parse_mix(data: Any, where: str = "mix", overrides: Optional[dict] = None) -> Mix:
    """A plan mix mapping (from YAML), validated; `overrides` replace top-level keys (the task types
    and pool numbers measured in Prometheus, the command line's --knee, --replicas, --margin).
    Every problem is one ConfigError `where: key.path: problem`."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(where, "", f"expected a mapping at the top, got {type(data).__name__}")
    return Reader(where).section(PlanMix, {**(data or {}), **(overrides or {})}, "").mix()
