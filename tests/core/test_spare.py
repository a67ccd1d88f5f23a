"""Spare capacity until the next peak (monitor/capacity/spare.py) on a hand-computed forecast.

knee 10, margin 0.2: ceiling 8. The forecast: hourly points at now .. now + 5 h, the load's upper
band 2.5, 2.5, 5.2, 7.9, 3.0, 1.0; each point stands for the hour after it (the forecaster labels a
slot by its start).
Spare per hour = floor(8 - upper): 5, 5, 2, 0, 5, 7; the first hour is also held to the interactive
load measured now (4.0): floor(8 - 4) = 4. So the hours hold 4, 5, 2, 0, 5, 7.
"""
from __future__ import annotations

import numpy as np
import pytest

from monitor.capacity.spare import SpareInputs, cluster_spare, earliest_fit, merge, pool_spare
from monitor.model.spare_data import SpareWindow

NOW = 1_800_000_000.0
H = 3600.0
UPPER = [2.5, 2.5, 5.2, 7.9, 3.0, 1.0]


def inputs(**kw) -> SpareInputs:
    base = dict(knee_requests=10.0, margin=0.2, timestamps=[NOW + H * k for k in range(0, 6)], upper=UPPER,
                fit_timestamp=NOW - 60, interactive_now=4.0, max_age=3600.0, budget_horizon=900.0)
    base.update(kw)
    return SpareInputs(**base)


def spans(windows):
    return [((w.start - NOW) / H, (w.end - NOW) / H, w.requests) for w in windows]


def test_windows_are_the_hours_merged_without_the_full_one():
    s = pool_spare(inputs(), NOW)
    assert s.ceiling == pytest.approx(8.0)
    assert spans(s.windows) == [(0, 1, 4), (1, 2, 5), (2, 3, 2), (4, 5, 5), (5, 6, 7)]


def test_equal_neighbours_merge_and_a_gap_does_not():
    parts = [SpareWindow(0, 10, 3), SpareWindow(10, 20, 3), SpareWindow(20, 30, 0), SpareWindow(30, 40, 3),
             SpareWindow(41, 50, 3)]
    assert merge(parts) == [SpareWindow(0, 20, 3), SpareWindow(30, 40, 3), SpareWindow(41, 50, 3)]


def test_horizons_are_the_fewest_from_now():
    s = pool_spare(inputs(), NOW)
    assert s.requests == {"now": 4.0, "1h": 4.0, "6h": 0.0, "1d": None}  # the forecast ends at 6 h


def test_a_later_now_drops_the_past_and_clips_the_current_hour():
    now = NOW + 1.5 * H  # in the second hour (upper 2.5): 5; no measured load
    s = pool_spare(inputs(interactive_now=None, max_age=3 * H), now)
    assert [((w.start - NOW) / H, (w.end - NOW) / H, w.requests) for w in s.windows] == \
        [(1.5, 2, 5), (2, 3, 2), (4, 5, 5), (5, 6, 7)]
    assert s.requests["now"] == 5.0 and s.requests["1h"] == 2.0


def test_budget_is_the_fewest_over_its_horizon_over_the_ceiling():
    s = pool_spare(inputs(), NOW)
    assert s.budget_ratio == pytest.approx(4 / 8)
    # a 2-hour budget horizon reaches the third hour (2 spare)
    assert pool_spare(inputs(budget_horizon=2.5 * H), NOW).budget_ratio == pytest.approx(2 / 8)


@pytest.mark.parametrize("kw, why", [
    (dict(pool_stale=True), "readings are stale"),
    (dict(fit_timestamp=NOW - 7200), "7200 s old"),
    (dict(fit_timestamp=None), "no forecast"),
    (dict(knee_requests=None), "knee is not known"),
    (dict(timestamps=[NOW - H * k for k in range(6, 0, -1)]), "ends before now"),
])
def test_budget_falls_to_0_on_stale_data(kw, why):
    fresh = pool_spare(inputs(), NOW)
    assert fresh.budget_ratio > 0
    s = pool_spare(inputs(**kw), NOW)
    assert s.budget_ratio == 0.0 and why in s.reason and s.reason.startswith("stale")
    assert s.windows == ()


def test_budget_falls_to_0_over_slo_while_the_windows_stay():
    s = pool_spare(inputs(over_slo=True), NOW)
    assert s.budget_ratio == 0.0 and s.reason.startswith("over SLO")
    assert spans(s.windows)[0] == (0, 1, 4)


def test_interactive_load_over_the_ceiling_leaves_nothing_now():
    s = pool_spare(inputs(interactive_now=9.0), NOW)
    assert s.requests["now"] == 0.0 and s.budget_ratio == 0.0
    assert spans(s.windows)[0] == (1, 2, 5)


@pytest.mark.parametrize("n, hours, window", [
    (5, 1, (1, 2, 5)),        # the second hour
    (5, 2, (4, 6, 5)),        # hours 5 and 6 (5, 7) follow one another
    (4, 2, (0, 2, 4)),        # hours 1 and 2 (4, 5)
    (2, 3, (0, 3, 2)),        # 4, 5, 2
])
def test_earliest_fit(n, hours, window):
    ans = earliest_fit(pool_spare(inputs(), NOW).windows, n, hours * H)
    assert ans.window is not None and spans([ans.window])[0] == window
    assert ans.as_dict()["fits"] is True


@pytest.mark.parametrize("n, hours, largest, at", [
    (6, 2, 5, (4, 6, 5)),     # 7 holds only one hour; 5 holds two from hour 4
    (9, 3, 2, (0, 3, 2)),     # only 2 holds three hours on end
    (1, 10, 0, None),         # no span of 10 hours in a 6-hour forecast
])
def test_none_in_the_horizon_gives_the_largest_that_fits(n, hours, largest, at):
    ans = earliest_fit(pool_spare(inputs(), NOW).windows, n, hours * H)
    d = ans.as_dict()
    assert ans.window is None and d["fits"] is False and d["reason"] == "none in the horizon"
    assert ans.largest == largest
    assert (spans([ans.largest_at])[0] if ans.largest_at else None) == at


def test_cluster_sums_known_pools_and_names_the_others():
    a = pool_spare(inputs(), NOW)
    b = pool_spare(inputs(knee_requests=20.0, interactive_now=None), NOW)  # ceiling 16: 13, 13, 10, 8, 13, 15
    c = pool_spare(inputs(pool_stale=True), NOW)
    cl = cluster_spare({"a": a, "b": b, "c": c})
    assert cl.unknown == ("c",) and cl.pools == 2
    assert cl.requests == {"now": 17.0, "1h": 17.0, "6h": 8.0, "1d": None}
    assert cl.ceiling == pytest.approx(24.0)
    assert cl.budget_ratio == pytest.approx((4 + 13) / 24)


def test_digest_week_blocks_from_a_hand_made_forecast():
    """knee 10, margin 0.2 (ceiling 8, a block holds >= floor(8/4) = 2): hourly points from a Monday
    00:00, the upper band 1 for six hours, 7 for two, 3 for three, 6.5 for one, then 7.5: spare 7 x 6 h,
    1 x 2 h, 5 x 3 h, 1, then 0. Blocks: 00:00-06:00 (7) and 08:00-11:00 (5)."""
    from monitor.digest.spare_week import spare_week
    monday = 1_799_020_800.0
    upper = [1.0] * 6 + [7.0] * 2 + [3.0] * 3 + [6.5] + [7.5] * 156
    fc = {"defined": True, "_times": np.array([monday + H * k for k in range(len(upper))]),
          "_bands": {0.95: (None, np.array(upper))}}
    sw = spare_week(fc, 10.0, 0.2, monday, "UTC")
    assert sw["least_requests"] == 2.0
    assert [(b["from"], b["to"], b["requests"], b["hours"]) for b in sw["blocks"]] == [
        ("Mon 2027-01-04 00:00 UTC", "Mon 2027-01-04 06:00 UTC", 7.0, 6.0),
        ("Mon 2027-01-04 08:00 UTC", "Mon 2027-01-04 11:00 UTC", 5.0, 3.0)]
    assert spare_week(fc, None, 0.2, monday, "UTC")["defined"] is False


def test_runs_join_gapless_windows_at_their_fewest():
    from monitor.capacity.spare import runs
    ws = pool_spare(inputs(), NOW).windows  # hours 4, 5, 2, (0), 5, 7
    assert spans(runs(ws)) == [(0, 3, 2), (4, 6, 5)]
    assert spans(runs(ws, least=4)) == [(0, 2, 4), (4, 6, 5)]


def test_coarse_grid_holds_the_fewest_through_each_slice():
    from monitor.capacity.spare import coarse
    ws = pool_spare(inputs(), NOW).windows  # hours 4, 5, 2, (0), 5, 7, then no forecast
    assert spans(coarse(ws, NOW, H, 8)) == [(0, 1, 4), (1, 2, 5), (2, 3, 2), (4, 5, 5), (5, 6, 7)]
    assert spans(coarse(ws, NOW, 2 * H, 4)) == [(0, 2, 4), (4, 6, 5)]  # hours 2-4 hold a gap: none


def test_a_point_stands_for_the_hour_after_it_so_the_peak_hour_is_not_offered():
    """Hourly points from now; the load's band 30 except the point at now + 9 h (50): the peak is
    the hour [9 h, 10 h). Ceiling 80 (knee 100): 50 spare every hour but that one, 30 in it."""
    upper = [30.0] * 24
    upper[9] = 50.0
    s = pool_spare(inputs(knee_requests=100.0, timestamps=[NOW + H * k for k in range(24)], upper=upper,
                          interactive_now=30.0), NOW)
    assert spans(s.windows)[:3] == [(0, 9, 50), (9, 10, 30), (10, 24, 50)]
    assert earliest_fit(s.windows, 40, 2 * H).window.start == NOW  # from now: 9 hours of 50 hold 40
    late = pool_spare(inputs(knee_requests=100.0, timestamps=[NOW + H * k for k in range(24)], upper=upper,
                             interactive_now=None, max_age=12 * H), NOW + 8.5 * H)
    assert late.requests["1h"] == 30.0  # the next hour reaches into the peak


def test_deferrable_work_running_now_is_not_counted_twice():
    """The band (60) is of the whole load, the 30 deferrable requests running now included: the
    interactive load is 30, so 80 - max(30, 60 - 30) = 50 fit now, not 80 - 60 = 20."""
    s = pool_spare(inputs(knee_requests=100.0, timestamps=[NOW + H * k for k in range(6)], upper=[60.0] * 6,
                          interactive_now=30.0, deferrable_now=30.0), NOW)
    assert s.requests["now"] == 50.0
    assert s.windows[0].requests == 50.0 and s.windows[1].requests == 20.0  # later hours on the band
    # a NaN deferrable figure takes nothing off the band
    nan = pool_spare(inputs(knee_requests=100.0, timestamps=[NOW + H * k for k in range(6)], upper=[60.0] * 6,
                            interactive_now=30.0, deferrable_now=float("nan")), NOW)
    assert nan.requests["now"] == 20.0
