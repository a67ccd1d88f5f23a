"""Rolling-origin backtests and the per-series forecast (pure).

`forecast_series(prep, horizon, settings)` is the one entry point the daemon, the digest and the
benchmark share (`headroom backtest` runs its first two steps, `backtest_models` and `select`, on the
origins it is asked for):
1. every candidate model whose minimum history is met is backtested from rolling origins at the end
   of the history (expanding window, refit at each origin; a combination's folds are averaged from
   its members' folds, no refits): `backtest_models`;
2. selection (monitor/forecast/selection.py `select`): among the candidates that score no worse
   than the best seasonal naive on the same folds, the earliest (in the configured order) whose
   MASE is within 10% of their lowest (`SeriesForecast.why` says, per model, why it was or was
   not); but when no candidate's MASE is below `average_below_skill` (1.0), none has shown skill
   over the seasonal naive and the choice would follow noise: the forecast is then the
   equal-weight average of every plain candidate, named `average` (bands calibrated on the
   average's own backtest folds; it has the naives among its members and is not held to their bar);
3. the selected model is fitted on the whole history; if that fit fails or overruns its time box,
   the next model in the fallback order is used (and the failure reported);
4. the 80% / 95% bands are replaced by bands calibrated on backtest residuals (split-conformal
   style, monitor/forecast/scores.py: empirical quantiles of (actual - forecast) / sqrt(forecast)),
   pooled over the selected model and every model within 1.5x of its MASE, when enough residuals exist.
When the history is too short for every model, the result is undefined with a reason; never raised.
Scores, calibration and selection are re-exported here for the callers that import them from this
module.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from monitor.forecast.calendar import Calendar, as_non_working
from monitor.forecast.models import DEFAULT_MODELS, Forecast, combine, get_model
from monitor.forecast.scores import (  # noqa: F401
    CALIBRATION_KINDS,
    Calibration,
    Fold,
    apply_calibration,
    calibrate,
    mase_scale,
    pooled_score,
    score,
)
from monitor.forecast.selection import (  # noqa: F401
    AVERAGE,
    NAIVE_MODELS,
    Selection,
    average_folds,
    combined_folds,
    members_last,
    naive_bar,
    no_skill_members,
    rank_models,
    select,
    selection_reasons,
)
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
    # time box (monitor/kit/timebox.py `FitPool`): an overrunning fit is abandoned and the next model
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


# --- rolling origin -----------------------------------------------------------------------------

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
        except Exception as exc:  # noqa: BLE001 - a failed fold is reported and skipped, never fatal
            errors.append(f"origin {o}: {type(exc).__name__}: {exc}")
            continue
        folds.append(Fold(o, fc, prep.values[o:o + h], prep.observed[o:o + h]))
    return folds, errors


def model_folds(prep: Prepared, name: str, done: dict[str, list[Fold]], horizon: int, origins: list[int],
                runner: Optional[Callable] = None, calendar: Optional[Calendar] = None
                ) -> tuple[list[Fold], list[str]]:
    """A model's backtest folds: averaged from its members' folds in `done` when it is a
    combination whose members were backtested at the same origins, else refitted per origin."""
    folds = combined_folds(name, done)
    if folds is not None:
        return folds, []
    return rolling_origin(prep, name, horizon, origins, runner, calendar)


@dataclass
class Backtest:
    """Every model's folds and pooled scores at the same origins (models without folds are absent
    from `folds` and `skill`; their failures are in `errors`)."""

    origins: list[int]
    scale: float  # the MASE scale: mase_scale of the history before the first origin
    folds: dict[str, list[Fold]] = field(default_factory=dict)
    skill: dict[str, dict] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)


def backtest_models(prep: Prepared, models, horizon: int, origins: list[int],
                    runner: Optional[Callable] = None, calendar: Optional[Calendar] = None,
                    progress: Optional[Callable] = None) -> Backtest:
    """Rolling-origin backtest of each of `models` at `origins` (`horizon` points each), scored
    with one MASE scale (the history before the first origin; the whole history when that is
    undefined). `progress(i, n, name)` is called before each model."""
    scale = mase_scale(prep.head(origins[0])) if origins else math.nan
    if not math.isfinite(scale):
        scale = mase_scale(prep)
    bt = Backtest(list(origins), scale)
    names = members_last(models)
    for i, name in enumerate(names):
        if progress:
            progress(i, len(names), name)
        folds, errors = model_folds(prep, name, bt.folds, horizon, origins, runner, calendar)
        if errors:
            bt.errors.setdefault(name, []).extend(errors)
        if folds:
            bt.folds[name] = folds
            bt.skill[name] = pooled_score(folds, scale)
    if progress:
        progress(len(names), len(names), "done")
    return bt


# --- the per-series forecast --------------------------------------------------------------------

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
    result = SeriesForecast(True, history_points=prep.n)
    t0, c0 = time.perf_counter(), time.process_time()
    bt = backtest_models(prep, eligible, fold_h, origins, settings.runner, settings.calendar)
    result.backtest_seconds = time.perf_counter() - t0
    result.backtest_cpu_seconds = time.process_time() - c0
    fold_sets, scale = bt.folds, bt.scale
    result.skill, result.errors = bt.skill, bt.errors

    sel = select(result.skill, settings.models, settings.selection_tolerance, settings.average_below_skill)
    order = sel.ranked + [m for m in eligible if m not in sel.ranked]
    t1, c1 = time.perf_counter(), time.process_time()
    if sel.average and _average(prep, horizon, sel.average, fold_sets, scale, settings, result):
        order = []  # the average stands; selection does not run
    for name in order:
        try:
            fc = run_fit(name, prep, horizon, settings.runner, settings.calendar)
        except Exception as exc:  # noqa: BLE001 - a model whose fit fails is noted; the next in order is tried
            result.errors.setdefault(name, []).append(f"final fit: {type(exc).__name__}: {exc}")
            continue
        result.model = name
        result.selected_by = "backtest" if name == (sel.ranked[0] if sel.ranked else None) else "fallback"
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
    # the reasons for what was forecast: the selection's, unless a final fit fell back
    result.why = sel.why if result.model == sel.model else selection_reasons(
        result.skill, [m for m in settings.models if m in result.skill], settings.selection_tolerance,
        result.model, sel.average, settings.average_below_skill)
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
        except Exception as exc:  # noqa: BLE001 - a member whose fit fails is noted and left out of the average
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
