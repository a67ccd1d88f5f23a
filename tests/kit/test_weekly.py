"""monitor/kit/weekly.py: the digest's weekly wall-clock time, across the daylight-saving changes of
2026 in Europe/London (29 March 01:00 GMT -> 02:00 BST; 25 October 02:00 BST -> 01:00 GMT) and
America/New_York (8 March 02:00 EST -> 03:00 EDT; 1 November 02:00 EDT -> 01:00 EST). Every expected
value is written as the UTC instant it must be, worked out by hand from those offsets."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from monitor.kit.weekly import next_weekly

MON, SUN = 0, 6
H = 3600.0


def utc(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("zone, after, weekday, hour, minute, expected", [
    # London, Monday 08:00: GMT (UTC+0) the week before spring forward, BST (UTC+1) the week after
    ("Europe/London", utc(2026, 3, 21, 12), MON, 8, 0, utc(2026, 3, 23, 8)),
    ("Europe/London", utc(2026, 3, 28, 12), MON, 8, 0, utc(2026, 3, 30, 7)),
    # London, Monday 08:00 around fall back: BST on 19 October, GMT on 26 October
    ("Europe/London", utc(2026, 10, 17, 12), MON, 8, 0, utc(2026, 10, 19, 7)),
    ("Europe/London", utc(2026, 10, 24, 12), MON, 8, 0, utc(2026, 10, 26, 8)),
    # New York, Monday 09:30: EST (UTC-5) on 2 March, EDT (UTC-4) on 9 March
    ("America/New_York", utc(2026, 2, 28), MON, 9, 30, utc(2026, 3, 2, 14, 30)),
    ("America/New_York", utc(2026, 3, 7), MON, 9, 30, utc(2026, 3, 9, 13, 30)),
    # New York, Monday 09:30 around fall back: EDT on 26 October, EST on 2 November
    ("America/New_York", utc(2026, 10, 24), MON, 9, 30, utc(2026, 10, 26, 13, 30)),
    ("America/New_York", utc(2026, 10, 31), MON, 9, 30, utc(2026, 11, 2, 14, 30)),
    # on the day of the change itself, after it: Sunday 12:00 is BST / EDT / GMT / EST already
    ("Europe/London", utc(2026, 3, 28, 12), SUN, 12, 0, utc(2026, 3, 29, 11)),
    ("America/New_York", utc(2026, 3, 7, 12), SUN, 12, 0, utc(2026, 3, 8, 16)),
    ("Europe/London", utc(2026, 10, 24, 12), SUN, 12, 0, utc(2026, 10, 25, 12)),
    ("America/New_York", utc(2026, 10, 31, 12), SUN, 12, 0, utc(2026, 11, 1, 17)),
    # a time the clocks skip fires as long after the gap's start as the wall time named, never skipped:
    # 01:30 in London on 29 March (01:00 GMT is 02:00 BST) is read as 01:30 GMT = 02:30 BST
    ("Europe/London", utc(2026, 3, 28, 12), SUN, 1, 30, utc(2026, 3, 29, 1, 30)),
    # 02:30 in New York on 8 March (02:00 EST is 03:00 EDT) is read as 02:30 EST = 03:30 EDT
    ("America/New_York", utc(2026, 3, 7, 12), SUN, 2, 30, utc(2026, 3, 8, 7, 30)),
    # a time the clocks pass twice fires at its first pass: 01:30 BST (not GMT), 01:30 EDT (not EST)
    ("Europe/London", utc(2026, 10, 24, 12), SUN, 1, 30, utc(2026, 10, 25, 0, 30)),
    ("America/New_York", utc(2026, 10, 31, 12), SUN, 1, 30, utc(2026, 11, 1, 5, 30)),
])
def test_next_weekly_across_daylight_saving(zone, after, weekday, hour, minute, expected):
    assert next_weekly(after, weekday, hour, minute, zone) == expected


@pytest.mark.parametrize("zone, first, then", [
    ("Europe/London", utc(2026, 10, 25, 0, 30), utc(2026, 11, 1, 1, 30)),  # 01:30 GMT a week later
    ("America/New_York", utc(2026, 11, 1, 5, 30), utc(2026, 11, 8, 6, 30)),  # 01:30 EST a week later
])
def test_a_repeated_hour_fires_once(zone, first, then):
    """After the first pass of 01:30 on the fall-back night, the next fire is next week's 01:30, not
    the second 01:30 an hour later (a digest built twice)."""
    assert next_weekly(first, SUN, 1, 30, zone) == then
    assert next_weekly(first + 0.5 * H, SUN, 1, 30, zone) == then  # between the two passes
    assert next_weekly(first + H, SUN, 1, 30, zone) == then  # at the second pass itself


def test_strictly_after():
    fire = utc(2026, 1, 12, 8)  # a Monday in GMT, a week from the next
    assert next_weekly(fire - 0.001, MON, 8, 0, "Europe/London") == fire
    assert next_weekly(fire, MON, 8, 0, "Europe/London") == fire + 7 * 24 * H
    assert next_weekly(fire - 7 * 24 * H, MON, 8, 0, "Europe/London") == fire  # exactly a week before


@pytest.mark.parametrize("zone", ["Europe/London", "America/New_York", "Asia/Tokyo", "Australia/Lord_Howe"])
def test_a_year_of_fires(zone):
    """60 weeks from one fire to the next: each on the named day and wall time, 7 days apart but for
    the weeks a change falls in (Lord Howe moves its clocks by half an hour), each week once."""
    tz = ZoneInfo(zone)
    t = utc(2026, 1, 1)
    fires = []
    for _ in range(60):
        t = next_weekly(t, MON, 8, 15, zone)
        fires.append(t)
    for f in fires:
        local = datetime.fromtimestamp(f, tz)
        assert (local.weekday(), local.hour, local.minute) == (MON, 8, 15), local
    gaps = {round(b - a) for a, b in zip(fires, fires[1:])}
    week = round(7 * 24 * H)
    assert gaps <= {week, week - 3600, week + 3600, week - 1800, week + 1800}, gaps
    assert len({datetime.fromtimestamp(f, tz).date() for f in fires}) == 60
    assert all(b - a > 6 * 24 * H for a, b in zip(fires, fires[1:]))


@pytest.mark.parametrize("args", [(7, 8, 0), (-1, 8, 0), (MON, 24, 0), (MON, 8, 60)])
def test_no_such_time_is_refused(args):
    with pytest.raises(ValueError, match="no such weekly time"):
        next_weekly(0.0, *args, "UTC")


def test_the_digest_schedule_uses_it():
    """monitor/digest/schedule.py weekly_fire_times: the digest's day, hour, minute and time zone."""
    from monitor.digest.schedule import weekly_fire_times
    from monitor.digest.settings import from_dict
    settings = from_dict({"schedule": {"day_of_week": "sunday", "hour": 2, "minute": 30,
                                       "timezone": "America/New_York"}}, "<test>")
    next_fire = weekly_fire_times(settings)
    assert next_fire(utc(2026, 3, 7, 12)) == utc(2026, 3, 8, 7, 30)  # the absent 02:30: 03:30 EDT
    assert next_fire(utc(2026, 3, 8, 7, 30)) == utc(2026, 3, 15, 6, 30)  # 02:30 EDT a week later
    assert timedelta(seconds=next_fire(utc(2026, 3, 8, 7, 30)) - utc(2026, 3, 8, 7, 30)) == timedelta(days=6, hours=23)
