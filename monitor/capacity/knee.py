"""The utilisation knee: the per-replica concurrency where latency turns up, learned live.

`KneeEstimator` is stateful but pure (no I/O, no clock): feed it one (load, kv_tokens, latency)
observation per replica and cycle with `observe`, ask `estimate()` each cycle.

Fit (segmented regression, "hockey stick"; monitor/capacity/knee_fit.py):
  1. keep the last `max_observations` observations (older behaviour ages out); observations above
     `fit_range_factor` (4) x the prior's knee are left out (a queue far past every engine limit says
     nothing about where latency turned up);
  2. bin them by load into equal-COUNT bins (n / 3 of them, 6..24) and take each bin's median
     latency, weighted by sqrt(count): robust to outliers, and every bin has data;
  3. for each candidate knee k between bin centres fit  y = a + b1 x + b2 max(0, x - k)  by weighted
     least squares; keep the k with the smallest error, then refine on a finer grid around it;
  4. confidence (0..1) = agreement x coverage, 0 unless latency gets at least twice as steep past
     the knee. Agreement: the share of 32 bootstrap resamples of the observations (drawn with
     replacement; the generator seeded from their number, so the same data give the same answer)
     whose own hinge is also twice as steep and lands within 15 % of k. Coverage: bins on both sides
     (3 below, 2 above) and at least 5 observations past the knee nearer the hinge than the straight
     line (`Fit.support`): a knee the load barely reached is not claimed. The confidence says how
     reproducibly the data place the knee.

Why not the earlier fit (24 equal-width bins, at least 3 observations each, confidence = share of
the straight line's error the hinge removes x rise / 5 residual spreads x coverage, 60
observations): on the real vLLM CPU engine behind LiteLLM with 20 closed-loop agent sessions (tool
waits between calls), direct mode at the default 15 s reached 60 observations after 17 min and every
fit then scored 0.00-0.56. That run's observations were not kept; its shape was replayed through the
simulator (benchmarks/knee_learn_bench.py: 8 slots, 3,072 KV tokens, a KV knee of 6.46 by
construction, 20 sessions, 8 s tool waits) and on hand-made series (tests/core/test_knee_plausible.py).
The engine's load is bursty: the 30 s averages sit mostly at 4-5 and pass the knee in 3-9 % of
the windows. Three causes, in order of weight:
  - the bar came late: 60 observations are 15 min at 15 s with one replica, before any fit;
  - the score swung: equal-width bins over that range (24 of about 0.1-0.2 requests) drop the thin
    tail past the knee (fewer than 3 observations a bin) and leave medians of 3-4 observations, which
    the error-share score reads as "no knee" one cycle and as a knee the next: the old fit's
    confidence on the simulated trials ranged 0.00-0.97 within each 25-minute run, so three
    confident fits in a row (the confirmations) came at 16-25 min (median 16.5);
  - the hinge can sit no higher than the third bin from the top, so with the tail dropped the knee
    comes out low, and the coverage term (2 bins past the knee) is met by construction and says
    nothing about how many observations show the rise.
Left as they were: the overlapping observations (each 30 s window shares half with the one before:
successive observations are alike, so 30 of them hold about 15 windows' worth, which the bootstrap
does not discount) and the queue-time signal, zero below the knee most of the time (a hinge fits a
flat zero well; the hand-made series are zero in 80 % of the windows under the knee and are learned).
Equal-count bins keep the tail in its own bins; `Fit.support` asks for 5 observations that show the
rise; the bootstrap scores what the confidence should say (would the same process give this knee
again?) and is not lowered by noise that averages out. `min_observations` is 30: at 15 s with one
replica the first fit comes after 7.5 min. Measured (the benchmark, 8 trials): the knee learned in
8 of 8, within 10 min in 6 (median 8.5 min) against 0 of 8 within 10 min (median 16.5) before; the
knee both learn is 0.72-0.92 of the construction's 6.46, because a 30 s average of bursty load
queues before it reaches the per-instant limit (the knee is where the load as averaged turns
latency up; the headroom it feeds is counted on the same averages).

Plausibility. A learned knee is compared with the engine's limits (the prior: max_num_seqs and KV
capacity / KV tokens per request) and with the load it was learned under. It is contradicted when
at least half of the observations at load >= 1.5 x the knee (at least 5 of them) lie nearer the
straight line below the knee than the hinge past it (`Fit.excess` < 0.5: the load went well past
the knee and latency did not turn up); when the knee is under half the prior's limit, a quarter of
those at >= 2 x the knee is enough, and a fit learned under load that never reached 2 x it (fewer than 5
observations there) is unconfirmed and refused too: on a starved front end (issue 37's trials: the
engine's API server and LiteLLM sharing busy cores) the engine's own latency rises at 1.7-2.2
requests on an engine that runs 5-8, and nothing past the knee says whether the engine or the CPU
turned it up; the caller's view (`limit="slo"`) carries that case. A knee in a gap of the load (the
nearest observations under and over it further apart than the knee itself: an idle pool, then a
burst of 5 on a 4-slot engine, put the hinge at 0.18) is refused as well: the data place it anywhere
in the gap. A contradicted fit is not published: the prior (or the knee published before)
answers, `implausible` holds the reason, and the prior's `detail` says "implausible: ..."
(headroom_knee_implausible, alert HeadroomKneeImplausible). A published knee is checked again each
cycle against the last `min_observations` observations: contradicted, its confidence falls by the
contradicting share, and once under `min_confidence` it is withdrawn (the prior answers, flagged
implausible) instead of being held by the hysteresis below for ever. A knee over 1.5x the limit
learned from load that (nearly) never went under the limit is refused too: every observation was
past the engine's limit, so none shows where latency turned up (a closed loop overloading the engine
throughout: with the benchmark's 3 s tool waits the old fit published 13.3 on a 6.46 engine); this one is
asked of a fit's own observations only, not of a published knee's later ones. The flag clears with a
plausible confident fit, or after `min_observations` further observations without a refused one.

Until a fit is confident the estimator answers with the prior from the engine's limits
(`prior_knee`: max_num_seqs, or KV capacity / mean KV tokens per request, whichever is smaller),
labelled source="prior". `SteadyPrior` keeps that prior from jumping between cycles: it changes
only when the limits do (the KV tokens per request, a median of measurements, with hysteresis). The
published knee moves only when `confirmations` consecutive confident fits agree with each other and
all differ from the published knee by at least `min_change` (relative): noise does not move it, a
real change does after a few cycles.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from monitor.capacity.knee_fit import Fit, fit_hinge
from monitor.capacity.settings import KNEE_SIGNALS


@dataclass(frozen=True)
class Knee:
    requests: Optional[float]  # concurrent requests (active + queued) per replica at the knee
    kv_tokens: Optional[float]  # live KV tokens per replica at the knee
    source: str  # "learned" or "prior"
    signal: str  # latency signal the knee was found on ("limits" for a prior)
    confidence: float = 0.0
    observations: int = 0
    detail: str = ""  # why a prior, or the fit's numbers
    implausible: str = ""  # why the last learned knee was refused or withdrawn ("" when it was not)


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
    which = min(limits, key=limits.__getitem__)
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


def _near(knee: Knee, published: Knee, change: float) -> bool:
    """Whether a learned knee is within `change` (relative) of the published one (learned knees have a value)."""
    assert knee.requests is not None and published.requests is not None
    return abs(knee.requests - published.requests) < change * published.requests


def _same_limits(a: tuple, b: tuple, tolerance: float = 0.01) -> bool:
    for x, y in zip(a, b):
        if (x is None) != (y is None):
            return False
        if x is not None and abs(x - y) > tolerance * max(abs(x), abs(y)):
            return False
    return True


CONTRADICTION_LOAD, CONTRADICTION_SHARE = 1.5, 0.5  # half the observations at >= 1.5 x the knee calm
CONTRADICTION_MIN = 5  # ... of at least this many
FAR_BELOW = 0.5  # a knee under half the prior's limit ...
FAR_LOAD, FAR_SHARE = 2.0, 0.25  # ... is refused when a quarter of those at >= 2 x the knee are calm
FAR_ABOVE = 1.5  # a knee over 1.5 x the limit, from load that never went under the limit, is refused


def _gap_around(knee: float, loads: np.ndarray) -> Optional[tuple[float, float]]:
    """(the nearest load under the knee, the nearest over it) when the empty stretch between them is
    wider than the knee itself (an idle pool then a burst: 0.1 then 5 requests), else None."""
    below, above = loads[loads <= knee], loads[loads > knee]
    if not len(below) or not len(above):
        return None
    lo, hi = float(below.max()), float(above.min())
    return (lo, hi) if hi - lo > knee else None


class KneeEstimator:
    def __init__(self, signal: str = "ttft", prior: Optional[Knee] = None, *, min_observations: int = 30,
                 min_confidence: float = 0.6, min_change: float = 0.10, confirmations: int = 3,
                 max_observations: int = 5000, n_bins: Optional[int] = None, fit_range_factor: float = 4.0) -> None:
        if signal not in KNEE_SIGNALS:
            raise ValueError(f"knee signal {signal!r} is not one of {', '.join(KNEE_SIGNALS)}")
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
        self._published_fit: Optional[Fit] = None
        self._pending: deque = deque(maxlen=confirmations)
        self.last_fit: Optional[Fit] = None
        self.implausible = ""  # why the last learned knee was refused or withdrawn
        self._implausible_at = 0  # observations seen when it was
        self._seen = 0  # observations accepted, ever
        self._fitted_at = -1  # self._seen at the last fit

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
        self._seen += 1
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

    def _window(self) -> np.ndarray:
        arr = np.array(self._obs) if self._obs else np.empty((0, 3))
        if self.prior.requests and self.fit_range_factor:
            # deep overload (a queue far past every engine limit) says nothing about where the knee
            # is and would stretch the bins: fit on loads up to fit_range_factor x the prior
            arr = arr[arr[:, 0] <= self.fit_range_factor * self.prior.requests]
        return arr

    def _calm(self, fit: Fit, arr: np.ndarray) -> tuple[float, float, np.ndarray]:
        """(the bar, the share of the observations well past the knee where latency did not turn up,
        those observations); the bar is lower and "well past" further for a knee far under the
        engine's limit."""
        limit = self.prior.requests
        far = bool(limit and fit.knee < FAR_BELOW * limit)
        factor, bar = (FAR_LOAD, FAR_SHARE) if far else (CONTRADICTION_LOAD, CONTRADICTION_SHARE)
        high = arr[arr[:, 0] >= factor * fit.knee]
        if len(high) < CONTRADICTION_MIN:
            return bar, 0.0, high
        return bar, float(np.mean(fit.excess(high[:, 0], high[:, 2]) < 0.5)), high

    def contradiction(self, fit: Fit, arr: np.ndarray, learned_from: bool = True) -> str:
        """Why `fit`'s knee is implausible against the limits and the observations `arr`, or "".
        `learned_from`: `arr` are the observations the fit was made on (not later ones: a sustained
        overload after a knee was learned does not make it a knee seen only past the limit)."""
        limit = self.prior.requests
        if learned_from and limit and fit.knee > FAR_ABOVE * limit and np.sum(arr[:, 0] <= limit) < CONTRADICTION_MIN:
            return (f"implausible: knee {fit.knee:.3g}, {fit.knee / limit:.2f}x the engine's limit {limit:.3g}, "
                    f"learned only from load past that limit (from {arr[:, 0].min():.3g})")
        gap = _gap_around(fit.knee, arr[:, 0]) if learned_from else None
        if gap is not None:
            return (f"implausible: knee {fit.knee:.3g} lies in a gap of the load (no observation between "
                    f"{gap[0]:.3g} and {gap[1]:.3g}): the load jumped past it, so it could lie anywhere there")
        bar, calm, high = self._calm(fit, arr)
        if learned_from and limit and fit.knee < FAR_BELOW * limit and len(high) < CONTRADICTION_MIN:
            return (f"implausible: knee {fit.knee:.3g}, {fit.knee / limit:.2f}x the engine's limit {limit:.3g}, "
                    f"unconfirmed: fewer than {CONTRADICTION_MIN} observations at {FAR_LOAD:g}x it or more "
                    f"(load at most {arr[:, 0].max():.3g})")
        if not len(high) or calm < bar:
            return ""
        k, limit = fit.knee, self.prior.requests
        against = f", {k / limit:.2f}x the engine's limit {limit:.3g}" if limit else ""
        return (f"implausible: knee {k:.3g}{against}, but {calm:.0%} of {len(high)} observations at load "
                f"{high[:, 0].min():.3g}-{high[:, 0].max():.3g} show latency not turning up")

    def _flag(self, why: str) -> None:
        self.implausible, self._implausible_at = why, self._seen

    def _candidate(self) -> Optional[Knee]:
        if len(self._obs) < self.min_observations:
            return None
        arr = self._window()
        if len(arr) < self.min_observations:
            self.last_fit, self._fitted_at = None, -1
            return None
        if self._fitted_at != self._seen:  # no new observation (a stale pool): the same fit
            self.last_fit, self._fitted_at = fit_hinge(arr[:, 0], arr[:, 2], n_bins=self.n_bins), self._seen
        fit = self.last_fit
        if fit is None or fit.confidence < self.min_confidence:
            return None
        why = self.contradiction(fit, arr)
        if why:
            self._flag(why)
            return None
        self.implausible = ""
        return Knee(fit.knee, self._kv_at(fit.knee, arr), "learned", self.signal, fit.confidence,
                    len(self._obs), f"hinge fit: slope {fit.slope_before:.3g} -> {fit.slope_after:.3g} "
                    f"per request, {fit.bins} bins, {fit.agreement:.0%} of resamples agree")

    def _recheck_published(self) -> None:
        """A published knee contradicted by the recent observations loses confidence; under the bar
        it is withdrawn (the prior answers, flagged implausible)."""
        pub, fit = self._published, self._published_fit
        if pub is None or fit is None:
            return
        recent = np.array(list(self._obs)[-self.min_observations:])
        why = self.contradiction(fit, recent, learned_from=False)
        if not why:
            return
        _, calm, _ = self._calm(fit, recent)
        conf = pub.confidence * (1.0 - calm)
        if conf >= self.min_confidence:
            self._published = replace(pub, confidence=conf)
            return
        self._flag(f"{why}; the learned knee {pub.requests:.3g} was withdrawn")
        self._published = self._published_fit = None

    def estimate(self) -> Knee:
        """The published knee: learned when a fit is confident, plausible and confirmed, else the prior."""
        if self.implausible and self._seen - self._implausible_at >= self.min_observations:
            self.implausible = ""  # a window of observations without a refused fit
        self._recheck_published()
        cand = self._candidate()
        pub = self._published
        if cand is None:
            self._pending.clear()
            if pub is not None:
                return self._answer(replace(pub, observations=len(self._obs)))
            return self._prior_answer()
        if pub is not None and _near(cand, pub, self.min_change):
            self._pending.clear()
            # confirm the published knee; confidence follows the latest fit, the value does not move
            self._published = replace(pub, confidence=cand.confidence, observations=len(self._obs))
            return self._answer(self._published)
        self._pending.append((cand, self.last_fit))
        if len(self._pending) < self.confirmations:
            return self._answer(replace(pub, observations=len(self._obs))) if pub is not None else self._prior_answer()
        values = [c.requests for c, _ in self._pending]
        centre = float(np.median(values))
        if max(abs(v - centre) for v in values) > self.min_change * centre:
            return self._answer(replace(pub, observations=len(self._obs))) if pub is not None else self._prior_answer()
        self._published, self._published_fit = self._pending[-1]
        self._pending.clear()
        return self._answer(self._published)

    def _answer(self, knee: Knee) -> Knee:
        """The published learned knee, saying so when a later fit was refused beside it."""
        detail = f"{knee.detail}; a later fit was refused: {self.implausible}" if self.implausible else knee.detail
        return replace(knee, implausible=self.implausible, detail=detail)

    def _prior_answer(self) -> Knee:
        n = len(self._obs)
        if self.implausible:
            why = self.implausible
        elif n < self.min_observations:
            why = f"{n} of {self.min_observations} observations needed for a fit"
        elif self.last_fit is None:
            why = "load has not varied enough for a fit"
        elif self._pending:
            why = f"fit awaiting confirmation ({len(self._pending)} of {self.confirmations})"
        else:
            why = f"fit confidence {self.last_fit.confidence:.2f} below {self.min_confidence:.2f}"
        return replace(self.prior, observations=n, implausible=self.implausible,
                       detail=(self.prior.detail + "; " if self.prior.detail else "") + why)
