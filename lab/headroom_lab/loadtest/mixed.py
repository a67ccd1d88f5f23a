"""`headroom loadtest --pattern mixed`: is interactive work protected while deferrable work runs?

Interactive and deferrable (batch) task types run together, in up to four cases, one after the other,
with the same interactive arrivals (same seed) in each:

  alone      the interactive tasks only: the baseline
  unmanaged  plus `load.mixed.deferrable_concurrency` deferrable sessions looping flat out
  priority   the same, each request carrying its task type's `priority` in the body (vLLM runs lower
             values first when started with `--scheduling-policy priority`; an engine without it
             refuses a non-zero priority, which the case's deferrable errors then show)
  budget     the same, the deferrable calls held to floor(budget x deferrable_concurrency) in flight,
             the budget read every `budget_interval_seconds` (follower.py; headroom's
             headroom_deferrable_budget_ratio{pool}, or whatever source the caller passes)

Each case reports the interactive calls' TTFT and end-to-end quantiles and the share over the TTFT
target, and the deferrable calls completed per second during the load. The target is the mix's
slo.ttft_seconds, else 5 x the first case's unloaded TTFT (at least 0.2 s), the same for every case.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from .analyze import analyze, q_of
from .follower import Follower
from .mix import LoadMix
from .runner import Runner, RunResult
from .schedule import Plan, build_plan

SCHEMA = "headroom.loadtest-mixed/v1"
CASES = ("alone", "unmanaged", "priority", "budget")


@dataclass
class Setup:
    """Where and how the cases run. `priority_targets`/`priority_metrics`: the engine(s) started with
    priority scheduling, when not the same as `targets`. `budget_source`: a follower.Reading callable."""
    targets: list
    model: str
    seed: int = 1
    metrics: Optional[list] = None
    priority_targets: Optional[list] = None
    priority_metrics: Optional[list] = None
    budget_source: Optional[Callable] = None
    budget_label: str = ""
    api_key: Optional[str] = None
    scrape_interval: float = 1.0
    probes: int = 3
    tags: object = None


def case_plan(plan: Plan, case: str) -> Plan:
    """The mixed plan for one case: `alone` keeps the interactive sessions only."""
    if case == "alone":
        return replace(plan, sessions=tuple(s for s in plan.sessions if s.klass != "batch"))
    return plan


def ttft_target(mix: LoadMix, first: RunResult) -> tuple[Optional[float], str]:
    if mix.slo.ttft_seconds is not None:
        return mix.slo.ttft_seconds, "mix slo.ttft_seconds"
    probe = [c.ttft for c in first.calls if c.phase == "probe" and c.ok and c.ttft is not None]
    if not probe:
        return None, "none: no slo.ttft_seconds and no probe call succeeded"
    return max(5 * float(np.median(probe)), 0.2), "derived: 5 x the first case's unloaded TTFT (at least 0.2 s)"


def _q(values) -> dict:
    return {"p50": q_of(values, 0.5), "p95": q_of(values, 0.95), "count": len([v for v in values if v is not None])}


def case_summary(res: RunResult, duration: float, target: Optional[float], priorities: Optional[dict],
                 budget: Optional[dict]) -> dict:
    """The figures of one case (pure: the run's records in, plain data out)."""
    load = [c for c in res.calls if c.phase == "load"]
    inter = [c for c in load if c.klass == "interactive"]
    iok = [c for c in inter if c.ok]
    over = None
    if target is not None and inter:
        over = sum(1 for c in inter if not c.ok or c.ttft > target) / len(inter)
    t0, t1 = res.load_started, res.load_started + duration
    batch = [c for c in load if c.klass == "batch"]
    bok = [c for c in batch if c.ok]
    done = [c for c in bok if t0 <= c.end <= t1]
    errors: dict = {}
    examples: dict = {}
    for c in batch + inter:
        if not c.ok:
            key = f"{'deferrable' if c.klass == 'batch' else c.klass}:{c.error}"
            errors[key] = errors.get(key, 0) + 1
            examples.setdefault(key, c.detail or "")
    return {
        "interactive": {"calls": len(inter), "succeeded": len(iok), "failed": len(inter) - len(iok),
                        "ttft_seconds": _q([c.ttft for c in iok]), "e2e_seconds": _q([c.e2e for c in iok]),
                        "over_target": over},
        "deferrable": {"calls": len(batch), "succeeded": len(bok), "failed": len(batch) - len(bok),
                       "calls_per_second": len(done) / duration,
                       "output_tokens_per_second": sum(c.completion_tokens or 0 for c in done) / duration,
                       "max_in_flight": max((c.in_flight for c in batch), default=0)},
        "priorities_sent": priorities,
        "budget": budget,
        "errors": errors,
        "error_examples": examples,
    }


def run_case(mix: LoadMix, plan: Plan, case: str, setup: Setup, progress=None) -> tuple[RunResult, Optional[dict]]:
    """One case against the engine(s): the run's records and the follower's summary (budget case)."""
    prio = case == "priority"
    targets = (setup.priority_targets or setup.targets) if prio else setup.targets
    metrics = (setup.priority_metrics if setup.priority_targets else setup.metrics) if prio else setup.metrics
    follower = None
    if case == "budget":
        if setup.budget_source is None:
            raise ValueError("the budget case needs a budget source (--budget-url)")
        follower = Follower(setup.budget_source, mix.load.mixed.deferrable_concurrency,
                            mix.load.mixed.budget_interval_seconds, setup.budget_label).start()
    runner = Runner(mix, case_plan(plan, case), targets, setup.model, setup.seed, api_key=setup.api_key,
                    metrics=metrics, scrape_interval=setup.scrape_interval, probes=setup.probes, progress=progress,
                    tags=setup.tags, send_priority=prio, batch_gate=follower.gate if follower else None)
    try:
        res = runner.run()
    finally:
        if follower:
            follower.stop()
    return res, (follower.summary(res.load_started, res.load_started + plan.duration) if follower else None)


def run_mixed(mix: LoadMix, setup: Setup, duration: float, cases=CASES, progress=None,
              on_case: Optional[Callable[[str, dict], None]] = None) -> dict:
    """Run the cases in order; returns the mixed report (full per-case reports under `reports`)."""
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        raise ValueError(f"cases must be some of {', '.join(CASES)}, got {', '.join(cases) or 'none'}")
    plan = build_plan(mix, "mixed", duration, setup.seed)
    prios = {n: t.priority for n, t in mix.task_types.items()}
    out: dict = {"cases": {}, "reports": {}}
    target = source = None
    started = time.time()
    for i, case in enumerate(cases):
        if i:
            time.sleep(mix.load.mixed.pause_seconds)
        res, budget = run_case(mix, plan, case, setup, progress)
        if i == 0:
            target, source = ttft_target(mix, res)
        summary = case_summary(res, duration, target, prios if case == "priority" else None, budget)
        summary["started"] = res.load_started
        out["cases"][case] = summary
        meta = {"targets": list((setup.priority_targets or setup.targets) if case == "priority" else setup.targets),
                "seed": setup.seed, "case": case}
        out["reports"][case] = analyze(mix, case_plan(plan, case), res, meta)
        if on_case:
            on_case(case, summary)
    out.update({
        "schema": SCHEMA,
        "run": {"duration_seconds": duration, "seed": setup.seed, "mix_digest": mix.digest, "model": setup.model,
                "targets": list(setup.targets), "priority_targets": setup.priority_targets,
                "deferrable_concurrency": mix.load.mixed.deferrable_concurrency,
                "interactive_sessions": sum(1 for s in plan.sessions if s.klass == "interactive"),
                "budget_source": setup.budget_label or None, "started": started, "ended": time.time()},
        "target": {"ttft_seconds": target, "source": source},
        "cases_run": list(cases),
    })
    return out


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}"


def summary_lines(rep: dict) -> list[str]:
    t = rep["target"]
    lines = [f"interactive TTFT target {_fmt(t['ttft_seconds'])} s ({t['source']})",
             f"{'case':<10} {'TTFT p50':>9} {'TTFT p95':>9} {'e2e p95':>8} {'over':>6} {'defer calls/s':>13} "
             f"{'defer failed':>12}"]
    for name in rep["cases_run"]:
        c = rep["cases"][name]
        i, d = c["interactive"], c["deferrable"]
        lines.append(f"{name:<10} {_fmt(i['ttft_seconds']['p50']):>9} {_fmt(i['ttft_seconds']['p95']):>9} "
                     f"{_fmt(i['e2e_seconds']['p95']):>8} {_fmt(i['over_target'], 2):>6} "
                     f"{_fmt(d['calls_per_second'], 2):>13} {d['failed']:>12}")
        if name == "priority" and d["calls"] and d["failed"] == d["calls"]:
            lines.append("  every deferrable call failed in the priority case: is the engine started with "
                         "--scheduling-policy priority? " + "; ".join(c["error_examples"].values())[:200])
        if c["budget"]:
            b = c["budget"]
            lines.append(f"  budget ({b['source']}): mean {_fmt(b['allowed_mean'], 2)} of {b['max_concurrency']} "
                         f"allowed, gate shut {_fmt(b['shut_fraction'], 2)} of the time, "
                         f"{b['unknown_readings']} of {b['readings']} readings unknown")
    return lines
