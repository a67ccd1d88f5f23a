"""How the engines' histograms are read from a parse: `_bucket` samples grouped into series by (model,
engine, request type), checked (cumulative, finite, not negative) and summed per model. Shared by
vllm.py and sglang.py; where each bucket of a family goes is worked out once per sequence of label
sets (the fast parser hands the same label dicts every scrape), each series' counts then picked in C.
"""
from __future__ import annotations

import math
from operator import itemgetter
from typing import Optional

from monitor.kit.exposition import ParsedScrape

from ..model import Histogram

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


def _histograms(buckets, sums, counts, scrape: Optional[ParsedScrape] = None) -> dict[str, Histogram]:
    """Group `_bucket` samples by (model, engine, request_type) and sum them per model (the render
    histogram of vLLM 0.34 has one series per request type). Where each bucket goes is worked out
    once per sequence of label sets (`_layout`); each series' counts are then one C-level pick."""
    if not buckets:
        return {}
    labels, values = zip(*buckets)
    layout = _layout(labels, scrape is not None and scrape.shared_labels)
    sum_by = {_series(lb): v for lb, v in sums}
    count_by = {_series(lb): v for lb, v in counts}
    per_model: dict[str, Histogram] = {}
    for key, bounds, pick, tied in layout:
        if tied is None:
            cum = pick(values)
        else:  # two buckets of one bound (le="1" and le="1.0"): (bound, count) pairs sorted, as ever
            line_bounds, line_pick = tied
            bounds, cum = zip(*sorted(zip(line_bounds, line_pick(values))))
        if scrape is not None and not math.isinf(bounds[-1]):
            scrape.anomaly("histogram_without_inf")  # used as is: the count comes from _count
        if _usable(cum, scrape):
            hist = Histogram(bounds, cum, sum_by.get(key, 0.0), count_by.get(key, cum[-1]))
            model = key[0]
            old = per_model.get(model)
            per_model[model] = hist if old is None else (old.plus(hist) or old)
    return per_model


# A family's bucket label sets, in order -> where each bucket goes: [(series key, its bounds in
# order, a picker of its counts from the values in line order, None or True when two buckets share a
# bound)], series with a model only, in the order first seen. Keyed by the label sets' ids when the
# parser hands the same dicts every scrape (`shared_labels`); the entry holds the dicts themselves,
# so no id is reused while it is kept.
_LAYOUTS: dict[tuple, tuple[tuple, list]] = {}
_LAYOUTS_MAX = 5_000


def _picker(order: tuple):
    """values -> the tuple of values[i] for i in order (itemgetter gives a bare value for one index)."""
    return itemgetter(*order) if len(order) > 1 else (lambda values, i=order[0]: (values[i],))


def _layout(labels: tuple, keep: bool) -> list:
    ids = tuple(map(id, labels)) if keep else ()  # () unused: no layout kept
    if keep:
        got = _LAYOUTS.get(ids)
        if got is not None:
            return got[1]
    groups: dict[tuple, list[tuple[float, int]]] = {}
    for i, lb in enumerate(labels):
        le = lb.get("le")
        bound = None if le is None else _bound(le)
        key = _series(lb)
        if bound is not None and key[0] is not None:
            groups.setdefault(key, []).append((bound, i))
    layout = []
    for key, pairs in groups.items():
        tied = None
        if len({b for b, _ in pairs}) < len(pairs) or any(b != b for b, _ in pairs):  # or a NaN bound
            line_bounds, line_order = zip(*pairs)
            tied = (line_bounds, _picker(line_order))
        pairs.sort()
        bounds, order = zip(*pairs)
        layout.append((key, bounds, _picker(order), tied))
    if keep:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[ids] = (labels, layout)
    return layout


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
