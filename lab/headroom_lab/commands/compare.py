"""`headroom compare A.json B.json`: two load-test reports side by side.

The ranking is by usable capacity at the SLO (the calls in flight, then the throughput, at which the
SLO still held), not by calls completed: a configuration that completes more calls while blowing the
SLO is not the better one. Also shown: the knee, the operating point, latency quantiles, failures,
and whether interactive tasks stayed within the SLO while batch work was in flight.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from headroom_lab.loadtest.analyze import SCHEMA

TIE = 0.05  # relative difference under which two numbers count as equal


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A.json", help="first load-test report (report.json)")
    p.add_argument("b", metavar="B.json", help="second load-test report")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--names", default="A,B", help="labels of the two runs, comma separated (default A,B)")


def load_report(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(rep, dict) or rep.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema: expected {SCHEMA!r} (a headroom loadtest report.json), "
                         f"got {rep.get('schema') if isinstance(rep, dict) else type(rep).__name__!r}")
    for key in ("run", "usable_capacity", "calls", "counts", "interactive_protection"):
        if key not in rep:
            raise ValueError(f"{path}: {key}: missing from the report")
    return rep


def _better(a: Optional[float], b: Optional[float], higher_is_better: bool = True) -> str:
    if a is None and b is None:
        return "-"
    if a is None:
        return "B"
    if b is None:
        return "A"
    scale = max(abs(a), abs(b))
    if scale == 0 or abs(a - b) <= TIE * scale:
        return "tie"
    return ("A" if a > b else "B") if higher_is_better else ("A" if a < b else "B")


def _metrics(rep: dict) -> dict:
    u = rep["usable_capacity"]
    q = u["slo"]["quantile"]
    k = rep.get("knee") or {}
    allc = rep["calls"]["all"]
    c = rep["counts"]
    p = rep["interactive_protection"]
    inter = rep["calls"].get("by_class", {}).get("interactive")
    return {
        "usable_concurrency_at_slo": u["concurrency"],
        "calls_per_second_at_slo": u["calls_per_second"],
        "goodput_calls_per_second_at_slo": u["goodput_calls_per_second"],
        "tasks_per_second_at_slo": u["tasks_per_second"],
        "run_goodput_calls_per_second": u.get("run_goodput_calls_per_second"),
        "knee_concurrency": k.get("concurrency"),
        "operating_point_concurrency": (rep.get("operating_point") or {}).get("concurrency"),
        "ttft_p50": allc["ttft_seconds"]["p50"],
        "ttft_p95": allc["ttft_seconds"]["p95"],
        "call_p95": allc["e2e_seconds"]["p95"],
        "task_p95": rep["tasks"]["all"]["duration_seconds"]["p95"],
        "calls_succeeded": c["succeeded"],
        "calls_failed": c["failed"],
        "calls_timed_out": c["timed_out"],
        "interactive_ttft_p95": inter["ttft_seconds"]["p95"] if inter else None,
        "interactive_ttft_with_batch": p.get("ttft_with_batch"),
        "interactive_protected": p.get("protected"),
        "slo_quantile": q,
    }


ROWS = [  # key, label, higher is better (None: not ranked)
    ("usable_concurrency_at_slo", "usable capacity at SLO (calls in flight)", True),
    ("calls_per_second_at_slo", "throughput at SLO (calls/s)", True),
    ("goodput_calls_per_second_at_slo", "goodput at SLO (calls/s within SLO)", True),
    ("tasks_per_second_at_slo", "tasks/s at SLO", True),
    ("run_goodput_calls_per_second", "goodput over the run (calls/s within SLO)", True),
    ("knee_concurrency", "knee (calls in flight)", True),
    ("operating_point_concurrency", "operating point (calls in flight)", True),
    ("ttft_p50", "TTFT p50 (s)", False),
    ("ttft_p95", "TTFT p95 (s)", False),
    ("call_p95", "call p95 (s)", False),
    ("task_p95", "task p95 (s)", False),
    ("calls_succeeded", "calls succeeded", None),
    ("calls_failed", "calls failed", False),
    ("calls_timed_out", "calls timed out", False),
    ("interactive_ttft_p95", "interactive TTFT p95 (s)", False),
    ("interactive_ttft_with_batch", "interactive TTFT p95 with batch active (s)", False),
    ("interactive_protected", "interactive protected from batch", None),
]


def compare(a: dict, b: dict) -> dict:
    ma, mb = _metrics(a), _metrics(b)
    rows = []
    for key, label, hib in ROWS:
        va, vb = ma[key], mb[key]
        better = "-" if hib is None or isinstance(va, bool) or isinstance(vb, bool) else _better(va, vb, hib)
        rows.append({"metric": key, "label": label, "a": va, "b": vb, "better": better})
    ra, rb = a["run"], b["run"]
    same = {"seed": ra.get("seed") == rb.get("seed"), "mix": ra.get("mix_digest") == rb.get("mix_digest"),
            "pattern": ra.get("pattern") == rb.get("pattern"),
            "duration": ra.get("duration_seconds") == rb.get("duration_seconds")}
    # ranking: usable capacity at the SLO. A ramp measures it as concurrency (the last step that held);
    # a fixed load (sustained, burst, reduced-capacity) as throughput in the windows that held. Ties
    # (within 5%) fall through to the next key; the last is the run's goodput.
    ramp = ra.get("pattern") == "ramp" and rb.get("pattern") == "ramp"
    keys = (("usable_concurrency_at_slo", "calls_per_second_at_slo") if ramp else
            ("calls_per_second_at_slo",)) + ("goodput_calls_per_second_at_slo", "run_goodput_calls_per_second")
    winner, basis = "tie", None
    for key in keys:
        w = _better(ma[key], mb[key], True)
        if w in ("A", "B"):
            winner, basis = w, key
            break
    notes = []
    if not all(same.values()):
        notes.append("the runs differ in " + ", ".join(k for k, v in same.items() if not v) +
                     ": prompts and arrivals are not the same, so the comparison is weaker")
    for name, m in (("A", ma), ("B", mb)):
        if m["interactive_protected"] is False:
            notes.append(f"{name}: interactive tasks were NOT protected while batch work was active")
    return {"schema": "headroom.compare/v1", "same": same, "rows": rows, "better": winner, "basis": basis,
            "a": {"pattern": ra.get("pattern"), "targets": len(ra.get("targets", [])), "model": ra.get("model")},
            "b": {"pattern": rb.get("pattern"), "targets": len(rb.get("targets", [])), "model": rb.get("model")},
            "notes": notes}


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def render(cmp: dict, names: tuple[str, str]) -> str:
    head = ("metric", names[0], names[1], "better")
    rows = [head] + [(r["label"], _fmt(r["a"]), _fmt(r["b"]),
                      {"A": names[0], "B": names[1]}.get(r["better"], r["better"])) for r in cmp["rows"]]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    win = {"A": names[0], "B": names[1]}.get(cmp["better"], "neither (tie)")
    lines.append("")
    lines.append(f"Better: {win}" + (f" (on {cmp['basis'].replace('_', ' ')})" if cmp["basis"] else ""))
    lines += [f"Note: {n}" for n in cmp["notes"]]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    names = tuple((args.names.split(",") + ["A", "B"])[:2])
    try:
        a, b = load_report(args.a), load_report(args.b)
    except ValueError as exc:
        sys.stderr.write(f"headroom compare: {exc}\n")
        return 2
    cmp = compare(a, b)
    cmp["names"] = list(names)
    if args.json:
        json.dump(cmp, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(cmp, names))
    return 0
