"""The next time a weekly wall-clock schedule names: a day of the week, an hour and a minute in a time
zone (the digest's `digest.schedule`), daylight saving included.

    next_weekly(after, weekday, hour, minute, zone) -> Unix seconds, the first such time after `after`

Each candidate is the local date's wall time read by `zoneinfo` (fold=0, PEP 495), which settles the
two days a year the wall clock is not one-to-one:
- a time the clocks skip (01:30 in London on the last Sunday of March: 01:00 GMT goes to 02:00 BST)
  is read with the offset before the change, so the schedule fires as many seconds after the gap's
  start as the wall time named (02:30 BST); the week is not skipped;
- a time the clocks pass twice (01:30 in New York on the first Sunday of November) fires at its first
  pass only (EDT), never again an hour later.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo


def next_weekly(after: float, weekday: int, hour: int, minute: int, zone: str) -> float:
    """The first time strictly after `after` (Unix seconds) that is `weekday` (0 Monday .. 6 Sunday),
    `hour`:`minute` on the wall clocks of `zone` (an IANA name)."""
    if not (0 <= weekday <= 6 and 0 <= hour <= 23 and 0 <= minute <= 59):
        raise ValueError(f"no such weekly time: weekday {weekday}, {hour:02d}:{minute:02d}")
    tz = ZoneInfo(zone)
    today = datetime.fromtimestamp(after, tz).date()
    first = today + timedelta(days=(weekday - today.weekday()) % 7)
    for day in (first, first + timedelta(days=7)):  # today's time may have passed: then a week later
        fire = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz).timestamp()
        if fire > after:
            return fire
    raise AssertionError("unreachable: a week after today is after `after`")
