"""Holidays forecast as the non-working days they are (issue #17 part 2), and the `calendar:` section."""
import datetime as dt

import numpy as np
import pandas as pd
import pytest

from monitor.config import ConfigError, from_dict
from monitor.forecast.calendar import Calendar, as_non_working
from monitor.forecast.models import MODELS
from monitor.forecast.rolling_origin import ForecastSettings, forecast_series
from monitor.forecast.series import prepare

HOUR = 3600.0
MONDAY = dt.datetime(2026, 11, 2, tzinfo=dt.timezone.utc).timestamp()  # a Monday, 00:00 UTC


def office(weeks: int, holidays=()):
    """Hourly: working days 10 + 30 in working hours, weekends (and `holidays`) 2 + 3."""
    t = MONDAY + HOUR * np.arange(weeks * 7 * 24)
    days = pd.to_datetime(t, unit="s", utc=True)
    hour = days.hour.to_numpy()
    off = (days.day_of_week >= 5) | np.isin(days.date, list(holidays))
    busy = (hour >= 8) & (hour < 18)
    y = np.where(off, 2.0 + 3.0 * busy, 10.0 + 30.0 * busy)
    return pd.Series(y, index=t)


def test_a_holiday_in_the_horizon_is_forecast_as_the_last_weekend_days():
    hist = prepare(office(3))  # ends on a Sunday night: the next day is Monday 2026-11-23
    holiday = dt.date(2026, 11, 24)  # the Tuesday after
    cal = Calendar(dates=frozenset({holiday}))
    fc = MODELS["snaive_week"].fit(hist).forecast(7 * 24)
    adjusted = as_non_working(hist, fc, cal)
    tuesday = slice(24, 48)
    assert adjusted.mean[tuesday] == pytest.approx(np.where((np.arange(24) >= 8) & (np.arange(24) < 18), 5.0, 2.0))
    keep = np.r_[0:24, 48:7 * 24]
    assert np.array_equal(adjusted.mean[keep], fc.mean[keep])  # every other day as the model said
    for lo, hi in adjusted.bands.values():
        assert np.all(lo[tuesday] <= adjusted.mean[tuesday]) and np.all(adjusted.mean[tuesday] <= hi[tuesday])
    assert as_non_working(hist, fc, Calendar()) is fc  # no holiday: the same forecast object


def test_the_backtest_scores_the_holiday_as_a_non_working_day():
    holiday = dt.date(2026, 11, 24)
    series = office(4, holidays=[holiday])[: (3 * 7 + 2) * 24]  # ends at the end of the holiday
    prep = prepare(series)
    plain = ForecastSettings(models=("snaive_week",), folds=1, max_folds=1, calibrate=False)
    with_cal = ForecastSettings(models=("snaive_week",), folds=1, max_folds=1, calibrate=False,
                                calendar=Calendar(dates=frozenset({holiday})))
    a, b = forecast_series(prep, 24, plain), forecast_series(prep, 24, with_cal)
    assert b.skill["snaive_week"]["mase"] == pytest.approx(0.0, abs=1e-9)  # the holiday forecast exactly
    assert a.skill["snaive_week"]["mase"] > 1.0  # a working Tuesday's peak forecast on the holiday


GOOD = {"sources": {"vllm": {"targets": ["http://a:8000/metrics"]}}}


@pytest.mark.parametrize("section, where, problem", [
    ({"country": "XX"}, "calendar.country", "not a country the holidays library knows"),
    ({"country": "DE", "subdivision": "ZZ"}, "calendar.subdivision", "is not a subdivision of DE"),
    ({"subdivision": "BY"}, "calendar.subdivision", "needs calendar.country"),
    ({"non_working": ["24.12.2026"]}, "calendar.non_working[0]", "expected a date like 2026-12-24"),
    ({"recurring": ["13-01"]}, "calendar.recurring[0]", "expected a month and day"),
    ({"weekend": ["fri", "caturday"]}, "calendar.weekend", "unknown ['caturday']"),
    ({"timezone": "Mars/Olympus"}, "calendar.timezone", "unknown time zone"),
])
def test_a_bad_calendar_is_named(section, where, problem):
    with pytest.raises(ConfigError) as e:
        from_dict({**GOOD, "calendar": section}, "f.yml")
    assert e.value.key == where and problem in e.value.problem, e.value


def test_a_company_shutdown_and_public_holidays():
    import yaml
    cfg = from_dict({**GOOD, **yaml.safe_load("""
calendar:
  timezone: Europe/Berlin
  country: DE
  subdivision: BY
  non_working: [2026-12-28, 2026-12-29, 2026-12-30]
  recurring: ["12-24", "12-31"]
""")}, "f.yml")
    cal = cfg.calendar.calendar()
    assert all(cal.holiday(dt.date(2026, 12, d)) for d in (24, 25, 28, 29, 30, 31))  # 25th: public holiday
    assert not cal.holiday(dt.date(2026, 12, 26)) and cal.non_working(dt.date(2026, 12, 26))  # a Saturday
    assert cal.holiday(dt.date(2027, 1, 6))  # Epiphany, a holiday in Bavaria
    assert not cal.holiday(dt.date(2026, 12, 22))
