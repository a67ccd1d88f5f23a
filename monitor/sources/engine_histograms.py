"""How the engines' histograms are read from a parse: `_bucket` samples grouped into series by (model,
engine, request type), checked (cumulative, finite, not negative) and summed per model. Shared by
vllm.py and sglang.py; each bucket label set's series key and bound are worked out once.
"""
from __future__ import annotations

import math
from typing import Optional

from ..model import Histogram
from monitor.kit.exposition import ParsedScrape


_BOUNDS: dict[str, float] = {}


def _bound(le: str) -> Optional[float]:
    b = _BOUNDS.get(le)
    if b is None:
        try:
            b = float(le)
        except ValueError:
            return None
        if len(_BOUNDS) < 10_000:
            _BOUNDS[le] = b
    return b


def _series(labels: dict[str, str]) -> tuple:
    """A histogram series' key: (model, engine, request type); `_engine` inlined (once per bucket)."""
    engine = labels.get("engine", "")
    replica = labels.get("ReplicaId")
    return labels.get("model_name"), f"{replica}/{engine}" if replica else engine, labels.get("request_type", "")


# A bucket's label set -> (that label set, its series key, its bound or None): the fast parser hands
# the same dict for the same label text every scrape (exposition's label cache, `shared_labels`), so
# each is worked out once. Keyed by id(); the entry holds the dict itself, so the id cannot be reused
# while it is kept. Label sets made afresh (Prometheus mode, full parses) are not kept.
_BUCKET_KEYS: dict[int, tuple[dict, tuple, Optional[float]]] = {}
_BUCKET_KEYS_MAX = 50_000


def _bucket_key(labels: dict[str, str], keep: bool) -> tuple[dict, tuple, Optional[float]]:
    le = labels.get("le")
    got = (labels, _series(labels), None if le is None else _bound(le))
    if not keep:
        return got
    if len(_BUCKET_KEYS) >= _BUCKET_KEYS_MAX:
        _BUCKET_KEYS.clear()
    _BUCKET_KEYS[id(labels)] = got
    return got


def _histograms(buckets, sums, counts, scrape: Optional[ParsedScrape] = None) -> dict[str, Histogram]:
    """Group `_bucket` samples by (model, engine, request_type) and sum them per model (the render
    histogram of vLLM 0.34 has one series per request type)."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    keep = scrape is not None and scrape.shared_labels
    known = _BUCKET_KEYS if keep else {}
    for labels, value in buckets:
        got = known.get(id(labels))
        if got is None or got[0] is not labels:
            got = _bucket_key(labels, keep)
        bound = got[2]
        if bound is None:
            continue
        key = got[1]
        g = groups.get(key)
        if g is None:
            groups[key] = [(bound, value)]
        else:
            g.append((bound, value))
    sum_by = {_series(lb): v for lb, v in sums}
    count_by = {_series(lb): v for lb, v in counts}
    per_model: dict[str, Histogram] = {}
    for key, pairs in groups.items():
        model = key[0]
        if model is None:
            continue
        pairs.sort()
        bounds, cum = zip(*pairs)
        if scrape is not None and not math.isinf(bounds[-1]):
            scrape.anomaly("histogram_without_inf")  # used as is: the count comes from _count
        if _usable(cum, scrape):
            hist = Histogram(bounds, cum, sum_by.get(key, 0.0), count_by.get(key, cum[-1]))
            old = per_model.get(model)
            per_model[model] = hist if old is None else (old.plus(hist) or old)
    return per_model


def _usable(cum: tuple, scrape: Optional[ParsedScrape]) -> bool:
    """Whether cumulative bucket counts are fit to use: never decreasing (else the anomaly
    `histogram_not_cumulative`, checked first), each finite and not negative (else `non_finite` or
    `negative`). The usual case, all finite, is checked with C-level calls."""
    finite = all(map(math.isfinite, cum))
    if finite:
        ordered = list(cum) == sorted(cum)  # no NaN: sorted is the non-decreasing order
    else:
        ordered = not any(b < a for a, b in zip(cum, cum[1:]))
    if scrape is not None and not ordered:
        scrape.anomaly("histogram_not_cumulative")
        return False
    if finite and min(cum) >= 0:
        return True
    if scrape is not None:
        scrape.anomaly("non_finite" if not finite else "negative")
    return False
