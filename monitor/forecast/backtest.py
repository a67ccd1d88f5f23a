"""Rolling-origin backtests, skill scores, band calibration and per-series model selection (pure).

`forecast_series(prep, horizon, settings)` is the one entry point the daemon, the CLI and the
benchmark share:
1. every candidate model whose minimum history is met is backtested from rolling origins at the end
   of the history (expanding window, refit at each origin);
2. among the candidates that score no worse than the best seasonal naive on the same folds, the
   earliest (in the configured order) whose MASE is within 10% of their lowest is selected
   (`SeriesForecast.why` says, per model, why it was or was not); but when no candidate's MASE is below `average_below_skill` (1.0), none has shown
   skill over the seasonal naive and the choice would follow noise: the forecast is then the
   equal-weight average of every plain candidate, named `average` (bands calibrated on the
   average's own backtest folds; it has the naives among its members and is not held to their bar);
3. the selected model is fitted on the whole history; if that fit fails or overruns its time box,
   the next model in the fallback order is used (and the failure reported);
4. the 80% / 95% bands are replaced by bands calibrated on backtest residuals (split-conformal
   style: empirical quantiles of (actual - forecast) / sqrt(forecast)), pooled over the selected
   model and every model within 1.5x of its MASE, when enough residuals exist.
When the history is too short for every model, the result is undefined with a reason; never raised.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from monitor.forecast.calendar import Calendar, as_non_working
from monitor.forecast.models import DEFAULT_MODELS, LEVELS, Forecast, combine, get_model
from monitor.forecast.series import DAY, Prepared


@dataclass(frozen=True)
class ForecastSettings:
    models: tuple[str, ...] = DEFAULT_MODELS  # candidates, in fallback order
    folds: int = 2  # rolling origins per backtest
    fold_horizon_seconds: float = DAY  # horizon of each backtest fold (capped at the horizon asked)
    calibration_seconds: float = DAY / 2  # at least this much forecast time in the calibration folds
    max_folds: int = 4
    calibrate: bool = True
    min_calibration_points: int = 24
    # how a fit is run: runner(fn, args) -> fn(*args), or raises (None: inline). The daemon injects a
    # time box (monitor/timebox.py `timeboxed`): an overrunning fit is abandoned and the next model
    # in `models` used. The forecast package itself starts no process.
    runner: Optional[Callable] = field(default=None, compare=False, repr=False)
    # a model later in `models` is selected only when its backtest MASE beats every earlier one by
    # this factor (two folds are a small sample; the order encodes what usually wins)
    selection_tolerance: float = 0.10
    # calibrate the bands on the backtest residuals of every model whose MASE is within this factor
    # of the selected one (1.0: the selected model only). Residuals of the winner alone are
    # optimistic (it was chosen for small errors on those very folds); the runners-up carry the
    # model uncertainty the winner's few folds hide.
    calibration_pool: float = 1.5
    calibration_kind: str = "sqrt"  # how residuals are scaled across levels: sqrt, ratio or diff
    # when no candidate's backtest MASE is below this (1.0: none beats the in-sample one-day
    # seasonal naive), none has shown skill and picking the "best" of two folds picks noise:
    # forecast the equal-weight average of every plain candidate instead (0 turns the rule off)
    average_below_skill: float = 1.0
    # non-working days (monitor/forecast/calendar.py): a holiday is forecast, and backtested, as
    # the non-working day it is; None: every day is the model's own
    calendar: Optional[Calendar] = None

    def __post_init__(self):
        for name in self.models:
            get_model(name)  # raises ValueError naming the unknown model
        if not self.models:
            raise ValueError("forecast settings need at least one model")
        if self.folds < 1:
            raise ValueError(f"folds must be >= 1, got {self.folds}")
        if self.fold_horizon_seconds <= 0:
            raise ValueError("fold_horizon_seconds must be positive")
        if self.calibration_kind not in CALIBRATION_KINDS:
            raise ValueError(f"calibration_kind must be one of {CALIBRATION_KINDS}, "
                             f"got {self.calibration_kind!r}")
        if self.average_below_skill < 0:
            raise ValueError(f"average_below_skill must be >= 0, got {self.average_below_skill}")


# --- scores -------------------------------------------------------------------------------------

def mase_scale(prep: Prepared) -> float:
    """In-sample MAE of the one-day seasonal naive (over pairs where both points were observed);
    the one-step naive when the history is shorter than two days. NaN when it is zero."""
    m = prep.per_day if prep.n > 2 * prep.per_day else 1
    y, ok = prep.values, prep.observed
    if prep.n <= m:
        return math.nan
    pair = ok[m:] & ok[:-m]
    if not pair.any():
        return math.nan
    scale = float(np.mean(np.abs(y[m:] - y[:-m])[pair]))
    tiny = 1e-9 * float(np.mean(np.abs(y[ok]))) if ok.any() else 0.0
    return scale if scale > tiny else math.nan  # exactly periodic (up to rounding): undefined


def score(actual: np.ndarray, fc: Forecast, observed: np.ndarray, scale: float) -> dict:
    """MASE, sMAPE (percent), 80%/95% coverage, 95% band width over the mean actual."""
    ok = observed & np.isfinite(actual)
    if not ok.any():
        return {"mase": None, "smape": None, "coverage80": None, "coverage95": None,
                "width95_ratio": None, "points": 0}
    a, f = actual[ok], fc.mean[ok]
    err = np.abs(f - a)
    denom = np.abs(f) + np.abs(a)
    smape = float(np.mean(np.where(denom > 0, 2 * err / np.where(denom > 0, denom, 1), 0.0)) * 100)
    out = {"mase": float(np.mean(err) / scale) if scale and math.isfinite(scale) else None,
           "smape": smape, "points": int(ok.sum())}
    for lv in LEVELS:
        lo, hi = fc.bands[lv]
        out[f"coverage{int(lv * 100)}"] = float(np.mean((a >= lo[ok]) & (a <= hi[ok])))
    lo, hi = fc.bands[0.95]
    mean_a = float(np.mean(a))
    out["width95_ratio"] = float(np.mean(hi[ok] - lo[ok]) / mean_a) if mean_a > 0 else None
    return out


# --- rolling origin -----------------------------------------------------------------------------

@dataclass
class Fold:
    origin: int  # index of the first forecast point
    forecast: Forecast
    actual: np.ndarray
    observed: np.ndarray


def _fit_forecast(model_name: str, prep: Prepared, h: int) -> Forecast:
    return get_model(model_name).fit(prep).forecast(h)


def run_fit(model_name: str, prep: Prepared, h: int, runner: Optional[Callable] = None,
            calendar: Optional[Calendar] = None) -> Forecast:
    args = (model_name, prep, h)
    fc = runner(_fit_forecast, args) if runner is not None else _fit_forecast(*args)
    return as_non_working(prep, fc, calendar) if calendar is not None else fc


def origins_for(n: int, horizon: int, folds: int) -> list[int]:
    """Expanding-window origins: the last `folds` windows of `horizon` points, oldest first."""
    return [n - k * horizon for k in range(folds, 0, -1) if n - k * horizon > 0]


def rolling_origin(prep: Prepared, model_name: str, horizon: int, origins: list[int],
                   runner: Optional[Callable] = None, calendar: Optional[Calendar] = None
                   ) -> tuple[list[Fold], list[str]]:
    """Refit at every origin on everything before it, forecast `horizon` points (cut at the end)."""
    model = get_model(model_name)
    folds, errors = [], []
    for o in origins:
        train = prep.head(o)
        h = min(horizon, prep.n - o)
        if h <= 0:
            continue
        if train.n < model.min_history(train):
            continue
        try:
            fc = run_fit(model_name, train, h, runner, calendar)
        except Exception as exc:  # a failed fold is reported and skipped, never fatal
            errors.append(f"origin {o}: {type(exc).__name__}: {exc}")
            continue
        folds.append(Fold(o, fc, prep.values[o:o + h], prep.observed[o:o + h]))
    return folds, errors


def pooled_score(folds: list[Fold], scale: float) -> dict:
    if not folds:
        return {}
    actual = np.concatenate([f.actual for f in folds])
    observed = np.concatenate([f.observed for f in folds])
    mean = np.concatenate([f.forecast.mean for f in folds])
    bands = {lv: (np.concatenate([f.forecast.bands[lv][0] for f in folds]),
                  np.concatenate([f.forecast.bands[lv][1] for f in folds])) for lv in LEVELS}
    out = score(actual, Forecast(mean, bands), observed, scale)
    out["folds"] = len(folds)
    return out


# --- calibration --------------------------------------------------------------------------------

@dataclass
class Calibration:
    kind: str  # "ratio" (a / f), "sqrt" ((a - f) / sqrt(f)) or "diff" (a - f)
    quantiles: dict[float, tuple[float, float]]  # level -> (lower, upper) of the scaled residual
    points: int


CALIBRATION_KINDS = ("sqrt", "ratio", "diff")


def _scale(mean: np.ndarray, kind: str) -> np.ndarray:
    if kind == "ratio":
        return mean
    if kind == "sqrt":
        return np.sqrt(mean)
    return np.ones_like(mean)


def calibrate(folds: list[Fold], min_points: int = 24, kind: str = "sqrt") -> Optional[Calibration]:
    """Empirical quantiles of backtest residuals, scaled so they transfer across levels:
    `sqrt` divides a - f by sqrt(f) (variance proportional to the level, as for counts), `ratio`
    divides by f, `diff` does not scale. Falls back to `diff` when a forecast is not positive."""
    if kind not in CALIBRATION_KINDS:
        raise ValueError(f"calibration kind must be one of {CALIBRATION_KINDS}, got {kind!r}")
    actual = np.concatenate([f.actual for f in folds]) if folds else np.array([])
    mean = np.concatenate([f.forecast.mean for f in folds]) if folds else np.array([])
    ok = np.concatenate([f.observed for f in folds]) if folds else np.array([], bool)
    if ok.sum() < min_points:
        return None
    a, f = actual[ok], mean[ok]
    n = len(a)
    if not np.all(f > 0):
        kind = "diff"
    r = (a / f) if kind == "ratio" else (a - f) / _scale(f, kind)
    qs = {}
    for lv in LEVELS:
        # split-conformal finite-sample correction on each tail
        lo_p = max(0.0, math.floor((n + 1) * (1 - lv) / 2) / n)
        hi_p = min(1.0, math.ceil((n + 1) * (1 - (1 - lv) / 2)) / n)
        qs[lv] = (float(np.quantile(r, lo_p)), float(np.quantile(r, hi_p)))
    return Calibration(kind, qs, n)


def apply_calibration(fc: Forecast, cal: Calibration) -> Forecast:
    bands = {}
    m = np.maximum(fc.mean, 0.0)
    for lv in LEVELS:
        qlo, qhi = cal.quantiles[lv]
        if cal.kind == "ratio":
            lo, hi = m * qlo, m * qhi
        else:
            sc = _scale(m, cal.kind)
            lo, hi = m + qlo * sc, m + qhi * sc
        bands[lv] = (np.minimum(np.maximum(lo, 0.0), fc.mean), np.maximum(hi, fc.mean))
    return Forecast(fc.mean, bands, fc.model)


# the seasonal naives: a selected model must score at least as well as the best of them
NAIVE_MODELS = ("snaive_day", "snaive_week", "snaive_week_level")


def naive_bar(skill: dict[str, dict]) -> Optional[tuple[str, float]]:
    """(model, MASE) of the best seasonal naive backtested on these folds, or None."""
    naive = [(skill[m]["mase"], m) for m in NAIVE_MODELS if skill.get(m, {}).get("mase") is not None]
    return (min(naive)[1], min(naive)[0]) if naive else None


def rank_models(skill: dict[str, dict], order: list[str], tolerance: float) -> list[str]:
    """Models by preference: among the models that score no worse than the best seasonal naive
    on the same folds, the earliest in `order` whose MASE is within (1 + tolerance) of their best
    comes first; then the rest by MASE. Models without a MASE go last, in order."""
    with_mase = [m for m in order if skill.get(m, {}).get("mase") is not None]
    without = [m for m in order if m not in with_mase]
    if not with_mase:
        return without
    bar = naive_bar(skill)
    eligible = [m for m in with_mase if bar is None or m in NAIVE_MODELS or skill[m]["mase"] <= bar[1]]
    best = min(skill[m]["mase"] for m in eligible)
    first = next(m for m in eligible if skill[m]["mase"] <= best * (1 + tolerance))
    rest = sorted((m for m in with_mase if m != first), key=lambda m: skill[m]["mase"])
    return [first] + rest + without


def selection_reasons(skill: dict[str, dict], order: list[str], tolerance: float,
                      chosen: Optional[str]) -> dict[str, str]:
    """One line per backtested model: why it was or was not selected (`headroom backtest` prints it)."""
    bar = naive_bar(skill)
    scored = {m: skill[m]["mase"] for m in order if skill.get(m, {}).get("mase") is not None}
    eligible = {m: v for m, v in scored.items() if bar is None or m in NAIVE_MODELS or v <= bar[1]}
    best = min(eligible.values()) if eligible else None
    out = {}
    for m in order:
        v = scored.get(m)
        if m == chosen:
            out[m] = (f"selected: MASE {v:.3f}, the earliest within {tolerance:.0%} of the best ({best:.3f})"
                      if v is not None and best is not None else "selected")
        elif v is None:
            out[m] = "no backtest score (history too short for its folds, or every fold failed)"
        elif m not in eligible:
            out[m] = f"not selected: MASE {v:.3f} is worse than the seasonal naive {bar[0]} ({bar[1]:.3f})"
        elif best is not None and v > best * (1 + tolerance):
            out[m] = f"not selected: MASE {v:.3f}, more than {tolerance:.0%} above the best ({best:.3f})"
        else:
            out[m] = f"not selected: MASE {v:.3f} is within {tolerance:.0%} of the best, but later in the order"
    return out


# --- selection + final forecast -----------------------------------------------------------------

@dataclass
class SeriesForecast:
    defined: bool
    reason: str = ""
    model: str = ""
    selected_by: str = ""  # "backtest" or "fallback"
    forecast: Optional[Forecast] = None
    skill: dict[str, dict] = field(default_factory=dict)  # model -> pooled backtest scores
    errors: dict[str, list[str]] = field(default_factory=dict)  # model -> failures / time-outs
    calibration: Optional[Calibration] = None
    fit_seconds: float = 0.0  # final fit + forecast, wall time
    backtest_seconds: float = 0.0
    fit_cpu_seconds: float = 0.0  # the same in process CPU time (inline fits only)
    backtest_cpu_seconds: float = 0.0
    history_points: int = 0
    why: dict[str, str] = field(default_factory=dict)  # model -> why it was or was not selected


AVERAGE = "average"  # the model name of the no-skill average (see ForecastSettings.average_below_skill)


def average_folds(members, fold_sets: dict[str, list[Fold]], name: str) -> Optional[list[Fold]]:
    """Backtest folds of the equal-weight average of `members`, averaged from their folds (no
    refits), when every member was backtested at the same origins; None otherwise."""
    if not members or any(m not in fold_sets for m in members):
        return None
    sets = [fold_sets[m] for m in members]
    if len({tuple(f.origin for f in fs) for fs in sets}) != 1:
        return None
    return [Fold(group[0].origin, combine([f.forecast for f in group], name), group[0].actual,
                 group[0].observed) for group in zip(*sets)]


def combined_folds(name: str, fold_sets: dict[str, list[Fold]]) -> Optional[list[Fold]]:
    """A combination's backtest folds averaged from its members' folds (no refits); None when a
    member is missing or was backtested elsewhere (then it is backtested itself)."""
    return average_folds(getattr(get_model(name), "members", None), fold_sets, name)


def no_skill_members(skill: dict[str, dict], order, threshold: float) -> list[str]:
    """The plain (non-combination) backtested models of `order` to average when none of the
    backtested models reached a MASE below `threshold`; [] when one did, the rule is off
    (threshold 0) or fewer than two could be averaged."""
    scored = [m for m in skill if skill[m].get("mase") is not None]
    if threshold <= 0 or not scored or min(skill[m]["mase"] for m in scored) < threshold:
        return []
    members = [m for m in order if m in scored and not hasattr(get_model(m), "members")]
    return members if len(members) >= 2 else []


def members_last(names) -> list[str]:
    """The models in the given order, combinations moved after every plain model, so that
    `model_folds` can average a combination's folds from its members'."""
    return sorted(names, key=lambda m: hasattr(get_model(m), "members"))


def model_folds(prep: Prepared, name: str, done: dict[str, list[Fold]], horizon: int, origins: list[int],
                runner: Optional[Callable] = None, calendar: Optional[Calendar] = None
                ) -> tuple[list[Fold], list[str]]:
    """A model's backtest folds: averaged from its members' folds in `done` when it is a
    combination whose members were backtested at the same origins, else refitted per origin."""
    folds = combined_folds(name, done)
    if folds is not None:
        return folds, []
    return rolling_origin(prep, name, horizon, origins, runner, calendar)


def forecast_series(prep: Prepared, horizon: int, settings: ForecastSettings = ForecastSettings()
                    ) -> SeriesForecast:
    if horizon < 1:
        raise ValueError(f"horizon must be at least one point, got {horizon}")
    eligible = [m for m in settings.models if prep.n >= get_model(m).min_history(prep)]
    if not eligible:
        need = min(get_model(m).min_history(prep) for m in settings.models)
        return SeriesForecast(False, reason=(
            f"history too short: {prep.n} points ({prep.n * prep.step / 3600:.1f} h), the least "
            f"demanding model needs {need} ({need * prep.step / 3600:.1f} h)"), history_points=prep.n)
    fold_h = max(1, min(horizon, int(round(settings.fold_horizon_seconds / prep.step))))
    n_folds = max(settings.folds, math.ceil(settings.calibration_seconds / (fold_h * prep.step)))
    n_folds = min(n_folds, settings.max_folds)
    origins = origins_for(prep.n, fold_h, n_folds)
    scale = mase_scale(prep.head(origins[0])) if origins else math.nan
    if not math.isfinite(scale):
        scale = mase_scale(prep)
    result = SeriesForecast(True, history_points=prep.n)
    fold_sets: dict[str, list[Fold]] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for name in members_last(eligible):
        folds, errors = model_folds(prep, name, fold_sets, fold_h, origins, settings.runner, settings.calendar)
        if errors:
            result.errors.setdefault(name, []).extend(errors)
        if folds:
            fold_sets[name] = folds
            result.skill[name] = pooled_score(folds, scale)
    result.backtest_seconds = time.perf_counter() - t0
    result.backtest_cpu_seconds = time.process_time() - c0

    scored = rank_models(result.skill, [m for m in settings.models if m in fold_sets],
                         settings.selection_tolerance)
    order = scored + [m for m in eligible if m not in scored]
    t1, c1 = time.perf_counter(), time.process_time()
    members = no_skill_members(result.skill, settings.models, settings.average_below_skill)
    if members and _average(prep, horizon, members, fold_sets, scale, settings, result):
        order = []  # the average stands; selection does not run
    for name in order:
        try:
            fc = run_fit(name, prep, horizon, settings.runner, settings.calendar)
        except Exception as exc:
            result.errors.setdefault(name, []).append(f"final fit: {type(exc).__name__}: {exc}")
            continue
        result.model = name
        result.selected_by = "backtest" if name == (scored[0] if scored else None) else "fallback"
        if settings.calibrate and name in fold_sets:
            pool = [name]
            base = result.skill[name].get("mase")
            if base is not None and settings.calibration_pool > 1.0:
                pool += [m for m in fold_sets if m != name and result.skill[m].get("mase") is not None
                         and result.skill[m]["mase"] <= base * settings.calibration_pool]
            cal = calibrate([f for m in pool for f in fold_sets[m]], settings.min_calibration_points,
                            settings.calibration_kind)
            if cal is not None:
                fc = apply_calibration(fc, cal)
                result.calibration = cal
        fc.model = name
        result.forecast = fc
        break
    result.fit_seconds = time.perf_counter() - t1
    result.fit_cpu_seconds = time.process_time() - c1
    result.why = selection_reasons(result.skill, [m for m in settings.models if m in result.skill],
                                   settings.selection_tolerance, result.model)
    if result.model == AVERAGE:
        result.why[AVERAGE] = f"selected: {result.selected_by} (no candidate reached MASE {settings.average_below_skill:g})"
    if result.forecast is None:
        result.defined = False
        result.reason = "every model failed: " + "; ".join(
            f"{k}: {v[-1]}" for k, v in result.errors.items())
    return result


def _average(prep: Prepared, horizon: int, members: list[str], fold_sets: dict[str, list[Fold]],
             scale: float, settings: ForecastSettings, result: SeriesForecast) -> bool:
    """Forecast the equal-weight average of `members` (each refitted on the whole history), with
    bands calibrated on the average's own backtest folds. False when fewer than two members could
    be fitted (then the usual selection runs)."""
    fits = {}
    for name in members:
        try:
            fits[name] = run_fit(name, prep, horizon, settings.runner, settings.calendar)
        except Exception as exc:
            result.errors.setdefault(name, []).append(f"final fit: {type(exc).__name__}: {exc}")
    if len(fits) < 2:
        return False
    folds = average_folds(list(fits), fold_sets, AVERAGE)
    fc = combine(list(fits.values()), AVERAGE)
    if folds:
        # not held to the naive bar: it is the hedge of last resort, not a model picked for its
        # score, and it has the naive among its members (on the ServeGen task the bar cost 0.06 MASE)
        result.skill[AVERAGE] = pooled_score(folds, scale)
        cal = calibrate(folds, settings.min_calibration_points, settings.calibration_kind) \
            if settings.calibrate else None
        if cal is not None:
            fc = apply_calibration(fc, cal)
            result.calibration = cal
    result.model = AVERAGE
    result.selected_by = "no-skill rule: " + "+".join(fits)
    result.forecast = fc
    return True
