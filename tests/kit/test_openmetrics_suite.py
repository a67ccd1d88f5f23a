"""The official OpenMetrics parser test suite, case by case, against headroom's exposition parser.

The cases are prometheus/OpenMetrics tests/testdata/parsers (Apache-2.0), copied verbatim into
tests/fixtures/openmetrics/parsers; SOURCES.md there names the commit. Each case is a directory with
the body (`metrics`) and `test.json`, whose `shouldParse` says whether a conforming parser accepts it.

The body is read in OpenMetrics mode: `parse(text, openmetrics=True)`, as for a response whose
Content-Type is application/openmetrics-text (without it, headroom tells OpenMetrics by `# EOF`).

- must parse: headroom does not raise, and reads every series prometheus_client's OpenMetrics parser
  reads, with the same name, labels and value; its oldest timestamp is prometheus_client's oldest.
  The fast path (`wanted` = every sample name) reads the same samples as the full read.
- must fail: headroom raises ExpositionError or counts an anomaly on the scrape; and whatever it
  returns (on the full read and on the fast path) is what the line literally says.

Deliberate differences from prometheus_client, each harmless for what headroom reads:
- exemplars are checked (grammar, finite timestamp, 128-character label limit, allowed only on
  buckets and counter totals) but not kept: headroom reads sample values only. Cases:
  counter_exemplars, counter_exemplars_empty_brackets, exemplars_wide_chars,
  exemplars_with_hash_in_label_values, gaugehistogram_exemplars, histogram_exemplars.
- per-sample timestamps are not kept; the scrape keeps the oldest one (`oldest_timestamp`), which
  is compared instead. Cases: timestamps, info_timestamps, duplicate_timestamps_*, counter_exemplars*.
- a series written again at another timestamp is another point of it, read as prometheus_client
  reads it (to the nanosecond: duplicate_timestamps_0); a series written again at the same instant
  is read once and counted as `duplicate_series` (EXPECTED_ANOMALIES below). The fast path (the
  readers') keeps one point per series, its newest (`ParsedScrape.keep_newest`).
- the OpenMetrics rules about families (metadata placement and repetition, units, clashing names,
  grouping, counter/bucket/info/stateset values, histogram structure, le/quantile labels) are counted
  as `openmetrics_*` anomalies on the scrape (ParsedScrape.anomalies) rather than refusing it: every
  value is still read as written. Lines outside the OpenMetrics grammar are refused.
- the fast path (`wanted`, what the vLLM, gateway and DCGM readers use) stays a fast path: it reads
  the wanted lines as strictly as the text format asks and skips the rest, but it does not check the
  OpenMetrics family rules or the OpenMetrics spacing (one blank exactly) on them. So on a must-fail
  case it may return samples without refusing; the test holds it to "never mis-read" only: each
  sample it returns is the value its line literally says.
"""
import json
import math
import re
from pathlib import Path

import pytest

# _parse_sample (one line, no family rules) is private to prometheus_client; it reads the literal
# value of a line for the must-fail cases, which the public parser refuses whole.
from prometheus_client.openmetrics.parser import _parse_sample, text_string_to_metric_families

from monitor.kit.exposition import ExpositionError, parse

SUITE = Path(__file__).parents[1] / "fixtures" / "openmetrics" / "parsers"


def _load():
    cases = {}
    for d in sorted(SUITE.iterdir()):
        spec = json.loads((d / "test.json").read_text(encoding="utf-8"))
        assert spec["type"] == "text" and spec["file"] == "metrics", d.name
        with open(d / spec["file"], encoding="utf-8", newline="") as f:
            cases[d.name] = (spec["shouldParse"], f.read())
    return cases


CASES = _load()
GOOD = sorted(n for n, (ok, _) in CASES.items() if ok)
BAD = sorted(n for n, (ok, _) in CASES.items() if not ok)

# must-parse cases whose scrape carries an anomaly, and why
EXPECTED_ANOMALIES = {
    "duplicate_timestamps_0": {"duplicate_series": 2},  # a series repeated at the same nanosecond
    "duplicate_timestamps_1": {"duplicate_series": 3},  # a series repeated at the same timestamp
}
def _key(name, labels):
    return name, tuple(sorted(labels.items()))


def _same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


def _points(scrape):
    """Every sample read, sorted by series (stable: a series' points in the order written)."""
    return sorted(((_key(n, lb), v) for n, rows in scrape.samples.items() for lb, v in rows), key=lambda r: r[0])


def _rows(scrape):
    return {_key(n, lb): v for n, rows in scrape.samples.items() for lb, v in rows}


def _sample_names(text):
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ \t]", text, re.M)}


_LINE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})?(.*)')


def _literal(text):
    """Each sample line read on its own by prometheus_client (no family rules): {series: value of its
    first line}. A line that breaks only the spacing, a trailing label comma or its exemplar is
    read with those set right first (its name, labels and value tokens unchanged)."""
    out = {}
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        try:
            s = _parse_sample(line)
        except Exception:
            m = _LINE.fullmatch(line)
            if m is None:
                continue
            name, labels, rest = m.groups()
            labels = (labels or "").replace(",}", "}")
            try:
                s = _parse_sample(name + labels + " " + " ".join(rest.split(" # ")[0].split()))
            except Exception:
                continue
        out.setdefault(_key(s.name, s.labels), s.value)
    return out


def test_suite_is_complete():
    assert len(CASES) == 211 and len(GOOD) == 44 and len(BAD) == 167


@pytest.mark.parametrize("case", GOOD)
def test_must_parse_case_reads_as_prometheus_client(case):
    _, text = CASES[case]
    ref, stamps = [], []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            ref.append((_key(s.name, s.labels), s.value))  # every point, a series at several instants too
            if s.timestamp is not None:
                stamps.append(float(s.timestamp))
    full = parse(text, openmetrics=True)
    assert full.openmetrics
    got = _points(full)
    assert [k for k, _ in got] == sorted(k for k, _ in ref), case
    for (key, value), (_, want) in zip(got, sorted(ref, key=lambda r: r[0])):
        assert _same(value, want), (case, key, value, want)
    assert full.anomalies == EXPECTED_ANOMALIES.get(case, {}), case
    if stamps:
        assert full.oldest_timestamp == pytest.approx(min(stamps), abs=1e-9)
    else:
        assert full.oldest_timestamp is None
    fast = parse(text, wanted={n for (n, _), _ in ref}, openmetrics=True)
    full.keep_newest()  # the fast path (the readers') keeps one point per series, its newest
    fast_rows, newest = _points(fast), _points(full)
    assert [k for k, _ in fast_rows] == [k for k, _ in newest], case
    assert all(_same(a, b) for (_, a), (_, b) in zip(fast_rows, newest)), case
    assert fast.oldest_timestamp == full.oldest_timestamp, case


@pytest.mark.parametrize("case", BAD)
def test_must_fail_case_is_refused_or_flagged_never_misread(case):
    _, text = CASES[case]
    with pytest.raises(Exception):  # noqa: B017 - the reference refuses it too, with an error type of its own
        list(text_string_to_metric_families(text))
    literal = _literal(text)
    try:
        full = parse(text, openmetrics=True)
    except ExpositionError as exc:
        assert str(exc) and exc.reason in ("parse", "truncated")
    else:
        assert full.anomalies, f"{case}: accepted without an anomaly"
        for key, value in _rows(full).items():
            assert key in literal and _same(value, literal[key]), (case, key, value)
    try:
        fast = parse(text, wanted=_sample_names(text), openmetrics=True)
    except ExpositionError:
        return
    for key, value in _rows(fast).items():
        assert key in literal and _same(value, literal[key]), (case, key, value)


def test_openmetrics_mode_needs_eof():
    with pytest.raises(ExpositionError) as info:
        parse("", openmetrics=True)
    assert info.value.reason == "truncated"
    with pytest.raises(ExpositionError) as info:
        parse("# TYPE a gauge\na 1\n", openmetrics=True)
    assert info.value.reason == "truncated"
    assert parse("# TYPE a gauge\na 1\n").get("a") == [({}, 1.0)]  # the text format, told by no # EOF
