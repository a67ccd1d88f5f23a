"""What the capacity layer says of a pool, typed: scenarios, limits, the capacity, tasks and SLOs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .replica_reading import Quantiles


@dataclass(frozen=True)
class Scenarios:
    """A value now and with the pool's largest replica lost, both on the load averaged over the
    latency window; `instant`: now, on this cycle's load (it swings with every tool wait)."""

    current: Optional[float] = None
    n_minus_1: Optional[float] = None
    instant: Optional[float] = None

    def as_dict(self) -> dict[str, Any]:
        return {"current": self.current, "n_minus_1": self.n_minus_1, "instant": self.instant}


@dataclass(frozen=True)
class Limits:
    """Concurrent requests a pool can hold, by limit; `effective` is the smallest known. `slo`: set
    only while a latency target is over its allowed share (monitor/capacity/slo_limit.py)."""

    slots: Optional[float] = None
    kv: Optional[float] = None
    knee: Optional[float] = None
    effective: Optional[float] = None
    slo: Optional[float] = None
    lora: Optional[float] = None  # LoRA adapter slots x requests per adapter (monitor/capacity/headroom.py)

    def as_dict(self) -> dict[str, Any]:
        """Every limit; `lora` only where LoRA adapters are in use (a shape older readers know)."""
        out = {"slots": self.slots, "kv": self.kv, "knee": self.knee, "slo": self.slo, "effective": self.effective}
        if self.lora is not None:
            out["lora"] = self.lora
        return out


@dataclass(frozen=True)
class Capacity:
    """A pool's capacity and headroom in one cycle (monitor/capacity/headroom.py defines each).

    None is "not known" and is never exported. `withheld`: the pool is stale and nothing is said.
    """

    knee_requests: Optional[float] = None
    knee_kv_tokens: Optional[float] = None
    knee_source: Optional[str] = None  # "learned" or "prior"
    knee_signal: Optional[str] = None  # the latency signal ("limits" for a prior)
    knee_confidence_ratio: Optional[float] = None
    knee_implausible: Optional[bool] = None  # the learned knee was refused or withdrawn (knee_detail says why)
    utilisation_ratio: Optional[float] = None
    ratio: Scenarios = Scenarios()
    headroom_requests: Scenarios = Scenarios()
    capacity_requests: Limits = Limits()
    sessions: Optional[float] = None
    session_capacity: Optional[float] = None
    power_watts: Optional[float] = None
    sessions_per_megawatt: Optional[float] = None
    # explanations (not metrics)
    limiting_factor: Optional[str] = None  # slots | kv | knee | slo | lora: the limit the effective capacity is
    load_requests: Optional[float] = None  # averaged over load_window_seconds: what `current` judges
    load_requests_instant: Optional[float] = None  # this cycle's: what `instant` judges
    load_window_seconds: Optional[float] = None
    load_source: Optional[str] = None  # littles_law | window_mean | instant (monitor/capacity/enrich.py)
    slo_limited_by: Optional[dict[str, Any]] = None  # the target over its allowed share setting the slo limit
    kv_tokens_per_request: Optional[float] = None
    kv_tokens_per_request_source: Optional[str] = None
    active_requests_per_session: Optional[float] = None
    active_requests_per_session_source: Optional[str] = None
    power_source: Optional[str] = None
    n_minus_1_share: Optional[float] = None
    knee_detail: str = ""
    withheld: bool = False
    knee_suspect: str = ""  # why the learned knee may no longer hold (monitor/capacity/knee_suspect.py)

    @property
    def exhaustion_requests(self) -> Optional[float]:
        """The concurrency a forecast's time to exhaustion is counted against: the effective
        capacity, else the knee."""
        effective = self.capacity_requests.effective
        return effective if effective is not None else self.knee_requests

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of `headroom once --json` and /api/v1/snapshot."""
        if self.withheld:
            return {"knee_requests": None, "knee_detail": self.knee_detail}
        return {
            "knee_requests": self.knee_requests, "knee_kv_tokens": self.knee_kv_tokens,
            "knee_info": {"source": self.knee_source, "signal": self.knee_signal},
            "knee_confidence_ratio": self.knee_confidence_ratio,
            "knee_implausible": self.knee_implausible,
            "utilisation_ratio": self.utilisation_ratio, "ratio": self.ratio.as_dict(),
            "headroom_requests": self.headroom_requests.as_dict(),
            "capacity_requests": self.capacity_requests.as_dict(),
            "sessions": self.sessions, "session_capacity": self.session_capacity,
            "power_watts": self.power_watts, "sessions_per_megawatt": self.sessions_per_megawatt,
            "limiting_factor": self.limiting_factor, "load_requests": self.load_requests,
            "load_requests_instant": self.load_requests_instant, "load_window_seconds": self.load_window_seconds,
            "load_source": self.load_source,
            "slo_limited_by": self.slo_limited_by,
            "kv_tokens_per_request": self.kv_tokens_per_request,
            "kv_tokens_per_request_source": self.kv_tokens_per_request_source,
            "active_requests_per_session": self.active_requests_per_session,
            "active_requests_per_session_source": self.active_requests_per_session_source,
            "power_source": self.power_source, "n_minus_1_share": self.n_minus_1_share,
            "knee_detail": self.knee_detail, "knee_suspect": self.knee_suspect,
        }


def _q(q: Optional[Quantiles]) -> Optional[dict[str, Any]]:
    return q.as_dict() if q is not None else None


@dataclass(frozen=True)
class TaskStats:
    """One task type over the window between two gateway readings (monitor/capacity/tasks.py)."""

    task_type: str
    tasks: Optional[float] = None  # tasks started in the window
    calls: Optional[float] = None  # model calls in the window
    arrival_rate: Optional[float] = None  # tasks per second
    call_rate: Optional[float] = None
    completed_tasks: Optional[float] = None
    completion_rate: Optional[float] = None  # tasks completed per second (the task-duration histogram's count)
    calls_per_task: Optional[float] = None
    calls_per_task_source: Optional[str] = None
    task_latency: Optional[Quantiles] = None
    call_latency: Optional[Quantiles] = None
    ttft: Optional[Quantiles] = None
    sessions: Optional[float] = None
    sessions_source: Optional[str] = None
    call_class: str = "interactive"
    input_tokens_per_call: Optional[float] = None
    output_tokens_per_call: Optional[float] = None
    slo_target_seconds: Optional[float] = None
    slo_objective: Optional[float] = None
    slo_violation_ratio: Optional[float] = None
    slo_window_seconds: Optional[float] = None  # set when the ratio is over the SLO window
    slo_burn_rate: dict[str, Optional[float]] = field(default_factory=dict)  # window -> rate (None: not covered)
    slo_source: Optional[str] = None  # where the burn windows came from: "prometheus" | "tracker"

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape; the SLO window's keys only when the task type has an SLO window."""
        out = {
            "tasks": self.tasks, "calls": self.calls, "arrival_rate": self.arrival_rate,
            "call_rate": self.call_rate, "completed_tasks": self.completed_tasks,
            "completion_rate": self.completion_rate,
            "calls_per_task": self.calls_per_task, "calls_per_task_source": self.calls_per_task_source,
            "task_latency": _q(self.task_latency), "call_latency": _q(self.call_latency),
            "ttft": _q(self.ttft), "sessions": self.sessions, "sessions_source": self.sessions_source,
            "class": self.call_class, "input_tokens_per_call": self.input_tokens_per_call,
            "output_tokens_per_call": self.output_tokens_per_call,
            "slo_target_seconds": self.slo_target_seconds, "slo_objective": self.slo_objective,
            "slo_violation_ratio": self.slo_violation_ratio,
        }
        if self.slo_window_seconds is not None:
            out["slo_window_seconds"] = self.slo_window_seconds
        if self.slo_burn_rate:
            out["slo_burn_rate"] = dict(self.slo_burn_rate)
            out["slo_source"] = self.slo_source
        return out


@dataclass(frozen=True)
class PoolSlo:
    """A pool-level latency target (pools.<name>.slo) over the pool's summed replica histograms."""

    signal: str  # ttft, e2e, queue, itl
    slo_target_seconds: float
    slo_objective: float
    slo_violation_ratio: Optional[float] = None
    slo_burn_rate: dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"pool:{self.signal}"  # its task_type label in headroom_slo_* metrics

    def as_dict(self) -> dict[str, Any]:
        return {"slo_target_seconds": self.slo_target_seconds, "slo_objective": self.slo_objective,
                "slo_violation_ratio": self.slo_violation_ratio, "slo_burn_rate": dict(self.slo_burn_rate),
                "slo_source": "tracker"}  # the pool's summed replica histograms: always the tracker


@dataclass(frozen=True)
class PoolTasks:
    """What a pool's task types, its pool-level SLOs and its call classes showed this cycle."""

    by_type: dict[str, TaskStats] = field(default_factory=dict)
    slos: dict[str, PoolSlo] = field(default_factory=dict)  # keyed "pool:<signal>"
    call_latency_by_class: dict[str, Quantiles] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {tt: t.as_dict() for tt, t in self.by_type.items()}
        out.update({k: s.as_dict() for k, s in self.slos.items()})
        out["_call_latency_by_class"] = {c: q.as_dict() for c, q in self.call_latency_by_class.items()}
        return out
