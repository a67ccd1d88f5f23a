"""OpenMetrics 1.0 rules, checked on full reads of an OpenMetrics body (monitor/kit/exposition.py
`parse`): a line outside the grammar raises `ExpositionError`, a broken family rule is counted as an
anomaly. The rules follow the specification's parser test suite (tests/fixtures/openmetrics) and
prometheus_client's OpenMetrics parser."""
from __future__ import annotations

import math
import re
from typing import Optional

from monitor.kit.exposition_tokens import ExpositionError, ParsedScrape, parse_float, parse_labels

# OpenMetrics 1.0 (https://prometheus.io/docs/specs/om/open_metrics_spec/), checked on full reads of
# an OpenMetrics body; the rules follow the specification's parser test suite
# (tests/fixtures/openmetrics) and prometheus_client's OpenMetrics parser.
_OM_TYPES = {"counter", "gauge", "histogram", "gaugehistogram", "stateset", "info", "summary", "unknown"}
_OM_SUFFIXES = {"counter": ("_total", "_created"), "summary": ("", "_count", "_sum", "_created"),
                "histogram": ("_count", "_sum", "_bucket", "_created"), "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
                "info": ("_info",)}
_OM_COUNTERLIKE = ("_total", "_sum", "_count", "_bucket", "_gcount", "_gsum")  # never NaN (_gsum may be < 0)
_OM_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
_OM_LABELS = r"\{(?:" + _OM_LABEL + r"(?:," + _OM_LABEL + r")*)?\}"
# name[{labels}] SP value [SP timestamp] [SP "#" SP {labels} SP value [SP timestamp]]: single spaces, no trailing blank
_OM_SAMPLE_RE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(" + _OM_LABELS + r")? (\S+)(?: (\S+))?"
                           r"(?: # (" + _OM_LABELS + r") (\S+)(?: (\S+))?)?")
_OM_META_RE = re.compile(r"# (HELP|TYPE|UNIT) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)")


_Group = tuple[tuple[str, str], ...]  # a sample's labels, sorted: its series group
_Bucket = tuple[str, _Group, Optional[str], float, Optional[float]]  # suffix, group, le, value, timestamp


class _Family:
    """One OpenMetrics metric family while it is read."""
    __slots__ = ("name", "type", "unit", "meta", "groups", "group", "group_ts", "buckets")

    def __init__(self, name: str):
        self.name, self.type, self.unit = name, "unknown", ""
        self.meta: set[str] = set()
        self.groups: set[_Group] = set()
        self.group: Optional[_Group] = None
        self.group_ts: Optional[float] = None
        self.buckets: list[_Bucket] = []  # (suffix, labels, le, value, timestamp) of histogram samples

    def names(self) -> tuple[str, ...]:
        return tuple(self.name + s for s in _OM_SUFFIXES.get(self.type, ("",)))


def check_openmetrics(text: str, out: ParsedScrape) -> None:
    """Raise on a line outside the OpenMetrics grammar; count each broken rule as an anomaly."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    claimed: set[str] = set()  # sample names owned by the families read so far
    fam: Optional[_Family] = None
    for lineno, line in enumerate(lines, 1):
        if lineno == len(lines):
            if line != "# EOF":
                raise ExpositionError(f"OpenMetrics ends with {line[:60]!r}, not '# EOF'", line=lineno)
            _close_family(fam, claimed, out)
            break
        if not line:
            raise ExpositionError("blank line in OpenMetrics", line=lineno)
        if line[0] == "#":
            m = _OM_META_RE.fullmatch(line)
            if m is None:
                raise ExpositionError(f"malformed OpenMetrics metadata {line[:60]!r}", line=lineno)
            kind, name, value = m.groups()
            if fam is None or name != fam.name:
                _close_family(fam, claimed, out)
                fam = _Family(name)
            elif fam.group is not None:
                out.anomaly("openmetrics_metadata")  # metadata after the family's samples
            if kind in fam.meta:
                out.anomaly("openmetrics_metadata")  # a second HELP, TYPE or UNIT
            fam.meta.add(kind)
            if kind == "TYPE":
                if value != value.strip() or not value:
                    raise ExpositionError(f"malformed OpenMetrics type {value[:40]!r}", line=lineno)
                if value not in _OM_TYPES:
                    out.anomaly("openmetrics_metadata")  # e.g. `untyped` (text format only)
                fam.type = value if value in _OM_TYPES else "unknown"
            elif kind == "UNIT":
                fam.unit = value
            continue
        m = _OM_SAMPLE_RE.fullmatch(line)
        if m is None:
            raise ExpositionError(f"malformed OpenMetrics sample line {line[:60]!r}", line=lineno)
        name, label_text, value_text, ts_text, ex_labels, ex_value, ex_ts = m.groups()
        labels = parse_labels(label_text[1:], lineno) if label_text else {}
        value = parse_float(value_text, lineno)
        ts = None
        for stamp in (ts_text, ex_ts):
            if stamp is not None and not math.isfinite(parse_float(stamp, lineno)):
                raise ExpositionError(f"bad timestamp {stamp[:40]!r}", line=lineno)
        if ts_text is not None:
            ts = float(ts_text)
        if ex_labels is not None:
            parse_float(ex_value, lineno)
            exemplar = parse_labels(ex_labels[1:], lineno)
            if sum(len(k) + len(v) for k, v in exemplar.items()) > 128:
                out.anomaly("openmetrics_exemplar")  # exemplar label set over 128 characters
        if fam is None or name not in fam.names():
            _close_family(fam, claimed, out)
            fam = _Family(name)
        _check_om_sample(fam, name[len(fam.name):], labels, value, ts, ex_labels is not None, out)


def _canonical_number(text: str) -> Optional[float]:
    """The float of an `le`/`quantile` label value; None if it is not one (or +Inf spelled otherwise)."""
    try:
        v = float(text)
    except ValueError:
        return None
    return None if math.isnan(v) or (v == math.inf and text != "+Inf") or "_" in text else v


def _check_om_sample(fam: _Family, suffix: str, labels: dict[str, str], value: float, ts: Optional[float],
                     exemplar: bool, out: ParsedScrape) -> None:
    typ = fam.type
    group = labels
    if typ == "stateset":
        if fam.name not in labels:
            out.anomaly("openmetrics_labels")  # a stateset sample names its state in a label
        if value not in (0.0, 1.0):
            out.anomaly("openmetrics_value")
        group = {k: v for k, v in labels.items() if k != fam.name}
    elif typ == "info":
        group = {}
        if value != 1.0:
            out.anomaly("openmetrics_value")
    elif typ == "summary" and suffix == "":
        q = _canonical_number(labels.get("quantile", "-1"))
        if q is None or not 0.0 <= q <= 1.0:
            out.anomaly("openmetrics_labels")
        if value < 0:
            out.anomaly("openmetrics_value")
        group = {k: v for k, v in labels.items() if k != "quantile"}
    if suffix == "_bucket":
        if _canonical_number(labels.get("le", "NaN")) is None:
            out.anomaly("openmetrics_labels")
        group = {k: v for k, v in labels.items() if k != "le"}
    if suffix in ("_bucket", "_count", "_gcount") and not float(value).is_integer():
        out.anomaly("openmetrics_value")  # bucket and count values are integers
    if suffix in _OM_COUNTERLIKE and (math.isnan(value) or (value < 0 and suffix != "_gsum")):
        out.anomaly("openmetrics_value")
    if exemplar and not ((typ in ("histogram", "gaugehistogram") and suffix == "_bucket")
                         or (typ == "counter" and suffix == "_total")):
        out.anomaly("openmetrics_exemplar")  # only buckets and counter totals carry exemplars
    key = tuple(sorted(group.items()))
    if fam.group is not None and key != fam.group and key in fam.groups:
        out.anomaly("openmetrics_grouping")  # a series group interleaved with another
    elif key == fam.group and ((ts is None) != (fam.group_ts is None)
                               or (ts is not None and fam.group_ts is not None and ts < fam.group_ts and typ != "info")):
        out.anomaly("openmetrics_grouping")  # timestamps mixed or going backwards within a group
    fam.group, fam.group_ts = key, ts
    fam.groups.add(key)
    if typ in ("histogram", "gaugehistogram"):
        fam.buckets.append((suffix, key, labels.get("le"), value, ts))


def _close_family(fam: Optional[_Family], claimed: set[str], out: ParsedScrape) -> None:
    if fam is None:
        return
    for name in set(fam.names()) | {fam.name}:
        if name in claimed:
            out.anomaly("openmetrics_metadata")  # two families own this sample name
        claimed.add(name)
    if fam.unit and (not fam.name.endswith("_" + fam.unit) or fam.type in ("info", "stateset")):
        out.anomaly("openmetrics_metadata")  # the unit must end the name, and info/stateset have none
    if fam.buckets and not _histogram_ok(fam.buckets):
        out.anomaly("openmetrics_histogram")


def _histogram_ok(rows: list[_Bucket]) -> bool:
    """Each group of a (gauge) histogram: ascending `le` ending at +Inf, cumulative counts, _count equal
    to the +Inf bucket, _sum (_gsum) exactly when _count (_gcount); _sum only without negative buckets."""
    groups: dict[tuple[_Group, Optional[float]], list[tuple[str, Optional[str], float]]] = {}
    for suffix, key, le, value, ts in rows:
        groups.setdefault((key, ts), []).append((suffix, le, value))
    for samples in groups.values():
        bound, last, count = None, 0.0, None
        has_sum = has_gsum = negative_bucket = negative_gsum = False
        for suffix, le, value in samples:
            if suffix == "_bucket":
                b = _canonical_number(le or "NaN")
                if b is None:
                    continue  # counted already (openmetrics_labels)
                if (bound is not None and b <= bound) or value < last:
                    return False
                negative_bucket |= b < 0
                bound, last = b, value
            elif suffix in ("_count", "_gcount"):
                count = value
            elif suffix == "_sum":
                has_sum = True
            elif suffix == "_gsum":
                has_gsum, negative_gsum = True, negative_gsum or value < 0
        if bound != math.inf and (bound is not None or count is not None or has_sum or has_gsum):
            return False
        if (count is not None and count != last) or ((has_sum or has_gsum) != (count is not None)):
            return False
        if (negative_bucket and has_sum) or (negative_gsum and not negative_bucket):
            return False
    return True
