"""The knee's fit: a hinge of latency over load, and how often the data give the same hinge again.

`fit_hinge(load, latency)` -> `Fit` or None (monitor/capacity/knee.py explains the algorithm and why
it is this one). Pure numpy, deterministic for the same observations (the bootstrap's generator is
seeded from the data's size), no clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

BOOTSTRAP = 32  # resamples behind the confidence
RESAMPLE = 600  # observations drawn per resample at most (bounds the cost; fewer draws only widen the spread)
AGREE = 0.15  # a resample agrees when its knee is within 15 % of the fit's
SUPPORT = 5  # observations past the knee with latency turned up that a full confidence needs
MAX_BINS, MIN_BINS, PER_BIN = 24, 6, 3  # equal-count bins: n / 3 of them, 6..24


@dataclass(frozen=True)
class Fit:
    knee: float
    confidence: float  # agreement x coverage (0 unless latency gets at least twice as steep)
    slope_before: float
    slope_after: float
    intercept: float
    r_gain: float  # share of the straight line's error the hinge removes (diagnostic)
    rise_snr: float  # rise past the knee over the residual spread (diagnostic)
    bins: int
    agreement: float = 0.0  # share of bootstrap resamples whose knee is within 15 % of this one
    support: int = 0  # observations past the knee nearer the hinge than the straight line

    def excess(self, load: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """How far each observation sits above the no-knee line, in units of the rise the hinge
        predicts for it (0: on the straight line, 1: on the hinge); only meaningful past the knee."""
        line = self.intercept + self.slope_before * load
        rise = (self.slope_after - self.slope_before) * np.maximum(0.0, load - self.knee)
        return (latency - line) / np.where(rise > 0, rise, np.inf)


def _bins_equal_count(load: np.ndarray, latency: np.ndarray, n_bins: int, min_bin: int):
    """Bins of equal count by load (sizes differ by one at most): each bin's median load, median
    latency and count (vectorised: the fit runs it once per bootstrap resample)."""
    n = load.size
    n_bins = min(n_bins, n)
    order = np.argsort(load, kind="stable")
    base, extra = divmod(n, n_bins)
    sizes = np.full(n_bins, base)
    sizes[:extra] += 1
    sizes = sizes[sizes >= max(1, min_bin)]
    if not sizes.size:
        return np.array([]), np.array([]), np.array([])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    group = np.repeat(np.arange(sizes.size), sizes)
    xs_sorted = load[order][: group.size]
    ys = latency[order][: group.size]
    ys_sorted = ys[np.lexsort((ys, group))]
    lo, hi = starts + (sizes - 1) // 2, starts + sizes // 2
    return ((xs_sorted[lo] + xs_sorted[hi]) / 2.0, (ys_sorted[lo] + ys_sorted[hi]) / 2.0,
            sizes.astype(float))


def _bins_equal_width(load: np.ndarray, latency: np.ndarray, n_bins: int, min_bin: int):
    lo, hi = np.percentile(load, 2), np.percentile(load, 98)
    if not hi > lo:
        return np.array([]), np.array([]), np.array([])
    edges = np.linspace(lo, hi, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, load, side="right") - 1, 0, n_bins - 1)
    xs, ys, ws = [], [], []
    for b in range(n_bins):
        sel = idx == b
        if sel.sum() >= min_bin:
            xs.append(float(np.median(load[sel])))
            ys.append(float(np.median(latency[sel])))
            ws.append(float(sel.sum()))
    return np.array(xs), np.array(ys), np.array(ws)


def _hinge_fits(x: np.ndarray, y: np.ndarray, w: np.ndarray, ks: np.ndarray):
    """Weighted least squares of y = a + b1 x + b2 max(0, x - k) for every k of `ks` at once (the
    3 x 3 normal equations, batched): (coefficients (m, 3), SSE (m,))."""
    H = np.maximum(0.0, x[None, :] - ks[:, None])
    s1, sx, sxx = np.sum(w), np.sum(w * x), np.sum(w * x * x)
    sh, sxh, shh = H @ w, H @ (w * x), (H * H) @ w
    A = np.empty((ks.size, 3, 3))
    A[:, 0, 0], A[:, 0, 1], A[:, 1, 1] = s1, sx, sxx
    A[:, 0, 2], A[:, 1, 2], A[:, 2, 2] = sh, sxh, shh
    A[:, 1, 0], A[:, 2, 0], A[:, 2, 1] = A[:, 0, 1], A[:, 0, 2], A[:, 1, 2]
    A += 1e-12 * np.eye(3)[None]
    b = np.column_stack([np.full(ks.size, np.sum(w * y)), np.full(ks.size, np.sum(w * x * y)), H @ (w * y)])
    coef = np.linalg.solve(A, b[..., None])[..., 0]
    fitted = coef[:, :1] + coef[:, 1:2] * x[None, :] + coef[:, 2:3] * H
    return coef, np.sum(w[None, :] * (y[None, :] - fitted) ** 2, axis=1)


def _line_sse(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    X = np.column_stack([np.ones_like(x), x]) * np.sqrt(w)[:, None]
    coef, *_ = np.linalg.lstsq(X, y * np.sqrt(w), rcond=None)
    return float(np.sum(w * (y - coef[0] - coef[1] * x) ** 2))


def _hinge(x: np.ndarray, y: np.ndarray, w: np.ndarray):
    """The best hinge over the bins: (knee, (a, b1, b2), sse); candidates between the bin centres,
    then a finer grid around the best."""
    def best_of(ks: np.ndarray):
        coef, sse = _hinge_fits(x, y, w, ks)
        i = int(np.argmin(sse))
        return float(ks[i]), coef[i], float(sse[i])

    k, coef, sse = best_of(x[1:-2])
    step = (x[-1] - x[0]) / (x.size - 1)
    fine = np.linspace(k - step, k + step, 41)
    fine = fine[(fine >= x[1]) & (fine <= x[-3])]
    if fine.size:
        k2, coef2, sse2 = best_of(fine)
        if sse2 < sse:
            k, coef, sse = k2, coef2, sse2
    return k, coef, sse


def _steeper(b1: float, b2: float) -> bool:
    return b2 > 0 and (b1 + b2) >= 2.0 * max(b1, 0.0) and (b1 + b2) > 0


def fit_hinge(load, latency, n_bins: Optional[int] = None, min_bin: int = 3,
              bootstrap: int = BOOTSTRAP) -> Optional[Fit]:
    """Segmented-regression knee of latency over load; None when the data cannot support one.

    `n_bins` None: equal-count bins (n / 5, 6..24: the default); a number: that many equal-width bins
    between the 2nd and 98th percentile of load (a stepped sweep of known levels, one bin per level)."""
    load = np.asarray(load, dtype=float)
    latency = np.asarray(latency, dtype=float)
    ok = np.isfinite(load) & np.isfinite(latency)
    load, latency = load[ok], latency[ok]
    if load.size < 4 * min_bin or not np.ptp(load) > 0:
        return None
    if n_bins is None:
        count = int(min(MAX_BINS, max(MIN_BINS, load.size // PER_BIN)))

        def binned(lo, la):
            return _bins_equal_count(lo, la, count, min_bin)
    else:
        def binned(lo, la):
            return _bins_equal_width(lo, la, n_bins, min_bin)
    x, y, w = binned(load, latency)
    if x.size < 6 or not np.ptp(x) > 0:
        return None
    w = np.sqrt(w)  # dampen heavily sampled bins so the sparse high-load tail still counts
    k, (a, b1, b2), sse = _hinge(x, y, w)
    sse_lin = _line_sse(x, y, w)
    below, above = int(np.sum(x <= k)), int(np.sum(x > k))
    line, hinge = a + b1 * load, b2 * np.maximum(0.0, load - k)
    support = int(np.sum((load > k) & (hinge > 0) & (latency - line >= 0.5 * hinge)))
    coverage = min(1.0, below / 3.0, above / 2.0, support / SUPPORT)
    r_gain = 0.0 if sse_lin <= 0 else max(0.0, 1.0 - sse / sse_lin)
    resid_sd = math.sqrt(sse / max(1.0, float(np.sum(w))))
    rise = b2 * (x[-1] - k)
    rise_snr = rise / (resid_sd + 1e-12) if rise > 0 else 0.0
    # the bootstrap (the cost) only where its answer can matter
    agreement = _agreement(load, latency, k, binned, bootstrap) if _steeper(b1, b2) and coverage > 0 else 0.0
    conf = agreement * coverage
    return Fit(float(k), float(max(0.0, min(1.0, conf))), float(b1), float(b1 + b2), float(a),
               float(r_gain), float(rise_snr), int(x.size), float(agreement), support)


def _agreement(load: np.ndarray, latency: np.ndarray, k: float, binned, rounds: int) -> float:
    """Share of bootstrap resamples (min(n, RESAMPLE) observations drawn with replacement) whose own
    hinge gets at least twice as steep within `AGREE` of `k`. Drawing fewer than n (an m-out-of-n
    bootstrap) can only spread the resamples' knees wider: the confidence errs low, never high."""
    if rounds <= 0:
        return 1.0
    rng = np.random.default_rng(load.size)
    agree = 0
    for _ in range(rounds):
        i = rng.integers(0, load.size, min(load.size, RESAMPLE))
        x, y, w = binned(load[i], latency[i])
        if x.size < 6 or not np.ptp(x) > 0:
            continue
        kb, (_, b1, b2), _ = _hinge(x, y, np.sqrt(w))
        if _steeper(b1, b2) and abs(kb - k) <= AGREE * k:
            agree += 1
    return agree / rounds
