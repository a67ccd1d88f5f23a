"""A pool's identity: one canonical string key, used everywhere a pool is named.

`global.pool_by` lists the labels that make a pool, e.g. `[cluster, model_name]`. The LAST label
names the pool (the `pool` label, as with a single label); every other label is carried beside it
(`cluster="a"`). The key is the one value every layer stores, compares, hashes and writes:

    pool_by [model_name]            -> "meta-llama/Llama-3.1-8B"              (unchanged, byte for byte)
    pool_by [cluster, model_name]   -> 'meta-llama/Llama-3.1-8B{cluster="a"}'

So the same model in two clusters is two keys (two pools, two histories, two forecasts, two shard
owners), and `labels_of(key)` gives back the exported labels: {"pool": name, "cluster": "a"}.
A key without the `{...}` suffix is a plain pool name; a name that itself looks like a suffix is
left alone unless every pair in it parses.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from monitor.kit.settings.kinds import Kind

MODEL_LABELS = ("model_name", "model")
DEFAULT_POOL_BY = ("model_name",)
# a Prometheus label name (a pool_by label must be one: it becomes an exported label)
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED = ("pool", "replica", "__name__")
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


def make_key(name: str, extra: Mapping[str, str] = (), order: Iterable[str] = ()) -> str:
    """The canonical key of pool `name` with its extra labels (in `order`, else sorted)."""
    extra = dict(extra)
    if not extra:
        return name
    names = [k for k in order if k in extra] or sorted(extra)
    return name + "{" + ",".join(f'{k}="{_escape(extra[k])}"' for k in names) + "}"


def key_of(labels: Mapping[str, str], model: str, pool_by: Optional[PoolBy]) -> str:
    """The key of a replica (or a series) with these labels serving `model`: the last pool_by
    label's value names it (the model for model_name / model, or when the label is absent); every
    other pool_by label's value is carried (empty when absent: the same as Prometheus)."""
    by = normalise(pool_by)
    last = by[-1]
    name = model if last in MODEL_LABELS else (labels.get(last) or model)
    if len(by) == 1:
        return name
    extra = {label: (model if label in MODEL_LABELS else labels.get(label, "")) for label in by[:-1]}
    return make_key(name, extra, by[:-1])


@lru_cache(maxsize=65536)
def split(key: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(pool name, ((label, value), ...)) of a key; a plain name has no extra labels."""
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
