"""What the weekly digest says (pure: no I/O, no clock; `week_end` is passed in).

Input: `DigestInput` - per pool, history series indexed by Unix seconds covering at least the week
[week_end - 7 d, week_end) (and, for "how last week's forecast did", the weeks before), plus the
facts history does not carry (replicas, knee per replica, GPUs, watts, tokens per call).

Series (per pool; any may be missing, the section then says "not known"):
    active_requests, queued_requests, load, kv_tokens,        gauges (peaks are taken from these;
    sessions                                                  load = active + queued, its own peak)
    arrival_rate                                              model calls per second
    (the names of monitor/model/schema.py)
    task_arrivals:<task_type>                                 tasks started per second
    task_latency:<task_type>                                  task latency (s) per interval, or
    slo_violation_ratio:<task_type>                           share of tasks over target per interval
    power_watts                                               measured GPU power (else modelled)

Output: a JSON-able dict (see `build_digest`); keys starting with "_" carry arrays for the charts
and are left out of the JSON rendering.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Optional
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from monitor.digest import coverage
from monitor.digest.capacity_at import capacity_at, power_model
from monitor.digest.coverage import HOUR, WEEK, fmt_time
from monitor.digest.coverage import window as _window
from monitor.digest.forecasts import _recommend, forecast_check, forecast_week, hourly_max
from monitor.digest.inputs import DigestError, DigestInput, PoolInput
from monitor.digest.settings import DigestSettings, TaskFacts
from monitor.digest.spare_week import spare_week
from monitor.forecast.pool import exhaustion_seconds

PEAK_SERIES = ("active_requests", "queued_requests", "kv_tokens", "sessions")


# ---- small helpers ------------------------------------------------------------------------------

def _secs(s: pd.Series) -> pd.Series:
    """The series with a float Unix-seconds index, sorted, NaN dropped."""
    if not isinstance(s, pd.Series):
        raise DigestError(f"expected a pandas Series, got {type(s).__name__}")
    idx = s.index
    if isinstance(idx, pd.DatetimeIndex):
        if idx.tz is None:
            idx = idx.tz_localize("UTC")
        secs = (idx - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)
        s = pd.Series(np.asarray(s.values, dtype=float), index=np.asarray(secs, dtype=float))
    else:
        s = pd.Series(pd.to_numeric(pd.Series(np.asarray(s.values)), errors="coerce").to_numpy(float),
                      index=np.asarray(idx, dtype=float))
    s = s[np.isfinite(s.to_numpy())]
    return s.sort_index()


def iso_week(ts: float, tz: str = "UTC") -> str:
    y, w, _ = datetime.fromtimestamp(ts, tz=timezone.utc).astimezone(ZoneInfo(tz)).isocalendar()
    return f"{y}-W{w:02d}"


def digest_week(week_end: float, tz: str = "UTC") -> str:
    """The ISO week a digest covers: that of the middle of [week_end - 7 d, week_end). It names
    the digest and is half of every delivery's idempotency key."""
    return iso_week(week_end - WEEK / 2, tz)


def digest_edition(week: str, shard: Optional[tuple[int, int]] = None) -> str:
    """What one digest delivery is: the ISO week, and for a sharded daemon (monitor/model/shard.py, more
    than one shard) its shard too (`2025-W48-shard-1-of-2`). It names the outbox payload and the
    directory, and is half of every delivery's idempotency key, so a receiver that drops repeated
    keys keeps every shard's digest."""
    if shard is None or shard[1] <= 1:
        return week
    return f"{week}-shard-{shard[0]}-of-{shard[1]}"


def peak_of(s: Optional[pd.Series], start: float, end: float, tz: str) -> Optional[dict]:
    """Largest value in [start, end) and the first time it was reached."""
    if s is None:
        return None
    w = _window(s, start, end)
    if w.empty:
        return None
    vals = w.to_numpy()
    i = int(np.argmax(vals))
    ts = float(w.index[i])
    return {"value": float(vals[i]), "timestamp": ts, "when": fmt_time(ts, tz)}


def load_series(series: dict[str, pd.Series]) -> Optional[pd.Series]:
    """Concurrent requests (active + queued): what capacity at the knee is compared with. The
    history's own `load` series (the peak of the sum, monitor/model/schema.py) where there is one;
    else active + queued added bucket by bucket (the simulated history of `digest --demo`)."""
    if series.get("load") is not None:
        return series["load"]
    a = series.get("active_requests")
    if a is None:
        return None
    q = series.get("queued_requests")
    if q is None:
        return a
    return a.add(q.reindex(a.index).fillna(0.0), fill_value=0.0)


def demand_series(series: dict[str, pd.Series], load: Optional[pd.Series]) -> tuple[Optional[pd.Series], str]:
    """(what the forecasts are of, its name): "offered" where the history has it, else "load".

    The offered series is the active requests plus what was turned away (monitor/model/schema.py); it
    does not count what waits in the queues, so on its own it reads the active requests while the
    peaks table's load is active + queued. The demand is at least either: bucket by bucket the
    larger of the two."""
    offered = series.get("offered")
    if offered is None or offered.dropna().empty:
        return load, "load"
    if load is None:
        return offered, "offered"
    both = pd.concat([offered, load], axis=1)
    return both.max(axis=1, skipna=True).dropna(), "offered"


# ---- one pool ---------------------------------------------------------------------------------

def _slo(p: PoolInput, task: str, start: float, end: float, settings: DigestSettings,
         arrivals: Optional[pd.Series]) -> dict:
    target = settings.slo_targets.get(task, settings.slo_targets.get("*"))
    objective = settings.slo_objectives.get(task, settings.slo_objectives.get("*", 0.95))
    out: dict = {"target_seconds": target, "objective": objective if target else None,
                 "violation_ratio": None, "met": None, "basis": None}
    ratio_s = p.series.get(f"slo_violation_ratio:{task}")
    lat_s = p.series.get(f"task_latency:{task}")
    if ratio_s is not None:
        r = _window(ratio_s, start, end)
        basis = "measured share over target"
    elif lat_s is not None and target:
        lat = _window(lat_s, start, end)
        r = (lat > target).astype(float)
        basis = "intervals whose mean task latency exceeded the target"
    else:
        return out
    if r.empty:
        return out
    if arrivals is not None:
        w = _window(arrivals, start, end).reindex(r.index).fillna(0.0)
        tot = float(w.sum())
        ratio = float((r * w).sum() / tot) if tot > 0 else float(r.mean())
    else:
        ratio = float(r.mean())
    out.update(violation_ratio=ratio, basis=basis,
               met=(ratio <= 1.0 - objective) if objective is not None else None)
    return out


CHART_HOURLY_AFTER = 2 * 86400.0  # covered spans at least this long are charted as hourly peaks


def _chart_points(load: pd.Series, start: float, end: float, step: float, cover: dict) -> tuple[pd.Series, float]:
    """What the charts draw of `load` in [start, end): hourly peaks once the history spans two days,
    else every bucket of the history (20 minutes are 4 five-minute peaks, not one hourly point)."""
    w = _window(load, start, end)
    first = cover["first"]
    span = (cover["last_end"] - first) if first is not None else 0.0
    chart_step = HOUR if span >= CHART_HOURLY_AFTER else step
    return hourly_max(w, chart_step), chart_step


def build_pool(p: PoolInput, start: float, end: float, settings: DigestSettings,
               step: Optional[float] = None) -> dict:
    tz, prices = settings.zone, settings.prices
    series = {k: _secs(v) for k, v in p.series.items()}
    step = float(step) if step else coverage.step_of(series.values(), settings.history_step)
    p = PoolInput(**{**p.__dict__, "series": series})
    if p.replicas is None or p.replicas < 1:
        raise DigestError(f"pool {p.name}: replicas must be known and >= 1 (set pools."
                          f"{p.name}.replicas)")
    load = load_series(series)
    per_rep = p.knee_requests_per_replica
    cap = per_rep * p.replicas if per_rep else None
    cover = coverage.covered(series.values(), start, end, step)
    out: dict = {"name": p.name, "model": p.model, "replicas": p.replicas,
                 "gpus_per_replica": p.gpus_per_replica,
                 "knee": {"requests_per_replica": per_rep, "requests": cap, "source": p.knee_source,
                          "note": p.knee_note,
                          "requests_n_minus_1": per_rep * (p.replicas - 1) if per_rep else None},
                 "coverage": {"step_seconds": step, "hours": cover["hours"], "share": cover["share"],
                              "first": cover["first"], "first_text": fmt_time(cover["first"], tz)},
                 "_week": (start, end)}
    out["peaks"] = {k: peak_of(series.get(k), start, end, tz) for k in PEAK_SERIES}
    out["peaks"]["load"] = peak_of(load, start, end, tz) if load is not None else None

    # capacity now and at last week's peak
    power = power_model(p, load, cap) if load is not None else None
    if load is not None and not _window(load, start, end).empty:
        wl = _window(load, start, end)
        out["capacity_now"] = capacity_at(p, float(wl.index[-1]), load, power)
        out["capacity_at_peak"] = capacity_at(p, out["peaks"]["load"]["timestamp"], load, power)
        out["sessions_per_megawatt"] = out["capacity_at_peak"]["sessions_per_megawatt"]
        out["utilisation_mean"] = float(wl.mean() / cap) if cap else None
        hr, out["_chart_step"] = _chart_points(load, start, end, step, cover)
        out["_headroom"] = {"times": hr.index.to_numpy(),
                            "current": (1.0 - hr.to_numpy() / cap) if cap else None,
                            "n_minus_1": (1.0 - hr.to_numpy() / (per_rep * (p.replicas - 1)))
                            if (per_rep and p.replicas > 1) else None}
    else:
        out["capacity_now"] = out["capacity_at_peak"] = None
        out["sessions_per_megawatt"] = out["utilisation_mean"] = None

    # forecasts: last week (trained before it) and next week (trained on everything), of the
    # offered load where the history has it, else the served load; the chart's actual line, the
    # check of last week's forecast and the peaks table's forecast row are of that same series
    demand, out["forecast_series"] = demand_series(series, load)
    if out["forecast_series"] == "offered":
        out["peaks"]["offered"] = peak_of(demand, start, end, tz)
    out.update(_forecasts(p, demand, start, end, step, settings))

    # tasks (one whole count per task type) and the cost over the covered hours
    tasks = _tasks(p, series, start, end, step, settings)
    out["tasks"] = tasks
    out["task_count"] = sum(t["tasks"] for t in tasks)  # completed where measured, else started
    out["tasks_counted"] = coverage.counted_as(tasks)
    done = [t["completed"] for t in tasks if t["completed"] is not None]
    out["completed_tasks"] = sum(done) if done else None

    # SLO of the pool: arrival-weighted over its task types
    viol = [(t["slo"]["violation_ratio"], t["tasks"]) for t in tasks if t["slo"]["violation_ratio"] is not None]
    out["slo_violation_ratio"] = (sum(v * w for v, w in viol) / sum(w for _, w in viol)) \
        if viol and sum(w for _, w in viol) > 0 else None

    # the cost is over the hours the tasks were counted in (Prometheus may hold a week of vLLM load
    # before headroom counted its first task), else over every hour the history covers
    counted = [series[k] for k in series if k.startswith("task_arrivals:")]
    hours = coverage.covered(counted, start, end, step) if counted else cover
    out["cost"] = coverage.cost(replicas=p.replicas, gpus_per_replica=p.gpus_per_replica,
                                covered_hours=hours["hours"], tasks=tasks, prices=prices,
                                kwh=coverage.energy_kwh(power, start, end, step, hours["buckets"]),
                                utilisation_mean=out["utilisation_mean"])
    return out


def _forecasts(p: PoolInput, load: Optional[pd.Series], start: float, end: float, step: float,
               settings: DigestSettings) -> dict:
    """Last week's forecast (trained before it) against what happened, next week's, the time to
    exhaustion, the recommendation and the chart's actual line."""
    tz, per_rep = settings.zone, p.knee_requests_per_replica
    cap = per_rep * p.replicas if per_rep else None
    out: dict = {}
    if load is None:
        out["forecast_last_week"] = out["forecast_next_week"] = out["exhaustion"] = None
        out["recommendation"] = {"action": "unknown", "text": f"Pool {p.name}: no load history."}
        out["spare_week"] = {"defined": False, "reason": "no load history"}
        return out
    last = forecast_week(load, start, settings, tz)
    nxt = forecast_week(load, end, settings, tz)
    out["forecast_last_week"] = forecast_check(last, _window(load, start, end))
    out["_forecast_last"] = last
    out["forecast_next_week"] = {k: v for k, v in nxt.items() if not k.startswith("_")}
    out["_forecast_next"] = nxt
    before = coverage.covered([load], start - WEEK, start, step)
    actual_from = start - WEEK if before["seconds"] >= CHART_HOURLY_AFTER else start
    out["_actual"] = _chart_points(load, actual_from, end, step, coverage.covered([load], actual_from, end, step))[0]
    if nxt.get("defined") and cap and per_rep:  # (cap: per_rep is known)
        cur = float(load.iloc[-1])
        ex = exhaustion_seconds(nxt["_times"], nxt["_bands"][settings.recommend_level][1], cap, end, cur)
        ex_n1 = exhaustion_seconds(nxt["_times"], nxt["_bands"][settings.recommend_level][1],
                                   per_rep * (p.replicas - 1), end, cur) if p.replicas > 1 else None
        out["exhaustion"] = {"seconds": ex, "at": fmt_time(end + ex, tz) if ex is not None and math.isfinite(ex) else None,
                             "n_minus_1_seconds": ex_n1,
                             "n_minus_1_at": fmt_time(end + ex_n1, tz) if ex_n1 is not None and math.isfinite(ex_n1) else None,
                             "level": settings.recommend_level}
    else:
        out["exhaustion"] = None
    out["recommendation"] = _recommend(p.name, p.replicas, per_rep, nxt, settings.recommend_level, tz)
    out["spare_week"] = spare_week(nxt, cap, settings.spare_margin, end, tz, settings.recommend_level)
    return out


def _tasks(p: PoolInput, series: dict[str, pd.Series], start: float, end: float, step: float,
           settings: DigestSettings) -> list[dict]:
    """Per task type: tasks completed where the history has completions, else started (a whole number,
    `coverage.tasks_in`; `counted` says which; both kept), peak arrivals, SLO,
    next week's forecast and, where tokens per call are known, the managed API's price per 1,000."""
    tz, prices = settings.zone, settings.prices
    tasks = []
    for name in sorted(k.split(":", 1)[1] for k in series if k.startswith("task_arrivals:")):
        arr = series[f"task_arrivals:{name}"]
        facts = p.tasks.get(name) or settings.tasks.get(name) or TaskFacts(pool=p.name)
        nxt = forecast_week(arr, end, settings, tz, agg="mean")
        done = series.get(f"task_completions:{name}")
        started = coverage.tasks_in(arr, start, end, step)
        # completions count only where they cover the hours the starts do (a daemon upgraded mid-week
        # has starts from before it exported completions): else the week's count is the starts
        completed = coverage.tasks_in(done, start, end, step) if (
            done is not None and coverage.covered([done], start, end, step)["seconds"]
            >= coverage.covered([arr], start, end, step)["seconds"]) else None
        t = {"name": name, "tasks": completed if completed is not None else started,
             "counted": "completed" if completed is not None else "started",
             "completed": completed, "started": started,
             "peak_arrival_rate": peak_of(arr, start, end, tz),
             "slo": _slo(p, name, start, end, settings, arr),
             "forecast_next_week": {k: v for k, v in nxt.items() if not k.startswith("_")},
             "calls_per_task": facts.calls_per_task}
        tin, tout = facts.input_tokens_per_call, facts.output_tokens_per_call
        if tin is not None and tout is not None:
            per_task_in, per_task_out = facts.calls_per_task * tin, facts.calls_per_task * tout
            api = (per_task_in * prices.api.input_per_million + per_task_out * prices.api.output_per_million) / 1e6
            t.update(input_tokens_per_task=per_task_in, output_tokens_per_task=per_task_out,
                     api_cost_per_1000=api * 1000.0)
        tasks.append(t)
    return tasks


def build_digest(inp: DigestInput, settings: DigestSettings, generated_at: Optional[float] = None) -> dict:
    if not inp.pools:
        raise DigestError("no pools in the history: nothing to report")
    end = float(inp.week_end)
    start = end - WEEK
    pools = [build_pool(p, start, end, settings, inp.step) for p in sorted(inp.pools, key=lambda p: p.name)]
    recs = [p["recommendation"]["text"] for p in pools]
    tz = settings.zone
    summary = []
    for p in pools:
        pk = (p["peaks"].get("load") or {})
        fn = p.get("forecast_next_week") or {}
        line = f"{p['name']}: peak {pk.get('value', float('nan')):,.0f} concurrent requests ({pk.get('when')})"
        if p["knee"]["requests"]:
            line += f" vs {p['knee']['requests']:,.0f} at the knee"
        if fn.get("defined"):
            line += (f"; next week's forecast peak {fn['peak']:,.0f} (95% up to {fn['interval95'][1]:,.0f}) "
                     f"{fn['peak_when']}")
        summary.append(line)
    return {
        "title": settings.title,
        "iso_week": digest_week(end, tz),
        "edition": digest_edition(digest_week(end, tz), inp.shard),
        "shard": f"{inp.shard[0]}/{inp.shard[1]}" if inp.shard and inp.shard[1] > 1 else None,
        "week": {"start": start, "end": end, "start_text": fmt_time(start, tz), "end_text": fmt_time(end, tz)},
        "generated_at": generated_at if generated_at is not None else end,
        "timezone": tz, "currency": settings.prices.currency,
        "prices": {"gpu_hour": settings.prices.gpu_hour, "energy_kwh": settings.prices.energy_kwh,
                   "api_name": settings.prices.api.name,
                   "api_input_per_million": settings.prices.api.input_per_million,
                   "api_output_per_million": settings.prices.api.output_per_million},
        "recommend_level": settings.recommend_level,
        "source": inp.source,
        "pools": pools, "recommendations": recs, "summary": summary,
    }


def public(obj):
    """The digest without the chart arrays (keys starting with "_"), JSON-able (inf -> null)."""
    if isinstance(obj, dict):
        return {k: public(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [public(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) + 0.0 if math.isfinite(obj) else None  # + 0.0: never -0.0
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj
