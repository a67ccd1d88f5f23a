"""The fast path's usual body, read from its wanted lines whole (monitor/kit/exposition.py `parse`).

A wanted line in the plain form is `head value`: its head (name and label set, as written) says
where the value goes, and a replica writes the same heads scrape after scrape (only the values
move). So a line is split at its last space, in C, and the heads are looked up, not read:
- each head, the first time it is seen, is read by the strict plain-form regex (`plain_rx`, the one
  the line-by-line fast path uses) and kept: (raw name, label text, labels);
- each sequence of heads (a body's shape) is kept with its runs of one sample name and the label
  dicts in line order, so a body with a known shape costs the regex that finds its lines, the split,
  one float per value and one slice per name.
Anything else (a value token that is not one plain number, a head that is not plain, a series
twice, a name in two runs) returns False with `out` untouched: the line-by-line reader then reads
the body and names the first problem, as ever.
"""
from __future__ import annotations

import re
from itertools import groupby, repeat
from typing import Optional, Sequence

from monitor.kit.exposition_lines import _NORMALISED, normalise_name
from monitor.kit.exposition_tokens import ExpositionError, ParsedScrape, parse_labels

# a value token that `float` would read but the plain form refuses: blanks (float strips them),
# `#` (an exemplar), braces, `_` (float reads 1_2 as 12)
_BAD_TOKEN = re.compile(r"[\s#{}_]")


def _bad_tokens(joined: str) -> bool:
    """`_BAD_TOKEN.search(joined)` with C-level scans (a third of its time over a body's ~200
    tokens): `str.split` finds the blanks `\\s` does (both by Py_UNICODE_ISSPACE); the ends are
    fenced so a blank there splits too."""
    return ("_" in joined or "#" in joined or "{" in joined or "}" in joined
            or len(("\x00" + joined + "\x00").split(None, 1)) > 1)

_HEADS: dict[str, tuple[str, str, dict[str, str]]] = {}  # head -> (raw name, label text, labels)
_HEADS_MAX = 200_000
# a body's heads in line order -> ([(normalised name, start, end)], labels in line order)
_SHAPES: dict[tuple[str, ...], tuple[list[tuple[str, int, int]], tuple[dict[str, str], ...]]] = {}
_SHAPES_MAX = 256  # each keeps its heads (~20 KB for a vLLM body): bounded so memory is too


def read_lines(lines: list[str], out: ParsedScrape, plain_rx: re.Pattern[str],
               labels_cache: dict[str, dict[str, str]]) -> bool:
    """Every wanted line (`lines`, whole, no `# EOF`/`# UNIT ` marks) into `out.samples`; False
    (and `out` untouched) when some line is not in the plain form or the body breaks a rule the
    line-by-line reader counts or names."""
    if not lines:
        return True
    heads, _, tokens = zip(*map(str.rpartition, lines, repeat(" ")))
    if "" in tokens or _bad_tokens("\x00".join(tokens)):
        return False
    shape = _SHAPES.get(heads)
    if shape is None:
        shape = _shape(lines, heads, tokens, plain_rx, labels_cache)
        if shape is None:
            return False
    runs, labels = shape
    try:
        values = list(map(float, tokens))
    except ValueError:
        return False
    add_runs(out.samples, list(zip(labels, values)), runs)
    return True


def add_runs(samples: dict[str, list[tuple[dict[str, str], float]]], rows: list[tuple[dict[str, str], float]],
             runs: Sequence[tuple[str, int, int]]) -> None:
    """Each run's rows (name, start, end: `rows[start:end]`) under its name in `samples`."""
    for name, start, end in runs:
        bucket = samples.get(name)
        if bucket is None:
            samples[name] = rows[start:end]
        else:  # two spellings of one name (vllm_x and vllm:x)
            bucket.extend(rows[start:end])


def _shape(lines: list[str], heads: tuple[str, ...], tokens: tuple[str, ...], plain_rx: re.Pattern[str],
           labels_cache: dict[str, dict[str, str]]
           ) -> Optional[tuple[list[tuple[str, int, int]], tuple[dict[str, str], ...]]]:
    """A body's shape (kept in `_SHAPES`), its unknown heads read by `plain_rx` first; None when a
    line is not plain (its value not the token after its last space), a label set does not read,
    a series repeats or a name comes back after another's run."""
    names, texts, labels = [], [], []
    for line, head, token in zip(lines, heads, tokens):
        got = _HEADS.get(head)
        if got is None:
            got = _read_head(line, token, plain_rx, labels_cache)
            if got is None:
                return None
            if len(_HEADS) >= _HEADS_MAX:
                _HEADS.clear()
            _HEADS[head] = got
        names.append(got[0])
        texts.append(got[1])
        labels.append(got[2])
    runs = _runs(names, texts)
    if runs is None:
        return None
    normalised = _NORMALISED
    shape = ([(normalised.get(raw) or normalise_name(raw), start, end) for raw, start, end in runs], tuple(labels))
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
    _SHAPES[heads] = shape
    return shape


def _read_head(line: str, token: str, plain_rx: re.Pattern[str], labels_cache: dict[str, dict[str, str]]
               ) -> Optional[tuple[str, str, dict[str, str]]]:
    """(raw name, label text, labels) of a line the plain-form regex reads with `token` as its
    value; None otherwise. Another token after the same head reads the same way (a token has no
    blank, `#`, brace or `_`: `read_lines` checks)."""
    m = plain_rx.match("\n" + line)
    if m is None or m.end() != len(line) + 1:
        return None
    raw_name, label_text, value, rest, mark = m.groups("")
    if rest or mark or value != token:
        return None
    if not label_text:
        return raw_name, "", {}
    got = labels_cache.get(label_text)
    if got is None:
        try:
            got = labels_cache[label_text] = parse_labels(label_text[1:], None)
        except ExpositionError:
            return None
    return raw_name, label_text, got


def _runs(names: Sequence[str], label_texts: Sequence[str]) -> Optional[list[tuple[str, int, int]]]:
    """The runs of one sample name (a family's lines stand together): [(name, start, end)], or None
    when a name comes back after another's run or a label set repeats within a run (a duplicate:
    the line-by-line loop counts it)."""
    runs, start = [], 0
    for raw_name, run in groupby(names):
        end = start + len(list(run))
        if end - start > 1 and len(set(label_texts[start:end])) != end - start:
            return None
        runs.append((raw_name, start, end))
        start = end
    if len({r[0] for r in runs}) != len(runs):
        return None
    return runs
