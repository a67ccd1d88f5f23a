"""Charts of the digest as PNG bytes (matplotlib, Agg backend; no display, no files).

Per pool:
  forecast   hourly peak concurrent requests last week, last week's forecast (made before it) and
             next week's forecast, each with 80% and 95% bands; capacity at the knee and at N-1
  headroom   headroom ratio over last week, current and with the largest replica lost
"""
from __future__ import annotations

import io
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ACTUAL, LAST, NEXT, KNEE, N1 = "#1f2937", "#d97706", "#2563eb", "#dc2626", "#9333ea"


def _dates(ts, tz: str):
    z = ZoneInfo(tz)
    return [datetime.fromtimestamp(float(t), tz=timezone.utc).astimezone(z) for t in ts]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _axis(ax, tz: str, days: float = 7.0):
    z = ZoneInfo(tz)
    ax.xaxis.set_major_locator(mdates.DayLocator(interval=1 if days <= 8 else 2, tz=z))
    ax.xaxis.set_minor_locator(mdates.DayLocator(tz=z))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%a\n%d %b", tz=z))
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _band(ax, fc: dict, color: str, label: str, tz: str):
    if not fc or not fc.get("defined"):
        return
    d = _dates(fc["_times"], tz)
    lo95, hi95 = fc["_bands"][0.95]
    lo80, hi80 = fc["_bands"][0.8]
    ax.fill_between(d, lo95, hi95, color=color, alpha=0.15, linewidth=0, label=f"{label} 95%")
    ax.fill_between(d, lo80, hi80, color=color, alpha=0.3, linewidth=0, label=f"{label} 80%")
    ax.plot(d, fc["_mean"], color=color, linewidth=1.4, label=f"{label} (mean)")


def forecast_chart(pool: dict, tz: str) -> bytes:
    fig, ax = plt.subplots(figsize=(10, 4.0))
    actual = pool.get("_actual")
    _band(ax, pool.get("_forecast_last"), LAST, "last week's forecast", tz)
    _band(ax, pool.get("_forecast_next"), NEXT, "next week's forecast", tz)
    days = 7.0
    if actual is not None and len(actual):
        ax.plot(_dates(actual.index, tz), actual.to_numpy(), color=ACTUAL, linewidth=1.0,
                label="actual (hourly peak)", zorder=5)
        days = (float(actual.index[-1]) - float(actual.index[0])) / 86400.0 + 7.0
    knee = pool["knee"]
    if knee.get("requests"):
        ax.axhline(knee["requests"], color=KNEE, linestyle="--", linewidth=1.2,
                   label=f"knee ({knee['requests']:,.0f})")
    if knee.get("requests_n_minus_1"):
        ax.axhline(knee["requests_n_minus_1"], color=N1, linestyle=":", linewidth=1.2,
                   label=f"N-1 ({knee['requests_n_minus_1']:,.0f})")
    ax.set_ylabel("concurrent requests")
    ax.set_ylim(bottom=0)
    _axis(ax, tz, days)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7, ncol=5, frameon=False)
    fig.tight_layout()
    return _png(fig)


def headroom_chart(pool: dict, tz: str) -> bytes:
    fig, ax = plt.subplots(figsize=(10, 3.0))
    h = pool.get("_headroom")
    if h is not None and h.get("current") is not None:
        d = _dates(h["times"], tz)
        cur = np.asarray(h["current"]) * 100
        ax.plot(d, cur, color=NEXT, linewidth=1.2, label="headroom")
        if np.nanmin(cur) < 0:
            ax.fill_between(d, 0, cur, where=cur < 0, color=KNEE, alpha=0.3, linewidth=0,
                            label="over the knee")
        if h.get("n_minus_1") is not None:
            ax.plot(d, np.asarray(h["n_minus_1"]) * 100, color=N1, linewidth=1.0, linestyle=":",
                    label="headroom at N-1")
        lo = min(-10.0, float(np.nanmin(cur)) - 5, float(np.nanmin(np.asarray(h["n_minus_1"]) * 100)) - 5
                 if h.get("n_minus_1") is not None else -10.0)
        ax.set_ylim(max(lo, -200.0), 105)
    ax.axhline(0, color=KNEE, linewidth=1.0)
    ax.set_ylabel("headroom (%)")
    _axis(ax, tz)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=7, ncol=3, frameon=False)
    fig.tight_layout()
    return _png(fig)


def charts_for(digest: dict) -> dict[str, bytes]:
    """{content id: PNG bytes}: "pool<i>-forecast" and "pool<i>-headroom" per pool (index-based ids,
    so no label value ever reaches an id, a file name or a URL)."""
    out = {}
    tz = digest["timezone"]
    for i, p in enumerate(digest["pools"]):
        out[f"pool{i}-forecast"] = forecast_chart(p, tz)
        out[f"pool{i}-headroom"] = headroom_chart(p, tz)
    return out
