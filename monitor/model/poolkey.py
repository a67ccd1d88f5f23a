"""A pool's identity: one canonical string key, used everywhere a pool is named.

`global.pool_by` lists the labels that make a pool, e.g. `[cluster, model_name]`. The LAST label
names the pool (the `pool` label, as with a single label); every other label is carried beside it
(`cluster="a"`). The key is the one value every layer stores, compares, hashes and writes:

    pool_by [model_name]            -> "meta-llama/Llama-3.1-8B"              (unchanged, byte for byte)
    pool_by [cluster, model_name]   -> 'meta-llama/Llama-3.1-8B{cluster="a"}'

So the same model in two clusters is two keys (two pools, two histories, two forecasts, two shard
owners), and `labels_of(key)` gives back the exported labels: {"pool": name, "cluster": "a"}.

Why a key is never mis-parsed, whatever its label values hold. A label value is any text: a target
may name its model `evil{replica="x"}`, which is also the key of the pool "evil" carrying
`replica="x"`. If every plain name kept its bytes, no reader of the text alone could tell the two
apart (every string would be somebody's plain name), and one such value froze every render for an
hour (issue 38). The key therefore has two forms, and the writer picks, never the reader:

    raw     name + '{k="v",...}'    (the suffix only with extra labels)  -- what it always was
    quoted  '"' + escaped name + '"' + '{k="v",...}'                      -- only when raw would lie

`make_key` builds the raw form, reads it back with the one reader (`split`), and keeps it only when
the reading gives back exactly (name, labels) and the raw form does not begin with `"`; otherwise it
writes the quoted form. `split` reads a key beginning with `"` strictly (the name's escapes `\\`,
`\"`, `\n` only, then `{k="v",...}` strictly or nothing), every other key as before. So for every
name and labels: split(make_key(name, labels)) == (name, labels) -- for a raw key by the check made
when it was written, for a quoted key because the strict reader is the exact inverse of the quoting
(and a raw key never begins with `"`, so the two forms never meet). That is all the proof needs: the
reader is a function, the writer checks it (label names are Prometheus label names: pool_by's are
checked when the configuration is read). Ordinary names (no `"` first, no `{...}` tail that reads
as labels) keep their keys byte for byte, so existing stores, histories, shard owners, digests and
the JSON read the same; a name that would be mis-read gets a new, quoted key (its old series in a
store are not carried over: before this they could not be rendered at all).

Why a text key and not a structure: the key crosses the store, the shard hash, the history read
from Prometheus, the digest and the JSON as text; a structure would need an encoding at each of
those edges anyway, with the same proof to make. One encoding, checked where it is written, is the
smaller change, and callers keep `split` / `name_of` / `labels_of` / `extras_of` as they were.
"""
from __future__ import annotations

import re
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from monitor.kit.settings.kinds import Kind

MODEL_LABELS = ("model_name", "model")
DEFAULT_POOL_BY = ("model_name",)
# a Prometheus label name (a pool_by label must be one: it becomes an exported label)
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED = ("pool", "replica", "__name__")
LABEL_NAME_AT = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')  # a label name and its opening quote
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
PoolBy = Union[str, Sequence[str]]


def normalise(pool_by: Optional[PoolBy]) -> tuple[str, ...]:
    """pool_by as a tuple of labels: a string is one label; None or empty is the model name."""
    if pool_by is None:
        return DEFAULT_POOL_BY
    if isinstance(pool_by, str):
        return (pool_by,)
    return tuple(pool_by) or DEFAULT_POOL_BY


def extra_labels(pool_by: Optional[PoolBy]) -> tuple[str, ...]:
    """The labels carried beside `pool`: every pool_by label but the last."""
    return normalise(pool_by)[:-1]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _suffix(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}" if pairs else ""


def make_key(name: str, extra: Mapping[str, str] = MappingProxyType({}), order: Iterable[str] = ()) -> str:
    """The canonical key of pool `name` with its extra labels (in `order`, else sorted): the raw form
    when it reads back as exactly this, else the quoted form (module docstring)."""
    extra = dict(extra)
    names = [k for k in order if k in extra] or sorted(extra)
    pairs = tuple((k, extra[k]) for k in names)
    if not pairs and not (name.endswith("}") or name.startswith('"')):
        return name  # the common case, without a look-up: no tail to mis-read, not the quoted form
    raw = name + _suffix(pairs)
    if not raw.startswith('"') and split(raw) == (name, pairs):
        return raw
    return '"' + _escape(name) + '"' + _suffix(pairs)


def key_of(labels: Mapping[str, str], model: str, pool_by: Optional[PoolBy]) -> str:
    """The key of a replica (or a series) with these labels serving `model`: the last pool_by
    label's value names it (the model for model_name / model, or when the label is absent); every
    other pool_by label's value is carried (empty when absent: the same as Prometheus)."""
    by = normalise(pool_by)
    last = by[-1]
    name = model if last in MODEL_LABELS else (labels.get(last) or model)
    if len(by) == 1:
        return make_key(name)
    extra = {label: (model if label in MODEL_LABELS else labels.get(label, "")) for label in by[:-1]}
    return make_key(name, extra, by[:-1])


def _read_quoted(text: str, at: int) -> Optional[tuple[str, int]]:
    """The escaped text of `text` from `at` (just after an opening quote) to its closing quote, read
    strictly (only \\\\, \\" and \\n), and the index after that quote; None when it does not read."""
    out: list[str] = []
    i = at
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            nxt = text[i + 1:i + 2]
            if nxt not in ("\\", '"', "n"):
                return None
            out.append("\n" if nxt == "n" else nxt)
            i += 2
            continue
        out.append(c)
        i += 1
    return None


def _split_quoted(key: str) -> Optional[tuple[str, tuple[tuple[str, str], ...]]]:
    """The quoted form read strictly: '"name"' then nothing or '{k="v",...}'; None when it does not read."""
    read = _read_quoted(key, 1)
    if read is None:
        return None
    name, i = read
    if i == len(key):
        return name, ()
    if key[i] != "{" or not key.endswith("}"):
        return None
    pairs = []
    i += 1
    while True:
        m = LABEL_NAME_AT.match(key, i)
        if m is None:
            return None
        value = _read_quoted(key, m.end())
        if value is None:
            return None
        pairs.append((m.group(1), value[0]))
        i = value[1]
        if key[i:] == "}":
            return name, tuple(pairs)
        if key[i:i + 1] != ",":
            return None
        i += 1


@lru_cache(maxsize=65536)
def split(key: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(pool name, ((label, value), ...)) of a key; a plain name has no extra labels. The one reader
    of keys (make_key checks its raw keys with it)."""
    if key.startswith('"'):
        quoted = _split_quoted(key)
        if quoted is not None:
            return quoted
    if not key.endswith("}") or "{" not in key:
        return key, ()
    brace = key.find("{")
    # a name may hold "{": find the suffix whose pairs all parse
    while brace >= 0:
        body = key[brace + 1:-1]
        pairs = list(_PAIR.finditer(body))
        if pairs and ",".join(m.group(0) for m in pairs) == body:
            return key[:brace], tuple((m.group(1), _unescape(m.group(2))) for m in pairs)
        brace = key.find("{", brace + 1)
    return key, ()


def name_of(key: str) -> str:
    """The `pool` label of a key: the pool's (or model's) name."""
    return split(key)[0]


def labels_of(key: str) -> dict[str, str]:
    """The exported labels of a pool: {"pool": name, **extra labels}."""
    name, extra = split(key)
    return {"pool": name, **dict(extra)}


def extras_of(key: str) -> dict[str, str]:
    """The extra labels of a key alone (e.g. {"cluster": "a"}); {} for a plain name."""
    return dict(split(key)[1])


class PoolBySetting(Kind):
    """`global.pool_by`: one label, or a list of labels (the last names the pool)."""
    name = "label or list of labels"

    def parse(self, v: Any) -> tuple[str, ...]:
        labels = [v] if isinstance(v, str) else v
        if not isinstance(labels, list) or not labels:
            raise ValueError(f"expected a label or a non-empty list of labels, got {v!r}")
        for label in labels:
            if not isinstance(label, str) or not LABEL_NAME.match(label):
                raise ValueError(f"{label!r} is not a label name (letters, digits, _)")
        if len(set(labels)) != len(labels):
            raise ValueError(f"a label is listed twice in {labels}")
        for label in labels[:-1]:
            if label in RESERVED or label in MODEL_LABELS:
                raise ValueError(f"{label!r} cannot be carried beside the pool (only the last label may be "
                                 f"{label!r})")
        return tuple(labels)

    def show(self, value: Any) -> str:
        by = normalise(value)
        return by[0] if len(by) == 1 else "[" + ", ".join(by) + "]"

    def rules(self) -> str:
        return "the last names the pool"


__all__ = ["PoolBySetting", "DEFAULT_POOL_BY", "LABEL_NAME", "MODEL_LABELS", "RESERVED", "extra_labels", "extras_of", "key_of",
           "labels_of", "make_key", "name_of", "normalise", "split"]
