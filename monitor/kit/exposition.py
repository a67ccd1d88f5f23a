"""Fast parser for the Prometheus text format (0.0.4) and OpenMetrics 1.0.

It reads only the sample names it is asked for (everything else is skipped after a prefix check),
but parses those fully: quoted label values with escapes, +Inf/-Inf/NaN, optional timestamps,
OpenMetrics exemplars and the `# EOF` terminator. Label order never matters.

Broken input raises `ExpositionError` naming the line and the problem; a native-histogram item where
a value goes (`{count:..,schema:..}`) is skipped and counted (`native_histogram`); a body cut short (no final
newline, or OpenMetrics without `# EOF`) is reported as truncated, so the caller can mark the target
down instead of deriving from half a scrape.
"""
from __future__ import annotations

import re
from typing import AbstractSet, Iterable, Optional, cast

from monitor.kit.exposition_heads import _runs, add_runs, read_lines
from monitor.kit.exposition_lines import _NATIVE_RE, _NORMALISED, _keep

# the readers' names, theirs from here (explicit re-exports)
from monitor.kit.exposition_lines import VLLM_PREFIXES as VLLM_PREFIXES
from monitor.kit.exposition_lines import native_item as native_item
from monitor.kit.exposition_lines import normalise_name as normalise_name
from monitor.kit.exposition_tokens import ExpositionError as ExpositionError
from monitor.kit.exposition_tokens import ParsedScrape as ParsedScrape
from monitor.kit.exposition_tokens import parse_float as parse_float
from monitor.kit.exposition_tokens import parse_labels
from monitor.kit.openmetrics_rules import check_openmetrics


def parse(text: str, wanted: Optional[Iterable[str]] = None, prefixes: Optional[tuple[str, ...]] = None,
          strict_end: bool = True, openmetrics: Optional[bool] = None, notice: tuple[str, ...] = (),
          max_samples: Optional[int] = None) -> ParsedScrape:
    """Parse exposition text.

    wanted: sample names to keep (normalised spelling, e.g. `vllm:e2e_request_latency_seconds_bucket`);
        None keeps every sample. With `wanted`, unwanted lines are skipped inside one compiled
        regular expression, so their cost is close to zero.
    prefixes: cheap pre-filter on the raw line (e.g. ("vllm",)) when `wanted` is None.
    strict_end: report a body without its final newline (or OpenMetrics without `# EOF`) as truncated.
    openmetrics: True when the caller knows the body is OpenMetrics (its Content-Type said so), so a
        body without `# EOF`, even an empty one, is truncated; None tells OpenMetrics by its `# EOF`.

    An OpenMetrics body read in full (`wanted` None) is also checked against the OpenMetrics 1.0
    rules (`check_openmetrics`): a line outside its grammar raises, a broken rule (misplaced
    metadata, a NaN counter, a histogram without +Inf, ...) is counted as an `openmetrics_*` anomaly.
    The fast path (`wanted`) reads its lines as strictly but leaves the others, and the rules, unread.

    A series written more than once: the full read reads it as the reference parsers do (every point
    of a series written at several timestamps; in the text format one sample per sample line, a
    series written twice at one instant kept twice and counted as `duplicate_series`; in OpenMetrics
    that second line left out and counted). The fast path, what the readers use, keeps one point per
    series, its newest (the first line at one instant): `ParsedScrape.keep_newest`.
    notice: line prefixes (not wanted names) whose presence at the start of some line is reported in
        `noticed` (another engine's names: scrape.py tells the engine by them without a second search).
    max_samples: with `wanted`, read at most this many wanted sample lines: the body is not read past
        them (its end not checked) and `cut` says how many were found beyond (at least 1).
    """
    out = ParsedScrape()
    if not text:
        if openmetrics and strict_end:
            raise ExpositionError("OpenMetrics body is empty (no # EOF)", reason="truncated", line=1)
        return out
    if strict_end and not text.endswith("\n") and not text.endswith("\n# EOF") and text != "# EOF":  # OpenMetrics may end at EOF
        raise ExpositionError("body does not end with a newline (truncated?)", reason="truncated",
                              line=text.count("\n") + 1)
    if wanted is not None:  # one pass of the regex finds the wanted lines and the `# EOF`/`# UNIT ` ones
        wanted = frozenset(wanted)
        rx = _wanted_regex(wanted, notice)
        if max_samples is None and _read_whole(text, out, wanted, notice, rx, strict_end, openmetrics):
            return out
        found = rx.findall("\n" + text) if max_samples is None else _first_found(rx, text, max_samples, out)
        marks = {m[4] for m in found if m[4]}
        if not out.cut:  # a body read to its end: its end checked
            _check_eof(text, out, strict_end, openmetrics, marks)
        if notice:
            out.noticed = marks.intersection(notice)
        _read_wanted(found, out)
        if out.instants:  # a series written at several timestamps: the readers take its newest point
            out.keep_newest()
        out.shared_labels = True  # readers may key their own work on these dicts' identity
        return out
    _check_eof(text, out, strict_end, openmetrics, None)
    out.noticed = {p for p in notice if text.startswith(p) or "\n" + p in text}
    for m in _TYPE_RE.finditer("\n" + text):
        out.types[normalise_name(m.group(1))] = m.group(2)
        if m.group(2) not in KNOWN_TYPES:
            out.anomaly("unknown_type")
    lineno = 0
    seen_generic: set[tuple[str | int, ...]] = set()
    for line in text.split("\n"):
        lineno += 1
        if not line or line[0] == "#":
            continue
        out.lines += 1
        if prefixes is not None and not line.startswith(prefixes):
            out.skipped += 1
            continue
        brace = line.find("{")
        space = _blank(line)
        if brace != -1 and (space == -1 or brace < space):
            raw_name, rest = line[:brace], line[brace:]
        elif space == -1:
            raise ExpositionError(f"sample line without a value: {line[:60]!r}", line=lineno)
        else:
            raw_name, rest = line[:space], line[space:]
        rest = _labels_first(rest)
        key = (raw_name, rest.rsplit("}", 1)[0] if rest.startswith("{") else "")
        try:
            _keep(out, raw_name, rest, key, seen_generic, lineno, every_line=not out.openmetrics)
        except ExpositionError:
            if not native_item(rest):
                raise
            out.anomaly("native_histogram")  # that item skipped, the rest of the body read
    if out.openmetrics:
        check_openmetrics(text, out)
    return out


def _labels_first(rest: str) -> str:
    """`name {labels} value`: the blanks before a label set dropped (the rest as it was otherwise)."""
    stripped = rest.lstrip(" \t")
    return stripped if stripped.startswith("{") else rest


def _blank(line: str) -> int:
    """Index of the first space or tab (the separators the text format allows), -1 without one."""
    a, b = line.find(" "), line.find("\t")
    return a if b == -1 else (b if a == -1 else min(a, b))


def _check_eof(text: str, out: ParsedScrape, strict_end: bool, openmetrics: Optional[bool],
               marks: Optional[AbstractSet[str]]) -> None:
    """OpenMetrics' `# EOF`: the last line (the body is OpenMetrics), or a line before the end
    (raises), or missing from a body that is OpenMetrics by its Content-Type or a `# UNIT ` line
    (truncated). `marks`: the `# EOF`/`# UNIT ` lines the fast path's regex found (None: search)."""
    if _last_line(text).rstrip() == "# EOF":
        out.openmetrics = True
    elif text.startswith("# EOF\n") or ("\n# EOF\n" in text if marks is None else "# EOF" in marks):
        eof = 0 if text.startswith("# EOF\n") else text.index("\n# EOF\n") + 1
        raise ExpositionError("content after # EOF", line=text.count("\n", 0, eof) + 2)
    elif strict_end and (openmetrics or text.startswith("# UNIT ")
                         or ("\n# UNIT " in text if marks is None else "# UNIT " in marks)):
        raise ExpositionError("OpenMetrics body without # EOF (truncated?)", reason="truncated")


def _last_line(text: str) -> str:
    """`text.rstrip("\\n").rsplit("\\n", 1)[-1]` without copying the body (twice) to find it."""
    end = len(text)
    while end and text[end - 1] == "\n":
        end -= 1
        if len(text) - end > 64:  # a body of blank lines: the plain way
            return text.rstrip("\n").rsplit("\n", 1)[-1]
    return text[text.rfind("\n", 0, end) + 1:end]


def _first_found(rx: re.Pattern[str], text: str, max_samples: int, out: ParsedScrape) -> list[tuple[str, ...]]:
    """`rx.findall` up to `max_samples` sample lines; one more found sets `out.cut` and ends the search."""
    found: list[tuple[str, ...]] = []
    rows = 0
    for m in rx.finditer("\n" + text):
        groups = m.groups("")
        if groups[0]:
            rows += 1
            if rows > max_samples:
                out.cut = 1
                break
        found.append(groups)
    return found


def _read_whole(text: str, out: ParsedScrape, wanted: frozenset[str], notice: tuple[str, ...],
                plain_rx: re.Pattern[str], strict_end: bool, openmetrics: Optional[bool]) -> bool:
    """The usual body: its wanted lines found whole by one regex and read by their heads
    (`exposition_heads.read_lines`). False, with `out` untouched, when a line is not in the plain
    form (or the body breaks a rule the line-by-line reader counts): the caller reads it as before."""
    rx, markset = _lines_regex(wanted, notice)
    found = rx.findall("\n" + text)
    if markset.isdisjoint(found):
        marks: set[str] | frozenset[str] = set()
    else:
        marks = markset.intersection(found)
        found = [f for f in found if f not in markset]
    if not read_lines(found, out, plain_rx, _label_cache()):  # `out` untouched when it says no
        return False
    _check_eof(text, out, strict_end, openmetrics, marks)  # raises as the line-by-line path would
    if notice:
        out.noticed = marks.intersection(notice)
    out.shared_labels = True
    return True


def _lines_regex(wanted: frozenset[str], notice: tuple[str, ...]) -> tuple[re.Pattern[str], frozenset[str]]:
    """One regex finding every wanted sample line whole (its name, then a label set or a blank, then
    the rest of the line), and the `# EOF`, `# UNIT ` and `notice` marks (returned as a set: no
    wanted line is one of them, each holding a blank or a brace after its name)."""
    key = ("lines", wanted, notice)
    rx = _REGEX_CACHE.get(key)
    if rx is None:
        marks = "".join("|" + re.escape(p) for p in notice)
        rx = re.compile(r"\n(" + _trie(_spellings(wanted)) + r"[{ \t][^\n]*|# EOF(?=\n)|# UNIT " + marks + ")")
        if len(_REGEX_CACHE) > 64:
            _REGEX_CACHE.clear()
        _REGEX_CACHE[key] = rx
    return rx, frozenset(("# EOF", "# UNIT ") + tuple(notice))


def _label_cache() -> dict[str, dict[str, str]]:
    if len(_LABEL_CACHE) > _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()
    return _LABEL_CACHE


def _read_wanted(found: list[tuple[str, ...]], out: ParsedScrape) -> None:
    """The fast path: every wanted sample line, as found by one regex (`_wanted_regex`).

    A plain line (`name[{labels}] value`, no timestamp, no `#`) comes back split by the regex:
    name, label text, value. Any other wanted line comes back whole and is read as before, the
    unusual ones (timestamp, exemplar, broken) by the strict `_keep`, which names the problem."""
    cache = _LABEL_CACHE
    if len(cache) > _LABEL_CACHE_MAX:
        cache.clear()
    if found and _read_plain(found, out, cache):
        return
    samples = out.samples
    normalised = _NORMALISED
    seen: set[tuple[str | int, ...]] = set()
    for raw_name, label_text, token, rest, mark in found:
        if mark:
            continue
        if not rest:  # the plain form: the line's only `}` closes its label set
            key = (raw_name, label_text[:-1])
            if key in seen:
                out.anomaly("duplicate_series")
                continue
            seen.add(key)
            if label_text:
                labels = cache.get(label_text)
                if labels is None:
                    labels = cache[label_text] = parse_labels(label_text[1:], None)
            else:
                labels = {}
        else:
            got = _wanted_line(raw_name, rest, seen, cache, out)
            if got is None:
                continue
            labels, token = got
        try:
            value = float(token) if "_" not in token else parse_float(token, None)
        except ValueError:
            value = parse_float(token, None)
        name = normalised.get(raw_name) or normalise_name(raw_name)
        bucket = samples.get(name)
        if bucket is None:
            samples[name] = [(labels, value)]
        else:
            bucket.append((labels, value))


def _read_plain(found: list[tuple[str, ...]], out: ParsedScrape, cache: dict[str, dict[str, str]]) -> bool:
    """`_read_wanted` for the usual body, a column at a time (C-level map and zip rather than a
    Python step per line): every wanted line in the plain form, no series twice, every value a
    number and every label set read before (or readable). Anything else returns False with `out`
    untouched, and the line-by-line loop reads the body (and names the first problem, as ever)."""
    names, label_texts, tokens, rests, marks = zip(*found)
    if any(marks):
        found = [f for f in found if not f[4]]
        if not found:
            return True
        names, label_texts, tokens, rests, _ = zip(*found)
    if any(rests) or "_" in "".join(tokens):
        return False
    runs = _runs(names, label_texts)  # None: a series twice, or a name in two runs
    if runs is None:
        return False
    try:
        values = list(map(float, tokens))
    except ValueError:
        return False
    labels = list(map(cache.get, label_texts))
    if None in labels:  # a label set not read before (the first scrape of a target, mostly)
        for i, text in enumerate(label_texts):
            if labels[i] is None:
                try:
                    labels[i] = cache[text] = parse_labels(text[1:], None) if text else {}
                except ExpositionError:
                    return False
    rows = cast("list[tuple[dict[str, str], float]]", list(zip(labels, values)))  # every label set read above
    normalised = _NORMALISED
    add_runs(out.samples, rows, [(normalised.get(raw) or normalise_name(raw), start, end) for raw, start, end in runs])
    return True


def _wanted_line(raw_name: str, rest: str, seen: set[tuple[str | int, ...]], cache: dict[str, dict[str, str]],
                 out: ParsedScrape) -> Optional[tuple[dict[str, str], str]]:
    """A wanted line not in the plain form: (labels, value token) to add, or None when it
    was a duplicate or was read by the strict `_keep` (timestamp, exemplar, malformed)."""
    if rest[0] != "{":
        rest = _labels_first(rest)
    key = (raw_name, rest.rsplit("}", 1)[0] if rest[0] == "{" else "")
    if (_NATIVE_RE.match(rest) or rest.count("{") > 1) and native_item(rest):
        out.anomaly("native_histogram")  # that item skipped, the rest of the body read
        return None
    if "#" in rest:
        _keep(out, raw_name, rest, key, seen)  # exemplar (or '#' in a label value)
        return None
    if rest[0] == "{":
        close = rest.rfind("}")
        if close <= 0:
            _keep(out, raw_name, rest, key, seen)  # the strict reader names the problem
            return None
        label_text, tail = rest[:close + 1], rest[close + 1:]
    else:
        label_text, tail = "", rest
    tokens = tail.split()
    if len(tokens) != 1:
        _keep(out, raw_name, rest, key, seen)  # timestamp, exemplar or malformed
        return None
    if key in seen:
        out.anomaly("duplicate_series")
        return None
    seen.add(key)
    labels = cache.get(label_text) if label_text else {}
    if labels is None:
        labels = cache[label_text] = parse_labels(label_text[1:], None)
    return labels, tokens[0]


KNOWN_TYPES = {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset",
               "gaugehistogram"}
_TYPE_RE = re.compile(r"\n# TYPE[ \t]+(\S+)[ \t]+(\S+)")
_REGEX_CACHE: dict[tuple[object, ...], re.Pattern[str]] = {}


_LABEL_CACHE: dict[str, dict[str, str]] = {}
_LABEL_CACHE_MAX = 200_000  # label sets repeat from scrape to scrape; bounded so memory is too


def _wanted_regex(wanted: frozenset[str], notice: tuple[str, ...] = ()) -> re.Pattern[str]:
    """One regex finding every wanted sample line: its name, then either the plain form
    `[{labels}] value` split into (label text, value), or any other line's rest, for `_wanted_line`;
    and the `# EOF` and `# UNIT ` lines (`_check_eof`), so the body is read once. The names are one
    trie (`_trie`): a line that is not wanted fails on its first characters, whatever their number.
    The `notice` prefixes are marks too (`parse`'s `noticed`)."""
    rx = _REGEX_CACHE.get((wanted, notice))
    if rx is None:
        names = _trie(_spellings(wanted))
        # plain: a label set without `}`, `#` or a newline inside, then one value without `{`, `}`,
        # `#` or blanks; the blanks around it are what str.split() skips (re's \s is the same set)
        plain = r"(?:[ \t]*(\{[^\n#}]*\})|[ \t])[^\S\n]*([^\s#{}]+)[^\S\n]*(?=\n|\Z)"
        marks = "".join("|" + re.escape(p) for p in notice)
        rx = re.compile(r"\n(?:(" + names + r")(?:" + plain + r"|([{ \t][^\n]*))|(# EOF(?=\n)|# UNIT " + marks + "))")
        if len(_REGEX_CACHE) > 64:
            _REGEX_CACHE.clear()
        _REGEX_CACHE[(wanted, notice)] = rx
    return rx


def _spellings(wanted: frozenset[str]) -> set[str]:
    """The wanted names and every other spelling of vLLM's prefix (VLLM_PREFIXES)."""
    alts: set[str] = set()
    for name in wanted:
        alts.add(name)
        if name.startswith("vllm:"):
            alts.update(prefix + name[5:] for prefix in VLLM_PREFIXES)
    return alts


_Trie = dict[str, "_Trie"]  # a trie node: each next character -> its node, "" -> {} where a word ends


def _trie(words: Iterable[str]) -> str:
    """A regex alternation matching exactly `words`, shared prefixes factored out (Python's re tries
    the branches of a flat alternation one by one: 60 names cost 60 tries on every line)."""
    root: _Trie = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}
    return _trie_node(root)


def _trie_node(node: _Trie) -> str:
    branches = []
    for ch in sorted(k for k in node if k):
        sub, text = node[ch], re.escape(ch)
        while len(sub) == 1 and "" not in sub:  # a chain with one way on: one literal
            (ch2, sub), = sub.items()
            text += re.escape(ch2)
        branches.append(text + _trie_node(sub))
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return "(?:" + body + ")?" if "" in node else body
