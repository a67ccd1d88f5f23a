"""The caller's view as a capacity limit: a pool whose latency is over its target has no headroom (pure).

    limit = slo_limit(load, judged)     # None: no target over, or none judged

`judged` is every latency target of the pool the cycle judged over the latency window
(`global.latency_window`, the SLO tracker's counts, never one cycle): the pool's own targets on the
engines' histograms (`slos.pools` / `pools.<name>.slo`: ttft, e2e, queue, itl; the gateway's call
latency with `call`) and the task types' targets fed to the pool (`slos.task_types` / `slos.default`:
task completion, a call's latency or TTFT at the gateway). A target is over when more than its
allowed share (1 - objective, its error budget) of the window's observations were over its seconds,
with at least `MIN_OBSERVATIONS` observations (a few slow calls of a light hour say nothing of
capacity). Then the pool holds more than it can within its SLO, whatever its concurrency knee says:
the limit is the load scaled down by the worst target's allowed share over its share over target,

    slo limit = load x allowed / over        (e.g. 93 % over a 5 % allowance: load x 0.054)

so the headroom that follows, 1 - load / limit = 1 - over / allowed, is below 0, and falls the further
the callers' latency is over. A pool within every target, or with no target configured, has no slo
limit (its capacity is the engines' limits and the knee).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

MIN_OBSERVATIONS = 20  # observations in the window before a target over budget limits the pool


@dataclass(frozen=True)
class Judged:
    """One latency target of a pool over the latency window."""

    target: str  # the task type, or "pool:<signal>" for a pool target
    seconds: float  # the target's latency
    allowed: float  # its allowed share over (1 - objective)
    observations: float  # in the window
    over: float  # share of them over `seconds`

    def as_dict(self) -> dict:
        return {"target": self.target, "slo_target_seconds": self.seconds, "allowed_ratio": self.allowed,
                "observations": self.observations, "slo_violation_ratio": self.over}


def judged_from_counts(target: str, seconds: float, allowed: float,
                       counts: Optional[tuple[float, float]]) -> Optional[Judged]:
    """A `Judged` from the tracker's (observations, bad) over the window; None without observations."""
    if counts is None or not counts[0] > 0:
        return None
    total, bad = counts
    return Judged(target, seconds, allowed, total, max(0.0, min(1.0, bad / total)))


def slo_limit(load: Optional[float], judged: Iterable[Judged]) -> Optional[tuple[float, Judged]]:
    """(the slo limit in concurrent requests, the target that sets it), or None (module docstring)."""
    over = [j for j in judged if j.observations >= MIN_OBSERVATIONS and j.over > j.allowed]
    if not over or load is None:
        return None
    worst = max(over, key=lambda j: (j.over / j.allowed, j.target))
    return load * worst.allowed / worst.over, worst


__all__ = ["Judged", "MIN_OBSERVATIONS", "judged_from_counts", "slo_limit"]
