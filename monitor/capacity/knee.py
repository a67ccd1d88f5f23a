"""The utilisation knee: the per-replica concurrency where latency turns up, learned live.

`KneeEstimator` is stateful but pure (no I/O, no clock): feed it one (load, kv_tokens, latency)
observation per replica and cycle with `observe`, ask `estimate()` each cycle.

Fit (segmented regression, "hockey stick"):
  1. keep the last `max_observations` observations (older behaviour ages out);
  2. bin them by load (equal width between the 2nd and 98th percentile of load) and take each bin's
     median latency, weighted by the bin's count: robust to outliers and to uneven sampling;
  3. for each candidate knee k between bin centres fit  y = a + b1 x + b2 max(0, x - k)  by weighted
     least squares; keep the k with the smallest error, then refine on a finer grid around it;
  4. confidence (0..1) = (share of the straight line's error the hinge removes)
     x min(1, rise after the knee / (5 x residual spread)) x coverage (bins on both sides), and
     0 when latency does not get steeper past the knee (b2 <= 0 or slope ratio < 2).

Observations above `fit_range_factor` (4) x the prior's knee are left out of the fit: a queue
far past every engine limit says nothing about where latency turned up.

Until a fit is confident the estimator answers with the prior from the engine's limits
(`prior_knee`: max_num_seqs, or KV capacity / mean KV tokens per request, whichever is smaller),
labelled source="prior". `SteadyPrior` keeps that prior from jumping between cycles: it changes
only when the limits do (the KV tokens per request, a median of measurements, with hysteresis). The published knee moves only when `confirmations` consecutive confident
fits agree with each other and all differ from the published knee by at least `min_change`
(relative): noise does not move it, a real change does after a few cycles.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

SIGNALS = ("ttft", "queue", "e2e_per_token", "e2e", "itl")


@dataclass(frozen=True)
class Knee:
    requests: Optional[float]  # concurrent requests (active + queued) per replica at the knee
    kv_tokens: Optional[float]  # live KV tokens per replica at the knee
    source: str  # "learned" or "prior"
    signal: str  # latency signal the knee was found on ("limits" for a prior)
    confidence: float = 0.0
    observations: int = 0
    detail: str = ""  # why a prior, or the fit's numbers


def prior_knee(max_num_seqs: Optional[float] = None, kv_capacity_tokens: Optional[float] = None,
               mean_kv_tokens_per_request: Optional[float] = None, detail: str = "") -> Knee:
    """The knee assumed from the engine's limits (per replica), before any learning."""
    limits = {}
    if max_num_seqs is not None:
        if max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be > 0, got {max_num_seqs}")
        limits["slots"] = float(max_num_seqs)
    if kv_capacity_tokens and mean_kv_tokens_per_request:
        if mean_kv_tokens_per_request <= 0 or kv_capacity_tokens <= 0:
            raise ValueError("KV capacity and mean KV tokens per request must be > 0")
        limits["kv"] = kv_capacity_tokens / mean_kv_tokens_per_request
    if not limits:
        return Knee(None, None, "prior", "limits", 0.0, 0,
                    detail or "no max_num_seqs and no KV capacity / tokens per request known")
    which = min(limits, key=limits.get)
    requests = limits[which]
    kv = requests * mean_kv_tokens_per_request if mean_kv_tokens_per_request else kv_capacity_tokens
    text = detail or f"prior from {which} limit ({', '.join(f'{k}={v:g}' for k, v in limits.items())})"
    return Knee(requests, kv, "prior", "limits", 0.0, 0, text)


class SteadyPrior:
    """The prior knee of one pool, kept steady from cycle to cycle (pure: no I/O, no clock).

    `update(max_num_seqs, kv_capacity_tokens, kv_per_request)` once a cycle, with the replica's
    limits and this cycle's measured KV tokens per running request (None when nothing runs). The
    measured figure moves with every cycle (a request's KV grows while it decodes, and which
    requests run changes), so it is not used as is: the prior uses the median of the last `window`
    measurements, adopted only when it differs from the figure in use by more than `hysteresis`
    (relative; 0.5: by half). Until `min_samples` measurements exist the configured figure is
    used (capacity.kv_tokens_per_request), else the first median. The prior (a `Knee`) is
    re-derived only when max_num_seqs, the KV capacity (by more than 1%) or the figure in use
    change; `kv_tokens_per_request` / `kv_source` give the figure in use, so the capacity's KV
    limit (monitor/capacity/headroom.py) counts with the same steady number."""

    def __init__(self, configured_kv_per_request: Optional[float] = None, *, window: int = 60,
                 min_samples: int = 5, hysteresis: float = 0.5) -> None:
        if window < 1 or min_samples < 1 or hysteresis < 0:
            raise ValueError("SteadyPrior needs window >= 1, min_samples >= 1 and hysteresis >= 0")
        self.configured = configured_kv_per_request
        self.window, self.min_samples, self.hysteresis = window, min(min_samples, window), hysteresis
        self._samples: deque = deque(maxlen=window)
        self.kv_tokens_per_request: Optional[float] = configured_kv_per_request
        self.kv_source: Optional[str] = "configured" if configured_kv_per_request else None
        self._limits: Optional[tuple] = None
        self.knee: Knee = prior_knee()

    def _follow_measurements(self, sample: Optional[float]) -> None:
        if sample is not None and math.isfinite(sample) and sample > 0:
            self._samples.append(float(sample))
        if len(self._samples) < self.min_samples:
            return
        median = float(np.median(self._samples))
        cur = self.kv_tokens_per_request if self.kv_source == "measured" else None
        if cur is None or abs(median - cur) > self.hysteresis * cur:
            self.kv_tokens_per_request, self.kv_source = median, "measured"

    def update(self, max_num_seqs: Optional[float], kv_capacity_tokens: Optional[float],
               kv_per_request: Optional[float] = None) -> Knee:
        """The prior after this cycle's limits and measurement (the same object while nothing moved)."""
        self._follow_measurements(kv_per_request)
        limits = (max_num_seqs, kv_capacity_tokens, self.kv_tokens_per_request)
        if self._limits is None or not _same_limits(self._limits, limits):
            self._limits = limits
            self.knee = prior_knee(max_num_seqs, kv_capacity_tokens, self.kv_tokens_per_request)
        return self.knee


def _same_limits(a: tuple, b: tuple, tolerance: float = 0.01) -> bool:
    for x, y in zip(a, b):
        if (x is None) != (y is None):
            return False
        if x is not None and abs(x - y) > tolerance * max(abs(x), abs(y)):
            return False
    return True


@dataclass(frozen=True)
class Fit:
    knee: float
    confidence: float
    slope_before: float
    slope_after: float
    intercept: float
    r_gain: float
    rise_snr: float
    bins: int


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    resid = y - X @ coef
    return coef, float(np.sum(w * resid ** 2))


def fit_hinge(load: np.ndarray, latency: np.ndarray, n_bins: int = 24, min_bin: int = 3) -> Optional[Fit]:
    """Segmented-regression knee of latency over load; None when the data cannot support one."""
    load = np.asarray(load, dtype=float)
    latency = np.asarray(latency, dtype=float)
    ok = np.isfinite(load) & np.isfinite(latency)
    load, latency = load[ok], latency[ok]
    if load.size < 4 * min_bin:
        return None
    lo, hi = np.percentile(load, 2), np.percentile(load, 98)
    if not hi > lo:
        return None
    edges = np.linspace(lo, hi, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, load, side="right") - 1, 0, n_bins - 1)
    xs, ys, ws = [], [], []
    for b in range(n_bins):
        sel = idx == b
        if sel.sum() >= min_bin:
            xs.append(float(np.median(load[sel])))
            ys.append(float(np.median(latency[sel])))
            ws.append(float(sel.sum()))
    x, y, w = np.array(xs), np.array(ys), np.array(ws)
    if x.size < 6:
        return None
    w = np.sqrt(w)  # dampen heavily sampled bins so the sparse high-load tail still counts
    ones = np.ones_like(x)
    _, sse_lin = _wls(np.column_stack([ones, x]), y, w)
    best = None

    def trial(k: float):
        X = np.column_stack([ones, x, np.maximum(0.0, x - k)])
        coef, sse = _wls(X, y, w)
        return sse, k, coef

    for k in x[1:-2]:
        t = trial(float(k))
        if best is None or t[0] < best[0]:
            best = t
    step = (x[-1] - x[0]) / (x.size - 1)
    for k in np.linspace(best[1] - step, best[1] + step, 41):
        if x[1] <= k <= x[-3]:
            t = trial(float(k))
            if t[0] < best[0]:
                best = t
    sse, k, (a, b1, b2) = best
    below, above = int(np.sum(x <= k)), int(np.sum(x > k))
    coverage = min(1.0, below / 3.0, above / 2.0)
    r_gain = 0.0 if sse_lin <= 0 else max(0.0, 1.0 - sse / sse_lin)
    resid_sd = math.sqrt(sse / max(1.0, float(np.sum(w))))
    rise = b2 * (x[-1] - k)
    rise_snr = rise / (resid_sd + 1e-12) if rise > 0 else 0.0
    steeper = b2 > 0 and (b1 + b2) >= 2.0 * max(b1, 0.0) and (b1 + b2) > 0
    conf = r_gain * min(1.0, rise_snr / 5.0) * coverage if steeper else 0.0
    return Fit(float(k), float(max(0.0, min(1.0, conf))), float(b1), float(b1 + b2), float(a),
               float(r_gain), float(rise_snr), int(x.size))


class KneeEstimator:
    def __init__(self, signal: str = "ttft", prior: Optional[Knee] = None, *, min_observations: int = 60,
                 min_confidence: float = 0.6, min_change: float = 0.10, confirmations: int = 3,
                 max_observations: int = 5000, n_bins: int = 24, fit_range_factor: float = 4.0) -> None:
        if signal not in SIGNALS:
            raise ValueError(f"knee signal {signal!r} is not one of {', '.join(SIGNALS)}")
        if not 0 <= min_confidence <= 1:
            raise ValueError(f"min_confidence must be within 0..1, got {min_confidence}")
        if min_change < 0 or confirmations < 1 or max_observations < 10 or min_observations < 10:
            raise ValueError("min_change >= 0, confirmations >= 1, min/max_observations >= 10 needed")
        self.signal = signal
        self.prior = prior or prior_knee()
        self.min_observations = min_observations
        self.min_confidence = min_confidence
        self.min_change = min_change
        self.confirmations = confirmations
        self.n_bins = n_bins
        self.fit_range_factor = fit_range_factor
        self._obs: deque = deque(maxlen=max_observations)
        self._published: Optional[Knee] = None
        self._pending: deque = deque(maxlen=confirmations)
        self.last_fit: Optional[Fit] = None

    def set_prior(self, prior: Knee) -> None:
        """Update the prior (e.g. replicas' limits became known); a learned knee is kept."""
        self.prior = prior

    def observe(self, load: float, kv_tokens: Optional[float], latency_signal: Optional[float]) -> bool:
        """One (load, kv tokens, latency) pair; returns False (and ignores it) when unusable."""
        if load is None or latency_signal is None:
            return False
        if not (math.isfinite(load) and math.isfinite(latency_signal)) or load < 0 or latency_signal < 0:
            return False
        kv = float(kv_tokens) if kv_tokens is not None and math.isfinite(kv_tokens) else math.nan
        self._obs.append((float(load), kv, float(latency_signal)))
        return True

    @property
    def observations(self) -> int:
        return len(self._obs)

    def _kv_at(self, k: float, arr: np.ndarray) -> Optional[float]:
        sel = np.isfinite(arr[:, 1])
        if sel.sum() < 10:
            return None
        x, kv = arr[sel, 0], arr[sel, 1]
        if np.ptp(x) <= 0:
            return float(np.median(kv))
        slope, icpt = np.polyfit(x, kv, 1)
        return float(max(0.0, slope * k + icpt))

    def _candidate(self) -> Optional[Knee]:
        if len(self._obs) < self.min_observations:
            return None
        arr = np.array(self._obs)
        if self.prior.requests and self.fit_range_factor:
            # deep overload (a queue far past every engine limit) says nothing about where the knee
            # is and would stretch the bins: fit on loads up to fit_range_factor x the prior
            arr = arr[arr[:, 0] <= self.fit_range_factor * self.prior.requests]
            if len(arr) < self.min_observations:
                self.last_fit = None
                return None
        fit = fit_hinge(arr[:, 0], arr[:, 2], n_bins=self.n_bins)
        self.last_fit = fit
        if fit is None or fit.confidence < self.min_confidence:
            return None
        return Knee(fit.knee, self._kv_at(fit.knee, arr), "learned", self.signal, fit.confidence,
                    len(self._obs), f"hinge fit: slope {fit.slope_before:.3g} -> {fit.slope_after:.3g} "
                    f"per request, {fit.bins} bins")

    def estimate(self) -> Knee:
        """The published knee: learned when a fit is confident and confirmed, else the prior."""
        cand = self._candidate()
        pub = self._published
        if cand is None:
            self._pending.clear()
            if pub is not None:
                return replace(pub, observations=len(self._obs))
            return self._prior_answer()
        if pub is not None and abs(cand.requests - pub.requests) < self.min_change * pub.requests:
            self._pending.clear()
            # confirm the published knee; confidence follows the latest fit, the value does not move
            self._published = replace(pub, confidence=cand.confidence, observations=len(self._obs))
            return self._published
        self._pending.append(cand)
        if len(self._pending) < self.confirmations:
            return replace(pub, observations=len(self._obs)) if pub is not None else self._prior_answer()
        values = [c.requests for c in self._pending]
        centre = float(np.median(values))
        if max(abs(v - centre) for v in values) > self.min_change * centre:
            return replace(pub, observations=len(self._obs)) if pub is not None else self._prior_answer()
        self._published = self._pending[-1]
        self._pending.clear()
        return self._published

    def _prior_answer(self) -> Knee:
        n = len(self._obs)
        if n < self.min_observations:
            why = f"{n} of {self.min_observations} observations needed for a fit"
        elif self.last_fit is None:
            why = "load has not varied enough for a fit"
        elif self._pending:
            why = f"fit awaiting confirmation ({len(self._pending)} of {self.confirmations})"
        else:
            why = f"fit confidence {self.last_fit.confidence:.2f} below {self.min_confidence:.2f}"
        return replace(self.prior, observations=n,
                       detail=(self.prior.detail + "; " if self.prior.detail else "") + why)
