"""Spare capacity for deferrable work until the next interactive peak (pure: plain data and `now`).

    spare = pool_spare(SpareInputs(...), now)          # a `Spare` (monitor/model/spare_data.py)
    cluster = cluster_spare({pool: spare, ...})        # the fleet's sums
    answer = earliest_fit(spare.windows, N, H_seconds)  # /api/v1/spare

The algorithm, per pool:
  1. ceiling = knee x (1 - margin): the concurrency the interactive and the deferrable load share
     (the margin keeps the pool off its knee, where latency bends).
  2. The forecast's steps: the path's point at t_k (Unix seconds) stands for the step [t_k, t_k +
     step) (step: the path's spacing; the forecaster labels a slot by its start, as history does),
     its value the load's upper band (95 %). In each step spare_k = floor(max(0, ceiling - upper_k))
     whole requests (rounded down: never promise more).
  3. Now: the step holding `now` (the forecast's first step clipped to start at `now`, or, when the
     forecast starts after `now`, the span from `now` to it, on the first step's band) is also held
     to the load measured now: floor(max(0, ceiling - max(interactive now, upper - deferrable now))).
     The band is of the whole load (history keeps no interactive-only series), so the deferrable
     load running now is taken off it here, not counted twice. Steps that end at or before `now`
     are past and dropped.
  4. Windows: adjacent steps with the same spare merged into {start, end, requests}; spans where
     nothing fits (0) are no window. Over the forecast, at most 7 days.
  5. Per horizon (now, 1h, 6h, 1d): the fewest requests that fit from `now` to `now` + horizon
     ("now": the step holding now); None when the forecast ends before the horizon does, or
     leaves a gap in it (a step with no finite band).
  6. The budget ratio D in [0, 1] (ready for llm-d's `prometheus-query` gate): the fewest spare
     requests over the next `budget_horizon` seconds over the ceiling. It is 0 (fail closed) when
     the data behind it is stale (the pool is stale, its knee or forecast unknown, the forecast
     older than `max_age` or ending before now) or the pool is over its SLO now (a latency target
     over its allowed share: the `slo` capacity limit, monitor/capacity/slo_limit.py); `reason` says so.

`earliest_fit` answers /api/v1/spare: the earliest start from which N requests fit for H seconds
on end (over windows that follow one another without a gap), else "none in the horizon" with the
largest N that fits for H seconds somewhere (0 when no span of H seconds is spare).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from monitor.model.spare_data import SPARE_HORIZONS, WEEK_SECONDS, Spare, SpareWindow

if TYPE_CHECKING:  # numpy is loaded when steps are built, not when the module is
    import numpy as np

EPS = 1e-9


@dataclass(frozen=True)
class SpareInputs:
    """One pool's plain inputs. `timestamps`/`upper`: the interactive load's forecast path and its
    upper band; `fit_timestamp`: when the forecast was fitted (None: no forecast)."""

    knee_requests: Optional[float]
    margin: float
    timestamps: Sequence[float] = ()
    upper: Sequence[float] = ()
    fit_timestamp: Optional[float] = None
    interactive_now: Optional[float] = None
    deferrable_now: Optional[float] = None
    pool_stale: bool = False
    over_slo: bool = False
    max_age: float = 3600.0
    budget_horizon: float = 900.0


def ceiling_of(knee: Optional[float], margin: float) -> Optional[float]:
    if knee is None or not math.isfinite(knee) or knee <= 0:
        return None
    return knee * (1.0 - margin)


def fits(ceiling: float, load: float) -> float:
    """Whole requests that fit beside `load` below `ceiling` (rounded down, never below 0)."""
    return float(max(0, math.floor(ceiling - load + EPS)))


@dataclass(frozen=True)
class Steps:
    """The forecast's steps from `now` on (module docstring, 2 and 3), as arrays: each step's start,
    end and spare requests. Arrays, not objects: a week of 5-minute steps is 2,016 of them per pool
    and cycle."""

    start: np.ndarray
    end: np.ndarray
    requests: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def of(cls, parts: Sequence[SpareWindow]) -> "Steps":
        import numpy as np  # noqa: PLC0415 (the web and CLI floors read windows without loading numpy: tests/app/test_cli_start.py)
        return cls(*(np.array([getattr(w, k) for w in parts], dtype=float) for k in ("start", "end", "requests")))


def steps(inp: SpareInputs, ceiling: float, now: float, until: float = math.inf) -> Steps:
    """The steps from `now` to `until` (clipped), each with its spare."""
    import numpy as np  # noqa: PLC0415
    ts = np.asarray(inp.timestamps, dtype=float)
    up = np.asarray(inp.upper, dtype=float)
    step = ts[1] - ts[0] if len(ts) > 1 else 0.0
    keep = (ts + step > now) & np.isfinite(up) & (ts < until)
    start, end, up = ts[keep], np.minimum(ts[keep] + step, until), up[keep]
    if len(start) and start[0] > now:  # the span from now to the forecast's first step, on its band
        start, end, up = np.r_[now, start], np.r_[min(start[0], until), end], np.r_[up[0], up]
    req = np.maximum(0.0, np.floor(ceiling - up + EPS))
    if len(start):  # the step holding now: from now, held to the load measured now
        start[0] = now
        if inp.interactive_now is not None and math.isfinite(inp.interactive_now):
            deferrable = inp.deferrable_now if inp.deferrable_now is not None and math.isfinite(inp.deferrable_now) else 0.0
            band = up[0] - deferrable
            req[0] = fits(ceiling, max(inp.interactive_now, band))
    return Steps(start, end, req)


def _groups(st: Steps, same_value: bool) -> list[tuple[int, int]]:
    """(first, last) index of each gapless run of steps holding at least 1 request (of one value
    when `same_value`)."""
    import numpy as np  # noqa: PLC0415
    pos = st.requests > 0
    idx = np.flatnonzero(pos)
    if not len(idx):
        return []
    cut = np.abs(st.start[idx][1:] - st.end[idx][:-1]) > EPS  # a gap (a step with none between)
    if same_value:
        cut |= st.requests[idx][1:] != st.requests[idx][:-1]
    heads = np.concatenate(([0], np.flatnonzero(cut) + 1))
    tails = np.concatenate((heads[1:] - 1, [len(idx) - 1]))
    return [(int(idx[h]), int(idx[t])) for h, t in zip(heads, tails)]


def merge(parts: Sequence[SpareWindow] | Steps) -> list[SpareWindow]:
    """Adjacent parts with the same requests made one window; parts with none left out."""
    st = parts if isinstance(parts, Steps) else Steps.of(parts)
    return [SpareWindow(float(st.start[i]), float(st.end[j]), float(st.requests[i])) for i, j in _groups(st, True)]


def runs(windows: Sequence[SpareWindow], least: float = 1.0) -> list[SpareWindow]:
    """Gapless runs of windows that each hold at least `least`, each with the fewest it holds
    throughout (what a batch can count on from its start to its end)."""
    out: list[SpareWindow] = []
    for w in windows:
        if w.requests + EPS < least:
            continue
        last = out[-1] if out else None
        if last is not None and abs(last.end - w.start) < EPS:
            out[-1] = SpareWindow(last.start, w.end, min(last.requests, w.requests))
        else:
            out.append(w)
    return out


def coarse(windows: Sequence[SpareWindow], start: float, width: float, n: int) -> list[SpareWindow]:
    """The windows on a coarser grid: `n` slices of `width` seconds from `start`, each holding the
    fewest requests that fit through it (a slice any part of which has no window holds none), equal
    neighbours merged, empty slices left out. Bounds the count a page or a document carries (a
    week of 5-minute steps can merge into thousands of windows)."""
    slices: list[SpareWindow] = []
    ws = [w for w in windows if w.end > start and w.start < start + n * width]
    for k in range(n):
        a, b = start + k * width, start + (k + 1) * width
        over = [w for w in ws if w.start < b and w.end > a]
        covered = sum(min(w.end, b) - max(w.start, a) for w in over)
        slices.append(SpareWindow(a, b, min(w.requests for w in over) if over and covered >= width - 1e-6 else 0.0))
    return merge(slices)


def horizon_minimum(parts: Sequence[SpareWindow] | Steps, now: float, seconds: float) -> Optional[float]:
    """The fewest requests that fit over [now, now + seconds] ("now": the part holding now); None
    when the parts do not reach that far or leave a gap."""
    import numpy as np  # noqa: PLC0415
    st = parts if isinstance(parts, Steps) else Steps.of(parts)
    if not len(st) or st.start[0] > now + EPS:
        return None
    if seconds <= 0:
        return float(st.requests[0])
    until = now + seconds
    sel = (st.start < until - EPS) & (st.end > now)
    start, end = st.start[sel], st.end[sel]
    if end[-1] < until - EPS or np.any(np.abs(start[1:] - end[:-1]) > EPS):
        return None
    return float(st.requests[sel].min())


def stale_reason(inp: SpareInputs, ceiling: Optional[float], now: float) -> Optional[str]:
    if inp.pool_stale:
        return "stale: the pool's readings are stale"
    if ceiling is None:
        return "stale: the pool's knee is not known"
    if inp.fit_timestamp is None or not len(inp.timestamps):
        return "stale: no forecast of the pool's load"
    if now - inp.fit_timestamp > inp.max_age:
        return f"stale: the forecast is {now - inp.fit_timestamp:.0f} s old (more than {inp.max_age:.0f} s)"
    if float(inp.timestamps[-1]) <= now:
        return "stale: the forecast ends before now"
    return None


def pool_spare(inp: SpareInputs, now: float) -> Spare:
    """The pool's `Spare` (module docstring)."""
    ceiling = ceiling_of(inp.knee_requests, inp.margin)
    spare = partial(Spare, ceiling=ceiling, interactive_requests=inp.interactive_now,
                    deferrable_requests=inp.deferrable_now, timestamp=now)
    why = stale_reason(inp, ceiling, now)
    if why is not None:
        return spare(reason=why)
    assert ceiling is not None  # else stale_reason says so
    parts = steps(inp, ceiling, now, now + WEEK_SECONDS)
    requests = {h: horizon_minimum(parts, now, s) for h, s in SPARE_HORIZONS.items()}
    windows = tuple(merge(parts))
    if inp.over_slo:
        return spare(requests=requests, windows=windows, reason="over SLO: a latency target of the pool is "
                     "over its allowed share now")
    held = horizon_minimum(parts, now, inp.budget_horizon)
    if held is None:
        return spare(requests=requests, windows=windows, reason="stale: the forecast ends within the budget "
                     "horizon")
    ratio = min(1.0, max(0.0, held / ceiling)) if ceiling > 0 else 0.0
    return spare(requests=requests, windows=windows, budget_ratio=ratio,
                 reason=f"{held:g} of {ceiling:g} requests spare over the next {inp.budget_horizon:.0f} s")


@dataclass(frozen=True)
class FitAnswer:
    """/api/v1/spare's answer: `window` the earliest span holding `requests` for `seconds` (None: none
    in the horizon, then `largest` is the most requests that fit for `seconds` somewhere, at `largest_at`)."""

    requests: float
    seconds: float
    window: Optional[SpareWindow] = None
    largest: Optional[float] = None
    largest_at: Optional[SpareWindow] = None
    horizon_end: Optional[float] = None

    def as_dict(self) -> dict:
        if self.window is not None:
            return {"fits": True, "requests": self.requests, "seconds": self.seconds,
                    "window": self.window.as_dict(), "horizon_end": self.horizon_end}
        return {"fits": False, "requests": self.requests, "seconds": self.seconds, "window": None,
                "reason": "none in the horizon", "largest_requests": self.largest,
                "largest_window": self.largest_at.as_dict() if self.largest_at is not None else None,
                "horizon_end": self.horizon_end}


def first_span(windows: Sequence[SpareWindow], requests: float, seconds: float) -> Optional[SpareWindow]:
    """The earliest span of `seconds` over gapless windows that each hold `requests`; its
    `requests` is the fewest the run holds (the run runs on to its `end`)."""
    run: list[SpareWindow] = []
    for w in windows:
        if w.requests + EPS < requests or (run and abs(run[-1].end - w.start) > EPS):
            run = []
        if w.requests + EPS >= requests:
            run.append(w)
            if run[-1].end - run[0].start >= seconds - EPS:
                return SpareWindow(run[0].start, run[0].start + seconds, min(r.requests for r in run))
    return None


def earliest_fit(windows: Sequence[SpareWindow], requests: float, seconds: float) -> FitAnswer:
    end = windows[-1].end if windows else None
    found = first_span(windows, requests, seconds)
    if found is not None:
        return FitAnswer(requests, seconds, window=found, horizon_end=end)
    for n in sorted({w.requests for w in windows}, reverse=True):
        if n >= requests:
            continue
        at = first_span(windows, n, seconds)
        if at is not None:
            return FitAnswer(requests, seconds, largest=n, largest_at=at, horizon_end=end)
    return FitAnswer(requests, seconds, largest=0.0, horizon_end=end)


@dataclass(frozen=True)
class ClusterSpare:
    """The fleet's sums over the pools whose figure is known; `unknown` names the others."""

    requests: dict[str, Optional[float]]
    ceiling: float
    budget_ratio: float
    pools: int
    unknown: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"requests": dict(self.requests), "ceiling_requests": self.ceiling,
                "budget_ratio": self.budget_ratio, "pools": self.pools, "unknown": list(self.unknown)}


def cluster_spare(spares: Mapping[str, Spare]) -> ClusterSpare:
    """Per horizon the sum of the pools' minimums (each pool's own: never more than the fleet holds);
    the budget: the pools' budgeted requests (ratio x ceiling) over their ceilings."""
    known = {k: s for k, s in sorted(spares.items()) if s.ceiling is not None and s.requests}
    ceilings = {k: s.ceiling or 0.0 for k, s in known.items()}  # (each known pool has one)
    unknown = tuple(sorted(k for k in spares if k not in known))
    requests: dict[str, Optional[float]] = {}
    for h in SPARE_HORIZONS:
        vals = [s.requests.get(h) for s in known.values()]
        requests[h] = float(sum(v for v in vals if v is not None)) if known and None not in vals else None
    ceiling = float(sum(ceilings.values()))
    budget = sum(s.budget_ratio * ceilings[k] for k, s in known.items())
    return ClusterSpare(requests, ceiling, budget / ceiling if ceiling > 0 else 0.0, len(known), unknown)
