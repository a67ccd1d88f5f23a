"""The landing page at `/`: each pool's state at a glance, with an inline SVG chart of recent hours.

Every value that comes from a metric label or the configuration is HTML-escaped. It reads the same
snapshot as /metrics: the same capacity, and the same forecast (the forecaster's latest result as
the cycle found it).
"""
from __future__ import annotations

import html
import math
import time
from collections import deque
from typing import Optional

from .. import __version__
from ..capacity.fit import fleet_fit
from ..kit.numbers import fixed
from ..model import Alert, Capacity, PoolSnapshot, Quantiles, Snapshot
from .headline import Ratios, headline
from .landing_pages import LANDING_PAGE_POOLS, paged
from .spare_strip import spare_strip


class Trends:
    """Recent per-pool points for the chart: (timestamp, active, queued, kv ratio), ~1 per minute."""

    def __init__(self, keep_seconds: float = 6 * 3600, resolution: float = 60.0):
        self.keep = keep_seconds
        self.resolution = resolution
        self.points: dict[str, deque] = {}
        self.ratios = Ratios()  # every cycle's headroom ratio, for the headline (export/headline.py)

    def add(self, snap: Snapshot) -> None:
        self.ratios.add(snap)
        for p in snap.pools:
            if p.replicas == 0:
                continue
            dq = self.points.setdefault(p.pool, deque())
            if p.active_requests is None:
                continue
            point = (snap.timestamp, p.active_requests,
                     (p.queued_requests or 0.0) + (p.gateway_queued_requests or 0.0), p.kv_usage_ratio or 0.0)
            if dq and snap.timestamp - dq[-1][0] < self.resolution and len(dq) > 1 and \
                    dq[-1][0] - dq[-2][0] < self.resolution:
                dq[-1] = point  # same minute: keep the latest
            else:
                dq.append(point)
            while dq and snap.timestamp - dq[0][0] > self.keep:
                dq.popleft()
        # a pool gone for longer than the chart shows has nothing left to chart: forget it (churn)
        for pool in [k for k, dq in self.points.items() if not dq or snap.timestamp - dq[-1][0] > self.keep]:
            del self.points[pool]

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds`: the chart's points move with it."""
        for pool, dq in self.points.items():
            self.points[pool] = deque((t + seconds, *rest) for t, *rest in dq)
        self.ratios.shift_time(seconds)

    def seed(self, pool: str, points: list[tuple[float, float, float, float]]) -> None:
        dq = self.points.setdefault(pool, deque())
        for pt in sorted(points):
            if not dq or pt[0] > dq[-1][0]:
                dq.append(pt)


def _fmt(v: Optional[float], digits: int = 0) -> str:
    if v is None:
        return "–"
    if digits == 0:
        return fixed(v, ",.0f")
    return fixed(v, f",.{digits}f")


def _quantile(q: Optional[Quantiles], name: str, digits: int = 2) -> str:
    """A histogram quantile for the page: "≤ 0.3" when it fell in the first bucket, "≥ 10" past the
    last finite bound (the value then is only a bound; monitor/derive/histogram.py)."""
    if q is None or (v := getattr(q, name, None)) is None:
        return "–"
    side = q.bounds.get(name)
    if side is not None:
        return f"{'≤' if side[0] == 'upper' else '≥'} {side[1]:g}"
    return _fmt(v, digits)


def _latency_line(p: PoolSnapshot) -> str:
    """p50 / p95 of the engines' TTFT, queue time and end-to-end latency, bounds shown as bounds."""
    parts = []
    for kind, label in (("ttft", "TTFT"), ("queue", "queue"), ("e2e", "end-to-end")):
        q = p.latency.get(kind)
        if q is not None and q.count:
            parts.append(f"{label} p50 {_quantile(q, 'p50')} s, p95 {_quantile(q, 'p95')} s")
    return f'<p class="muted">{" · ".join(parts)}</p>' if parts else ""


MAX_CHART_POINTS = 180


def _svg(points: list[tuple[float, float, float, float]], knee: Optional[float], width=560, height=150) -> str:
    if len(points) < 2:
        return '<p class="muted">The chart fills in as cycles run.</p>'
    if len(points) > MAX_CHART_POINTS:  # a point per 3 px is all the chart can show; the last is kept
        stride = -(-len(points) // MAX_CHART_POINTS)
        points = points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
    t0, t1 = points[0][0], points[-1][0]
    top = max(max(p[1] + p[2] for p in points), knee or 0.0, 1.0) * 1.1
    span = max(t1 - t0, 1.0)

    def xy(t: float, v: float) -> str:
        return f"{(t - t0) / span * (width - 40) + 35:.1f},{height - 20 - v / top * (height - 30):.1f}"

    active = " ".join(xy(p[0], p[1]) for p in points)
    total = " ".join(xy(p[0], p[1] + p[2]) for p in points)
    base = f"{xy(t1, 0)} {xy(t0, 0)}"
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="active and queued requests">',
             f'<polygon points="{total} {base}" fill="#f4a261" opacity="0.55"/>',
             f'<polygon points="{active} {base}" fill="#2a9d8f" opacity="0.85"/>']
    if knee:
        y = xy(t0, knee).split(",")[1]
        parts.append(f'<line x1="35" x2="{width - 5}" y1="{y}" y2="{y}" stroke="#e63946" stroke-dasharray="5,4"/>')
        parts.append(f'<text x="{width - 8}" y="{float(y) - 4:.1f}" text-anchor="end" class="lbl">knee {knee:,.0f}</text>')
    hours = span / 3600
    parts.append(f'<text x="35" y="{height - 4}" class="lbl">{hours:.1f} h ago</text>')
    parts.append(f'<text x="{width - 5}" y="{height - 4}" text-anchor="end" class="lbl">now</text>')
    parts.append(f'<text x="2" y="14" class="lbl">{top / 1.1:,.0f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _forecast_kpi(p: PoolSnapshot) -> str:
    """The day's forecast peak and the time to exhaustion: the forecast /metrics exports."""
    fc = p.forecast
    if fc is None or (day := fc.horizons.get("1d")) is None:
        return ""
    left = fc.exhaustion_seconds
    if left is None:
        until = "capacity unknown"
    elif math.isinf(left):
        until = "no exhaustion within the forecast"
    else:
        until = f"capacity reached in {left / 3600:,.1f} h"
    rec = p.recommended_replicas.get("1d")
    scale = (f" · {rec} replicas recommended (with one lost, the rest hold the 95 % peak)"
             if rec is not None else "")
    at = time.strftime("%a %H:%M UTC", time.gmtime(day.peak_timestamp))
    band80 = f"80 % band up to {_fmt(day.peak_upper_80)}, " if day.peak_upper_80 is not None else ""
    return (f'<div><b>{_fmt(day.peak)}</b><span>forecast peak requests (1 d) at {at}: {band80}95 % band up to '
            f'{_fmt(day.peak_upper)} · {until}{scale}</span></div>')


def _gateway_kpi(p: PoolSnapshot) -> str:
    if not p.gateway_queued:
        return ""
    return f'<div><b>{_fmt(p.gateway_queued_requests)}</b><span>queued in front of them (gateway)</span></div>'


def _limit_kpi(cap: Capacity) -> str:
    """What limits the pool (the smallest capacity: slots, kv, knee or slo) and the load it is judged on."""
    if cap.limiting_factor is None:
        return ""
    e = html.escape
    why = ""
    by = cap.slo_limited_by
    if cap.limiting_factor == "slo" and by:
        why = (f": {e(str(by.get('target')))} {by.get('slo_violation_ratio', 0) * 100:.0f}% over "
               f"{by.get('slo_target_seconds'):g} s (allowed {by.get('allowed_ratio', 0) * 100:.0f}%)")
    window = cap.load_window_seconds
    judged = f"load {_fmt(cap.load_requests)} averaged over {window:.0f} s" if window else f"load {_fmt(cap.load_requests)}"
    instant = f" · now {_fmt(cap.load_requests_instant)}" if window else ""
    return (f'<div><b>{e(cap.limiting_factor)}</b><span>limits the pool{why} · {judged}{instant}</span></div>')


def _knee_kpi(cap: Capacity) -> str:
    """The knee and where it comes from: learned (with its confidence) or the prior from the limits."""
    if cap.knee_requests is None:
        return ""
    if cap.knee_source == "learned":
        conf = f", confidence {cap.knee_confidence_ratio:.2f}" if cap.knee_confidence_ratio is not None else ""
        how = f"learned on {html.escape(cap.knee_signal or '?')}{conf}"
    else:
        how = f"prior from the {html.escape(cap.knee_signal or 'limits')}"
    return f'<div><b>{_fmt(cap.knee_requests)}</b><span>knee requests ({how})</span></div>'


def _since(alert: Alert, now: float) -> str:
    if alert.since is None:
        return ""
    minutes = max(0.0, now - alert.since) / 60
    return f" for {minutes:,.0f} min" if minutes >= 1 else " for under a minute"


def _alert_items(alerts: list[Alert], now: float) -> str:
    e = html.escape
    return "".join(
        f'<li class="{e(a.state)}"><b>{e(a.name)}</b> {e(a.state)}{_since(a, now)}'
        f'{" · " + e(a.severity) if a.severity else ""}{" · pool " + e(a.pool) if a.pool else ""}'
        f'{": " + e(a.summary) if a.summary else ""}</li>' for a in alerts)


def _alerts_section(snapshot: Snapshot, has_source: bool) -> str:
    """Headroom's alerts as the configured Prometheus or Alertmanager shows them (sources.alerts)."""
    e = html.escape
    link = f' <a href="{e(snapshot.alerts_ui)}">all alerts</a>' if snapshot.alerts_ui else ""
    if snapshot.alerts is None:
        if not has_source:
            return ('<p class="muted">No alerts source: set sources.alerts to the Prometheus or Alertmanager '
                    'that evaluates headroom\'s rules to see firing alerts here.</p>')
        return f'<p class="muted">The alerts source did not answer this cycle.{link}</p>'
    firing = [a for a in snapshot.alerts if a.state == "firing"]
    pending = [a for a in snapshot.alerts if a.state != "firing"]
    cut = snapshot.anomalies.get("alerts_cut", 0.0)  # monitor/sources/alerts.py caps the answer
    cut_note = (f'<p class="muted">{cut:,.0f} alerts or alert texts cut since start (too many, or too long: '
                f'see the source{link}).</p>') if cut else ""
    if not snapshot.alerts:
        return f"<p>No headroom alert is firing.{link}</p>{cut_note}"
    return (f'<p>{len(firing)} firing, {len(pending)} pending.{link}</p>{cut_note}'
            f'<ul class="alerts">{_alert_items(snapshot.alerts[:30], snapshot.timestamp)}</ul>')


def _tasks_table(p: PoolSnapshot) -> str:
    """Task types: arrival rate x calls per task, and task latency against its target."""
    if p.tasks is None or not p.tasks.by_type:
        return ""
    e = html.escape
    rows = []
    for name, t in sorted(p.tasks.by_type.items()):
        target = f"{t.slo_target_seconds:g} s" if t.slo_target_seconds is not None else "–"
        over = (fixed(t.slo_violation_ratio * 100, ".1f") + " %" if t.slo_violation_ratio is not None else "–")
        rows.append(f"<tr><td>{e(name)}</td><td>{_fmt(t.arrival_rate, 2)}</td><td>{_fmt(t.calls_per_task, 1)}</td>"
                    f"<td>{_fmt(t.sessions)}</td><td>{_quantile(t.task_latency, 'p95', 1)}</td><td>{target}</td><td>{over}</td>"
                    f"<td>{_burn_cell(t.slo_burn_rate)}</td></tr>")
    return ('<table class="tasks"><tr><th>task type</th><th>tasks/s</th><th>calls/task</th><th>sessions</th>'
            '<th>task p95 s</th><th>target</th><th>over target</th><th>budget burn</th></tr>'
            + "".join(rows) + "</table>")


def _burn_cell(rates: dict) -> str:
    """Each burn window's rate; a window the history does not cover yet reads "—", titled so."""
    if not rates:
        return "–"
    return " ".join(f"{html.escape(w)} {fixed(v, '.1f')}" if v is not None else
                    f'<span class="muted" title="not yet covered">{html.escape(w)} —</span>'
                    for w, v in rates.items())


def _kv_band_text(p: PoolSnapshot) -> str:
    """The live-KV estimate's band, when block rounding leaves one (SGLang counts tokens: none)."""
    lo, hi = p.kv_tokens_live_low, p.kv_tokens_live_high
    if lo is None or hi is None or hi <= lo:
        return ""
    return f" · band {_fmt(lo)}–{_fmt(hi)}"


def _pool_card(p: PoolSnapshot, trend: list, alerts: Optional[list[Alert]] = None, now: float = 0.0,
               ratios=()) -> str:
    e = html.escape
    cap = p.capacity if p.capacity is not None else Capacity()
    knee = cap.knee_requests
    kv_pct = p.kv_usage_ratio * 100 if p.kv_usage_ratio is not None else None
    kv_text = _fmt(None) if kv_pct is None else f"{kv_pct:.0f}%"  # unknown usage: the page's dash, never 0 %
    cls, headline_kpi = headline(p, cap, list(ratios))
    stale = ' <span class="badge bad">stale</span>' if p.stale else ""
    sessions, session_cap, spmw = cap.sessions, cap.session_capacity, cap.sessions_per_megawatt
    mine = [a for a in alerts or () if a.state == "firing" and _alert_of(a, p)]  # pending: above
    if mine:
        stale += ' <span class="badge bad">alert firing</span>'
    slow = [r.replica for r in p.replica_detail if r.slow]
    if slow:
        stale += f' <span class="badge bad" title="{e(", ".join(slow))}">{len(slow)} slow</span>'
    return f"""
<section class="card {cls}">
  <h2>{e(p.name)}{_labels_text(p)}{stale}</h2>
  <div class="kpis">
    <div><b>{_fmt(p.active_requests)}</b><span>active requests</span></div>
    <div><b>{_fmt(p.queued_requests)}</b><span>queued in the engines</span></div>
    {_gateway_kpi(p)}
    <div><b>{_fmt(p.kv_tokens_live)}</b><span>of {_fmt(p.kv_tokens_capacity)} KV tokens ({kv_text}){_kv_band_text(p)}</span></div>
    {headline_kpi}
    <div><b>{_fmt(sessions)}</b><span>agent sessions of {_fmt(session_cap)} sustainable</span></div>
    <div><b>{_fmt(spmw)}</b><span>sessions per MW</span></div>
    <div><b>{p.replicas}/{p.replicas_configured}</b><span>replicas up</span></div>
    {_knee_kpi(cap)}
    {_limit_kpi(cap)}
    {_forecast_kpi(p)}
  </div>
  <div class="bar"><div style="width:{min(kv_pct or 0.0, 100):.0f}%"></div></div>
  {_latency_line(p)}
  {_svg(trend, knee)}
  <p class="legend"><i style="background:#2a9d8f"></i>active <i style="background:#f4a261"></i>queued
  <i style="background:#e63946"></i>knee</p>
  {spare_strip(p, now)}
  {_tasks_table(p)}
  {f'<ul class="alerts">{_alert_items(mine, now)}</ul>' if mine else ""}
</section>"""


def _alert_of(alert: Alert, p: PoolSnapshot) -> bool:
    """The alert is about this pool: its pool label names it (or its model) and, with a pool_by list,
    its other labels (cluster) are the pool's."""
    if alert.pool == p.pool:
        return True
    return alert.pool in (p.name, p.model) and all(alert.labels.get(k) == v for k, v in p.extra_labels.items())


def _labels_text(p: PoolSnapshot) -> str:
    """The pool's other pool_by labels (its cluster) beside its name; "" with one pool_by label."""
    extra = p.extra_labels
    return "".join(f' <span class="lbl">{html.escape(k)}={html.escape(v)}</span>' for k, v in extra.items())


def _groups(pools: list[PoolSnapshot]) -> list[tuple[tuple, list[PoolSnapshot]]]:
    """Pools grouped by their other pool_by labels (by cluster), groups in label order; one group
    (no heading) when no pool carries any."""
    groups: dict[tuple, list[PoolSnapshot]] = {}
    for p in pools:
        groups.setdefault(tuple(sorted(p.extra_labels.items())), []).append(p)
    return sorted(groups.items())


def _group_head(group: tuple) -> str:
    if not group:
        return ""
    text = " ".join(f"{k}={v}" for k, v in group)
    return f'<h3 class="group">{html.escape(text)}</h3>'


def _fit_section(pools: list[PoolSnapshot]) -> str:
    """Where more sessions fit: spare sessions per (cluster and) pool, most first; shown with two or
    more pools of known headroom."""
    fits = fleet_fit(pools)
    if len(fits) < 2:
        return ""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(' '.join(f'{k}={v}' for k, v in f.labels))}</td><td>{e(f.pool)}</td>"
        f"<td>{_fmt(f.spare_sessions, 1)}</td><td>{_fmt(f.spare_sessions_n_minus_1, 1)}</td></tr>"
        for f in fits[:LANDING_PAGE_POOLS])
    more = (f'<p class="muted">and {len(fits) - LANDING_PAGE_POOLS:,} more pools with room (the JSON\'s '
            f'<code>fit</code>)</p>' if len(fits) > LANDING_PAGE_POOLS else "")
    return ('<h3>Where more sessions fit</h3><table class="tasks fit"><tr><th>where</th><th>pool</th>'
            f'<th>spare sessions</th><th>with one replica lost</th></tr>{rows}</table>{more}')


def render(snapshot: Optional[Snapshot], trends: Trends, title: str = "headroom",
           links: tuple[tuple[str, str], ...] = (), has_alerts_source: bool = False, page: int = 1) -> str:
    """The page; `links`: (label, URL) pairs shown under the title (the demo's Prometheus pages);
    `page`: which page of a large fleet's pools (`paged`)."""
    e = html.escape
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.timestamp)) if snapshot else "no cycle yet"
    cards = ""
    sources = ""
    alerts = ""
    more = "".join(f' · <a href="{e(url)}">{e(label)}</a>' for label, url in links)
    if snapshot:
        alerts = "<h3>Alerts</h3>" + _alerts_section(snapshot, has_alerts_source)
        shown, pages = paged(snapshot.pools, page)
        groups = _groups(shown) if not pages else [((), shown)]  # paged: in pressure order, labels on each card
        cards = pages + "".join(_group_head(group) + "".join(
            _pool_card(p, list(trends.points.get(p.pool, ())), snapshot.alerts, snapshot.timestamp,
                       trends.ratios.get(p.pool)) for p in pools)
            for group, pools in groups)
        alerts += _fit_section(snapshot.pools)
        down = [s for s in snapshot.sources if not s.up]
        up = len(snapshot.sources) - len(down)
        rows = "".join(f"<li>{e(s.source)} {e(s.target)}: {e(s.error or '')}</li>" for s in down[:20])
        sources = f"<p>{up} of {len(snapshot.sources)} sources answered.</p>" + (f"<ul class='down'>{rows}</ul>" if rows else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<meta http-equiv="refresh" content="15">
<style>
body {{ font-family: system-ui, -apple-system, "DejaVu Sans", sans-serif; margin: 24px; color: #1d3557; background: #f8f9fa; }}
h1 {{ margin: 0 0 4px 0; }} .muted, .lbl {{ color: #6c757d; font-size: 12px; }}
h3.group {{ width: 100%; margin: 8px 0 0 0; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 16px; }}
.card {{ box-sizing: border-box; background: white; border-radius: 8px; padding: 16px; width: 600px; box-shadow: 0 1px 3px #0002; border-top: 6px solid #2a9d8f; }}
.card.warn {{ border-top-color: #e9c46a; }} .card.bad {{ border-top-color: #e63946; }}
.kpis {{ display: flex; gap: 18px; flex-wrap: wrap; }} .kpis div {{ display: flex; flex-direction: column; }}
.kpis b {{ font-size: 24px; }} .kpis span {{ font-size: 12px; color: #6c757d; }}
b.bad {{ color: #e63946; }} b.warn {{ color: #b08900; }}
.bar {{ background: #e9ecef; height: 8px; border-radius: 4px; margin: 10px 0; }} .bar div {{ background: #457b9d; height: 8px; border-radius: 4px; }}
.badge {{ font-size: 12px; padding: 2px 6px; border-radius: 4px; color: white; background: #e63946; }}
.legend i {{ display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 10px; }}
p.pages {{ width: 100%; margin: 0; }}
ul.down {{ color: #e63946; }} ul.alerts li.firing {{ color: #e63946; }} ul.alerts li.pending {{ color: #b08900; }}
table.tasks {{ border-collapse: collapse; font-size: 12px; margin-top: 8px; }} table.tasks td, table.tasks th {{ padding: 2px 8px; text-align: right; }}
table.tasks td:first-child, table.tasks th:first-child {{ text-align: left; }}
</style></head>
<body>
<h1>{e(title)}</h1>
<p class="muted">Capacity of the inference fleet: active vs queued requests, live KV tokens and headroom before the knee. Last cycle: {e(when)}. <a href="/metrics">/metrics</a> · <a href="/api/v1/snapshot">/api/v1/snapshot</a>{more} · version {e(__version__)}</p>
{alerts}
<div class="grid">{cards or '<p>No pools yet: the first cycle has not finished.</p>'}</div>
<h3>Sources</h3>{sources}
</body></html>"""
