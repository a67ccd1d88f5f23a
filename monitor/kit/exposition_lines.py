"""The strict reader of one sample line (monitor/kit/exposition.py's parser uses it for every line of a
full read and for the unusual lines of its fast path), and the one spelling of vLLM's names.

A line is read whole: name, label set, value, timestamp, exemplar; a problem raises ExpositionError
naming it. A series written again at another instant is another point of it; at the same instant it
is a duplicate (`duplicate_series`), left out or, on a full read of the text format, kept (`_keep`).
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Optional, cast

from monitor.kit.exposition_tokens import ExpositionError, ParsedScrape, parse_float, parse_labels

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


_NORMALISED: dict[str, str] = {}


# Spellings of vLLM's `vllm:` prefix: scrapers and OpenTelemetry rewrite the colon (`vllm_`); Ray
# Serve re-exports vLLM's metrics through ray.util.metrics, which sanitises the colon and prefixes
# `ray_` (vllm/v1/metrics/ray_wrappers.py: `ray_vllm_x`; some Ray versions keep `ray_vllm:x`).
VLLM_PREFIXES = ("vllm_", "ray_vllm:", "ray_vllm_")


def normalise_name(name: str) -> str:
    """vLLM names are `vllm:x`; any other spelling of the prefix (VLLM_PREFIXES) reads as `vllm:x`."""
    out = _NORMALISED.get(name)
    if out is None:
        out = name
        if name.startswith(VLLM_PREFIXES):
            out = "vllm:" + name.split("vllm", 1)[1][1:]
        if len(_NORMALISED) < 100_000:
            _NORMALISED[name] = out
    return out


def _keep(out: ParsedScrape, raw_name: str, rest: str, key: tuple[str | int, ...], seen: set[tuple[str | int, ...]],
          lineno: Optional[int] = None, every_line: bool = False) -> None:
    """One sample line read by the strict reader (`_read_sample`) and added to `out`. A series read
    already at the same instant is counted as `duplicate_series` and left out, the first kept; with
    `every_line` (a full read of the text format, read as its reference parsers read it: one sample
    per sample line) it is kept all the same, its name in `out.repeated`. The instant is the
    scrape's own for a line without a timestamp, else the one written, to the nanosecond (as
    prometheus_client reads it: `1` and `1.0000000001` are one instant). A series written again at
    another instant is another point of it, kept as the reference parsers keep it, its instant in
    `out.instants` (`ParsedScrape.keep_newest` leaves one point per series)."""
    labels, value, stamp, token = _read_sample(raw_name, rest, lineno)
    instant = None
    if token is not None:
        instant = _instant(token)
        key = key + (instant,)
    name = normalise_name(raw_name)
    if key in seen:
        out.anomaly("duplicate_series")
        if not every_line:
            return
        out.repeated.add(name)
    seen.add(key)
    out.stamp(stamp)
    bucket = out.samples.get(name)
    if bucket is None:
        bucket = out.samples[name] = []
    if instant is not None:
        out.instants[(name, len(bucket))] = (instant, cast(float, stamp))  # a timestamp token: a stamp
    bucket.append((labels, value))


def _instant(token: str) -> int:
    """A timestamp as written, in nanoseconds of its unit, cut (not rounded) past the ninth decimal."""
    return int(Decimal(token).scaleb(9))


def _read_sample(raw_name: str, rest: str, lineno: Optional[int] = None
                 ) -> tuple[dict[str, str], float, Optional[float], Optional[str]]:
    """Parse `{labels} value [timestamp] [# exemplar]` (or ` value ...`) for one sample line:
    (labels, value, timestamp as a number, timestamp as written); the last two None without one."""
    try:
        if not _NAME_RE.match(raw_name):
            raise ExpositionError(f"bad metric name {raw_name[:60]!r}")
        rest = rest.lstrip(" \t")  # blanks may stand between the name and its labels
        if rest.startswith("{"):
            close = rest.rfind("}") if " # " not in rest else _find_close(rest, 0, lineno)
            if close < 0:
                raise ExpositionError("label set not closed")
            labels = parse_labels(rest[1:close + 1], lineno)
            rest = rest[close + 1:]
        else:
            labels = {}
        hash_pos = rest.find(" # ")
        if hash_pos != -1:
            rest = rest[:hash_pos]
        tokens = rest.split()
        if not tokens or len(tokens) > 2:
            raise ExpositionError(f"expected 'value [timestamp]' after {raw_name[:60]!r}")
        value = parse_float(tokens[0], lineno)
        stamp = parse_float(tokens[1], lineno) if len(tokens) == 2 else None
        if stamp is not None and not math.isfinite(stamp):
            raise ExpositionError(f"bad timestamp {tokens[1][:40]!r}")
    except ExpositionError as exc:
        if exc.line is None and lineno is not None:
            raise ExpositionError(str(exc), exc.reason, lineno) from None
        raise
    return labels, value, stamp, (tokens[1] if stamp is not None else None)


_NATIVE_RE = re.compile(r"[ \t]*\{[ \t]*[a-z_]+:")


def native_item(rest: str) -> bool:
    """Whether a sample line's rest (`[{labels}] value...`) holds a native-histogram item where the
    value goes (`{count:12,sum:100.5,schema:0,...}`: Prometheus' text of a native histogram, the
    OpenMetrics 2.0 draft's): not a value this parser reads; its callers skip and count it."""
    text = rest.lstrip(" \t")
    if text.startswith("{") and not _NATIVE_RE.match(text):  # a label set first (no `name:` in one)
        try:
            text = text[_find_close(text, 0, None) + 1:]
        except ExpositionError:
            return False
    return bool(_NATIVE_RE.match(text))


def _find_close(line: str, start: int, lineno: Optional[int]) -> int:
    """Index of the `}` closing the label set opened at `start`, skipping quoted values."""
    i = start + 1
    n = len(line)
    in_quote = False
    while i < n:
        c = line[i]
        if in_quote:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_quote = False
        elif c == '"':
            in_quote = True
        elif c == "}":
            return i
        i += 1
    raise ExpositionError("label set not closed", line=lineno)
