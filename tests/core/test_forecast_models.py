"""Models on synthetic series with known seasonality and trend; too-short history; flat series."""
import numpy as np
import pandas as pd
import pytest

from monitor.forecast.models import LEVELS, MODELS, TooShort, get_model, mstl_periods
from monitor.forecast.series import SeriesError, prepare

HOUR = 3600.0


def hourly(days, fn, start=1_700_000_000.0 - 1_700_000_000.0 % 86400):
    t = start + HOUR * np.arange(int(days * 24))
    return pd.Series(fn(np.arange(len(t)), t), index=t)


def daily_shape(i):
    return 1.0 + 0.6 * np.sin(2 * np.pi * (i % 24) / 24.0)


def test_seasonal_naive_repeats_the_last_day_exactly():
    s = hourly(4, lambda i, t: 10 * daily_shape(i))
    p = prepare(s)
    fc = MODELS["snaive_day"].fit(p).forecast(48)
    assert fc.mean == pytest.approx(np.concatenate([p.values[-24:], p.values[-24:]]))


def test_holt_winters_learns_trend_and_multiplicative_season():
    rng = np.random.default_rng(3)
    # level grows 1% per day; the daily swing scales with the level (multiplicative)
    s = hourly(14, lambda i, t: 100 * (1 + 0.01 * i / 24) * daily_shape(i) * rng.normal(1, 0.01, len(i)))
    p = prepare(s)
    train, test = p.head(12 * 24), p.values[12 * 24:]
    fc = MODELS["ets"].fit(train).forecast(48)
    truth = 100 * (1 + 0.01 * np.arange(12 * 24, 14 * 24) / 24) * daily_shape(np.arange(12 * 24, 14 * 24))
    assert np.mean(np.abs(fc.mean - truth)) / np.mean(truth) < 0.03
    naive = MODELS["snaive_day"].fit(train).forecast(48)
    assert np.mean(np.abs(fc.mean - test)) < np.mean(np.abs(naive.mean - test))  # trend beats naive


def test_ets_on_30_minute_means_follows_a_noisy_5_minute_series():
    t = 1_700_000_000.0 + 300.0 * np.arange(4 * 288)
    i = np.arange(len(t))
    truth = 20 * (1 + 0.5 * np.sin(2 * np.pi * (i % 288) / 288))
    y = truth + np.random.default_rng(0).normal(0, 2, len(t))
    p = prepare(pd.Series(y, index=t))
    fc = MODELS["ets_30m"].fit(p.head(3 * 288)).forecast(288)
    # closer to the noise-free truth than the seasonal naive, which copies yesterday's noise
    naive = MODELS["snaive_day"].fit(p.head(3 * 288)).forecast(288)
    err = np.mean(np.abs(fc.mean - truth[3 * 288:]))
    assert err < 0.6 * np.mean(np.abs(naive.mean - truth[3 * 288:]))
    assert err < 1.0


def test_ets_on_hourly_means_follows_a_noisy_10_minute_series():
    t = 1_700_000_000.0 + 600.0 * np.arange(5 * 144)
    i = np.arange(len(t))
    truth = 50 * (1 + 0.5 * np.sin(2 * np.pi * (i % 144) / 144))
    y = truth * np.random.default_rng(1).normal(1, 0.1, len(t))
    p = prepare(pd.Series(y, index=t))
    assert MODELS["ets_1h"]._k(p) == 6
    fc = MODELS["ets_1h"].fit(p.head(4 * 144)).forecast(144)
    naive = MODELS["snaive_day"].fit(p.head(4 * 144)).forecast(144)
    err = np.mean(np.abs(fc.mean - truth[4 * 144:]))
    assert err < 0.5 * np.mean(np.abs(naive.mean - truth[4 * 144:]))


def test_ets_week_is_the_average_of_holt_winters_and_the_weekly_naive():
    rng = np.random.default_rng(5)
    weekday = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5])  # quiet weekends
    s = hourly(15, lambda i, t: 40 * weekday[(i // 24) % 7] * daily_shape(i) * rng.normal(1, 0.03, len(i)))
    p = prepare(s)
    train = p.head(14 * 24)
    fc = MODELS["ets_week"].fit(train).forecast(24)
    ets = MODELS["ets"].fit(train).forecast(24)
    week = MODELS["snaive_week"].fit(train).forecast(24)
    assert fc.model == "ets_week"
    assert fc.mean == pytest.approx((ets.mean + week.mean) / 2)
    for lv in LEVELS:
        assert fc.lower(lv) == pytest.approx(np.minimum((ets.lower(lv) + week.lower(lv)) / 2, fc.mean))
    # under a week of history (plus the naive's residual margin) it is not available
    with pytest.raises(TooShort, match="ets_week needs at least"):
        MODELS["ets_week"].fit(p.head(7 * 24))


def test_mstl_keeps_only_periods_with_more_than_two_cycles():
    p10 = prepare(hourly(10, lambda i, t: daily_shape(i)))
    p15 = prepare(hourly(15, lambda i, t: daily_shape(i)))
    assert mstl_periods(p10) == [24]  # a weekly period needs more than 14 days
    assert mstl_periods(p15) == [24, 168]


def test_mstl_forecasts_daily_and_weekly_pattern():
    weekly = lambda i: np.where(((i // 24) % 7) >= 5, 0.5, 1.0)  # noqa: E731 - weekend dip
    s = hourly(22, lambda i, t: 50 * daily_shape(i) * weekly(i))
    p = prepare(s)
    train = p.head(21 * 24)
    fc = MODELS["mstl"].fit(train).forecast(24)
    truth = p.values[21 * 24:]  # a Monday after a weekend at half level
    err = np.mean(np.abs(fc.mean - truth)) / np.mean(truth)
    naive = MODELS["snaive_day"].fit(train).forecast(24)
    assert err < 0.08
    assert err < np.mean(np.abs(naive.mean - truth)) / np.mean(truth) / 3  # the weekly season helps


def test_mstl_fits_a_5_minute_series_on_hourly_means():
    # 21 days at 5 minutes: a weekly period would be 2016 points (13-15 s a fit); hourly it is 168.
    # Days 18 and 19 are a weekend at half level; day 20, forecast, is a working day again.
    t = 1_700_000_000.0 - 1_700_000_000.0 % 86400 + 300.0 * np.arange(21 * 288)
    i = np.arange(len(t))
    weekend = ((i // 288) + 1) % 7 >= 5
    truth = 50 * (1 + 0.5 * np.sin(2 * np.pi * (i % 288) / 288)) * np.where(weekend, 0.5, 1.0)
    y = truth * np.random.default_rng(2).normal(1, 0.05, len(t))
    p = prepare(pd.Series(y, index=t))
    train, actual = p.head(20 * 288), truth[20 * 288:]
    model = MODELS["mstl"]
    assert model._k(p) == 12 and model.min_history(p) == 2 * 288 + 12
    fitted = model.fit(train)
    assert fitted.k == 12 and fitted.periods == [24, 168]
    fc = fitted.forecast(288)
    assert len(fc.mean) == 288
    err = np.mean(np.abs(fc.mean - actual)) / np.mean(actual)
    naive = MODELS["snaive_day"].fit(train).forecast(288)  # yesterday: the weekend
    assert err < 0.1 and err < np.mean(np.abs(naive.mean - actual)) / np.mean(actual) / 3
    lo95, hi95 = fc.bands[0.95]
    assert np.mean((actual >= lo95) & (actual <= hi95)) > 0.8


def test_sarimax_on_hourly_aggregates_of_a_5_minute_series():
    t = 1_700_000_000.0 + 300.0 * np.arange(6 * 288)
    i = np.arange(len(t))
    y = 20 * (1 + 0.5 * np.sin(2 * np.pi * (i % 288) / 288)) + np.random.default_rng(1).normal(0, 0.5, len(t))
    p = prepare(pd.Series(y, index=t))
    fc = MODELS["sarimax"].fit(p.head(5 * 288)).forecast(288)
    assert len(fc.mean) == 288
    truth = 20 * (1 + 0.5 * np.sin(2 * np.pi * (np.arange(288)) / 288))
    assert np.mean(np.abs(fc.mean - truth)) < 1.5  # amplitude 10: the shape is followed


@pytest.mark.parametrize("name", list(MODELS))
def test_too_short_history_raises_tooshort_with_the_need(name):
    p = prepare(hourly(1, lambda i, t: daily_shape(i)))
    with pytest.raises(TooShort, match=r"needs at least \d+ points"):
        MODELS[name].fit(p)


@pytest.mark.parametrize("name", ["snaive_day", "ets", "ets_30m", "ets_1h", "mstl", "sarimax"])
def test_flat_series_gives_the_constant_with_zero_width_bands(name):
    t = 1_700_000_000.0 + 300.0 * np.arange(4 * 288)
    p = prepare(pd.Series(np.full(len(t), 7.0), index=t))
    fc = MODELS[name].fit(p).forecast(30)
    assert fc.mean == pytest.approx(np.full(30, 7.0))
    for lv in LEVELS:
        lo, hi = fc.bands[lv]
        assert lo == pytest.approx(fc.mean) and hi == pytest.approx(fc.mean)


@pytest.mark.parametrize("name", ["snaive_day", "ets", "ets_30m", "ets_1h", "ets_week", "mstl",
                                  "sarimax"])
def test_bands_are_nested_and_contain_the_mean(name):
    rng = np.random.default_rng(7)
    p = prepare(hourly(8, lambda i, t: 30 * daily_shape(i) + rng.normal(0, 2, len(i))))
    fc = MODELS[name].fit(p).forecast(36)
    lo80, hi80 = fc.bands[0.8]
    lo95, hi95 = fc.bands[0.95]
    assert np.all(lo95 <= lo80 + 1e-9) and np.all(lo80 <= fc.mean + 1e-9)
    assert np.all(fc.mean <= hi80 + 1e-9) and np.all(hi80 <= hi95 + 1e-9)
    assert np.all(hi95 > lo95)  # a noisy series never gets zero-width bands
    assert np.all(lo95 >= 0)


def test_zero_values_switch_holt_winters_to_an_additive_season():
    p = prepare(hourly(5, lambda i, t: np.where(i % 24 < 6, 0.0, 10 * daily_shape(i))))
    fc = MODELS["ets"].fit(p).forecast(24)  # multiplicative would divide by zero
    assert np.all(np.isfinite(fc.mean)) and fc.mean.max() > 5


def test_unknown_model_and_bad_series_are_named():
    with pytest.raises(ValueError, match="unknown forecast model 'prophet'"):
        get_model("prophet")
    with pytest.raises(SeriesError, match="no usable values"):
        prepare(pd.Series([np.nan, np.nan], index=[0.0, 60.0]))
    with pytest.raises(SeriesError, match="neither datetimes nor Unix seconds"):
        prepare(pd.Series([1.0, 2.0], index=["a", "b"]))
    with pytest.raises(SeriesError, match="missing"):
        prepare(pd.Series([1.0] + [np.nan] * 9, index=60.0 * np.arange(10)))


def test_prepare_regularises_gaps_nan_and_counter_reset_negatives():
    t = 300.0 * np.arange(2 * 288)
    y = 10 + 5 * np.sin(2 * np.pi * np.arange(len(t)) / 288)
    y[100] = np.nan
    y[200] = -350.0  # a rate computed across an upstream counter reset
    keep = np.ones(len(t), bool)
    keep[400:410] = False  # a 50-minute hole in the timestamps
    p = prepare(pd.Series(y[keep], index=t[keep]))
    assert p.n == len(t) and p.step == 300.0
    assert not p.observed[100] and not p.observed[200] and not p.observed[400:410].any()
    assert p.observed.sum() == len(t) - 12
    assert np.all(p.values >= 0) and np.all(np.isfinite(p.values))
    # a filled point takes the value one day earlier when that was observed
    assert p.values[400] == pytest.approx(y[400 - 288])


def test_level_weekly_naive_is_last_week_times_the_recent_growth():
    week = 7 * 24
    # a weekly shape whose level grows 5 % a week, step by step at each week's start
    s = hourly(21, lambda i, t: 10 * daily_shape(i) * (1 + (i % week) / week) * 1.05 ** (i // week))
    p = prepare(s)
    fc = MODELS["snaive_week_level"].fit(p).forecast(week)
    assert fc.mean == pytest.approx(1.05 * p.values[-week:])
    plain = MODELS["snaive_week"].fit(p).forecast(week)
    assert plain.mean == pytest.approx(p.values[-week:])  # the plain naive keeps last week's level
    with pytest.raises(TooShort, match="snaive_week_level needs"):
        MODELS["snaive_week_level"].fit(prepare(hourly(13, lambda i, t: 10 * daily_shape(i))))
