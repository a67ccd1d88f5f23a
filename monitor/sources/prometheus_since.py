"""Prometheus mode reads again only the replicas Prometheus scraped since their last read (issue 42).

A replica's series change only when Prometheus scrapes it: between two scrapes an instant query
answers the same samples. Each cycle asks `up` with its samples' timestamps (`timestamp(up)`: when
each target was last scraped) before the replica series; a replica whose `up` timestamp is the one
seen when its series were last read has nothing new, and its last series are used again (its
readings are made again, stamped with the cycle's time, exactly as a full read would make them).
Only the others are asked for (`instance=~"a|b"`), so at a scrape interval of 60 s and a cycle of
10 s a cycle reads about a sixth of the fleet; at a scrape interval no longer than the cycle's,
every replica, as before.

What keeps it exact:
- `up` is asked first and a scrape's samples are committed together (the head's isolation), so a
  replica whose scrape lands between the two queries is read twice, never missed;
- an instance without an `up` series (series written by remote write without it) cannot be
  judged: while one is seen, every cycle reads the whole fleet;
- the whole fleet is read again at least every FULL_READ_EVERY seconds (a series backfilled or
  out of order, a selector matching other series than `up`'s), after any failed query, when the
  selector changes (a shard's pools), and when narrowing would not pay (more than NARROW_SHARE of
  the known replicas changed, or the matcher would be longer than NARROW_MAX_CHARS: some query
  layers cap a query's length, VictoriaMetrics at 16 KiB by default).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

FULL_READ_EVERY = 300.0  # seconds: Prometheus' lookback; the longest a held series is used unchecked
NARROW_SHARE = 0.5  # more of the known replicas changed than this: read them all
NARROW_MAX_CHARS = 8000  # the instance matcher's longest regex
_META = set("\\.+*?()|[]{}^$")  # RE2's metacharacters (escaped, Prometheus still matches the set by lookups)


SCRAPED = ("hr_up", "scraped_at")  # the label marking `up_query`'s scrape times (`or` ignores the metric name)


def up_query(up_selector: str) -> str:
    """`up` and, beside it (labelled `hr_up="scraped_at"`), when each target was last scraped."""
    return f'{up_selector} or label_replace(timestamp({up_selector}), "{SCRAPED[0]}", "{SCRAPED[1]}", "", "")'



def split_up(answer: list[tuple[dict[str, str], float]], instance_label: str
             ) -> tuple[list[tuple[dict[str, str], float]], dict[str, float]]:
    """(`up`'s samples, instance -> its last scrape's time) of `up_query`'s answer."""
    ups, times = [], {}
    for labels, value in answer:
        if labels.get(SCRAPED[0]) == SCRAPED[1] and "__name__" not in labels:
            times[labels.get(instance_label, "")] = value
        else:
            ups.append((labels, value))
    return ups, times


def _regex_escaped(value: str) -> Optional[str]:
    """`value` as a literal in a PromQL regex string; None when it holds characters left to a full read."""
    if not value or any(c == '"' or not c.isprintable() or ord(c) > 126 for c in value):
        return None
    regex = "".join("\\" + c if c in _META else c for c in value)  # a regex literal (RE2)
    return regex.replace("\\", "\\\\")  # then a PromQL string: each backslash written twice


@dataclass
class Held:
    """An instance's series as last read: when Prometheus had last scraped it then (`up`'s timestamp)
    and its regrouped series (None: the read found none of them, e.g. another shard's replica)."""

    scraped_at: float
    scrape: Any = None  # (ParsedScrape, {pool label: value}) as scrapes_from_vector(keep=...) gives
    present: Optional[dict[str, str]] = None  # its latency histograms found (present_bases)
    series: int = 0


class ReplicaSince:
    """The instances whose series a cycle reads again, and the series held for the others."""

    def __init__(self, instance_label: str = "instance"):
        self.instance_label = instance_label
        self.held: dict[str, Held] = {}
        self.selector: Optional[str] = None  # the selector the held series were read with
        self.full_at: Optional[float] = None  # steady time of the last full read
        self.times: Optional[dict[str, float]] = None  # this cycle's `up` timestamps
        self.asked: Optional[set[str]] = None  # this cycle's narrowed instances (None: a full read)

    def forget(self) -> None:
        """After a failed read: the next one reads the whole fleet."""
        self.held.clear()
        self.full_at = None
        self.times = self.asked = None

    def plan(self, times: Optional[dict[str, float]], selector: str, steady_now: float) -> Optional[str]:
        """This cycle's instance matcher (`instance=~"..."`, "" when no replica changed), or None for a
        full read. `times`: instance -> `up`'s timestamp this cycle (None: `up` did not answer)."""
        self.times, self.asked = times, None
        if (times is None or selector != self.selector or self.full_at is None
                or steady_now - self.full_at >= FULL_READ_EVERY):
            return None
        changed = [inst for inst, at in times.items() if (h := self.held.get(inst)) is None or h.scraped_at != at]
        if len(changed) > NARROW_SHARE * max(1, len(self.held)):
            return None
        escaped = [_regex_escaped(inst) for inst in sorted(changed)]
        if any(e is None for e in escaped):
            return None
        regex = "|".join(escaped)  # type: ignore[arg-type]
        if len(regex) > NARROW_MAX_CHARS:
            return None
        self.asked = set(changed)
        return f'{self.instance_label}=~"{regex}"' if changed else ""

    def merge(self, fresh: dict[str, tuple[Any, dict[str, str]]], present: dict[str, dict[str, str]],
              series: dict[str, int], selector: str, steady_now: float) -> dict[str, tuple[Any, dict[str, str]]]:
        """Every instance's regrouped series this cycle: `fresh` (this read's, with `present` and
        `series` per instance) and, on a narrowed read, those held for the instances not asked for.
        Keeps this read's for the next cycle when every instance read has an `up` timestamp."""
        times = self.times or {}
        if self.asked is None:  # a full read: hold it all, if every instance can be judged
            self.held.clear()
            self.selector, self.full_at = selector, steady_now
            if self.times is None or any(inst not in times for inst in fresh):
                self.forget()
                return fresh
            for inst, at in times.items():
                self.held[inst] = Held(at, fresh.get(inst), present.get(inst), series.get(inst, 0))
            return fresh
        if any(inst not in self.asked for inst in fresh):  # series of an instance not asked for: judge nothing
            out = {inst: h.scrape for inst, h in self.held.items() if h.scrape is not None and inst in times}
            self.forget()
            return {**out, **fresh}
        for inst in [i for i in self.held if i not in times]:  # gone from `up`: its series are gone too
            del self.held[inst]
        for inst in self.asked:
            self.held[inst] = Held(times[inst], fresh.get(inst), present.get(inst), series.get(inst, 0))
        return {inst: h.scrape for inst, h in self.held.items() if h.scrape is not None}

    def present(self) -> dict[str, str]:
        """The latency histograms (canonical base -> stored name) of the instances held."""
        out: dict[str, str] = {}
        for h in self.held.values():
            for base, name in (h.present or {}).items():
                out.setdefault(base, name)
        return out

    def found(self) -> list[dict[str, str]]:
        """Each held instance's latency histograms (canonical base -> stored name)."""
        return [h.present for h in self.held.values() if h.present]

    def series(self) -> int:
        return sum(h.series for h in self.held.values())


def by_instance(vector: list[tuple[dict[str, str], float]], instance_label: str, present_of
                ) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    """(instance -> its latency histograms found, instance -> its series) of a replica answer;
    `present_of`: prometheus_queries.present_bases."""
    counts: dict[str, list] = {}
    series: dict[str, int] = {}
    for labels, value in vector:
        inst = labels.get(instance_label, "")
        series[inst] = series.get(inst, 0) + 1
        if labels.get("__name__", "").endswith("_count"):
            counts.setdefault(inst, []).append((labels, value))
    return {inst: present_of(rows) for inst, rows in counts.items()}, series
