"""From a finished run to the report dictionary (pure: plain data in, plain data out).

Client-side queue estimate. The client cannot see the engine's queue; what it sees is the time to the
first token (TTFT) = overhead (HTTP, tokenisation, hand-off to the engine, streaming back) + queue wait
+ prefill step. Unloaded, the queue wait is zero, so the unloaded TTFT (the median of a few sequential
probe calls sent before the load, prompts of the mix's mean length) is overhead + prefill, and the
estimate per call is  max(0, TTFT - unloaded TTFT).  Its mean over the run's successful calls (probes
included) is held against the engine's mean of vllm:request_queue_time_seconds over the same requests
(histogram sum / count delta between each target's scrape before the first call and after the last).
It leans high by what load adds to the overhead: the prefill step then carries the batch's decodes
(about one step per call), and an API server starved of CPU holds requests before they reach the
engine core, where vLLM's queue clock starts. The engine's view of the same quantity is therefore
also given: wait from arrival at the API server to first scheduling (e2e - prefill - decode) plus the
run's mean prefill time minus the probe calls' (server_load_added); and the two mean TTFTs, whose
difference is time no engine clock sees (network, gateway, HTTP handling, a slow client).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from monitor.capacity.knee import fit_hinge

from .mix import LoadMix
from .runner import RunResult
from .schedule import Plan

SCHEMA = "headroom.loadtest/v1"
QS = (0.5, 0.9, 0.95, 0.99)
KNEE_MIN_CONFIDENCE = 0.5  # below this the hinge fit is reported (knee_fit) but not used


def _f(v) -> Optional[float]:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def quantiles(values) -> dict:
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if a.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": None}
    out = {"count": int(a.size), "mean": float(a.mean()), "max": float(a.max())}
    for q in QS:
        out[f"p{int(q * 100)}"] = float(np.quantile(a, q))
    return out


def q_of(values, q: float) -> Optional[float]:
    a = [v for v in values if v is not None]
    return float(np.quantile(np.asarray(a, dtype=float), q)) if a else None


def over(values, limit: Optional[float]) -> Optional[float]:
    a = [v for v in values if v is not None]
    if limit is None or not a:
        return None
    return float(sum(1 for v in a if v > limit) / len(a))


def mean_in_flight(calls, t0: float, t1: float) -> float:
    """Time-averaged number of calls in flight over [t0, t1)."""
    if t1 <= t0:
        return 0.0
    busy = 0.0
    for c in calls:
        if c.end is None:
            continue
        busy += max(0.0, min(c.end, t1) - max(c.start, t0))
    return busy / (t1 - t0)


def _rel(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """|a - b| / b, or None when either is missing or b is 0."""
    return abs(a - b) / b if (a is not None and b) else None


def _hist_delta(first, last, key: str):
    a, b = first.histograms.get(key), last.histograms.get(key)
    if a is None or b is None:
        return None
    return b.minus(a)


def _reading_at(readings: list, t: float, before: bool):
    """The last reading at or before t (before=True), or the first at or after t."""
    if before:
        cand = [r for r in readings if r.timestamp <= t]
        return cand[-1] if cand else None
    cand = [r for r in readings if r.timestamp >= t]
    return cand[0] if cand else None


def server_between(readings: dict, t0: Optional[float], t1: Optional[float], before_first: bool = True) -> dict:
    """Counter and histogram deltas summed over targets between the reading at/before t0 and at/after t1
    (t0 / t1 None: each target's first / last reading)."""
    succ = 0.0
    qsum = qcount = 0.0
    wsum = wcount = 0.0  # arrival at the API server -> first scheduled: e2e - prefill - decode
    psum = pcount = 0.0  # first scheduled -> first token (vllm:request_prefill_time_seconds)
    tsum = tcount = 0.0  # arrival at the API server -> first token (vllm:time_to_first_token_seconds)
    have = False
    for rs in readings.values():
        if not rs:
            continue
        a = rs[0] if t0 is None else _reading_at(rs, t0, before=before_first)
        b = rs[-1] if t1 is None else (_reading_at(rs, t1, before=False) or rs[-1])
        if a is None or b is None or b is a:
            continue
        have = True
        s0, s1 = a.counters.get("request_success"), b.counters.get("request_success")
        if s0 is not None and s1 is not None and s1 >= s0:
            succ += s1 - s0
        h = _hist_delta(a, b, "queue")
        if h is not None:
            qsum += h.sum
            qcount += h.count
        e, p, d = (_hist_delta(a, b, k) for k in ("e2e", "prefill", "decode"))
        if e is not None and p is not None and d is not None and e.count == p.count == d.count:
            wsum += e.sum - p.sum - d.sum
            wcount += e.count
        if p is not None:
            psum += p.sum
            pcount += p.count
        t = _hist_delta(a, b, "ttft")
        if t is not None:
            tsum += t.sum
            tcount += t.count
    if not have:
        return {"requests_succeeded": None, "queue_mean": None, "queue_count": None, "wait_mean": None,
                "prefill_mean": None, "prefill_count": None, "ttft_mean": None}
    return {"requests_succeeded": succ, "queue_mean": (qsum / qcount) if qcount else None,
            "queue_count": qcount, "wait_mean": (wsum / wcount) if wcount else None,
            "prefill_mean": (psum / pcount) if pcount else None, "prefill_count": pcount,
            "ttft_mean": (tsum / tcount) if tcount else None}


def _window_slo(calls_ok, calls_all, tasks_done, mix: LoadMix, ttft_limit: Optional[float]) -> tuple[bool, list]:
    slo = mix.slo
    why = []
    if len(calls_all) < 3:
        return False, ["fewer than 3 calls"]
    q = slo.quantile
    t = q_of([c.ttft for c in calls_ok], q)
    if ttft_limit is not None and (t is None or t > ttft_limit):
        why.append(f"TTFT p{q * 100:g} {t if t is None else round(t, 3)} s > {ttft_limit:g} s")
    if slo.call_seconds is not None:
        e = q_of([c.e2e for c in calls_ok], q)
        if e is None or e > slo.call_seconds:
            why.append(f"call p{q * 100:g} {e if e is None else round(e, 3)} s > {slo.call_seconds:g} s")
    if slo.task_seconds is not None and tasks_done:
        d = q_of([tk.duration for tk in tasks_done], q)
        if d is not None and d > slo.task_seconds:
            why.append(f"task p{q * 100:g} {round(d, 3)} s > {slo.task_seconds:g} s")
    err = 1 - len(calls_ok) / len(calls_all)
    if err > slo.max_error_ratio:
        why.append(f"errors {err:.1%} > {slo.max_error_ratio:.1%}")
    return not why, why


def knee_from(calls, margin: float, min_points: int = 24) -> Optional[dict]:
    """Hinge fit of client TTFT over the calls in flight when each call was sent."""
    pts = [(c.in_flight, c.ttft) for c in calls if c.ok and c.ttft is not None]
    if len(pts) < min_points:
        return None
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    fit = fit_hinge(x, y)
    if fit is None:
        return None
    return {"concurrency": fit.knee, "confidence": fit.confidence, "signal": "client_ttft",
            "load": "calls_in_flight_at_send", "slope_before": fit.slope_before, "slope_after": fit.slope_after,
            "intercept": fit.intercept, "bins": fit.bins, "points": len(pts),
            "operating_point": fit.knee * (1 - margin)}


def analyze(mix: LoadMix, plan: Plan, res: RunResult, meta: dict) -> dict:
    slo = mix.slo
    q = slo.quantile
    probes = [c for c in res.calls if c.phase == "probe"]
    load = [c for c in res.calls if c.phase == "load"]
    ok = [c for c in load if c.ok]
    probe_ttfts = [c.ttft for c in probes if c.ok and c.ttft is not None]
    baseline = float(np.median(probe_ttfts)) if probe_ttfts else (
        q_of([c.ttft for c in ok], 0.05) if ok else None)
    ttft_limit = slo.ttft_seconds
    ttft_limit_source = "mix"
    if ttft_limit is None and slo.call_seconds is None and slo.task_seconds is None and baseline:
        ttft_limit = max(5 * baseline, 0.2)
        ttft_limit_source = "derived: 5 x unloaded TTFT (at least 0.2 s); set slo.ttft_seconds"

    knee_fit = knee_from(load, mix.margin)
    knee = knee_fit if (knee_fit is not None and knee_fit["confidence"] >= KNEE_MIN_CONFIDENCE) else None
    queue_method = "TTFT - unloaded TTFT (median of the probe calls)"

    def unqueued(c):
        return baseline

    def qest(c):
        base = unqueued(c)
        return None if (c.ttft is None or base is None) else max(0.0, c.ttft - base)

    # ---- per call / per task -------------------------------------------------------------
    def call_stats(cs_all):
        cs = [c for c in cs_all if c.ok]
        return {
            "calls": len(cs_all), "succeeded": len(cs), "failed": len(cs_all) - len(cs),
            "ttft_seconds": quantiles(c.ttft for c in cs),
            "e2e_seconds": quantiles(c.e2e for c in cs),
            "queue_estimate_seconds": quantiles(qest(c) for c in cs),
            "completion_tokens": quantiles(c.completion_tokens for c in cs),
            "prompt_tokens": quantiles(c.prompt_tokens for c in cs),
            "over_ttft_slo": over([c.ttft for c in cs], ttft_limit),
            "over_call_slo": over([c.e2e for c in cs], slo.call_seconds),
        }

    types = sorted({c.task_type for c in load} | set(mix.task_types))
    per_type = {t: call_stats([c for c in load if c.task_type == t]) for t in types}
    per_class = {k: call_stats([c for c in load if c.klass == k]) for k in ("interactive", "batch")
                 if any(c.klass == k for c in load)}
    task_types = {}
    for t in types:
        tks = [tk for tk in res.tasks if tk.task_type == t]
        done = [tk for tk in tks if tk.ok]
        task_types[t] = {
            "tasks": len(tks), "completed": len(done), "failed": sum(1 for tk in tks if not tk.ok and not tk.cut),
            "cut_at_end": sum(1 for tk in tks if tk.cut),
            "duration_seconds": quantiles(tk.duration for tk in done),
            "over_task_slo": over([tk.duration for tk in done], slo.task_seconds),
            "calls_per_task": (sum(tk.calls for tk in done) / len(done)) if done else None,
        }
    errors: dict[str, int] = {}
    error_examples: dict[str, str] = {}  # first detail per reason (already scrubbed of the API key)
    for c in load:
        if not c.ok:
            errors[c.error or "unknown"] = errors.get(c.error or "unknown", 0) + 1
            error_examples.setdefault(c.error or "unknown", c.detail or "")

    # ---- windows (ramp steps, or fixed windows) --------------------------------------------
    t0 = res.load_started
    windows = []
    for w in plan.windows:
        a, b = t0 + w.start, t0 + w.end
        cs_all = [c for c in load if a <= c.start < b]
        cs = [c for c in cs_all if c.ok]
        done = [tk for tk in res.tasks if tk.ok and tk.end is not None and a <= tk.end < b]
        finished = [c for c in ok if a <= (c.end or 0) < b]
        slo_ok, why = _window_slo(cs, cs_all, done, mix, ttft_limit)
        srv = [s for s in res.server if a <= s.timestamp < b]
        sq = server_between(res.readings, a, b) if res.readings else {}
        span = b - a
        windows.append({
            "index": w.index, "start_offset": w.start, "end_offset": w.end, "sessions": w.sessions,
            "calls": len(cs_all), "succeeded": len(cs),
            "mean_in_flight": mean_in_flight(load, a, b),
            "ttft_seconds": {"p50": q_of([c.ttft for c in cs], 0.5), f"p{q * 100:g}": q_of([c.ttft for c in cs], q),
                             "mean": _f(np.mean([c.ttft for c in cs])) if cs else None},
            "e2e_seconds": {"p50": q_of([c.e2e for c in cs], 0.5), f"p{q * 100:g}": q_of([c.e2e for c in cs], q)},
            "queue_estimate_mean": _f(np.mean([qest(c) for c in cs])) if cs and baseline is not None else None,
            "calls_per_second": len(finished) / span,
            "tasks_per_second": len(done) / span,
            "goodput_calls_per_second": sum(
                1 for c in finished if (ttft_limit is None or c.ttft <= ttft_limit)
                and (slo.call_seconds is None or c.e2e <= slo.call_seconds)) / span,
            "slo_ok": slo_ok, "slo_violations": why,
            "server_waiting_max": max((s.waiting for s in srv), default=None),
            "server_running_max": max((s.running for s in srv), default=None),
            "server_running_mean": _f(np.mean([s.running for s in srv])) if srv else None,
            "server_kv_usage_max": max((s.kv_usage for s in srv if s.kv_usage is not None), default=None),
            "server_queue_mean": sq.get("queue_mean"),
        })

    # ---- usable capacity at the SLO ---------------------------------------------------------
    # ramp: the last step before the first violation (concurrency rises step by step); other
    # patterns offer a fixed load, so the usable capacity is the best throughput of a window in which
    # the SLO held
    usable = None
    if plan.pattern == "ramp":
        for w in windows:
            if not w["slo_ok"]:
                break
            usable = w
    else:
        held = [w for w in windows if w["slo_ok"]]
        usable = max(held, key=lambda w: (w["calls_per_second"], w["mean_in_flight"])) if held else None
    span = max(1e-9, min(plan.duration, (max((c.end or 0) for c in ok) - t0) if ok else plan.duration))
    goodput = sum(1 for c in ok if (ttft_limit is None or c.ttft <= ttft_limit)
                  and (slo.call_seconds is None or c.e2e <= slo.call_seconds)) / span
    usable_out = {
        "slo": {"quantile": q, "ttft_seconds": ttft_limit, "ttft_source": ttft_limit_source,
                "call_seconds": slo.call_seconds, "task_seconds": slo.task_seconds,
                "max_error_ratio": slo.max_error_ratio},
        "held": usable is not None,
        "concurrency": usable["mean_in_flight"] if usable else 0.0,
        "sessions": usable["sessions"] if usable else None,
        "calls_per_second": usable["calls_per_second"] if usable else 0.0,
        "tasks_per_second": usable["tasks_per_second"] if usable else 0.0,
        "goodput_calls_per_second": usable["goodput_calls_per_second"] if usable else 0.0,
        "window": usable["index"] if usable else None,
        "run_goodput_calls_per_second": goodput,
        "first_violation": next((w["slo_violations"] for w in windows if not w["slo_ok"]), None),
    }

    # ---- knee and operating point -----------------------------------------------------------
    n_targets = max(1, len(meta.get("targets", [])) or 1)
    if knee is not None:
        knee["per_replica"] = knee["concurrency"] / n_targets
    sessions_per_call = None
    if plan.pattern == "ramp":
        ratios = [w["sessions"] / w["mean_in_flight"] for w in windows if w["mean_in_flight"] > 0.5 and w["sessions"]]
        sessions_per_call = float(np.median(ratios)) if ratios else None
    if knee is not None:
        op = {"basis": "knee", "concurrency": knee["concurrency"] * (1 - mix.margin), "margin": mix.margin}
    elif usable_out["held"]:
        op = {"basis": "usable capacity at the SLO", "concurrency": usable_out["concurrency"] * (1 - mix.margin),
              "margin": mix.margin}
    else:
        op = {"basis": "none: no knee and the SLO never held", "concurrency": None, "margin": mix.margin}
    if op["concurrency"] is not None:
        op["per_replica"] = op["concurrency"] / n_targets
        op["sessions"] = op["concurrency"] * sessions_per_call if sessions_per_call else None

    # ---- interactive protection -----------------------------------------------------------
    inter = [c for c in ok if c.klass == "interactive"]
    with_b = [c.ttft for c in inter if c.batch_active]
    without_b = [c.ttft for c in inter if not c.batch_active]
    protection = {"interactive_calls_with_batch_active": len(with_b),
                  "interactive_calls_without_batch": len(without_b),
                  "ttft_with_batch": q_of(with_b, q), "ttft_without_batch": q_of(without_b, q),
                  "quantile": q, "protected": None}
    if with_b and len(with_b) >= 3:
        qa = protection["ttft_with_batch"]
        qb = protection["ttft_without_batch"]
        ok_slo = ttft_limit is None or qa <= ttft_limit
        ok_rel = qb is None or qa <= 1.5 * qb + 0.05
        protection["protected"] = bool(ok_slo and ok_rel)
        protection["rule"] = (f"interactive TTFT p{q * 100:g} while batch calls were in flight <= the SLO "
                              "and <= 1.5 x (+50 ms) the same without batch")

    # ---- server side and agreement ------------------------------------------------------------
    server = None
    agreement = None
    if res.readings:
        # the first reading (before any call) to the last (after the settle)
        tot = server_between(res.readings, None, None)
        samples = res.server
        server = {
            "targets": len(res.readings),
            "requests_succeeded_delta": tot["requests_succeeded"],
            "queue_mean_seconds": tot["queue_mean"], "queue_count": tot["queue_count"],
            "wait_before_scheduling_mean_seconds": tot["wait_mean"],
            "waiting_max": max((s.waiting for s in samples), default=None),
            "running_max": max((s.running for s in samples), default=None),
            "kv_usage_max": max((s.kv_usage for s in samples if s.kv_usage is not None), default=None),
            "scrapes": len(samples),
            "scrape_failures": sum(s.down for s in samples),
        }
        client_ok_all = [c for c in res.calls if c.ok]
        cq = [qest(c) for c in client_ok_all]
        cq = [v for v in cq if v is not None]
        client_q = float(np.mean(cq)) if cq else None
        sq = tot["queue_mean"]
        # the engine's view of what load added to the time to first token, the quantity the client's estimate
        # measures: the wait before scheduling plus how much longer the prefill step took than unloaded
        # (under load it carries the batch's decodes); unloaded = the probe calls, between the first reading
        # and the scrape that closes the probe phase
        unl = (server_between(res.readings, None, res.probes_ended)
               if res.probes_ended is not None else None)
        n_probes_ok = sum(1 for c in probes if c.ok)
        unloaded_prefill = (unl["prefill_mean"] if unl and unl["prefill_count"]
                            and int(round(unl["prefill_count"])) == n_probes_ok else None)
        load_added = (tot["wait_mean"] + tot["prefill_mean"] - unloaded_prefill
                      if None not in (tot["wait_mean"], tot["prefill_mean"], unloaded_prefill) else None)
        ct = [c.ttft for c in client_ok_all if c.ttft is not None]
        client_ttft = float(np.mean(ct)) if ct else None
        agreement = {
            "succeeded": {"client": len(client_ok_all), "server": tot["requests_succeeded"],
                          "equal": tot["requests_succeeded"] is not None
                          and int(round(tot["requests_succeeded"])) == len(client_ok_all),
                          "note": "client successes (probes included) vs the delta of vllm:request_success_total "
                                  "(every finished_reason) over all --metrics targets"},
            "queue_mean_seconds": {"client_estimate": client_q, "server": sq,
                                   "relative_difference": _rel(client_q, sq),
                                   "server_including_intake": tot["wait_mean"],
                                   "relative_difference_including_intake": _rel(client_q, tot["wait_mean"]),
                                   "server_prefill_mean": tot["prefill_mean"],
                                   "server_unloaded_prefill_mean": unloaded_prefill,
                                   "server_load_added": load_added,
                                   "relative_difference_load_added": _rel(client_q, load_added),
                                   "unloaded_ttft_seconds": baseline, "method": queue_method,
                                   "note": "client estimate = mean over successful calls of max(0, TTFT - unqueued "
                                           "TTFT); server = vllm:request_queue_time_seconds sum/count delta; "
                                           "server_including_intake = e2e - prefill - decode means (arrival at the "
                                           "API server -> first scheduled); server_load_added = that + the prefill "
                                           "mean over the run - the prefill mean of the probe calls"},
            "ttft_mean_seconds": {"client": client_ttft, "server": tot["ttft_mean"],
                                  "relative_difference": _rel(client_ttft, tot["ttft_mean"]),
                                  "note": "client: request sent -> first token received; server: "
                                          "vllm:time_to_first_token_seconds (arrival at the API server -> first "
                                          "token), sum/count delta"},
        }

    counts = {
        "calls": len(load), "succeeded": len(ok), "failed": len(load) - len(ok),
        "timed_out": sum(1 for c in load if c.error == "timeout"),
        "retries": sum(1 for c in load if c.attempt > 0),
        "tasks": len(res.tasks), "tasks_completed": sum(1 for t in res.tasks if t.ok),
        "tasks_failed": sum(1 for t in res.tasks if not t.ok and not t.cut),
        "tasks_cut_at_end": sum(1 for t in res.tasks if t.cut),
        "probes": len(probes), "skipped_arrivals": res.skipped_arrivals, "call_cap_hit": res.call_cap_hit,
    }
    return {
        "schema": SCHEMA,
        "run": {**meta, "pattern": plan.pattern, "duration_seconds": plan.duration, "mix_digest": mix.digest,
                "margin": mix.margin, "model": res.model, "started": res.started, "load_started": res.load_started,
                "ended": res.ended, "wall_seconds": res.ended - res.started,
                "sessions_planned": len(plan.sessions)},
        "counts": counts,
        "errors": errors,
        "error_examples": error_examples,
        "calls": {"all": call_stats(load), "by_task_type": per_type, "by_class": per_class},
        "tasks": {"by_task_type": task_types,
                  "all": {"duration_seconds": quantiles(t.duration for t in res.tasks if t.ok),
                          "over_task_slo": over([t.duration for t in res.tasks if t.ok], slo.task_seconds)}},
        "queue": {"unloaded_ttft_seconds": baseline, "client_method": queue_method,
                  "client_estimate_seconds": quantiles(qest(c) for c in ok),
                  "server_mean_seconds": server["queue_mean_seconds"] if server else None},
        "windows": windows,
        "knee": knee,
        "knee_fit": knee_fit,
        "operating_point": op,
        "usable_capacity": usable_out,
        "interactive_protection": protection,
        "server": server,
        "agreement": agreement,
        "timeline": {
            "calls": [[round(c.start - t0, 4), _f(c.ttft), _f(c.e2e), c.in_flight, c.ok, c.task_type, c.klass,
                       c.target] for c in load],
            "calls_columns": ["start_offset", "ttft", "e2e", "in_flight", "ok", "task_type", "class", "target"],
            "server": [[round(s.timestamp - t0, 3), s.running, s.waiting, s.kv_usage] for s in res.server],
            "server_columns": ["offset", "running", "waiting", "kv_usage"],
        },
    }
