"""Capacity plan from a task mix: the layered estimate (pure).

  per task type:  tasks/s x calls per task          = call arrivals (calls/s)
                  call arrivals x seconds per call  = average active calls (Little's law)
                  active calls x KV tokens per call = average KV residency
  pool:           average active calls L = the sum over task types. L is an AVERAGE, not a peak:
                  the load the pool must absorb is the busy-period load B:
                    poisson:       B = the q-quantile of a Poisson(L) count. With tasks arriving
                                   independently (Poisson) and each task's calls independent of
                                   other tasks, the number of calls in service is Poisson with mean
                                   L (the M/G/infinity result; it holds below the knee, where calls
                                   do not wait for each other). q = 0.99: B is exceeded 1 % of
                                   the time.
                    peak_to_mean:  B = factor x L, for measured burstier traffic (a daily peak, a
                                   09:00 rush) - take the factor from history.
                  replicas needed = ceil(B / (knee per replica x (1 - margin))), and at least what
                  the KV check needs: ceil(B x mean KV tokens per call / (KV capacity per replica
                  x (1 - margin))); plus one spare replica to survive the loss of one (N-1).
  what-ifs:       burst x k (every arrival rate x k), N replicas lost (current replicas - N),
                  one task type growing x k.

Mix file (YAML): docs/capacity.md and examples/mix.yaml; read by monitor/capacity/mix.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from monitor.kit.numbers import fixed
from monitor.kit.text import for_terminal


@dataclass(frozen=True)
class TaskMix:
    name: str
    tasks_per_second: float
    calls_per_task: float
    seconds_per_call: float
    kv_tokens_per_call: Optional[float] = None


@dataclass(frozen=True)
class BusyPeriod:
    method: str = "poisson"
    quantile: float = 0.99
    peak_to_mean: float = 2.0


@dataclass
class Mix:
    task_types: dict[str, TaskMix]
    knee_requests_per_replica: Optional[float] = None
    kv_capacity_tokens_per_replica: Optional[float] = None
    replicas: Optional[int] = None
    margin: float = 0.2
    busy: BusyPeriod = field(default_factory=BusyPeriod)
    pool: Optional[str] = None
    burst: tuple[float, ...] = ()
    replicas_lost: tuple[int, ...] = ()
    growth: dict[str, float] = field(default_factory=dict)


def poisson_quantile(mean: float, q: float) -> int:
    """Smallest n with P(X <= n) >= q for X ~ Poisson(mean)."""
    if mean < 0 or not 0 < q < 1:
        raise ValueError(f"poisson_quantile needs mean >= 0 and 0 < q < 1, got {mean}, {q}")
    if mean == 0:
        return 0
    # sum the pmf (in log space, so large means do not underflow) from far below the mean
    lo = max(0, int(mean - 40 * math.sqrt(mean) - 10))
    log_mean = math.log(mean)
    cdf = 0.0
    n = lo
    while True:
        cdf += math.exp(-mean + n * log_mean - math.lgamma(n + 1))
        if cdf >= q or n > mean + 40 * math.sqrt(mean) + 10:
            return n
        n += 1


def _layers(mix: Mix, scale: dict[str, float]) -> tuple[dict, float, float]:
    rows: dict[str, dict] = {}
    total_active = total_kv = 0.0
    kv_known = True
    for name, t in mix.task_types.items():
        rate = t.tasks_per_second * scale.get(name, 1.0)
        calls = rate * t.calls_per_task
        active = calls * t.seconds_per_call
        kv = active * t.kv_tokens_per_call if t.kv_tokens_per_call is not None else None
        kv_known &= kv is not None or active == 0
        rows[name] = {"tasks_per_second": rate, "calls_per_task": t.calls_per_task,
                      "calls_per_second": calls, "seconds_per_call": t.seconds_per_call,
                      "average_active_calls": active, "kv_tokens_per_call": t.kv_tokens_per_call,
                      "average_kv_tokens": kv}
        total_active += active
        total_kv += kv or 0.0
    return rows, total_active, (total_kv if kv_known else math.nan)


def evaluate(mix: Mix, scale: Optional[dict[str, float]] = None, replicas: Optional[int] = None) -> dict:
    """One scenario: layers, busy-period load, replicas needed, headroom with `replicas`."""
    rows, L, kv_total = _layers(mix, scale or {})
    if mix.busy.method == "poisson":
        busy = float(poisson_quantile(L, mix.busy.quantile))
        busy_how = f"Poisson q{mix.busy.quantile:g} of the average"
    else:
        busy = L * mix.busy.peak_to_mean
        busy_how = f"{mix.busy.peak_to_mean:g} x the average"
    kv_per_call = (kv_total / L) if (L > 0 and not math.isnan(kv_total)) else None
    busy_kv = busy * kv_per_call if kv_per_call is not None else None
    usable = mix.knee_requests_per_replica * (1 - mix.margin) if mix.knee_requests_per_replica else None
    need_knee = math.ceil(busy / usable - 1e-9) if usable else None
    kv_usable = (mix.kv_capacity_tokens_per_replica * (1 - mix.margin)
                 if mix.kv_capacity_tokens_per_replica else None)
    need_kv = math.ceil(busy_kv / kv_usable - 1e-9) if (kv_usable and busy_kv is not None) else None
    needs = [n for n in (need_knee, need_kv) if n is not None]
    needed = max(max(needs), 1 if L > 0 else 0) if needs else None
    out = {
        "task_types": rows,
        "average_active_calls": L,
        "average_kv_tokens": None if math.isnan(kv_total) else kv_total,
        "busy_period_active_calls": busy,
        "busy_period_method": busy_how,
        "busy_period_kv_tokens": busy_kv,
        "usable_requests_per_replica": usable,
        "replicas_needed_for_knee": need_knee,
        "replicas_needed_for_kv": need_kv,
        "replicas_needed": needed,
        "replicas_needed_n_minus_1": (needed + 1) if needed else needed,
        "limiting_factor": (None if not needs else ("kv" if (need_kv or 0) > (need_knee or 0) else "knee")),
    }
    if replicas is not None:
        cap = mix.knee_requests_per_replica * replicas if mix.knee_requests_per_replica else None
        out["replicas"] = replicas
        out["capacity_requests"] = cap
        out["headroom_ratio"] = (1 - busy / cap) if cap else (-math.inf if busy > 0 else None)
        out["fits"] = (needed is not None and replicas >= needed)
    return out


def plan(mix: Mix) -> dict:
    """The base scenario and every what-if of the mix."""
    base = evaluate(mix, replicas=mix.replicas)
    scenarios = []
    for k in mix.burst:
        s = evaluate(mix, {n: k for n in mix.task_types}, mix.replicas)
        scenarios.append({"name": f"burst x{k:g}", **s})
    for n in mix.replicas_lost:
        if mix.replicas is None:
            raise ValueError("what_if.replicas_lost needs replicas (the replicas running today)")
        s = evaluate(mix, None, max(mix.replicas - n, 0))
        scenarios.append({"name": f"{n} replica{'s' if n > 1 else ''} lost", **s})
    for name, k in mix.growth.items():
        s = evaluate(mix, {name: k}, mix.replicas)
        scenarios.append({"name": f"{name} x{k:g}", **s})
    return {
        "pool": mix.pool,
        "inputs": {"knee_requests_per_replica": mix.knee_requests_per_replica,
                   "kv_capacity_tokens_per_replica": mix.kv_capacity_tokens_per_replica,
                   "margin": mix.margin, "replicas": mix.replicas,
                   "busy_period": {"method": mix.busy.method, "quantile": mix.busy.quantile,
                                   "peak_to_mean": mix.busy.peak_to_mean}},
        "base": base,
        "what_if": scenarios,
        "note": "average active calls come from Little's law and are averages, not peak limits; "
                "replicas are sized on the busy-period load against the knee with the margin",
    }


def _fmt(v, digits=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if math.isinf(v):
            return "-inf" if v < 0 else "inf"
        if abs(v) >= 1000:
            return fixed(v, ",.0f")
        return fixed(v, f".{digits}f")
    return str(v)


def render_table(result: dict) -> str:
    """Plain-text report for a terminal; names from a mix or from Prometheus (task types, the pool,
    scenarios, the measuring notes) with their control characters escaped (kit/text.py)."""
    base = result["base"]
    inp = result["inputs"]
    lines = []
    title = f"Capacity plan{' for pool ' + for_terminal(result['pool']) if result.get('pool') else ''}"
    lines += [title, "=" * len(title), ""]
    head = ("task type", "tasks/s", "calls/task", "calls/s", "s/call", "avg active", "avg KV tokens")
    rows = [head]
    for name, r in base["task_types"].items():
        rows.append((for_terminal(name), _fmt(r["tasks_per_second"], 3), _fmt(r["calls_per_task"]), _fmt(r["calls_per_second"], 3),
                     _fmt(r["seconds_per_call"]), _fmt(r["average_active_calls"]), _fmt(r["average_kv_tokens"], 0)))
    rows.append(("total", "", "", "", "", _fmt(base["average_active_calls"]), _fmt(base["average_kv_tokens"], 0)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0 or i == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    lines += [""] + [f"Measured: {for_terminal(note)}" for note in result.get("measured", ())]
    lines += [
        "Average active calls (Little's law) are averages, not peak limits.",
        f"Busy-period load: {_fmt(base['busy_period_active_calls'])} active calls ({base['busy_period_method']})",
        f"Knee per replica: {_fmt(inp['knee_requests_per_replica'])} requests; margin {inp['margin']:.0%} "
        f"-> usable {_fmt(base['usable_requests_per_replica'])} per replica",
        f"Replicas needed: {_fmt(base['replicas_needed'])} (knee {_fmt(base['replicas_needed_for_knee'])}, "
        f"KV {_fmt(base['replicas_needed_for_kv'])}); with one spare for N-1: {_fmt(base['replicas_needed_n_minus_1'])}",
    ]
    if "replicas" in base:
        lines.append(f"With {base['replicas']} replicas today: headroom {_fmt(base['headroom_ratio'])} "
                     f"at the busy-period load; fits: {_fmt(base['fits'])}")
    if result["what_if"]:
        lines += ["", "What if"]
        head = ("scenario", "avg active", "busy load", "replicas needed", "replicas", "headroom", "fits")
        rows = [head] + [(for_terminal(s["name"]), _fmt(s["average_active_calls"]), _fmt(s["busy_period_active_calls"]),
                          _fmt(s["replicas_needed"]), _fmt(s.get("replicas")), _fmt(s.get("headroom_ratio")),
                          _fmt(s.get("fits"))) for s in result["what_if"]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        for i, r in enumerate(rows):
            lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
