"""Charts of the digest as PNG bytes (matplotlib, Agg backend; no display, no files).

Per pool:
  forecast   peak concurrent requests last week, last week's forecast (made before it) and
             next week's forecast, each with 80% and 95% bands; capacity at the knee and at N-1
  headroom   headroom ratio over last week, current and with the largest replica lost

Short history (a fresh install: 20 minutes) is drawn at the history's own step, not as hourly peaks
(one hourly point draws no line); the x axis is limited to what is shown and ticked by an automatic
date locator, so 20 minutes get minute ticks and three weeks day ticks (content.py `_chart_points`).
"""
from __future__ import annotations

import io
from datetime import datetime, timezone
from typing import Optional
from zoneinfo import ZoneInfo

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np

ACTUAL, LAST, NEXT, KNEE, N1 = "#1f2937", "#d97706", "#2563eb", "#dc2626", "#9333ea"


def _dates(ts, tz: str):
    z = ZoneInfo(tz)
    return [datetime.fromtimestamp(float(t), tz=timezone.utc).astimezone(z) for t in ts]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _axis(ax, tz: str, span: tuple[float, float]):
    """Dates on the x axis, limited to `span` (Unix seconds): an automatic locator picks minutes,
    hours or days for what is shown (20 minutes of history or three weeks), never thousands of
    ticks. Without explicit limits matplotlib widens a single point to +-2 years."""
    z = ZoneInfo(tz)
    lo, hi = span
    if not hi > lo:  # one instant: a few minutes either side
        lo, hi = lo - 300.0, hi + 300.0
    d0, d1 = _dates((lo, hi), tz)
    ax.set_xlim(d0, d1)
    locator = mdates.AutoDateLocator(tz=z, minticks=3, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=z))
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _line(ax, times, values, tz: str, **kw):
    """A data line; with fewer than 3 points each point also gets a marker (a single point draws
    no line segment at all)."""
    if len(times) < 3:
        kw.setdefault("marker", "o")
        kw.setdefault("markersize", 4)
    ax.plot(_dates(times, tz), np.asarray(values, dtype=float), **kw)


def _span(*arrays) -> tuple[float, float]:
    ts = [float(t) for a in arrays if a is not None for t in np.asarray(a, dtype=float) if np.isfinite(t)]
    return (min(ts), max(ts)) if ts else (0.0, 0.0)


def _band(ax, fc: Optional[dict], color: str, label: str, tz: str):
    if not fc or not fc.get("defined"):
        return
    d = _dates(fc["_times"], tz)
    lo95, hi95 = fc["_bands"][0.95]
    lo80, hi80 = fc["_bands"][0.8]
    ax.fill_between(d, lo95, hi95, color=color, alpha=0.15, linewidth=0, label=f"{label} 95%")
    ax.fill_between(d, lo80, hi80, color=color, alpha=0.3, linewidth=0, label=f"{label} 80%")
    ax.plot(d, fc["_mean"], color=color, linewidth=1.4, label=f"{label} (mean)")


def forecast_chart(pool: dict, tz: str) -> bytes:
    return _png(forecast_figure(pool, tz))


def headroom_chart(pool: dict, tz: str) -> bytes:
    return _png(headroom_figure(pool, tz))


def forecast_figure(pool: dict, tz: str):
    """The forecast chart's figure (close it with plt.close, or let forecast_chart encode it)."""
    fig, ax = plt.subplots(figsize=(10, 4.0))
    actual = pool.get("_actual")
    last, nxt = pool.get("_forecast_last"), pool.get("_forecast_next")
    _band(ax, last, LAST, "last week's forecast", tz)
    _band(ax, nxt, NEXT, "next week's forecast", tz)
    shown = []
    if actual is not None and len(actual):
        what = "offered load" if pool.get("forecast_series") == "offered" else "active + queued"
        per = "hourly peak" if pool.get("_chart_step", 3600.0) >= 3600.0 else "peak per step"
        label = f"actual {what} ({per})"
        _line(ax, actual.index.to_numpy(), actual.to_numpy(), tz, color=ACTUAL, linewidth=1.2,
              label=label, zorder=5)
        shown.append(actual.index.to_numpy())
    for fc in (last, nxt):
        if fc and fc.get("defined"):
            shown.append(fc["_times"])
    knee = pool["knee"]
    if knee.get("requests"):
        ax.axhline(knee["requests"], color=KNEE, linestyle="--", linewidth=1.2,
                   label=f"knee ({knee['requests']:,.0f})")
    if knee.get("requests_n_minus_1"):
        ax.axhline(knee["requests_n_minus_1"], color=N1, linestyle=":", linewidth=1.2,
                   label=f"N-1 ({knee['requests_n_minus_1']:,.0f})")
    ax.set_ylabel("concurrent requests")
    ax.set_ylim(bottom=0)
    ax.set_ylim(-0.02 * ax.get_ylim()[1], None)  # a quiet pool's line at 0 stays visible above the axis
    _axis(ax, tz, _span(*shown) if shown else _week(pool))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7, ncol=5, frameon=False)
    fig.tight_layout()
    return fig


def _week(pool: dict) -> tuple[float, float]:
    w = pool.get("_week") or (0.0, 0.0)
    return float(w[0]), float(w[1])


def headroom_figure(pool: dict, tz: str):
    """The headroom chart's figure (as forecast_figure)."""
    fig, ax = plt.subplots(figsize=(10, 3.0))
    h = pool.get("_headroom")
    span = _week(pool)
    if h is not None and h.get("current") is not None and len(h["times"]):
        times = np.asarray(h["times"], dtype=float)
        cur = np.asarray(h["current"], dtype=float) * 100
        _line(ax, times, cur, tz, color=NEXT, linewidth=1.2, label="headroom")
        if np.nanmin(cur) < 0:
            ax.fill_between(_dates(times, tz), 0, cur, where=cur < 0, color=KNEE, alpha=0.3, linewidth=0,
                            label="over the knee")
        lo = min(-10.0, float(np.nanmin(cur)) - 5)
        if h.get("n_minus_1") is not None:
            n1 = np.asarray(h["n_minus_1"], dtype=float) * 100
            _line(ax, times, n1, tz, color=N1, linewidth=1.0, linestyle=":", label="headroom at N-1")
            lo = min(lo, float(np.nanmin(n1)) - 5)
        ax.set_ylim(max(lo, -200.0), 105)
        span = _span(times)
    else:
        ax.text(0.5, 0.5, "headroom not known: no knee or no load history in the week", transform=ax.transAxes,
                ha="center", va="center", color=ACTUAL)
    ax.axhline(0, color=KNEE, linewidth=1.0)
    ax.set_ylabel("headroom (%)")
    _axis(ax, tz, span)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=7, ncol=3, frameon=False)
    fig.tight_layout()
    return fig


def charts_for(digest: dict) -> dict[str, bytes]:
    """{content id: PNG bytes}: "pool<i>-forecast" and "pool<i>-headroom" per pool (index-based ids,
    so no label value ever reaches an id, a file name or a URL)."""
    out = {}
    tz = digest["timezone"]
    for i, p in enumerate(digest["pools"]):
        out[f"pool{i}-forecast"] = forecast_chart(p, tz)
        out[f"pool{i}-headroom"] = headroom_chart(p, tz)
    return out
