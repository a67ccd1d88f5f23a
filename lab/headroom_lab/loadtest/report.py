"""Write the run's report: report.json (the analysis) and report.html (tables, embedded PNG charts)."""
from __future__ import annotations

import base64
import html
import io
import json
import os
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .analyze import KNEE_MIN_CONFIDENCE


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def charts(rep: dict) -> dict[str, str]:
    out = {}
    tl = rep["timeline"]
    calls = tl["calls"]
    ok = [c for c in calls if c[4] and c[1] is not None]
    # 1. latency vs concurrency with the knee
    if ok:
        fig, ax = plt.subplots(figsize=(7, 4))
        x = np.array([c[3] for c in ok], dtype=float)
        y = np.array([c[1] for c in ok], dtype=float)
        ax.scatter(x + np.random.default_rng(0).uniform(-0.2, 0.2, x.size), y, s=6, alpha=0.4, label="call TTFT")
        knee = rep.get("knee")
        if knee:
            xs = np.linspace(x.min(), x.max(), 100)
            ys = knee["intercept"] + knee["slope_before"] * xs + (knee["slope_after"] - knee["slope_before"]) * \
                np.maximum(0, xs - knee["concurrency"])
            ax.plot(xs, ys, color="k", lw=1.5, label="hinge fit")
            ax.axvline(knee["concurrency"], color="r", ls="--", label=f"knee {knee['concurrency']:.1f}")
        op = rep.get("operating_point") or {}
        if op.get("concurrency") is not None:
            ax.axvline(op["concurrency"], color="g", ls=":", label=f"operating point {op['concurrency']:.1f}")
        lim = rep["usable_capacity"]["slo"]["ttft_seconds"]
        if lim:
            ax.axhline(lim, color="orange", ls="-.", lw=1, label=f"TTFT SLO {lim:g} s")
        ax.set_xlabel("calls in flight when the call was sent")
        ax.set_ylabel("time to first token (s)")
        ax.set_title("Client latency vs concurrency")
        ax.legend(fontsize=8)
        out["knee"] = _png(fig)
    # 2. over time: TTFT and in-flight; server running / waiting
    if calls:
        fig, ax = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
        ax[0].scatter([c[0] for c in ok], [c[1] for c in ok], s=5, alpha=0.5, label="TTFT")
        bad = [c for c in calls if not c[4]]
        if bad:
            ax[0].scatter([c[0] for c in bad], [0] * len(bad), marker="x", color="r", label="failed")
        ax[0].set_ylabel("TTFT (s)")
        ax[0].legend(fontsize=8)
        srv = tl["server"]
        if srv:
            ax[1].plot([s[0] for s in srv], [s[1] for s in srv], label="server running")
            ax[1].plot([s[0] for s in srv], [s[2] for s in srv], label="server waiting")
        ax[1].step([c[0] for c in calls], [c[3] for c in calls], where="post", alpha=0.6,
                   label="client in flight (at send)")
        ax[1].set_xlabel("seconds since load start")
        ax[1].set_ylabel("requests")
        ax[1].legend(fontsize=8)
        fig.suptitle("Over time")
        out["timeline"] = _png(fig)
    # 3. per task type distributions
    types = sorted({c[5] for c in ok})
    if types:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.boxplot([[c[2] for c in ok if c[5] == t] for t in types], showfliers=False)
        ax.set_xticks(range(1, len(types) + 1), types, rotation=20, fontsize=8)
        ax.set_ylabel("call latency (s)")
        ax.set_title("Call latency per task type")
        out["types"] = _png(fig)
    return out


def _fmt(v, digits=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return html.escape(str(v))


def _table(head, rows) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{_fmt(c) if not isinstance(c, str) else html.escape(c)}</td>" for c in r) + "</tr>"
                for r in rows)
    return f"<table><tr>{h}</tr>{b}</table>"


def render_html(rep: dict, pngs: dict[str, str]) -> str:
    run = rep["run"]
    q = rep["usable_capacity"]["slo"]["quantile"]
    qk = f"p{q * 100:g}"
    parts = [f"<h1>headroom load test: {html.escape(run['pattern'])}</h1>",
             f"<p>model {html.escape(str(run.get('model')))}, {len(run.get('targets', []))} target(s), "
             f"duration {run['duration_seconds']:g} s, seed {run.get('seed')}, mix {html.escape(str(run.get('mix_file')))} "
             f"(digest {run['mix_digest']}), API key: {html.escape(str(run.get('api_key')))}</p>"]
    tagged = [f"metadata {k}={v}" for k, v in (run.get("metadata") or {}).items()]
    tagged += [f"header {k}: {v}" for k, v in (run.get("headers") or {}).items()]  # credentials already redacted
    if tagged:
        parts.append(f"<p>each request carried: {html.escape('; '.join(tagged))}</p>")
    k = rep.get("knee")
    op = rep["operating_point"]
    u = rep["usable_capacity"]
    parts.append("<h2>Capacity</h2>")
    fit = rep.get("knee_fit")
    unconfident = (f"not found (confidence {fit['confidence']:.2f} < {KNEE_MIN_CONFIDENCE:.2f}; the fit at "
                   f"{fit['concurrency']:.1f} is not used)") if (fit and not k) else None
    parts.append(_table(["", "value"], [
        ["knee (calls in flight, client TTFT)", k["concurrency"] if k else (unconfident or "not found")],
        ["knee confidence", k["confidence"] if k else None],
        ["recommended operating point (calls in flight)", op.get("concurrency")],
        ["operating point basis", op.get("basis")],
        ["usable capacity at the SLO (calls in flight)", u["concurrency"]],
        ["throughput at the SLO (calls/s)", u["calls_per_second"]],
        ["goodput at the SLO (calls/s within SLO)", u["goodput_calls_per_second"]],
        [f"SLO: TTFT {qk} <= (s)", u["slo"]["ttft_seconds"]],
        ["first SLO violation", "; ".join(u["first_violation"] or []) or "-"],
    ]))
    c = rep["counts"]
    parts.append("<h2>Requests</h2>")
    parts.append(_table(list(c.keys()), [list(c.values())]))
    if rep["errors"]:
        ex = rep.get("error_examples", {})
        parts.append(_table(["error", "count", "first detail"],
                            [[k, v, ex.get(k, "")] for k, v in sorted(rep["errors"].items())]))
    parts.append("<h2>Per task type (calls)</h2>")
    rows = []
    for t, s in rep["calls"]["by_task_type"].items():
        rows.append([t, s["calls"], s["failed"], s["ttft_seconds"]["p50"], s["ttft_seconds"][qk] if qk in s["ttft_seconds"] else s["ttft_seconds"]["p95"],
                     s["e2e_seconds"]["p50"], s["e2e_seconds"]["p95"], s["over_ttft_slo"], s["over_call_slo"]])
    parts.append(_table(["task type", "calls", "failed", "TTFT p50", "TTFT p95", "call p50", "call p95",
                         "over TTFT SLO", "over call SLO"], rows))
    parts.append("<h2>Per task type (tasks)</h2>")
    rows = [[t, s["tasks"], s["completed"], s["failed"], s["duration_seconds"]["p50"], s["duration_seconds"]["p95"],
             s["over_task_slo"], s["calls_per_task"]] for t, s in rep["tasks"]["by_task_type"].items()]
    parts.append(_table(["task type", "tasks", "completed", "failed", "task p50", "task p95", "over task SLO",
                         "calls/task"], rows))
    qd = rep["queue"]
    parts.append("<h2>Queue wait</h2>")
    parts.append(_table(["unloaded TTFT", "client estimate mean", "client estimate p95", "server mean"],
                        [[qd["unloaded_ttft_seconds"], qd["client_estimate_seconds"]["mean"],
                          qd["client_estimate_seconds"]["p95"], qd["server_mean_seconds"]]]))
    if rep.get("agreement"):
        a = rep["agreement"]
        aq = a["queue_mean_seconds"]
        at = a.get("ttft_mean_seconds") or {}  # reports written before it was added lack it
        parts.append(_table(["check", "client", "server", "agreement"], [
            ["requests succeeded", a["succeeded"]["client"], a["succeeded"]["server"], a["succeeded"]["equal"]],
            ["mean queue time (s)", aq["client_estimate"], aq["server"], aq["relative_difference"]],
            ["mean TTFT added by load (s): engine = wait before scheduling + prefill slow-down",
             aq["client_estimate"], aq.get("server_load_added"), aq.get("relative_difference_load_added")],
            ["mean TTFT (s)", at.get("client"), at.get("server"), at.get("relative_difference")]]))
    p = rep["interactive_protection"]
    parts.append("<h2>Interactive tasks while batch work is active</h2>")
    parts.append(_table(["calls with batch", "calls without", f"TTFT {qk} with batch", f"TTFT {qk} without", "protected"],
                        [[p["interactive_calls_with_batch_active"], p["interactive_calls_without_batch"],
                          p["ttft_with_batch"], p["ttft_without_batch"], p["protected"]]]))
    parts.append("<h2>Windows</h2>")
    rows = [[w["index"], w["start_offset"], w["sessions"], w["mean_in_flight"], w["calls"], w["ttft_seconds"]["p50"],
             w["calls_per_second"], w["server_waiting_max"], w["server_queue_mean"], w["slo_ok"]] for w in rep["windows"]]
    parts.append(_table(["#", "start s", "sessions", "mean in flight", "calls", "TTFT p50", "calls/s",
                         "server waiting max", "server queue mean", "SLO held"], rows))
    for name in ("knee", "timeline", "types"):
        if name in pngs:
            parts.append(f'<p><img alt="{name}" src="data:image/png;base64,{pngs[name]}"></p>')
    style = ("body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>headroom load test</title><style>{style}</style>" \
           f"</head><body>{''.join(parts)}</body></html>"


def write(rep: dict, out_dir: str, with_html: bool = True) -> dict[str, Optional[str]]:
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, "report.json")
    with open(jpath, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1, allow_nan=False)
    hpath = None
    if with_html:
        hpath = os.path.join(out_dir, "report.html")
        with open(hpath, "w", encoding="utf-8") as f:
            f.write(render_html(rep, charts(rep)))
    return {"json": jpath, "html": hpath}
