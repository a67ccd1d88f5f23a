"""Digest input from a simulated fortnight (headroom_lab.sim.history), for `headroom digest --demo`.

The history generator gives, per pool: active and queued requests, KV tokens, sessions, call and
task arrivals. The facts history does not carry come from the simulated fleet's own configuration:
replicas, GPUs, watts, and the knee by construction (`headroom_lab.sim.fleet.theoretical_knee`); tokens
per call from the task mix. Task latency per interval is estimated with Little's law (mean call
latency = concurrent requests / call arrival rate) times calls per task plus the tool waits; the SLO
section then reports the share of tasks that started in intervals whose estimate exceeded the target.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from headroom_lab.sim.fleet import FleetConfig, load_config, theoretical_knee
from headroom_lab.sim.history import generate_history
from monitor.capacity.slo_settings import read_slos
from monitor.digest.content import DigestInput, PoolInput
from monitor.digest.settings import DigestSettings, TaskFacts

# SLO targets (task completion, seconds) for the simulated office tasks: what `slos:` would say
DEMO_SLOS = {
    "objective": 0.95,
    "task_types": {
        "policy_question": {"p95_seconds": 6},
        "document_summary": {"p95_seconds": 25},
        "search_then_email": {"p95_seconds": 30},
        "nightly_batch": {"p95_seconds": 120},
    },
}


def last_monday(now: float) -> float:
    """00:00 UTC of the Monday at or before `now`."""
    day = math.floor(now / 86400.0) * 86400.0
    weekday = (int(day // 86400) + 3) % 7  # 1970-01-01 was a Thursday (weekday 3)
    return day - weekday * 86400.0


def demo_settings(base: Optional[DigestSettings] = None) -> DigestSettings:
    from monitor.digest.settings import from_dict
    s = from_dict({"title": "headroom weekly capacity digest (simulated fleet)"}, "<demo>", read_slos(DEMO_SLOS, "<demo>"))
    if base is None:
        return s
    return DigestSettings(**{**base.__dict__, "slo_targets": base.slo_targets or s.slo_targets,
                             "slo_objectives": base.slo_objectives or s.slo_objectives})


def _series(df: pd.DataFrame, pool: str) -> dict[str, pd.Series]:
    sub = df[(df["pool"] == pool) & (df["instance"] == "")]
    out = {}
    for name, g in sub.groupby("series", sort=False):
        g = g.sort_values("timestamp")
        out[str(name)] = pd.Series(g["value"].to_numpy(float), index=g["timestamp"].to_numpy(float))
    return out


def demo_input(week_end: float, days: float = 14.0, step_s: int = 300, seed: int = 1,
               config: FleetConfig | str | None = None, rename: Optional[dict[str, str]] = None,
               level: float = 0.8, weekly_growth: float = 0.02) -> tuple[DigestInput, pd.DataFrame]:
    """(digest input, the generated DataFrame). The history ends one step before `week_end`."""
    if days < 8:
        raise ValueError(f"the demo needs more than a week of history (got {days} days): one week to "
                         f"train the forecast that last week is checked against")
    cfg = config if isinstance(config, FleetConfig) else load_config(config)
    df = generate_history(cfg, days=days, step_s=step_s, end=week_end - step_s, seed=seed,
                          level=level, weekly_growth=weekly_growth, replica_series=False)
    rename = rename or {}
    pools = []
    for pp in cfg.pools:
        knee = theoretical_knee(pp, cfg.mix)
        raw = _series(df, pp.name)
        series: dict[str, pd.Series] = {}
        for k, name in (("active_requests", "active_requests"), ("queued_requests", "queued_requests"),
                        ("kv_tokens", "kv_tokens"), ("sessions", "sessions"), ("call_arrival_rate", "arrival_rate")):
            if k in raw:  # the simulator's column -> the history schema's name
                series[name] = raw[k]
        load = series["active_requests"] + series["queued_requests"]
        call_rate = series["arrival_rate"].to_numpy()
        w_call = load.to_numpy() / np.maximum(call_rate, 1e-6)  # Little's law
        tasks = {}
        for tt in cfg.mix.task_types.values():
            if tt.pool != pp.name or f"task_arrivals:{tt.name}" not in raw:
                continue
            series[f"task_arrivals:{tt.name}"] = raw[f"task_arrivals:{tt.name}"] / float(step_s)
            calls = tt.calls_per_task
            tool = sum(s.tool_wait_s for s in tt.steps)
            series[f"task_latency:{tt.name}"] = pd.Series(calls * w_call + tool, index=load.index)
            tasks[tt.name] = TaskFacts(
                pool=pp.name, calls_per_task=float(calls),
                input_tokens_per_call=sum(s.calls * s.prompt.mean for s in tt.steps) / calls,
                output_tokens_per_call=sum(s.calls * s.output.mean for s in tt.steps) / calls,
                tool_wait_seconds=tool)
        pools.append(PoolInput(
            name=rename.get(pp.name, pp.name), series=series, replicas=pp.replicas,
            knee_requests_per_replica=float(knee["per_replica"]), knee_source="construction",
            knee_note="the simulated fleet's knee by construction (headroom_lab.sim.fleet.theoretical_knee)",
            gpus_per_replica=pp.gpus_per_replica, max_num_seqs=pp.max_num_seqs,
            kv_capacity_tokens_per_replica=float(pp.kv_capacity_tokens),
            idle_watts_per_gpu=float(pp.idle_watts), max_watts_per_gpu=float(pp.max_watts),
            tasks=tasks, model=pp.model_name))
    if rename:
        df = df.assign(pool=df["pool"].map(lambda p: rename.get(p, p)))
    return DigestInput(week_end=float(week_end), pools=pools,
                       source=f"simulated fleet, {days:g} days at {step_s} s (headroom_lab.sim.history, seed {seed})"), df


__all__ = ["demo_input", "demo_settings", "last_monday", "DEMO_SLOS"]
