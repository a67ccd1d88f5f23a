"""The `forecast:` and `calendar:` sections: which days are not working days, for the forecasts.

    calendar:
      timezone: Europe/Berlin        # the zone the dates are in (default UTC)
      country: DE                    # public holidays from the `holidays` library (optional)
      subdivision: BY                # a state or region of it (optional)
      non_working: [2026-12-24, 2026-12-28, 2026-12-29, 2026-12-30]   # a company shutdown
      recurring: ["12-24", "12-31"]  # every year (MM-DD)
      weekend: [sat, sun]

A holiday is forecast as a non-working day, and the backtest scores it so (monitor/forecast/calendar.py).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from monitor.kit.settings.kinds import Kind, Number, Subset, Text, Timezone
from monitor.kit.settings.reader import Reader, key
from monitor.kit.settings.shapes import ListOf

if TYPE_CHECKING:
    from .calendar import Calendar

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Day(Kind):
    name = "date (YYYY-MM-DD)"

    def parse(self, v: Any) -> dt.date:
        if isinstance(v, dt.datetime):
            v = v.date()
        if isinstance(v, dt.date):
            return v
        if isinstance(v, str):
            try:
                return dt.date.fromisoformat(v.strip())
            except ValueError:
                pass
        raise ValueError(f"expected a date like 2026-12-24, got {v!r}")


class MonthDay(Kind):
    name = "month-day (MM-DD)"

    def parse(self, v: Any) -> tuple[int, int]:
        if isinstance(v, str) and len(v.strip()) == 5 and v.strip()[2] == "-":
            try:
                month, day = int(v[:2]), int(v[3:])
                dt.date(2024, month, day)  # a leap year: 02-29 is a date
                return month, day
            except ValueError:
                pass
        raise ValueError(f"expected a month and day like \"12-24\" (quoted), got {v!r}")


@dataclass(frozen=True)
class CalendarSection:
    timezone: str = key(Timezone(), "UTC", help="the zone the days are in (IANA name)")
    country: Optional[str] = key(Text(), help="public holidays of this country (ISO code, e.g. DE, US, GB)")
    subdivision: Optional[str] = key(Text(), help="and of this state or region of it (e.g. BY, CA)")
    non_working: list = key(ListOf(Day()), [], help="dates that are not working days (a shutdown, a bridge day)")
    recurring: list = key(ListOf(MonthDay()), [], help="month-days that are never working days (\"12-24\")")
    weekend: tuple = key(Subset(WEEKDAYS), ("sat", "sun"), help="the days of the week nobody works")

    def check(self, r: Reader, at: str) -> None:
        if self.subdivision and not self.country:
            raise r.fail(f"{at}.subdivision", "needs calendar.country")
        if self.country:
            import holidays  # noqa: PLC0415
            supported = holidays.list_supported_countries()
            if self.country not in supported:
                raise r.fail(f"{at}.country", f"not a country the holidays library knows ({self.country!r}; "
                                              f"e.g. {', '.join(sorted(supported)[:6])}, ...)")
            if self.subdivision and self.subdivision not in supported[self.country]:
                raise r.fail(f"{at}.subdivision", f"{self.subdivision!r} is not a subdivision of {self.country} "
                                                  f"({', '.join(supported[self.country][:12])}, ...)")

    def calendar(self) -> "Calendar":
        from .calendar import Calendar  # noqa: PLC0415 - pandas, only when a forecast is built
        return Calendar(self.timezone, frozenset(self.non_working), frozenset(self.recurring), self.country,
                        self.subdivision, frozenset(WEEKDAYS.index(d) for d in self.weekend))


@dataclass(frozen=True)
class Forecast:
    refit_minutes: float = key(Number(gt=0, le=10080), 15.0, help="refit every pool's forecasts every N minutes")
    fit_timeout_seconds: float = key(Number(gt=0, le=3600), 30.0, help="time box of one model fit")
