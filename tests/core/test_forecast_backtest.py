"""Rolling-origin backtest, selection, calibration, time boxes, undefined results."""

import numpy as np
import pandas as pd
import pytest

from monitor.forecast import models as models_mod
from monitor.forecast.models import Forecast, Model
from monitor.forecast.rolling_origin import (
    AVERAGE,
    ForecastSettings,
    apply_calibration,
    calibrate,
    forecast_series,
    mase_scale,
    no_skill_members,
    origins_for,
    rank_models,
    rolling_origin,
    score,
    select,
    selection_reasons,
)
from monitor.forecast.series import prepare
from monitor.kit.timebox import FitPool, TimeBoxExceeded

HOUR = 3600.0


def noisy_daily(days, sigma=0.05, seed=0, trend=0.0):
    rng = np.random.default_rng(seed)
    i = np.arange(int(days * 24))
    y = 40 * (1 + trend * i / 24) * (1 + 0.5 * np.sin(2 * np.pi * i / 24)) * rng.normal(1, sigma, len(i))
    return pd.Series(y, index=1_699_920_000.0 + HOUR * i)


def test_scores_on_a_hand_computed_example():
    actual = np.array([10.0, 20.0, 30.0, 40.0])
    mean = np.array([12.0, 18.0, 30.0, 50.0])
    bands = {0.8: (mean - 1, mean + 1), 0.95: (mean - 5, mean + 5)}
    s = score(actual, Forecast(mean, bands), np.array([True, True, True, False]), scale=2.0)
    assert s["mase"] == pytest.approx((2 + 2 + 0) / 3 / 2.0)  # the unobserved 4th point is ignored
    assert s["coverage80"] == pytest.approx(1 / 3)
    assert s["coverage95"] == pytest.approx(1.0)
    assert s["smape"] == pytest.approx(100 * np.mean([4 / 22, 4 / 38, 0.0]))
    assert s["width95_ratio"] == pytest.approx(10 / 20)


def test_mase_scale_is_the_in_sample_one_day_seasonal_naive_error():
    p = prepare(noisy_daily(4, seed=2))
    y = p.values
    assert mase_scale(p) == pytest.approx(np.mean(np.abs(y[24:] - y[:-24])))
    flat = prepare(pd.Series(np.ones(100), index=HOUR * np.arange(100)))
    assert np.isnan(mase_scale(flat))


def test_rolling_origin_refits_on_everything_before_each_origin():
    p = prepare(noisy_daily(6, seed=1))
    origins = origins_for(p.n, 24, 3)
    assert origins == [p.n - 72, p.n - 48, p.n - 24]
    folds, errors = rolling_origin(p, "snaive_day", 24, origins)
    assert errors == [] and [f.origin for f in folds] == origins
    for f in folds:  # the seasonal naive of the day before each origin, never data after it
        assert f.forecast.mean == pytest.approx(p.values[f.origin - 24:f.origin])
        assert f.actual == pytest.approx(p.values[f.origin:f.origin + 24])


def test_selection_picks_the_model_that_wins_the_backtest_and_bands_are_calibrated():
    p = prepare(noisy_daily(10, sigma=0.08, seed=4, trend=0.03))  # trending: naive lags
    r = forecast_series(p, 24, ForecastSettings(models=("ets", "snaive_day")))
    assert r.defined and r.model == "ets" and r.selected_by == "backtest"
    assert r.skill["ets"]["mase"] < min(1.0, r.skill["snaive_day"]["mase"])
    assert AVERAGE not in r.skill  # a model with skill: selection, not the no-skill average
    assert r.calibration is not None and r.calibration.kind == "sqrt"
    lo80, hi80 = r.forecast.bands[0.8]
    lo95, hi95 = r.forecast.bands[0.95]
    assert np.all(lo95 <= lo80) and np.all(hi80 <= hi95)


def test_calibrated_bands_cover_held_out_data_near_their_level():
    covered80, covered95 = [], []
    for seed in range(3):
        s = noisy_daily(12, sigma=0.1, seed=10 + seed)
        p = prepare(s)
        train = p.head(p.n - 48)
        r = forecast_series(train, 48, ForecastSettings(models=("snaive_day",), folds=4,
                                                          max_folds=4))
        a = p.values[p.n - 48:]
        lo, hi = r.forecast.bands[0.8]
        covered80 += list((a >= lo) & (a <= hi))
        lo, hi = r.forecast.bands[0.95]
        covered95 += list((a >= lo) & (a <= hi))
    assert 0.6 <= np.mean(covered80) <= 0.97
    assert 0.85 <= np.mean(covered95) <= 1.0


def test_calibration_uses_ratio_quantiles():
    from monitor.forecast.rolling_origin import Fold
    mean = np.full(100, 10.0)
    actual = mean * np.linspace(0.5, 1.5, 100)
    fold = Fold(0, Forecast(mean, {}), actual, np.ones(100, bool))
    cal = calibrate([fold], min_points=24, kind="ratio")
    assert cal.kind == "ratio"
    lo, hi = cal.quantiles[0.8]
    assert 0.55 < lo < 0.65 and 1.35 < hi < 1.45
    out = apply_calibration(Forecast(np.array([20.0]), {}), cal)
    assert out.bands[0.8][0][0] == pytest.approx(20 * lo) and out.bands[0.8][1][0] == pytest.approx(20 * hi)
    assert calibrate([fold], min_points=1000) is None  # too few residuals: keep native bands


def test_sqrt_calibration_scales_bands_with_the_square_root_of_the_level():
    from monitor.forecast.rolling_origin import Fold
    mean = np.full(200, 100.0)
    actual = mean + np.linspace(-20, 20, 200)  # residuals up to +-2 sqrt(100)
    cal = calibrate([Fold(0, Forecast(mean, {}), actual, np.ones(200, bool))], kind="sqrt")
    lo, hi = cal.quantiles[0.95]
    assert -2.0 <= lo < -1.8 and 1.8 < hi <= 2.0
    out = apply_calibration(Forecast(np.array([400.0, 25.0]), {}), cal)
    lo_b, hi_b = out.bands[0.95]
    assert hi_b == pytest.approx([400 + hi * 20, 25 + hi * 5])  # sqrt(400) = 20, sqrt(25) = 5
    assert lo_b == pytest.approx([400 + lo * 20, 25 + lo * 5])
    with pytest.raises(ValueError, match="calibration kind"):
        calibrate([], kind="log")
    # a forecast touching zero cannot be scaled: plain differences are used
    zero = Fold(0, Forecast(np.zeros(50), {}), np.linspace(0, 1, 50), np.ones(50, bool))
    assert calibrate([zero]).kind == "diff"


def test_rank_models_prefers_the_earlier_model_within_the_tolerance():
    skill = {"ets": {"mase": 0.52}, "mstl": {"mase": 0.50}, "snaive_day": {"mase": 0.9},
             "sarimax": {"mase": None}}
    order = ["ets", "mstl", "sarimax", "snaive_day"]
    assert rank_models(skill, order, 0.10) == ["ets", "mstl", "snaive_day", "sarimax"]
    assert rank_models(skill, order, 0.0) == ["mstl", "ets", "snaive_day", "sarimax"]


def test_too_short_history_is_undefined_with_a_reason_not_an_exception():
    p = prepare(noisy_daily(0.5))
    r = forecast_series(p, 24)
    assert not r.defined and r.forecast is None
    assert "history too short: 12 points" in r.reason and "needs" in r.reason


def test_gaps_and_nan_are_filled_for_fitting_and_never_scored():
    s = noisy_daily(8, seed=5)
    s.iloc[50:60] = np.nan
    s = s.drop(s.index[100:110])  # missing timestamps
    p = prepare(s)
    assert (~p.observed).sum() == 20
    r = forecast_series(p, 24, ForecastSettings(models=("ets", "snaive_day")))
    assert r.defined and np.all(np.isfinite(r.forecast.mean))
    assert sum(f["points"] for f in r.skill.values()) == sum(
        int(p.observed[o:o + 24].sum()) for o in origins_for(p.n, 24, 2)) * len(r.skill)


def test_counter_reset_negative_rates_do_not_drag_the_forecast_down():
    s = noisy_daily(8, sigma=0.02, seed=6)
    clean = forecast_series(prepare(s), 24, ForecastSettings(models=("snaive_day",)))
    s.iloc[-5] = -1e6  # rate() over a naive counter delta across a reset
    reset = forecast_series(prepare(s), 24, ForecastSettings(models=("snaive_day",)))
    assert reset.forecast.mean.min() >= 0
    assert np.max(np.abs(reset.forecast.mean - clean.forecast.mean)) < 0.2 * np.mean(clean.forecast.mean)


class _CountingModel(Model):
    """snaive_day under another name, counting its fits."""

    def __init__(self, name):
        self.name, self.fits = name, 0

    def min_history(self, prep):
        return models_mod.MODELS["snaive_day"].min_history(prep)

    def fit(self, prep):
        self.fits += 1
        return models_mod.MODELS["snaive_day"].fit(prep)


def test_a_combination_is_backtested_from_its_members_folds_without_refits(monkeypatch):
    a, b = _CountingModel("count_a"), _CountingModel("count_b")
    monkeypatch.setitem(models_mod.MODELS, "count_a", a)
    monkeypatch.setitem(models_mod.MODELS, "count_b", b)
    monkeypatch.setitem(models_mod.MODELS, "combo", models_mod.Combination("combo", ("count_a", "ets")))
    p = prepare(noisy_daily(8, seed=6))
    r = forecast_series(p, 24, ForecastSettings(models=("combo", "count_a", "ets", "count_b"),
                                                 selection_tolerance=10.0))
    assert r.defined and r.model == "combo"  # first in order, within the (huge) tolerance
    # members backtested once per origin, the combination's folds averaged from theirs; the final
    # fit of the combination fits its members again
    assert b.fits == r.skill["count_b"]["folds"] and a.fits == r.skill["count_a"]["folds"] + 1
    folds, _ = rolling_origin(p, "ets", 24, origins_for(p.n, 24, r.skill["ets"]["folds"]))
    naive, _ = rolling_origin(p, "snaive_day", 24, origins_for(p.n, 24, r.skill["ets"]["folds"]))
    scale = mase_scale(p.head(folds[0].origin))
    err = np.concatenate([np.abs((f.forecast.mean + g.forecast.mean) / 2 - f.actual)
                          for f, g in zip(folds, naive)])
    assert r.skill["combo"]["mase"] == pytest.approx(np.mean(err) / scale)


class _SlowModel(Model):
    name = "slow"

    def min_history(self, prep):
        return 2

    def fit(self, prep):
        raise AssertionError("never fit: the runner abandons it")


def _boxing_runner(fn, args):
    """What a time-boxed runner does to a fit over its box (monitor/kit/timebox.py FitPool, whose own
    test kills a real worker): raise TimeBoxExceeded; every other fit runs here."""
    if args[0] == "slow":
        raise TimeBoxExceeded("abandoned after 2 s")
    return fn(*args)


class _BrokenModel(Model):
    name = "broken"

    def min_history(self, prep):
        return 2

    def fit(self, prep):
        raise models_mod.FitError("broken: singular matrix")


def test_a_fit_over_its_time_box_is_abandoned_reported_and_the_next_model_used(monkeypatch):
    monkeypatch.setitem(models_mod.MODELS, "slow", _SlowModel())
    monkeypatch.setitem(models_mod.MODELS, "broken", _BrokenModel())
    p = prepare(noisy_daily(3))
    r = forecast_series(p, 24, ForecastSettings(models=("slow", "broken", "snaive_day"),
                                                 runner=_boxing_runner, folds=1, max_folds=1))
    assert r.defined and r.model == "snaive_day"
    assert any("abandoned after 2 s" in e for e in r.errors["slow"])
    assert any("singular matrix" in e for e in r.errors["broken"])


def test_every_model_failing_is_undefined_with_the_reasons(monkeypatch):
    monkeypatch.setitem(models_mod.MODELS, "broken", _BrokenModel())
    r = forecast_series(prepare(noisy_daily(3)), 24, ForecastSettings(models=("broken",)))
    assert not r.defined and "every model failed" in r.reason and "singular matrix" in r.reason


def test_settings_validate_their_fields():
    with pytest.raises(ValueError, match="unknown forecast model 'nope'"):
        ForecastSettings(models=("nope",))
    with pytest.raises(ValueError, match="folds"):
        ForecastSettings(folds=0)
    with pytest.raises(ValueError, match="time box must be positive"):
        FitPool(0)
    with pytest.raises(ValueError, match="average_below_skill"):
        ForecastSettings(average_below_skill=-1)
    with pytest.raises(ValueError, match="horizon"):
        forecast_series(prepare(noisy_daily(3)), 0)


def no_skill_series(days=8, seed=11):
    """A clean daily shape, then two days of large noise: the in-sample naive error (the MASE scale,
    from the history before the backtest) is small and every model's backtest error is large."""
    rng = np.random.default_rng(seed)
    i = np.arange(days * 24)
    y = 40 * (1 + 0.5 * np.sin(2 * np.pi * i / 24)) * rng.normal(1, 0.01, len(i))
    y[-48:] *= rng.lognormal(0, 0.5, 48)
    return pd.Series(y, index=1_699_920_000.0 + HOUR * i)


def test_no_skill_members_are_the_plain_backtested_models_when_none_beats_the_threshold():
    skill = {"ets_week": {"mase": 1.3}, "ets": {"mase": 1.2}, "snaive_day": {"mase": 1.1},
             "sarimax": {}}
    order = ("ets_week", "ets", "sarimax", "snaive_day")
    assert no_skill_members(skill, order, 1.0) == ["ets", "snaive_day"]  # no combination, no unscored
    assert no_skill_members(skill, order, 1.15) == []  # snaive_day beats 1.15: selection as usual
    assert no_skill_members(skill, order, 0.0) == []  # the rule off
    assert no_skill_members({"ets": {"mase": 2.0}}, order, 1.0) == []  # one model: nothing to average


def test_when_no_model_shows_skill_the_forecast_is_the_average_of_the_plain_candidates():
    p = prepare(no_skill_series())
    settings = ForecastSettings(models=("ets_week", "ets", "snaive_week", "snaive_day"))
    r = forecast_series(p, 24, settings)
    members = ["ets", "snaive_day"]  # snaive_week needs more than a week of history before the folds
    assert all(r.skill[m]["mase"] >= 1.0 for m in r.skill if m != AVERAGE), r.skill
    assert r.defined and r.model == AVERAGE and r.selected_by == "no-skill rule: " + "+".join(members)
    # the mean is the equal-weight average of the members' own fits on the whole history
    expected = np.mean([models_mod.MODELS[m].fit(p).forecast(24).mean for m in members], axis=0)
    assert r.forecast.mean == pytest.approx(expected)
    # scored and calibrated on the average of the members' backtest folds
    origins = origins_for(p.n, 24, r.skill["ets"]["folds"])
    folds = {m: rolling_origin(p, m, 24, origins)[0] for m in members}
    err = np.concatenate([np.abs(np.mean([folds[m][k].forecast.mean for m in members], axis=0)
                                 - folds[members[0]][k].actual) for k in range(len(origins))])
    assert r.skill[AVERAGE]["mase"] == pytest.approx(np.mean(err) / mase_scale(p.head(origins[0])))
    assert r.calibration is not None and r.calibration.points == 24 * len(origins)
    # the reasons are the selection's (monitor/forecast/selection.py), as `headroom backtest` prints them
    assert r.why[AVERAGE] == "selected: no candidate reached MASE 1; the average of ets+snaive_day"
    assert all("member of the no-skill average" in r.why[m] for m in members)
    backtested = {m: v for m, v in r.skill.items() if m != AVERAGE}
    assert r.why == select(backtested, settings.models, settings.selection_tolerance,
                           settings.average_below_skill).why
    # the rule off: the usual selection
    off = forecast_series(p, 24, ForecastSettings(models=settings.models, average_below_skill=0.0))
    assert off.model in members + ["ets_week"] and AVERAGE not in off.skill


def test_a_model_worse_than_the_best_seasonal_naive_is_never_selected():
    # ets is earliest and within 10 % of sarimax, but both score worse than snaive_week on these folds
    skill = {"ets": {"mase": 0.95}, "sarimax": {"mase": 0.90}, "snaive_week": {"mase": 0.80},
             "snaive_day": {"mase": 1.30}, "mstl": {"mase": None}}
    order = ["ets", "sarimax", "mstl", "snaive_week", "snaive_day"]
    assert rank_models(skill, order, 0.10)[0] == "snaive_week"
    why = selection_reasons(skill, order, 0.10, "snaive_week")
    assert why["snaive_week"].startswith("selected: MASE 0.800")
    assert why["ets"] == "not selected: MASE 0.950 is worse than the seasonal naive snaive_week (0.800)"
    assert why["mstl"].startswith("no backtest score")
    assert why["snaive_day"] == "not selected: MASE 1.300, more than 10% above the best (0.800)"
    # a model as good as the naive stays eligible, and the order decides within the tolerance
    skill["ets"]["mase"] = 0.80
    assert rank_models(skill, order, 0.10)[0] == "ets"
    assert "later in the order" in selection_reasons(skill, order, 0.10, "ets")["snaive_week"]
