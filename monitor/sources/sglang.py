"""Turn an SGLang `/metrics` scrape into the same `ReplicaReading`s that vllm.py produces.

What SGLang exposes (read in sgl-project/sglang, python/sglang/srt/observability/metrics_collector.py
at 016d8605e45876180312e29d6988e1de06562472; tests/fixtures/sglang/SOURCES.md has the details):
- Scheduler families (running, queue, KV, queue-time histogram, retraction counter) carry
  `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`, `dp_rank` when data-parallel, `priority`
  with priority scheduling, and any `--extra-metric-labels`. Only the scheduler with attention-TP
  rank 0 reports, unless `--enable-metrics-for-all-schedulers`: then every TP rank of a DP group
  repeats the same numbers. Engines here are DP ranks (absent label: one engine); within one, the
  series of the lowest (pp_rank, tp_rank) count and the other ranks' copies are ignored.
  With priority scheduling a gauge's total is under `priority=""`, its breakdowns under
  `priority="<n>"` (a priority seen once keeps its series, at 0 when it has no request): the totals
  are read as running and waiting (adding every series would count them twice), the breakdowns
  of running and waiting as `running_by_priority` / `waiting_by_priority`.
- Tokenizer families (request/token counters, TTFT, ITL, e2e histograms) come from the one tokenizer
  manager, with no rank labels; their series (by `is_streaming`, `priority`, `cache_source`, custom
  labels) are a partition and are summed.
- SGLang serves prometheus_client's multiprocess exposition (no `_created`; gauges declared without
  a multiprocess mode, e.g. `num_retracted_reqs`, get a `pid` label).

Mapping: running `num_running_reqs`, waiting `num_queue_reqs` (v0.3-era `num_requests_running` /
`num_requests_waiting`), KV capacity `max_total_num_tokens`, live KV the full-attention pool's
(sglang_kv.py: `token_usage` and `num_used_tokens` mix pools on hybrid models), kv_usage = live /
capacity over engines; hybrid models' KV pools and LoRA slots by sglang_kv.py.
`max_running_requests_under_SLO` is never read: SGLang declares it but writes it only when its
scheduler passes a value, which it never does (issue 40; a gauge never written has no sample). Preemptions come from the
counter `num_retracted_requests_total`; `num_retracted_reqs` is a gauge (retractions in the last
logging interval), not cumulative, so it is never used: without the counter, preemptions are
unknown. A value that is unusable on one engine makes the replica's value unknown, not a partial sum.
"""
from __future__ import annotations

from typing import Optional

from monitor.kit.exposition import ParsedScrape, parse

from ..model import ReplicaReading
from .engine_histograms import _histograms
from .engine_pass import Engine, Replicas, overflow_step, read
from .engine_values import MAX_COUNT, MAX_REQUESTS, MAX_TOKENS, checked
from .sglang_kv import read_kv
from .vllm import CONTRACT as vllm_contract
from .vllm import families_present, missing_in, sample_names

P = "sglang:"

# field -> candidate sample names, first present wins (the KV pool and LoRA fields: sglang_kv.py)
GAUGES = {
    "running": (P + "num_running_reqs", P + "num_requests_running"),
    "waiting": (P + "num_queue_reqs", P + "num_requests_waiting"),
    "used_tokens": (P + "num_used_tokens",),
    "token_usage": (P + "token_usage",),
    "capacity": (P + "max_total_num_tokens",),
    "page_size": (P + "page_size",),
    "num_pages": (P + "num_pages",),
    "kv_used": (P + "kv_used_tokens",),
    "full_usage": (P + "full_token_usage",),
    "swa_capacity": (P + "max_total_num_tokens_swa",),
    "swa_used": (P + "swa_used_tokens",),
    "swa_available": (P + "swa_available_tokens",),
    "swa_evictable": (P + "swa_evictable_tokens",),
    "swa_usage": (P + "swa_token_usage",),
    "mamba_used": (P + "mamba_used_tokens",),
    "mamba_available": (P + "mamba_available_tokens",),
    "mamba_evictable": (P + "mamba_evictable_tokens",),
    "mamba_usage": (P + "mamba_usage",),
    "lora_used": (P + "lora_pool_slots_used",),
    "lora_total": (P + "lora_pool_slots_total",),
}
# field -> the largest usable value (checked); fields not named here have no upper bound
_HIGH = {"running": MAX_REQUESTS, "waiting": MAX_REQUESTS, "lora_used": MAX_REQUESTS, "lora_total": MAX_REQUESTS,
         **{k: MAX_TOKENS for k in ("used_tokens", "capacity", "kv_used", "swa_capacity", "swa_used", "swa_available",
                                   "swa_evictable", "mamba_used", "mamba_available", "mamba_evictable")},
         **{k: 1.0 for k in ("token_usage", "full_usage", "swa_usage", "mamba_usage")}}

# canonical counter key (monitor/model/ COUNTERS) -> candidate sample names, first present wins
COUNTER_NAMES = {
    "request_success": (P + "num_requests_total", P + "request_success_total"),
    "prompt_tokens": (P + "prompt_tokens_total",),
    "generation_tokens": (P + "generation_tokens_total",),
    "preemptions": (P + "num_retracted_requests_total",),
    "prefix_cache_hits": (P + "cached_tokens_total",),  # tokens; queries are then prompt_tokens
}

# canonical histogram key (monitor/model/ HISTOGRAMS) -> candidate base names, first present wins
HISTOGRAM_NAMES = {
    "ttft": (P + "time_to_first_token_seconds",),
    "itl": (P + "inter_token_latency_seconds", P + "time_per_output_token_seconds"),
    "e2e": (P + "e2e_request_latency_seconds",),
    "queue": (P + "queue_time_seconds",),
    "prompt_len": (P + "prompt_tokens_histogram",),
    "generation_len": (P + "generation_tokens_histogram",),
}

# The metric contract, as vllm.CONTRACT: family -> any one of these sample names will do.
CONTRACT: dict[str, tuple[str, ...]] = {
    "num_running_reqs": GAUGES["running"],  # active requests
    "num_queue_reqs": GAUGES["waiting"],  # queued requests
    "num_used_tokens": GAUGES["used_tokens"] + GAUGES["token_usage"],  # live KV tokens
    "max_total_num_tokens": GAUGES["capacity"],  # KV capacity
    "num_requests_total": COUNTER_NAMES["request_success"],  # completion rate, stalls
    "generation_tokens_total": COUNTER_NAMES["generation_tokens"],  # token rate, stalls
    "e2e_request_latency_seconds": tuple(b + "_bucket" for b in HISTOGRAM_NAMES["e2e"]),
    "time_to_first_token_seconds": tuple(b + "_bucket" for b in HISTOGRAM_NAMES["ttft"]),
    "queue_time_seconds": tuple(b + "_bucket" for b in HISTOGRAM_NAMES["queue"]),  # the knee's signal
}


def missing_families(scrape: ParsedScrape) -> tuple[str, ...]:
    return missing_in(CONTRACT, scrape)


def looks_like_sglang(scrape: ParsedScrape) -> bool:
    """Whether a parsed body (or a Prometheus instance's series) is SGLang's: it has sglang samples,
    and more of SGLang's contract families than of vLLM's (one stray `vllm:` series does not make an
    SGLang body vLLM's; a tie is read as vLLM), as scrape.engine_of reads a text."""
    names = scrape.samples.keys()
    if not any(n.startswith(P) for n in names):
        return False
    if not any(n.startswith("vllm:") for n in names):
        return True
    return families_present(CONTRACT, scrape) > families_present(vllm_contract, scrape)


WANTED = sample_names((n for cands in GAUGES.values() for n in cands), COUNTER_NAMES, HISTOGRAM_NAMES)
# the same names as some scrapers rewrite them (`sglang_x`); parse_sglang folds them into `sglang:x`
_UNDERSCORED = frozenset("sglang_" + n[len(P):] for n in WANTED)


def parse_sglang(text: str) -> ParsedScrape:
    """Parse only the SGLang families headroom reads (fast path)."""
    scrape = parse(text, wanted=WANTED | _UNDERSCORED, prefixes=("sglang",))
    for name in [n for n in scrape.samples if n.startswith("sglang_")]:
        rows = scrape.samples.pop(name)
        if P + name[7:] in scrape.samples:
            scrape.anomaly("duplicate_series", len(rows))  # both spellings: the colon one counts
        else:
            scrape.samples[P + name[7:]] = rows
    return scrape


def _engine(labels: dict[str, str]) -> str:
    return labels.get("dp_rank", "")


def _rank_order(value: str) -> tuple[int, str]:
    return (len(value), value)  # numeric order for the decimal ranks SGLang writes


def _shard(labels: dict[str, str]) -> tuple:
    return (_rank_order(labels.get("pp_rank", "0")), _rank_order(labels.get("tp_rank", "0")))


def _primary(samples):
    """The samples of each (model, engine)'s lowest (pp_rank, tp_rank): other ranks only repeat it."""
    best: dict[tuple[str, str], tuple] = {}
    for labels, _value in samples:
        model = labels.get("model_name")
        if model is None:
            continue
        key, shard = (model, _engine(labels)), _shard(labels)
        if key not in best or shard < best[key]:
            best[key] = shard
    return [(lb, v) for lb, v in samples if lb.get("model_name") is not None
            and best[(lb["model_name"], _engine(lb))] == _shard(lb)]


def _gauge(scrape: ParsedScrape, candidates: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """(model, engine) -> raw value of the first candidate present (priority totals only)."""
    for name in candidates:
        samples = [(lb, v) for lb, v in scrape.get(name) if not lb.get("priority")]
        if not samples:
            continue
        out: dict[tuple[str, str], float] = {}
        for labels, value in _primary(samples):
            key = (labels["model_name"], _engine(labels))
            if key in out:
                scrape.anomaly("duplicate_engine")  # the same rank twice: the first one counts
                continue
            out[key] = value
        return out
    return {}


def _total(values: list[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) if values and len(known) == len(values) else None


def _gauges(scrape: ParsedScrape, replicas: Replicas) -> None:
    """Every gauge field (GAUGES) per (model, engine), each engine's checked once: running and waiting
    summed, KV and LoRA by sglang_kv.read_kv."""
    g = {k: _gauge(scrape, cands) for k, cands in GAUGES.items()}
    for values in g.values():
        for model, engine in values:
            replicas.engines.setdefault(model, set()).add(engine)
            replicas.reading(model)
    for model, r in replicas.by_model.items():
        _engine_gauges(scrape, r, g, sorted(replicas.engines[model]))


def _priorities(scrape: ParsedScrape, replicas: Replicas) -> None:
    for attr, candidates in (("running_by_priority", GAUGES["running"]), ("waiting_by_priority", GAUGES["waiting"])):
        for model, by_priority in _by_priority(scrape, candidates).items():
            if model in replicas.by_model:  # a breakdown without its total is not read
                setattr(replicas.by_model[model], attr, by_priority)


def _counter(scrape: ParsedScrape, key: str, name: str, replicas: Replicas) -> None:
    """A counter summed over the lowest rank's series; one series unusable: the sum is unknown, not partial."""
    per_model: dict[str, list[Optional[float]]] = {}
    for labels, value in _primary(scrape.get(name)):
        per_model.setdefault(labels["model_name"], []).append(checked(scrape, value, MAX_COUNT))
    for model, values in per_model.items():
        total = _total(values)
        if total is not None:
            replicas.reading(model).counters[key] = total


def _histogram(scrape: ParsedScrape, key: str, base: str, replicas: Replicas) -> None:
    parts = [_as_engine_series(_primary(scrape.get(base + s))) for s in ("_bucket", "_sum", "_count")]
    # relabelled dicts are new every scrape: no scrape passed, so the bucket-key memo is not churned
    for model, hist in _histograms(*parts).items():
        replicas.reading(model).histograms[key] = hist


def _prefix_queries(scrape: ParsedScrape, replicas: Replicas) -> None:
    """SGLang counts cached tokens, not queries: the queries are then the prompt tokens."""
    for r in replicas.by_model.values():
        if "prefix_cache_hits" in r.counters and "prompt_tokens" in r.counters:
            r.counters["prefix_cache_queries"] = r.counters["prompt_tokens"]


# which family fills which reading field, in the order read (engine_pass.read runs it)
SGLANG = Engine(naming="sglang", gauges=(_gauges, _priorities),
                counters=COUNTER_NAMES, counter=_counter,
                histograms=HISTOGRAM_NAMES, histogram=_histogram,
                closing=(_prefix_queries, overflow_step))


def readings_from_scrape(scrape: ParsedScrape, target: str, timestamp: float,
                         target_labels: Optional[dict[str, str]] = None) -> list[ReplicaReading]:
    """One ReplicaReading per model served by the target (DP engines summed)."""
    return read(SGLANG, scrape, target, timestamp, target_labels)


def _engine_gauges(scrape: ParsedScrape, r: ReplicaReading, g: dict, engines: list[str]) -> None:
    """The model's gauges, each engine's checked once: running and waiting summed, KV and LoRA by
    sglang_kv.read_kv."""
    model = r.model
    per_engine: list[dict[str, Optional[float]]] = []
    for engine in engines:
        values = {}
        for what, found in g.items():
            raw = found.get((model, engine))
            values[what] = None if raw is None else checked(scrape, raw, _HIGH.get(what))
        per_engine.append(values)
    for attr in ("running", "waiting"):
        if any(m == model for m, _ in g[attr]):
            setattr(r, attr, _total([v[attr] for v in per_engine]))
    read_kv(r, per_engine, scrape.anomaly)
    r.engines = max(1, len(engines))


def _by_priority(scrape: ParsedScrape, candidates: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """model -> priority -> the gauge's per-priority series (priority="<n>") summed over engines; a
    priority unusable on one engine is left out (unknown, not a partial sum)."""
    for name in candidates:
        rows = scrape.get(name)
        if not rows:
            continue
        out: dict[str, dict[str, float]] = {}
        seen, bad = set(), set()
        for labels, value in _primary([(lb, v) for lb, v in rows if lb.get("priority")]):
            model, priority = labels["model_name"], labels["priority"]
            key = (model, _engine(labels), priority)
            if key in seen:
                scrape.anomaly("duplicate_engine")  # the same rank twice: the first one counts
                continue
            seen.add(key)
            v = checked(scrape, value, MAX_REQUESTS)
            if v is None:
                bad.add((model, priority))
                continue
            out.setdefault(model, {})[priority] = out.get(model, {}).get(priority, 0.0) + v
        for model, priority in bad:
            out.get(model, {}).pop(priority, None)
        return {m: p for m, p in out.items() if p}
    return {}


def _as_engine_series(samples):
    """Relabel each series for engine_histograms._histograms: its labels other than model_name and le become its
    `engine` key, so the helper sums the series (DP ranks, is_streaming, priority) per model."""
    out = []
    for labels, value in samples:
        series = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("model_name", "le"))
        relabelled = {"model_name": labels["model_name"], "engine": series}
        if "le" in labels:
            relabelled["le"] = labels["le"]
        out.append((relabelled, value))
    return out


def readings_from_text(text: str, target: str, timestamp: float,
                       target_labels: Optional[dict[str, str]] = None) -> list[ReplicaReading]:
    return readings_from_scrape(parse_sglang(text), target, timestamp, target_labels)
