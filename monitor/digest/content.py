"""What the weekly digest says (pure: no I/O, no clock; `week_end` is passed in).

Input: `DigestInput` - per pool, history series indexed by Unix seconds covering at least the week
[week_end - 7 d, week_end) (and, for "how last week's forecast did", the weeks before), plus the
facts history does not carry (replicas, knee per replica, GPUs, watts, tokens per call).

Series (per pool; any may be missing, the section then says "not known"):
    active_requests, queued_requests, load, kv_tokens,        gauges (peaks are taken from these;
    sessions                                                  load = active + queued, its own peak)
    arrival_rate                                              model calls per second
    (the names of monitor/history/schema.py)
    task_arrivals:<task_type>                                 tasks started per second
    task_latency:<task_type>                                  task latency (s) per interval, or
    slo_violation_ratio:<task_type>                           share of tasks over target per interval
    power_watts                                               measured GPU power (else modelled)

Output: a JSON-able dict (see `build_digest`); keys starting with "_" carry arrays for the charts
and are left out of the JSON rendering.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from monitor.capacity.headroom import CapacitySettings, compute_capacity, recommended_replicas
from monitor.capacity.knee import Knee
from monitor.digest import coverage
from monitor.digest.settings import DigestSettings, TaskFacts
from monitor.forecast.backtest import ForecastSettings, forecast_series
from monitor.forecast.pool import exhaustion_seconds
from monitor.forecast.series import SeriesError, prepare
from monitor.model import PoolSnapshot

WEEK = 7 * 86400.0
HOUR = 3600.0
PEAK_SERIES = ("active_requests", "queued_requests", "kv_tokens", "sessions")


class DigestError(ValueError):
    """The digest cannot be built from this input; the message says why."""


@dataclass
class PoolInput:
    name: str
    series: dict[str, pd.Series]
    replicas: int
    knee_requests_per_replica: Optional[float]
    knee_source: str = "prior"  # learned | configured | prior | construction (monitor/digest/knee.py)
    knee_note: str = ""  # where the knee came from, in words
    gpus_per_replica: int = 1
    max_num_seqs: Optional[int] = None
    kv_capacity_tokens_per_replica: Optional[float] = None
    idle_watts_per_gpu: Optional[float] = None
    max_watts_per_gpu: Optional[float] = None
    tasks: dict[str, TaskFacts] = field(default_factory=dict)
    model: str = ""


@dataclass
class DigestInput:
    week_end: float  # Unix seconds; the digest covers [week_end - 7 d, week_end)
    pools: list[PoolInput]
    source: str = ""  # where the history came from (shown in the footer)
    step: Optional[float] = None  # seconds each history value covers (else the series' spacing)
    shard: Optional[tuple[int, int]] = None  # (index, total) of a sharded daemon: its pools only


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


def _window(s: pd.Series, start: float, end: float) -> pd.Series:
    idx = s.index.to_numpy()
    return s[(idx >= start) & (idx < end)]


def fmt_time(ts: Optional[float], tz: str, with_date: bool = True) -> Optional[str]:
    """'Tue 2026-11-24 10:00 UTC', or 'Tuesday 10:00 UTC' without the date."""
    if ts is None or not math.isfinite(ts):
        return None
    d = datetime.fromtimestamp(ts, tz=timezone.utc).astimezone(ZoneInfo(tz))
    text = d.strftime("%a %Y-%m-%d %H:%M" if with_date else "%A %H:%M")
    return f"{text} {d.tzname()}"


def iso_week(ts: float, tz: str = "UTC") -> str:
    y, w, _ = datetime.fromtimestamp(ts, tz=timezone.utc).astimezone(ZoneInfo(tz)).isocalendar()
    return f"{y}-W{w:02d}"


def digest_week(week_end: float, tz: str = "UTC") -> str:
    """The ISO week a digest covers: that of the middle of [week_end - 7 d, week_end). It names
    the digest and is half of every delivery's idempotency key."""
    return iso_week(week_end - WEEK / 2, tz)


def digest_edition(week: str, shard: Optional[tuple[int, int]] = None) -> str:
    """What one digest delivery is: the ISO week, and for a sharded daemon (monitor/shard.py, more
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
    history's own `load` series (the peak of the sum, monitor/history/schema.py) where there is one;
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


def hourly_max(s: pd.Series, step: float = HOUR) -> pd.Series:
    b = (np.floor(s.index.to_numpy() / step) * step)
    return s.groupby(b).max()


# ---- forecasts ----------------------------------------------------------------------------------

def forecast_week(history: pd.Series, origin: float, settings: DigestSettings, tz: str,
                  step: float = HOUR, agg: str = "max") -> dict:
    """Fit on `history` before `origin` (hourly peaks), forecast the 7 days from `origin`."""
    h = _window(history, -math.inf, origin)
    if h.empty:
        return {"defined": False, "reason": "no history before the forecast origin"}
    b = np.floor(h.index.to_numpy() / step) * step
    hourly = h.groupby(b).max() if agg == "max" else h.groupby(b).mean()
    try:
        prep = prepare(hourly, step)
    except SeriesError as exc:
        return {"defined": False, "reason": str(exc)}
    first = prep.end + step
    horizon = int(round((origin + WEEK - first) / step))
    if horizon < 1:
        return {"defined": False, "reason": "history reaches past the forecast week"}
    # backtest and calibrate on folds as long as the history allows (up to a week): a digest
    # forecasts a whole week, and folds of the last day alone (a weekend, for a Monday digest) would
    # calibrate the bands on quiet hours. Two folds, each leaving 7.5 days of training before it, so
    # the weekly seasonal naive can take part in the backtest.
    span = prep.n * step
    fold = min(WEEK, horizon * step, max(86400.0, (span - 7.5 * 86400.0) / 2))
    fold = math.floor(fold / step) * step
    res = forecast_series(prep, horizon, ForecastSettings(
        models=settings.forecast_models, folds=2, fold_horizon_seconds=fold,
        calibration_seconds=fold, max_folds=2))
    if not res.defined:
        return {"defined": False, "reason": res.reason}
    fc = res.forecast
    times = first + step * np.arange(horizon)
    keep = times >= origin - 1e-6
    times, mean = times[keep], fc.mean[keep]
    bands = {lv: (fc.lower(lv)[keep], fc.upper(lv)[keep]) for lv in (0.8, 0.95)}
    if len(times) == 0:
        return {"defined": False, "reason": "empty forecast"}
    i = int(np.argmax(mean))
    return {
        "defined": True, "model": res.model, "selected_by": res.selected_by,
        "calibrated": res.calibration is not None,
        "history_hours": int(prep.n), "origin": origin,
        "peak": float(mean[i]), "peak_timestamp": float(times[i]), "peak_when": fmt_time(float(times[i]), tz),
        "interval80": [float(bands[0.8][0][i]), float(bands[0.8][1][i])],
        "interval95": [float(bands[0.95][0][i]), float(bands[0.95][1][i])],
        "upper80_max": float(np.max(bands[0.8][1])), "upper95_max": float(np.max(bands[0.95][1])),
        "_times": times, "_mean": mean, "_bands": bands,
    }


def forecast_check(fc: dict, actual: pd.Series, step: float = HOUR) -> dict:
    """How a forecast of the week did against what happened (hourly peaks)."""
    if not fc.get("defined"):
        return {"defined": False, "reason": fc.get("reason", "no forecast")}
    b = np.floor(actual.index.to_numpy() / step) * step
    hourly = actual.groupby(b).max()
    t = fc["_times"]
    a = hourly.reindex(t).to_numpy()
    ok = np.isfinite(a)
    if not ok.any():
        return {"defined": False, "reason": "no actuals in the forecast week"}
    i = int(np.nanargmax(np.where(ok, a, -np.inf)))
    actual_peak, forecast_peak = float(a[i]), fc["peak"]
    cover = {}
    for lv in (0.8, 0.95):
        lo, hi = fc["_bands"][lv]
        cover[str(lv)] = float(np.mean((a[ok] >= lo[ok] - 1e-9) & (a[ok] <= hi[ok] + 1e-9)))
    err = forecast_peak - actual_peak
    lo95, hi95 = fc["interval95"]
    return {
        "defined": True, "model": fc["model"],
        "forecast_peak": forecast_peak, "forecast_peak_when": fc["peak_when"],
        "interval80": fc["interval80"], "interval95": fc["interval95"],
        "actual_peak": actual_peak, "actual_peak_timestamp": float(t[i]),
        "error": err, "error_ratio": (err / actual_peak) if actual_peak > 0 else None,
        "peak_timing_hours": (fc["peak_timestamp"] - float(t[i])) / 3600.0,
        "actual_peak_within_95": bool(lo95 <= actual_peak <= max(hi95, fc["upper95_max"])),
        "hourly_mape": float(np.mean(np.abs(fc["_mean"][ok] - a[ok]) / np.maximum(a[ok], 1.0))),
        "coverage": cover,
    }


# ---- one pool ---------------------------------------------------------------------------------

def _snapshot(p: PoolInput, at: float, load: pd.Series) -> PoolSnapshot:
    def val(name):
        s = p.series.get(name)
        if s is None or s.empty:
            return None
        idx = s.index.to_numpy()
        j = int(np.searchsorted(idx, at, side="right")) - 1
        return float(s.iloc[max(j, 0)])
    kv_cap = (p.kv_capacity_tokens_per_replica * p.replicas) if p.kv_capacity_tokens_per_replica else None
    return PoolSnapshot(pool=p.name, model=p.model, replicas=p.replicas, replicas_configured=p.replicas,
                        active_requests=val("active_requests") or 0.0,
                        queued_requests=val("queued_requests") or 0.0,
                        kv_tokens_live=val("kv_tokens"), kv_tokens_capacity=kv_cap)


def _power_model(p: PoolInput, load: pd.Series, cap: Optional[float]) -> Optional[pd.Series]:
    if "power_watts" in p.series:
        return p.series["power_watts"]
    if p.idle_watts_per_gpu is None or p.max_watts_per_gpu is None or not cap:
        return None
    util = np.clip(load.to_numpy() / cap, 0.0, 1.0)
    w = p.replicas * p.gpus_per_replica * (p.idle_watts_per_gpu + (p.max_watts_per_gpu - p.idle_watts_per_gpu) * util)
    return pd.Series(w, index=load.index)


def _capacity_at(p: PoolInput, at: float, load: pd.Series, power: Optional[pd.Series]) -> dict:
    snap = _snapshot(p, at, load)
    knee = Knee(p.knee_requests_per_replica, None, p.knee_source,
                "limits" if p.knee_source != "learned" else "queue")
    sessions = None
    if "sessions" in p.series:
        sessions = _snapshot_value(p.series["sessions"], at)
    pw = _snapshot_value(power, at) if power is not None else None
    watts = (p.max_watts_per_gpu * p.gpus_per_replica) if p.max_watts_per_gpu else None
    c = compute_capacity(snap, knee, CapacitySettings(max_num_seqs=p.max_num_seqs, watts_per_replica=watts),
                         power_watts=pw, sessions=sessions)
    return {
        "timestamp": at, "load_requests": c["load_requests"],
        "capacity_requests": c["capacity_requests"], "limiting_factor": c["limiting_factor"],
        "utilisation_ratio": c["utilisation_ratio"], "ratio": c["ratio"],
        "headroom_requests": c["headroom_requests"], "sessions": c["sessions"],
        "session_capacity": c["session_capacity"], "power_watts": c["power_watts"],
        "sessions_per_megawatt": c["sessions_per_megawatt"],
    }


def _snapshot_value(s: Optional[pd.Series], at: float) -> Optional[float]:
    if s is None or s.empty:
        return None
    j = int(np.searchsorted(s.index.to_numpy(), at, side="right")) - 1
    return float(s.iloc[max(j, 0)])


def _slo(p: PoolInput, task: str, start: float, end: float, settings: DigestSettings,
         arrivals: Optional[pd.Series]) -> dict:
    target = settings.slo_targets.get(task, settings.slo_targets.get("*"))
    objective = settings.slo_objectives.get(task, settings.slo_objectives.get("*", 0.95))
    out = {"target_seconds": target, "objective": objective if target else None,
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


def _recommend(name: str, replicas: int, per_rep: Optional[float], fc: dict, level: float,
               tz: str) -> dict:
    if not per_rep or not fc.get("defined"):
        return {"action": "unknown", "text": f"Pool {name}: no recommendation (no knee or no forecast)."}
    key = "upper95_max" if level == 0.95 else "upper80_max"
    upper = fc[key]
    lvl = f"{int(level * 100)}%"
    upper_series = fc["_bands"][level][1]
    times = fc["_times"]
    need = max(1, math.ceil(upper / per_rep - 1e-9))  # replicas to stay under the knee
    cap, cap_n1 = per_rep * replicas, per_rep * (replicas - 1)

    def first_cross(c):
        hit = np.flatnonzero(upper_series >= c)
        return float(times[hit[0]]) if len(hit) else None

    base = {"upper": upper, "level": level, "capacity_knee": cap, "capacity_n_minus_1": cap_n1,
            "replicas": replicas, "replicas_needed": need,
            # the same count /metrics exports as headroom_recommended_replicas (one definition)
            "replicas_needed_n_minus_1": recommended_replicas(upper, per_rep, 1)}
    if replicas < need:
        k = need - replicas
        by = first_cross(cap)
        when = fmt_time(by, tz, with_date=False) if by is not None else "next week"
        return {**base, "action": "add", "replicas_delta": k, "deadline": by, "text":
                f"Add {k} replica{'s' if k > 1 else ''} to pool {name} before {when}: the forecast "
                f"{lvl} upper bound ({upper:,.0f} concurrent requests) exceeds capacity at the knee "
                f"({cap:,.0f} with {replicas} replicas)."}
    n1 = base["replicas_needed_n_minus_1"]
    if replicas < n1:
        by = first_cross(cap_n1)
        when = fmt_time(by, tz, with_date=False) if by is not None else "next week"
        return {**base, "action": "add_for_n_minus_1", "replicas_delta": 1, "deadline": by, "text":
                f"Add one replica to pool {name} before {when} to keep N-1 cover: the forecast {lvl} "
                f"upper bound ({upper:,.0f}) fits the knee ({cap:,.0f}) but not the loss of a replica "
                f"({cap_n1:,.0f})."}
    spare = replicas - n1
    if spare >= 1:
        return {**base, "action": "remove", "replicas_delta": -spare, "deadline": None, "text":
                f"Pool {name} can lose {'a replica' if spare == 1 else f'{spare} replicas'}: the "
                f"forecast {lvl} upper bound ({upper:,.0f}) stays within N-1 capacity with "
                f"{replicas - spare} replicas ({per_rep * (replicas - spare - 1):,.0f})."}
    return {**base, "action": "keep", "replicas_delta": 0, "deadline": None, "text":
            f"Pool {name}: keep {replicas} replicas; the forecast {lvl} upper bound ({upper:,.0f}) "
            f"fits N-1 capacity ({cap_n1:,.0f}) with none to spare."}


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
    tz, prices = settings.timezone, settings.prices
    series = {k: _secs(v) for k, v in p.series.items()}
    step = float(step) if step else coverage.step_of(series.values(), settings.history_step)
    p = PoolInput(**{**p.__dict__, "series": series})
    if p.replicas is None or p.replicas < 1:
        raise DigestError(f"pool {p.name}: replicas must be known and >= 1 (set digest.pools."
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
    power = _power_model(p, load, cap) if load is not None else None
    if load is not None and not _window(load, start, end).empty:
        wl = _window(load, start, end)
        out["capacity_now"] = _capacity_at(p, float(wl.index[-1]), load, power)
        out["capacity_at_peak"] = _capacity_at(p, out["peaks"]["load"]["timestamp"], load, power)
        out["sessions_per_megawatt"] = out["capacity_at_peak"]["sessions_per_megawatt"]
        out["utilisation_mean"] = float(wl.mean() / cap) if cap else None
        hr, out["_chart_step"] = _chart_points(load, start, end, step, cover)
        out["_headroom"] = {"times": hr.index.to_numpy(),
                            "current": (1.0 - hr.to_numpy() / cap) if cap else None,
                            "n_minus_1": (1.0 - hr.to_numpy() / (per_rep * (p.replicas - 1)))
                            if (cap and p.replicas > 1) else None}
    else:
        out["capacity_now"] = out["capacity_at_peak"] = None
        out["sessions_per_megawatt"] = out["utilisation_mean"] = None

    # forecasts: last week (trained before it) and next week (trained on everything)
    if load is not None:
        last = forecast_week(load, start, settings, tz)
        nxt = forecast_week(load, end, settings, tz)
        out["forecast_last_week"] = forecast_check(last, _window(load, start, end))
        out["_forecast_last"] = last
        out["forecast_next_week"] = {k: v for k, v in nxt.items() if not k.startswith("_")}
        out["_forecast_next"] = nxt
        before = coverage.covered([load], start - WEEK, start, step)
        actual_from = start - WEEK if before["seconds"] >= CHART_HOURLY_AFTER else start
        out["_actual"] = _chart_points(load, actual_from, end, step, coverage.covered([load], actual_from, end, step))[0]
        if nxt.get("defined") and cap:
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
    else:
        out["forecast_last_week"] = out["forecast_next_week"] = out["exhaustion"] = None
        out["recommendation"] = {"action": "unknown", "text": f"Pool {p.name}: no load history."}

    # tasks (one whole count per task type) and the cost over the covered hours
    tasks = _tasks(p, series, start, end, step, settings)
    out["tasks"] = tasks
    out["completed_tasks"] = sum(t["completed"] for t in tasks)

    # SLO of the pool: arrival-weighted over its task types
    viol = [(t["slo"]["violation_ratio"], t["completed"]) for t in tasks if t["slo"]["violation_ratio"] is not None]
    out["slo_violation_ratio"] = (sum(v * w for v, w in viol) / sum(w for _, w in viol)) \
        if viol and sum(w for _, w in viol) > 0 else None

    out["cost"] = coverage.cost(replicas=p.replicas, gpus_per_replica=p.gpus_per_replica,
                                covered_hours=cover["hours"], tasks=tasks, prices=prices,
                                kwh=coverage.energy_kwh(power, start, end, step),
                                utilisation_mean=out["utilisation_mean"])
    return out


def _tasks(p: PoolInput, series: dict[str, pd.Series], start: float, end: float, step: float,
           settings: DigestSettings) -> list[dict]:
    """Per task type: tasks completed (a whole number, `coverage.completed`), peak arrivals, SLO,
    next week's forecast and, where tokens per call are known, the managed API's price per 1,000."""
    tz, prices = settings.timezone, settings.prices
    tasks = []
    for name in sorted(k.split(":", 1)[1] for k in series if k.startswith("task_arrivals:")):
        arr = series[f"task_arrivals:{name}"]
        facts = p.tasks.get(name) or settings.tasks.get(name) or TaskFacts(pool=p.name)
        nxt = forecast_week(arr, end, settings, tz, agg="mean")
        t = {"name": name, "completed": coverage.completed(arr, start, end, step),
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
    tz = settings.timezone
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
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj
