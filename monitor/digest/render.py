"""The digest as Markdown, a self-contained HTML page, JSON, and a Slack-compatible summary.

Every value that came from outside (pool, model and task names are metric label values) is escaped
for the format it lands in: HTML-escaped in HTML, Slack-escaped (& < >) in Slack text, and stripped
of Markdown table syntax in Markdown. Charts are referenced by index-based ids only.
"""
from __future__ import annotations

import base64
import html
import json
import math
from typing import Callable, Optional

from monitor.digest.content import public
from monitor.kit.numbers import fixed

SERIES_LABELS = {"load": "active + queued requests", "offered": "offered load (the forecasts' series)",
                 "active_requests": "active requests",
                 "queued_requests": "queued requests", "kv_tokens": "KV-cache tokens",
                 "sessions": "agent sessions"}


# ---- number formatting ------------------------------------------------------------------------

def num(x, digits: int = 0, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if abs(x) >= 100 or digits == 0:
        text = fixed(x, f",.{digits if abs(x) < 100 else 0}f")
    else:
        text = fixed(x, f",.{digits}f")
    return text + unit


def pct(x, digits: int = 1) -> str:
    return "n/a" if x is None else fixed(x * 100, f".{digits}f") + "%"


def money(x, currency: str, digits: int = 2) -> str:
    return "n/a" if x is None else f"{fixed(x, f',.{digits}f')} {currency}"


def duration(seconds) -> str:
    if seconds is None:
        return "n/a"
    if not math.isfinite(seconds):
        return "not within the week"
    if seconds <= 0:
        return "now (already at or over)"
    h = seconds / 3600.0
    return f"{h:.0f} h" if h < 48 else f"{h / 24:.1f} days"


def interval(iv) -> str:
    return "n/a" if not iv else f"{num(iv[0])} - {num(iv[1])}"


def hours(h) -> str:
    """Covered hours: '0.33 h (20 min)' below an hour, else '12.5 h' / '168 h'."""
    if h is None:
        return "n/a"
    if h < 1:
        return f"{h:.2f} h ({h * 60:.0f} min)"
    return f"{h:,.1f} h" if h < 100 else f"{h:,.0f} h"


def per_1000(c: dict, key: str, currency: str) -> str:
    """A cost per 1,000 tasks, or why there is none (fewer tasks than the minimum)."""
    if c.get(key) is None and c.get("per_task_note"):
        return f"{c['per_task_note']} ({num(c['tasks'])} {c['counted']}; a cost per task needs {num(c['min_tasks'])})"
    return money(c.get(key), currency)


def knee_text(p: dict) -> str:
    k = p["knee"]
    text = f"{num(k['requests'])} ({num(k['requests_per_replica'], 1)} per replica x {p['replicas']}, {k['source']})"
    return f"{text}: {k['note']}" if k.get("note") else text


def coverage_text(p: dict) -> str:
    c = p.get("coverage") or {}
    if not c.get("first"):
        return "no history in the week"
    return (f"{hours(c['hours'])} of the week's 168 h ({pct(c['share'])}), from {c['first_text']}, "
            f"in {num(c['step_seconds'])} s steps")


# ---- rows shared by every format -----------------------------------------------------------------

# what the next week's forecast is of (digest/content.py `forecast_series`)
FORECAST_OF = {"offered": "the offered load (active + queued, or active + turned away where higher)",
               "load": "the served load (active + queued)"}


def pool_sections(p: dict, currency: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) tables of one pool, as plain text cells (escaped by each renderer)."""
    return [_peaks(p), _capacity(p), _next_week(p), _spare_week(p), _last_week(p), _task_types(p),
            _cost(p, currency)]


def _spare_week(p: dict) -> tuple[str, list[str], list[list[str]]]:
    sw = p.get("spare_week") or {}
    title = "When to run deferrable work this week"
    if not sw.get("defined"):
        return (title, ["", "value"], [["spare windows", f"not available: {sw.get('reason', 'not computed')}"]])
    rows = [[b["from"], b["to"], num(b["requests"]), hours(b["hours"])] for b in sw["blocks"]]
    if not rows:
        rows = [[f"no span of 2 h holds {num(sw['least_requests'])} requests", "", "", ""]]
    return (title, ["from", "to", "requests that fit throughout", "hours"], rows)


def _peaks(p: dict) -> tuple[str, list[str], list[list[str]]]:
    rows = []
    keys = ("load",) + (("offered",) if "offered" in p["peaks"] else ()) + (
        "active_requests", "queued_requests", "kv_tokens", "sessions")
    for key in keys:
        pk = p["peaks"].get(key)
        when = "n/a" if not pk else (pk["when"] if pk["value"] > 0 else "(none)")
        rows.append([SERIES_LABELS[key], num(pk["value"], 1) if pk else "n/a", when])
    return ("Last week's peaks", ["series", "peak", "when"], rows)


def _capacity(p: dict) -> tuple[str, list[str], list[list[str]]]:
    k, now, at_peak = p["knee"], p.get("capacity_now") or {}, p.get("capacity_at_peak") or {}
    rows = [
        ["history covered", coverage_text(p)],
        ["knee (concurrent requests)", knee_text(p)],
        ["knee with one replica lost (N-1)", num(k["requests_n_minus_1"])],
        ["headroom now", f"{pct((now.get('ratio') or {}).get('current'))} "
                         f"({num((now.get('headroom_requests') or {}).get('current'))} requests)"],
        ["headroom now at N-1", pct((now.get("ratio") or {}).get("n_minus_1"))],
        ["headroom at last week's peak", pct((at_peak.get("ratio") or {}).get("current"))],
        ["headroom at last week's peak, N-1", pct((at_peak.get("ratio") or {}).get("n_minus_1"))],
        ["mean utilisation of the knee", pct(p.get("utilisation_mean"))],
        ["sessions per megawatt (at the peak)", num(p.get("sessions_per_megawatt"))],
    ]
    return ("Capacity", ["", "value"], rows)


def _next_week(p: dict) -> tuple[str, list[str], list[list[str]]]:
    fn = p.get("forecast_next_week") or {}
    ex = p.get("exhaustion") or {}
    if fn.get("defined"):
        rows = [["forecast of", FORECAST_OF.get(p.get("forecast_series") or "load", FORECAST_OF["load"])],
                ["forecast peak (mean)", f"{num(fn['peak'], 1)} at {fn['peak_when']}"],
                ["80% interval", interval(fn["interval80"])],
                ["95% interval", interval(fn["interval95"])],
                ["highest 95% upper bound in the week", num(fn["upper95_max"], 1)],
                ["time to exhaustion (knee)", f"{duration(ex.get('seconds'))}" + (f" ({ex['at']})" if ex.get("at") else "")],
                ["time to exhaustion (N-1)", f"{duration(ex.get('n_minus_1_seconds'))}" + (f" ({ex['n_minus_1_at']})" if ex.get("n_minus_1_at") else "")],
                ["model", f"{fn['model']} (selected by {fn['selected_by']}, {fn['history_hours']} h of history)"]]
    else:
        rows = [["forecast", f"not available: {fn.get('reason', 'no load history')}"]]
    return ("Next week's forecast (concurrent requests)", ["", "value"], rows)


def _last_week(p: dict) -> tuple[str, list[str], list[list[str]]]:
    fl = p.get("forecast_last_week") or {}
    if fl.get("defined"):
        rows = [["forecast peak", f"{num(fl['forecast_peak'], 1)} at {fl['forecast_peak_when']} "
                                  f"(80% {interval(fl['interval80'])}, 95% {interval(fl['interval95'])})"],
                ["actual peak", num(fl["actual_peak"], 1)],
                ["error", f"{num(fl['error'], 1)} ({pct(fl['error_ratio'])})"],
                ["peak timing error", f"{fixed(fl['peak_timing_hours'], '+.0f')} h"],
                ["hours inside the 80% / 95% band", f"{pct(fl['coverage']['0.8'], 0)} / {pct(fl['coverage']['0.95'], 0)}"],
                ["mean absolute error per hour", pct(fl["hourly_mape"])]]
    else:
        rows = [["forecast", f"not available: {fl.get('reason', 'no history before last week')}"]]
    return ("How last week's forecast did", ["", "value"], rows)


def _task_types(p: dict) -> tuple[str, list[str], list[list[str]]]:
    rows = []
    for t in p["tasks"]:
        s = t["slo"]
        pk = t.get("peak_arrival_rate") or {}
        f = t.get("forecast_next_week") or {}
        done = "n/a" if t["completed"] is None else f"{t['completed']:,d}"
        rows.append([t["name"], done, f"{t['started']:,d}", f"{num(pk.get('value'), 2)}/s ({pk.get('when', 'n/a')})",
                     f"{num(f.get('peak'), 2)}/s (95% to {num((f.get('interval95') or [None, None])[1], 2)})"
                     if f.get("defined") else "n/a",
                     "n/a" if not s["target_seconds"] else f"p{s['objective'] * 100:g} ≤ {num(s['target_seconds'], 1)} s",
                     pct(s["violation_ratio"], 2),
                     "n/a" if s["met"] is None else ("met" if s["met"] else "MISSED")])
    return ("Task types", ["task type", "completed", "started", "peak arrivals", "next week's peak", "SLO target",
                           "over target", "SLO"], rows)


def _cost(p: dict, currency: str) -> tuple[str, list[str], list[list[str]]]:
    c = p["cost"]
    rows = [["hours covered by history", hours(c["covered_hours"])],
            ["GPU-hours", f"{num(c['gpu_hours'], 2)} ({money(c['gpu_cost'], currency)})"],
            ["energy", f"{num(c['energy_kwh'], 2)} kWh ({money(c['energy_cost'], currency)})"],
            [f"tasks {c['counted']}", f"{c['tasks']:,d}"],
            [f"private cost per 1,000 tasks {c['counted']}", per_1000(c, "private_per_1000", currency)],
            [f"{c['api_name']} per 1,000 tasks {c['counted']} (same tokens)", per_1000(c, "api_per_1000", currency)],
            ["private / API", "n/a" if c["private_over_api"] is None else f"{c['private_over_api']:.2f}x"]]
    for t in p["tasks"]:
        if t.get("api_cost_per_1000") is not None:
            private = money(t["private_cost_per_1000"], currency) if t.get("private_cost_per_1000") is not None \
                else (c["per_task_note"] or "n/a")
            rows.append([f"{t['name']}: private vs API per 1,000", f"{private} vs {money(t['api_cost_per_1000'], currency)}"])
    return ("Cost", ["", "value"], rows)


# ---- Markdown -------------------------------------------------------------------------------------

def md_cell(text) -> str:
    """A Markdown table cell: no pipes, no newlines, no raw HTML."""
    return (html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")
            .replace("`", "'"))


def render_markdown(d: dict, image_names: Optional[dict[str, str]] = None) -> str:
    cur = d["currency"]
    lines = [f"# {md_cell(d['title'])}: {d['iso_week']}", "",
             f"Week {d['week']['start_text']} to {d['week']['end_text']} (times in {md_cell(d['timezone'])}).", "",
             "## Recommendations", ""]
    lines += [f"- {md_cell(r)}" for r in d["recommendations"]] + [""]
    for i, p in enumerate(d["pools"]):
        lines += [f"## Pool {md_cell(p['name'])}", "",
                  f"Model {md_cell(p['model'] or 'n/a')}, {p['replicas']} replicas x {p['gpus_per_replica']} GPU.", ""]
        for title, header, rows in pool_sections(p, cur):
            lines += [f"### {title}", "", "| " + " | ".join(md_cell(h) for h in header) + " |",
                      "|" + " --- |" * len(header)]
            lines += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows] + [""]
        if image_names:
            for kind in ("forecast", "headroom"):
                name = image_names.get(f"pool{i}-{kind}")
                if name:
                    lines += [f"![{kind} of pool {md_cell(p['name'])}]({name})", ""]
    lines += ["---", "", f"Prices: {num(d['prices']['gpu_hour'], 2)} {cur} per GPU-hour, "
              f"{num(d['prices']['energy_kwh'], 2)} {cur} per kWh; {md_cell(d['prices']['api_name'])} at "
              f"{num(d['prices']['api_input_per_million'], 2)} / {num(d['prices']['api_output_per_million'], 2)} {cur} "
              f"per million input / output tokens. Recommendations use the forecast's "
              f"{d['recommend_level'] * 100:g}% upper bound. Source: {md_cell(d['source'])}.", ""]
    return "\n".join(lines)


# ---- HTML -----------------------------------------------------------------------------------------

CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif;margin:0;background:#f3f4f6;color:#111827}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:20px;margin:28px 0 8px;border-bottom:2px solid #2563eb;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px;color:#374151}
.sub{color:#4b5563;margin:0 0 16px}
.card{background:#fff;border-radius:8px;padding:16px 20px;margin:12px 0;box-shadow:0 1px 3px rgba(0,0,0,.12)}
.recs li{margin:6px 0}.add{color:#b91c1c;font-weight:600}.remove{color:#047857;font-weight:600}
.keep{color:#374151}.add_for_n_minus_1{color:#b45309;font-weight:600}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:0 24px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:4px 0 8px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e5e7eb;vertical-align:top}
th{background:#f9fafb;color:#374151}
.missed{color:#b91c1c;font-weight:700}.met{color:#047857;font-weight:600}
img{max-width:100%;display:block;margin:8px 0}
footer{color:#6b7280;font-size:12px;margin-top:24px}
"""


def e(x) -> str:
    return html.escape(str(x), quote=True)


def _table(header, rows) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in header) if any(header) else ""
    body = []
    for r in rows:
        cells = []
        for c in r:
            cls = ' class="missed"' if c == "MISSED" else (' class="met"' if c == "met" else "")
            cells.append(f"<td{cls}>{e(c)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return "<table>" + (f"<thead><tr>{head}</tr></thead>" if head else "") + "<tbody>" + "".join(body) + "</tbody></table>"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_html(d: dict, charts: dict[str, bytes], image_src: Optional[Callable[[str, bytes], str]] = None) -> str:
    """A self-contained page. `image_src(id, png)` gives each chart's src (default: a data: URI;
    the e-mail uses cid: references)."""
    image_src = image_src or (lambda cid, png: data_uri(png))
    cur = d["currency"]
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{e(d['title'])}: {e(d['iso_week'])}</title><style>{CSS}</style></head><body><main>",
             f"<h1>{e(d['title'])}: {e(d['iso_week'])}</h1>",
             f"<p class=\"sub\">Week {e(d['week']['start_text'])} to {e(d['week']['end_text'])} "
             f"(times in {e(d['timezone'])})</p>",
             "<div class=\"card\"><h3>Recommendations</h3><ul class=\"recs\">"]
    for p in d["pools"]:
        r = p["recommendation"]
        parts.append(f"<li class=\"{e(r.get('action', 'keep'))}\">{e(r['text'])}</li>")
    parts.append("</ul></div>")
    for i, p in enumerate(d["pools"]):
        parts.append(f"<h2>Pool {e(p['name'])}</h2><p class=\"sub\">Model {e(p['model'] or 'n/a')}, "
                     f"{e(p['replicas'])} replicas x {e(p['gpus_per_replica'])} GPU</p>")
        secs = pool_sections(p, cur)
        by = {t: (h, r) for t, h, r in secs}
        for cid, title in ((f"pool{i}-forecast", "Actual vs forecast (hourly peak concurrent requests)"),
                           (f"pool{i}-headroom", "Headroom over last week")):
            if cid in charts:
                parts.append(f"<div class=\"card\"><h3>{e(title)}</h3><img alt=\"{e(title)}\" "
                             f"src=\"{e(image_src(cid, charts[cid]))}\"></div>")
        parts.append("<div class=\"card grid\">")
        for t in ("Last week's peaks", "Capacity", "Next week's forecast (concurrent requests)",
                  "How last week's forecast did"):
            h, r = by[t]
            parts.append(f"<div><h3>{e(t)}</h3>{_table(h, r)}</div>")
        parts.append("</div>")
        for t in ("Task types", "Cost"):
            h, r = by[t]
            parts.append(f"<div class=\"card\"><h3>{e(t)}</h3>{_table(h, r)}</div>")
    pr = d["prices"]
    level = f"{d['recommend_level'] * 100:g}"
    parts.append(f"<footer>Prices: {e(num(pr['gpu_hour'], 2))} {e(cur)} per GPU-hour, {e(num(pr['energy_kwh'], 2))} "
                 f"{e(cur)} per kWh; {e(pr['api_name'])} at {e(num(pr['api_input_per_million'], 2))} / "
                 f"{e(num(pr['api_output_per_million'], 2))} {e(cur)} per million input / output tokens. "
                 f"Recommendations use the forecast's {e(level)}% upper bound. "
                 f"Source: {e(d['source'])}.</footer></main></body></html>")
    return "".join(parts)


# ---- JSON and Slack ---------------------------------------------------------------------------------

def render_json(d: dict) -> str:
    return json.dumps(public(d), indent=2, sort_keys=False, allow_nan=False)


SLACK_MAX_POOLS = 45


def slack_escape(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def summary_text(d: dict) -> str:
    lines = [f"{d['title']}: {d['iso_week']}"]
    lines += [f"- {r}" for r in d["recommendations"]]
    lines += [f"- {s}" for s in d["summary"]]
    return "\n".join(lines)


def render_slack(d: dict) -> dict:
    """Slack-compatible webhook body: {"text": fallback, "blocks": [...]} (mrkdwn, escaped)."""
    text = slack_escape(summary_text(d))
    blocks: list[dict] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"{d['title']}: {d['iso_week']}"[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Recommendations*\n" + "\n".join(
            f"• {slack_escape(r)}" for r in d["recommendations"])[:3000]}}]
    shown = d["pools"][:SLACK_MAX_POOLS]  # Slack takes at most 50 blocks per message
    for p in shown:
        pk = p["peaks"].get("load") or {}
        fn = p.get("forecast_next_week") or {}
        slo = p.get("slo_violation_ratio")
        c = p["cost"]
        fields = [f"*Peak last week*\n{num(pk.get('value'))} requests ({slack_escape(pk.get('when', 'n/a'))})",
                  f"*Knee / N-1*\n{num(p['knee']['requests'])} / {num(p['knee']['requests_n_minus_1'])}",
                  f"*Next week's peak*\n{num(fn.get('peak'))} (95%: {interval(fn.get('interval95'))})"
                  if fn.get("defined") else "*Next week's peak*\nn/a",
                  f"*Over SLO target*\n{pct(slo, 2)}",
                  f"*Per 1,000 tasks {c['counted']}*\n{per_1000(c, 'private_per_1000', slack_escape(c['currency']))} private vs "
                  f"{per_1000(c, 'api_per_1000', slack_escape(c['currency']))} API",
                  f"*Sessions per MW*\n{num(p.get('sessions_per_megawatt'))}"]
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Pool {slack_escape(p['name'])}*"[:3000]},
                       "fields": [{"type": "mrkdwn", "text": f[:2000]} for f in fields]})
    if len(d["pools"]) > len(shown):
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text":
                       f"and {len(d['pools']) - len(shown)} more pools: see the e-mail or the HTML digest"}]})
    return {"text": text, "blocks": blocks}
