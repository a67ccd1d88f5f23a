"""What both exposition readers share (monitor/kit/exposition.py, the parser; and
monitor/kit/openmetrics_rules.py, the OpenMetrics 1.0 rules it applies on full reads): the error,
the parsed result, and how a label set and a sample value are read. A module below both, so neither
imports the other's internals.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import AbstractSet, Optional

_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"'
_LABELSET_RE = re.compile(r'\s*(?:' + _PAIR + r'\s*,\s*)*(?:' + _PAIR + r'\s*,?\s*)?\}')
_PAIRS_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_FLOATS = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan, "+inf": math.inf,
           "-inf": -math.inf, "nan": math.nan, "inf": math.inf}


class ExpositionError(ValueError):
    """The body is not valid exposition text. `reason` is a short machine label."""

    def __init__(self, message: str, reason: str = "parse", line: Optional[int] = None):
        super().__init__(message if line is None else f"line {line}: {message}")
        self.reason = reason
        self.line = line


@dataclass
class ParsedScrape:
    """Samples by (normalised) sample name: list of (labels, value)."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # family name -> type
    openmetrics: bool = False
    lines: int = 0
    skipped: int = 0  # sample lines not asked for
    anomalies: dict[str, int] = field(default_factory=dict)  # kind -> count (duplicate_series, ...)
    oldest_timestamp: Optional[float] = None  # the oldest explicit sample timestamp, Unix seconds
    noticed: AbstractSet[str] = field(default_factory=set)  # `parse`'s notice prefixes that start a line
    shared_labels: bool = False  # label dicts from the parser's cache (reused across scrapes, never mutated)
    cut: int = 0  # parse(max_samples=): 1 when wanted sample lines past the cap were left unread
    # (sample name, index in its list) -> (its instant, `exposition._instant`; its timestamp as read),
    # for timestamped samples only: a series may be written at several instants (`keep_newest`)
    instants: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    repeated: set[str] = field(default_factory=set)  # names with a series written twice at one instant, both kept

    def anomaly(self, kind: str, n: int = 1) -> None:
        self.anomalies[kind] = self.anomalies.get(kind, 0) + n

    def stamp(self, written: Optional[float]) -> None:
        """Keep the oldest sample timestamp (seconds; the text format writes milliseconds)."""
        if written is None or not math.isfinite(written):
            return
        seconds = written if self.openmetrics else written / 1000.0
        if self.oldest_timestamp is None or seconds < self.oldest_timestamp:
            self.oldest_timestamp = seconds

    def keep_newest(self) -> None:
        """One point per series: where a series was written at several instants, its newest (a
        sample without a timestamp is the scrape's own, the newest; on a tie, as for a series written
        twice at one instant, the first line's). Other
        series stay as and where they were; the oldest timestamp is then the oldest of those kept."""
        for name in {name for name, _ in self.instants} | self.repeated:
            rows = self.samples[name]
            stamps = {i: self.instants.pop((name, i)) for i in range(len(rows)) if (name, i) in self.instants}
            best: dict[tuple[tuple[str, str], ...], tuple[tuple[float, ...], int]] = {}
            for i, (labels, _value) in enumerate(rows):
                series = tuple(sorted(labels.items()))
                rank: tuple[float, ...] = stamps.get(i, (math.inf,))
                if series not in best or rank > best[series][0]:
                    best[series] = (rank, i)
            kept = sorted(i for _, i in best.values())
            self.samples[name] = [rows[i] for i in kept]
            self.instants.update({(name, new): stamps[old] for new, old in enumerate(kept) if old in stamps})
        self.repeated = set()
        self.oldest_timestamp = None
        for _instant, written in self.instants.values():
            self.stamp(written)

    def get(self, name: str) -> list[tuple[dict[str, str], float]]:
        return self.samples.get(name, [])

    def first(self, name: str) -> Optional[float]:
        s = self.samples.get(name)
        return s[0][1] if s else None


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    out = []
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if c == "\\" and i + 1 < n and value[i + 1] in '\\"n':
            nxt = value[i + 1]
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_labels(text: str, lineno: Optional[int]) -> dict[str, str]:
    """Parse the inside of `{...}` including the closing brace."""
    if not _LABELSET_RE.fullmatch(text):
        raise ExpositionError(f"malformed label set {text[:60]!r}", line=lineno)
    pairs = _PAIRS_RE.findall(text)
    labels = {name: (_unescape(value) if "\\" in value else value) for name, value in pairs}
    if len(labels) != len(pairs):
        raise ExpositionError("duplicate label name", line=lineno)
    return labels


def parse_float(token: str, lineno: Optional[int]) -> float:
    if "_" in token:  # Python's float reads 1_2 as 12; the exposition formats have no digit separators
        raise ExpositionError(f"bad sample value {token[:40]!r}", line=lineno)
    try:
        return float(token)
    except ValueError:
        v = _FLOATS.get(token)
        if v is None:
            raise ExpositionError(f"bad sample value {token[:40]!r}", line=lineno) from None
        return v
