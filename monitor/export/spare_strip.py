"""The landing page's 24-hour strip of a pool's spare capacity for deferrable work.

One row of the next 24 hours from the snapshot's time in half-hour columns: a green bar whose
height is the fewest requests that fit through the half hour (monitor/model/spare_data.py windows) over
the ceiling (knee x (1 - margin)), equal neighbours drawn as one bar; none a pale red gap (nothing
fits: the interactive peak); hour ticks every 6 h in UTC. Under it one line: the
spare now and over the next hour, the deferrable budget and why, and the next gapless run of windows (the fewest it holds). A pool whose
spare is not known says why instead (stale data: the budget is 0). Every text is escaped.
"""
from __future__ import annotations

import html
import time
from typing import Optional

from ..capacity.spare import coarse, runs
from ..model import PoolSnapshot, Spare
from ..model.spare_data import DAY_SECONDS

WIDTH, HEIGHT = 560, 46
COLUMNS = 48  # half an hour each


def _n(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _hhmm(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


def _bars(s: Spare, now: float) -> list[str]:
    top, span = s.ceiling or 1.0, DAY_SECONDS / COLUMNS
    col_w = (WIDTH - 40) / COLUMNS
    parts = [f'<rect x="35" y="4" width="{WIDTH - 40}" height="{HEIGHT - 18}" fill="#e6394622"/>']
    for w in coarse(s.windows, now, span, COLUMNS):
        h = max(2.0, min(1.0, w.requests / top) * (HEIGHT - 18))
        tip = html.escape(f"{_hhmm(w.start)}–{_hhmm(w.end)} UTC: at least {w.requests:,.0f} requests")
        parts.append(f'<rect x="{35 + (w.start - now) / span * col_w:.1f}" y="{HEIGHT - 14 - h:.1f}" '
                     f'width="{(w.end - w.start) / span * col_w:.1f}" height="{h:.1f}" fill="#2a9d8f">'
                     f'<title>{tip}</title></rect>')
    for hour in range(0, 25, 6):
        x = 35 + hour / 24 * (WIDTH - 40)
        anchor = "start" if hour == 0 else "end" if hour == 24 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 2}" text-anchor="{anchor}" class="lbl">'
                     f'{"now" if hour == 0 else _hhmm(now + hour * 3600)}</text>')
    return parts


def spare_strip(p: PoolSnapshot, now: float) -> str:
    """The strip and its line for the pool's card ("" when the pool has no spare figure at all)."""
    s = p.spare
    if s is None:
        return ""
    e = html.escape
    if not s.requests:
        return (f'<p class="spare muted">Spare for deferrable work: not known ({e(s.reason)}); '
                f'the deferrable budget is 0.</p>')
    nxt = next((w for w in runs(s.windows) if w.end > now), None)
    when = (f"next spare {_hhmm(nxt.start)}–{_hhmm(nxt.end)} UTC (at least {_n(nxt.requests)})" if nxt is not None
            else "no spare in the forecast")
    svg = "".join([f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" '
                   f'aria-label="spare requests for deferrable work over the next 24 hours">', *_bars(s, now),
                   "</svg>"])
    return (f'<div class="spare">{svg}<p class="legend">spare for deferrable work, next 24 h: '
            f'<b>{_n(s.requests.get("now"))}</b> now, {_n(s.requests.get("1h"))} over 1 h, '
            f'{_n(s.requests.get("1d"))} over 1 d · budget {s.budget_ratio:.2f} ({e(s.reason)}) · {e(when)}</p></div>')
