"""forecast_pool: horizons, peaks, time to exhaustion, undefined series, exported samples."""
import math

import numpy as np
import pandas as pd
import pytest

from monitor.export.samples import snapshot_samples
from monitor.forecast.pool import CAPACITY_SERIES, PoolSettings, exhaustion_seconds, forecast_pool
from monitor.forecast.rolling_origin import ForecastSettings
from monitor.model import RefitResult, Snapshot
from monitor.model.catalogue import BY_NAME

HOUR = 3600.0
FAST = PoolSettings(forecast=ForecastSettings(models=("ets", "snaive_day")))


def growing(days=10, growth=0.05, seed=0):
    """Hourly concurrent requests: daily peak at 18:00, level +5% a day, small noise."""
    rng = np.random.default_rng(seed)
    i = np.arange(days * 24)
    shape = 1 + 0.6 * np.cos(2 * np.pi * (i % 24 - 18) / 24)
    y = 50 * (1 + growth * i / 24) * shape * rng.normal(1, 0.02, len(i))
    t = 1_700_006_400.0 - 1_700_006_400.0 % 86400 + HOUR * i
    return pd.Series(y, index=t)


def test_horizons_peaks_and_exhaustion_on_a_growing_series():
    s = growing()
    now = s.index[-1] + 60
    capacity = 1.08 * s.iloc[-24:].max()  # 8% above today's peak: growth reaches it within days
    res = forecast_pool({CAPACITY_SERIES: s}, capacity_requests=capacity, now=now, settings=FAST)
    h = res.horizons
    assert set(h) == {"1h", "1d", "1w"}
    # the daily peak comes at 18:00 UTC; the forecast peak within a day falls there
    assert (h["1d"].peak_timestamp % 86400) / HOUR == pytest.approx(18, abs=1)
    assert h["1d"].peak_upper >= h["1d"].peak > h["1h"].peak * 0.5
    assert h["1w"].peak >= h["1d"].peak  # growth: the week's peak is at least the day's
    last_peak = s.iloc[-24:].max()
    assert h["1d"].peak == pytest.approx(last_peak * 1.05, rel=0.15)
    fc = res.path  # the first time the 95% upper bound reaches the capacity
    hit = np.flatnonzero(fc.upper >= capacity)
    expected = fc.timestamps[hit[0]] - now if len(hit) else math.inf
    assert res.exhaustion_seconds == pytest.approx(expected)
    assert 0 < res.exhaustion_seconds < 7 * 86400
    # the JSON document: the same numbers, without the path
    doc = res.as_dict()
    assert doc["horizons"]["1d"]["peak"] == h["1d"].peak and doc["exhaustion_seconds"] == res.exhaustion_seconds
    assert "path" not in doc and doc["series"][CAPACITY_SERIES]["defined"] is True


def test_exhaustion_is_inf_without_a_crossing_none_without_capacity_zero_when_already_over():
    t = np.arange(5) * 10.0 + 100
    up = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert exhaustion_seconds(t, up, 10.0, now=95.0) == math.inf
    assert exhaustion_seconds(t, up, 3.0, now=95.0) == pytest.approx(120 - 95)
    assert exhaustion_seconds(t, up, None, now=95.0) is None
    assert exhaustion_seconds(t, up, 3.0, now=95.0, current=3.5) == 0.0


def test_short_nan_and_unknown_series():
    s = growing()
    res = forecast_pool({CAPACITY_SERIES: s, "sessions": s.iloc[:10],
                         "kv_tokens": pd.Series([np.nan] * 50, index=HOUR * np.arange(50)),
                         "task_arrivals:summarise": s * 0.1},
                        capacity_requests=None, now=s.index[-1], settings=FAST)
    assert res.exhaustion_seconds is None  # no capacity known
    assert res.series["sessions"].defined is False
    assert "history too short" in res.series["sessions"].reason
    assert res.series["kv_tokens"].defined is False
    assert "no usable values" in res.series["kv_tokens"].reason
    assert res.series["task_arrivals:summarise"].defined is True
    with pytest.raises(ValueError, match="unknown series 'latency'"):
        forecast_pool({"latency": s}, None, 0.0, FAST)


def test_exported_forecast_samples_use_catalogue_names_and_labels():
    s = growing(days=8)
    res = forecast_pool({CAPACITY_SERIES: s, "sessions": s.iloc[:5]}, 500.0, s.index[-1], FAST)
    rendered = snapshot_samples(Snapshot(timestamp=0.0, forecast=RefitResult({"chat": res}, finished=7.0)))
    samples = [(n, labels, v) for n, rows in rendered.items() for labels, v in rows
               if n not in ("headroom_build_info", "headroom_cycles")]
    names = {n for n, _, _ in samples}
    assert {"headroom_forecast_requests", "headroom_forecast_peak_requests",
            "headroom_forecast_peak_requests_upper", "headroom_forecast_peak_timestamp_seconds",
            "headroom_exhaustion_seconds", "headroom_forecast_mase",
            "headroom_forecast_coverage_ratio", "headroom_forecast_selected_info",
            "headroom_history_points"} <= names
    for name, labels, value in samples:
        assert set(labels) == set(BY_NAME[name].labels), name
        assert isinstance(value, float)
    sel = [lab for n, lab, _ in samples if n == "headroom_forecast_selected_info"]
    assert sel == [{"pool": "chat", "series": CAPACITY_SERIES, "model": res.series[CAPACITY_SERIES].model}]
    points = {lab["series"]: v for n, lab, v in samples if n == "headroom_history_points"}
    assert points == {CAPACITY_SERIES: 192.0, "sessions": 5.0}
    assert rendered["headroom_forecast_last_fit_timestamp_seconds"] == [({}, 7.0)]
    peak = {lab["horizon"]: v for n, lab, v in samples if n == "headroom_forecast_peak_requests"}
    assert peak == {h: res.horizons[h].peak for h in ("1h", "1d", "1w")}
    assert rendered["headroom_exhaustion_seconds"] == [({"pool": "chat"}, res.exhaustion_seconds)]


def test_pool_settings_validate():
    with pytest.raises(ValueError, match="unknown horizon '2d'"):
        PoolSettings(horizons=("2d",))
