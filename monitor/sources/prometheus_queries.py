"""What a Prometheus-mode cycle asks the query layer, and how the answers are read back.

A cycle asks for what it needs at the granularity it needs (issue 27), never for every raw series:
- per replica (`replica_selector`): the gauges (running, waiting, KV usage, KV capacity), the
  counters and each latency histogram's `_sum` and `_count` - a few dozen series per replica, none
  of the ~300 bucket series. Counters stay raw so rates, resets and stall detection are computed
  exactly as in direct mode; `_sum` / `_count` feed the knee's mean latency.
- per pool (`pool_histogram_queries`): each latency histogram's bucket increases over the latency
  window, computed and summed by the query layer (`sum by (<pool labels>, le) (increase(...))`),
  and apart (`pool_total_queries`), for the signals with a pool SLO, the pool's cumulative buckets
  around its targets (`needed_les`); only for the histograms the replica read found. One query per histogram family, asked at once (the query layer evaluates
  each query on one core: apart, they share its cores); each answer series carries `hr_base` (the histogram's base name)
  and `hr_part` (bucket | total), so the candidates of one kind (vLLM's two ITL names) stay apart:
  the first present wins, per pool, as per replica in direct mode. The mean and the count of
  observations come from the replicas' sums and counts, exact as in direct mode.
"""
from __future__ import annotations

import math
import re
from typing import Iterable, Mapping, Optional

from ..model import Histogram
from ..model.poolkey import key_of
from . import sglang, vllm, vllm_tiers

LATENCY_KINDS = ("ttft", "itl", "e2e", "queue")  # what the pools' quantiles, the knee and pool SLOs read
PART_LABEL = "hr_part"
BASE_LABEL = "hr_base"
POOL_MODEL_LABEL = "model_name"


def _engine_names() -> list[tuple[str, list[str], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]]:
    """(prefix, gauge names, counters, histograms) of each engine reader."""
    # the edges (KV offload tier, LoRA slots, prefix hits by tier, speculative decoding): vLLM's
    # own names only; LMCache's `lmcache:` families are read in direct mode only
    vllm_gauges = list(vllm.GAUGES.values()) + sorted(n for n in vllm_tiers.WANTED if n.startswith("vllm:"))
    sglang_gauges = [n for cands in sglang.GAUGES.values() for n in cands]
    return [("vllm", vllm_gauges, vllm.COUNTER_NAMES, vllm.HISTOGRAM_NAMES),
            ("sglang", sglang_gauges, sglang.COUNTER_NAMES, sglang.HISTOGRAM_NAMES)]


def replica_names() -> dict[str, list[str]]:
    """prefix -> the per-replica sample names (without the prefix) a cycle reads."""
    out: dict[str, list[str]] = {}
    for prefix, gauges, counters, histograms in _engine_names():
        names = set(gauges)
        for cands in counters.values():
            names.update(cands)
        for kind in LATENCY_KINDS:
            for base in histograms.get(kind, ()):
                names.update((base + "_sum", base + "_count"))
        out[prefix] = sorted(n[len(prefix) + 1:] for n in names)
    return out


def _matchers(extra: str) -> list[str]:
    extra = extra.strip().strip("{}").strip()
    return [extra] if extra else []


def replica_selector(extra: str = "") -> str:
    """The per-replica series (either spelling of the prefix): gauges, counters, histogram sums and counts."""
    regex = "|".join(f"{prefix}[:_](" + "|".join(names) + ")" for prefix, names in replica_names().items())
    return "{" + ",".join([f'__name__=~"{regex}"'] + _matchers(extra)) + "}"


# what the vLLM reader takes of `cache_config_info` (~35 labels, a quarter of the replica answer's
# bytes): the KV capacity's labels and those naming the engine (monitor/sources/vllm.py)
CACHE_INFO_LABELS = ("engine", "ReplicaId", "model_name", *vllm_tiers.GPU_KV_LABELS)
CACHE_INFO = "cache_config_info"


def replica_selectors(extra: str = "", keep: Iterable[str] = ("instance",)) -> list[str]:
    """`replica_selector`'s series in three queries a cycle asks at once (the query layer answers
    them in parallel): the gauges and counters; the latency histograms' sums and counts; vLLM's
    `cache_config_info` with only its labels the reader takes and `keep` (the instance label, the
    pool_by labels), its name set back."""
    parts: list[list[str]] = [[], []]
    for prefix, names in replica_names().items():
        for i, part in enumerate(parts):
            chosen = [n for n in names if n.endswith(("_sum", "_count")) == bool(i) and n != CACHE_INFO]
            if chosen:
                part.append(f"{prefix}[:_](" + "|".join(chosen) + ")")
    out = ["{" + ",".join([f'__name__=~"{"|".join(regex)}"'] + _matchers(extra)) + "}" for regex in parts if regex]
    if CACHE_INFO in replica_names().get("vllm", ()):
        by = ", ".join(dict.fromkeys([*CACHE_INFO_LABELS, *keep]))
        info = "{" + ",".join([f'__name__=~"vllm[:_]{CACHE_INFO}"'] + _matchers(extra)) + "}"
        out.append(f'label_replace(max by ({by}) ({info}), "__name__", "vllm:{CACHE_INFO}", "", "")')
    return out


def shard_pools_query(extra: str = "") -> str:
    """The models served (one series each): what a shard picks its own pools from."""
    regex = "vllm[:_]num_requests_running|sglang[:_](num_running_reqs|num_requests_running)"
    return "count by (model_name) ({" + ",".join([f'__name__=~"{regex}"'] + _matchers(extra)) + "})"


def with_pools(extra: str, pools: Iterable[str]) -> str:
    """`extra` narrowed to the models `pools` (a PromQL regex of their names, each escaped; none: a
    matcher no series has)."""
    names = [re.escape(p).replace("\\", "\\\\").replace('"', '\\"') for p in pools]
    matcher = 'model_name=~"' + ("|".join(names) if names else "^$hr_no_pool") + '"'
    return ",".join(_matchers(extra) + [matcher])


def histogram_bases() -> list[tuple[str, str]]:
    """(kind, base name) of every latency histogram candidate, both engines, in preference order."""
    out: list[tuple[str, str]] = []
    for _prefix, _g, _c, histograms in _engine_names():
        for kind in LATENCY_KINDS:
            out.extend((kind, base) for base in histograms.get(kind, ()))
    return out


def _tagged(expr: str, base: str, part: str) -> str:
    inner = f'label_replace({expr}, "{BASE_LABEL}", "{base}", "", "")'
    return f'label_replace({inner}, "{PART_LABEL}", "{part}", "", "")'


def pool_labels(pool_by: Iterable[str]) -> list[str]:
    """The labels a pool-level aggregation keeps: every pool_by label, and model_name."""
    labels = [label for label in pool_by if label != "model"]
    if POOL_MODEL_LABEL not in labels:
        labels.append(POOL_MODEL_LABEL)
    return labels


def pool_histogram_query(extra: str, pool_by: Iterable[str], window_seconds: float,
                         present: Optional[dict[str, str]] = None) -> str:
    """One query for every pool's latency histograms: `pool_histogram_queries` joined by `or`."""
    return " or ".join(pool_histogram_queries(extra, pool_by, window_seconds, present).values())


def pool_histogram_queries(extra: str, pool_by: Iterable[str], window_seconds: float,
                           present: Optional[dict[str, str]] = None) -> dict[str, str]:
    """Canonical base name -> the query of every pool's latency histogram of that family: the bucket
    increases over the window (the cumulative buckets a pool SLO reads are `pool_total_queries`, asked
    apart). A cycle asks them at once: the query layer answers them in parallel. `present`:
    canonical base name -> the name as the query layer stores it (`vllm_x` from some scrapers), of
    the histograms the replica read found (their `_count`); only those are asked for. None: every
    candidate, by either spelling of the prefix. Sums and counts come from the replica read (exact
    deltas)."""
    by = ", ".join(pool_labels(pool_by))
    window = f"{max(1, int(round(window_seconds)))}s"
    out = {}
    for _kind, base in histogram_bases():
        if present is not None and base not in present:
            continue
        sel = _bucket_selector(base, extra, present)
        out[base] = _tagged(f"sum by ({by}, le) (increase({sel}[{window}]))", base, "bucket")
    return out


def pool_total_queries(extra: str, pool_by: Iterable[str], kinds: Iterable[str], present: dict[str, str],
                       les: Optional[Mapping[str, Iterable[str]]] = None) -> dict[str, str]:
    """Canonical base name -> the query of every pool's cumulative buckets of that family (its
    `hr_part` total), for the histograms of `present` (`pool_histogram_queries`) whose kind is one of
    `kinds` (the signals with a pool SLO), apart from the increases: a pool SLO's burn windows stamp
    them with the cycle's time, so they are asked every cycle, the increases on their own schedule.
    `les`: base -> the `le` values to read (`needed_les`: a target's bad count reads only the
    buckets around it and +Inf; a tenth of the series, a tenth of the query layer's work); a base
    not in it: every bucket."""
    by = ", ".join(pool_labels(pool_by))
    wanted = set(kinds)
    out = {}
    for kind, base in histogram_bases():
        if kind not in wanted or base not in present:
            continue
        values = None if les is None or base not in les else sorted(les[base])
        sel = _bucket_selector(base, extra, present, values)
        out[base] = _tagged(f"sum by ({by}, le) ({sel})", base, "total")
    return out


def _bucket_selector(base: str, extra: str, present: Optional[dict[str, str]], les: Optional[list[str]] = None) -> str:
    """The bucket series of a histogram family: by its stored name when `present` has it, else by
    either spelling of the prefix; `les`: only those `le` values (each a literal)."""
    matchers = _matchers(extra)
    if les is not None:
        escaped = [re.escape(le).replace("\\", "\\\\").replace('"', '\\"') for le in les]
        matchers.append('le=~"' + ("|".join(escaped) if escaped else "^$hr_no_le") + '"')
    if present is not None:
        return present[base] + "_bucket" + ("{" + ",".join(matchers) + "}" if matchers else "")
    prefix, _, rest = base.partition(":")
    return "{" + ",".join([f'__name__=~"{prefix}[:_]{rest}_bucket"'] + matchers) + "}"


def needed_les(bounds: Iterable[tuple[float, str]], thresholds: Iterable[float]) -> set[str]:
    """The `le` values of a pool's histogram (`bounds`: (bound, its le value) of every bucket) a
    target's bad count needs (monitor/derive/histogram.py `fraction_above` interpolates inside the
    bucket holding the threshold, `total` reads the last): per threshold the largest bound below it
    and the smallest at or above it, and the largest bound (+Inf). A histogram of only these gives
    the same total and the same count over each threshold as the whole one when its counts rise
    from bound to bound (one histogram, or a pool's replicas summed by `le` with one bucket layout);
    sums over different layouts are not monotone, and `_histogram`'s running maximum over these
    buckets can then differ from that over all."""
    pairs = sorted(bounds)
    if not pairs:
        return set()
    keep = {pairs[-1][0]}
    for t in thresholds:
        below = [b for b, _le in pairs if b < t]
        above = [b for b, _le in pairs if b >= t]
        keep.update(([below[-1]] if below else []) + ([above[0]] if above else []))
    return {le for b, le in pairs if b in keep}


def pool_bucket_les(samples: list[tuple[dict[str, str], float]], pool_by: Iterable[str]
                    ) -> dict[str, dict[str, tuple[tuple[float, str], ...]]]:
    """Base name -> pool key -> (bound, le value) of every bucket in a tagged answer
    (`pool_total_queries`, `pool_histogram_queries`): what `needed_les` picks from."""
    pool_by = list(pool_by)
    found: dict[str, dict[str, set[tuple[float, str]]]] = {}
    for labels, _value in samples:
        base, le = labels.get(BASE_LABEL), labels.get("le")
        if base is None or le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        found.setdefault(base, {}).setdefault(pool_key(labels, pool_by), set()).add((bound, le))
    return {base: {pool: tuple(sorted(les)) for pool, les in pools.items()} for base, pools in found.items()}


# the bundled recording rules (rules/headroom.rules.yaml): pool bucket rates over 5m, by model_name and le
RULE_WINDOW = 300.0
RULE_KINDS = {"time_to_first_token_seconds": "ttft", "inter_token_latency_seconds": "itl",
              "e2e_request_latency_seconds": "e2e", "request_queue_time_seconds": "queue"}
RULES_QUERY = '{__name__=~"pool_le:vllm_(' + "|".join(RULE_KINDS) + ')_bucket:rate5m"}'


def rule_histograms(samples: list[tuple[dict[str, str], float]]) -> dict[str, dict[str, Histogram]]:
    """Pool -> kind -> the bucket rates the bundled recording rules keep (scaled increases: the same
    quantiles; the mean and count come from the replicas)."""
    grouped: dict[tuple[str, str], dict[str, float]] = {}
    for labels, value in samples:
        name = labels.get("__name__", "")
        inner = name[len("pool_le:vllm_"):-len("_bucket:rate5m")] if name.startswith("pool_le:vllm_") else ""
        kind = RULE_KINDS.get(inner)
        if kind is None or "le" not in labels:
            continue
        slot = grouped.setdefault((labels.get(POOL_MODEL_LABEL, ""), kind), {})
        slot[labels["le"]] = slot.get(labels["le"], 0.0) + value
    out: dict[str, dict[str, Histogram]] = {}
    for (pool, kind), by_le in grouped.items():
        hist = _histogram(by_le, 0.0, None)
        if hist is not None:
            out.setdefault(pool, {})[kind] = hist
    return out


def rule_tagged(samples: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """The bundled recording rules' series (RULES_QUERY) tagged with the histogram's base name
    (`BASE_LABEL`) as the increase queries' are, for `pool_bucket_les`; the label dicts are copies."""
    out = []
    for labels, value in samples:
        name = labels.get("__name__", "")
        inner = name[len("pool_le:vllm_"):-len("_bucket:rate5m")] if name.startswith("pool_le:vllm_") else ""
        if inner in RULE_KINDS:
            out.append(({**labels, BASE_LABEL: "vllm:" + inner}, value))
    return out


def present_bases(samples: list[tuple[dict[str, str], float]]) -> dict[str, str]:
    """Canonical histogram base -> its stored name, for each latency histogram whose `_count` is in
    a replica read's answer."""
    wanted = {base for _kind, base in histogram_bases()}
    out: dict[str, str] = {}
    for labels, _value in samples:
        name = labels.get("__name__", "")
        if not name.endswith("_count"):
            continue
        raw = name[:-len("_count")]
        canonical = raw.replace("_", ":", 1) if raw.startswith(("vllm_", "sglang_")) else raw
        if canonical in wanted:
            out.setdefault(canonical, raw)
    return out


def needed_bases(found: Iterable[dict[str, str]]) -> dict[str, str]:
    """The latency histograms whose pool buckets a read asks for (canonical base -> stored name), of
    each replica's found ones (`present_bases`): per replica and kind only the first candidate it
    has. A pool's first candidate with data wins (`pool_histograms`), so a later one (a vLLM that
    exports `time_per_output_token_seconds` beside its renamed `inter_token_latency_seconds`)
    changes the answer only for a pool none of whose replicas has an earlier one: asked anyway, it
    cost as much Prometheus CPU as any other family's query (issue 42). vLLM 0.32 exports only the
    one ITL name (its legacy one is `request_time_per_output_token_seconds`, not a candidate)."""
    order = histogram_bases()
    out: dict[str, str] = {}
    for got in found:
        kinds: set[str] = set()
        for kind, base in order:
            if kind not in kinds and base in got:
                kinds.add(kind)
                out.setdefault(base, got[base])
    return out


def pool_key(labels: dict[str, str], pool_by: Iterable[str]) -> str:
    """The pool a series belongs to, as monitor/derive/core.py `pool_of` keys it (monitor/model/poolkey.py):
    named by the last pool_by label's value (model_name when it is missing), the others carried."""
    return key_of(labels, labels.get(POOL_MODEL_LABEL, ""), list(pool_by) or [POOL_MODEL_LABEL])


def pool_histograms(samples: list[tuple[dict[str, str], float]], pool_by: Iterable[str]
                    ) -> tuple[dict[str, dict[str, Histogram]], dict[str, dict[str, Histogram]]]:
    """(window increases, cumulative) per pool key and latency kind, from `pool_histogram_query`'s
    answer, or the cumulative ones of `pool_total_queries`'. Per pool and kind the first candidate base name with data wins; a histogram whose
    buckets are not finite is left out (unknown, never a made-up quantile)."""
    pool_by = list(pool_by)
    kind_of = dict((base, kind) for kind, base in histogram_bases())
    order = {base: i for i, (_k, base) in enumerate(histogram_bases())}
    grouped: dict[tuple[str, str, str], dict] = {}  # (pool, base, part) -> le/"" -> value
    for labels, value in samples:
        base, part = labels.get(BASE_LABEL), labels.get(PART_LABEL)
        if base not in kind_of or part is None:
            continue
        key = (pool_key(labels, pool_by), base, part)
        slot = grouped.setdefault(key, {})
        le = labels.get("le", "")
        slot[le] = slot.get(le, 0.0) + value
    window: dict[str, dict[str, Histogram]] = {}
    total: dict[str, dict[str, Histogram]] = {}
    chosen: dict[tuple[str, str, str], int] = {}
    for (pool, base, part), values in grouped.items():
        if part not in ("bucket", "total"):
            continue
        hist = _histogram(values, 0.0, None)
        if hist is None:
            continue
        kind = kind_of[base]
        ck = (pool, kind, part)
        if ck in chosen and chosen[ck] <= order[base]:
            continue
        chosen[ck] = order[base]
        (window if part == "bucket" else total).setdefault(pool, {})[kind] = hist
    return window, total


def _histogram(by_le: dict[str, float], sum_: Optional[float], count: Optional[float]) -> Optional[Histogram]:
    pairs = []
    for le, v in by_le.items():
        try:
            bound = float(le)
        except ValueError:
            continue
        if not math.isfinite(v) or v < 0:
            return None
        pairs.append((bound, v))
    if not pairs:
        return None
    pairs.sort()
    counts, running = [], 0.0
    for _b, v in pairs:
        running = max(running, v)  # extrapolated increases of one target's buckets: cumulative, up to rounding
        counts.append(running)
    n = counts[-1] if count is None or not math.isfinite(count) else count
    s = sum_ if sum_ is not None and math.isfinite(sum_) else 0.0
    return Histogram(tuple(b for b, _ in pairs), tuple(counts), s, n)
