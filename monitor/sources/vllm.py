"""Turn a vLLM `/metrics` scrape into `ReplicaReading`s, whatever the vLLM version.

Accepted variants (docs: metrics-reference.md §1.5, §6): `vllm:` and `vllm_` spellings, and Ray
Serve's `ray_vllm_` / `ray_vllm:` (exposition.VLLM_PREFIXES; its `ReplicaId` label is part of the
engine id, so the replicas on one Ray node are summed as engines); vLLM 0.34's render histogram
(`request_render_duration_seconds`, one series per request type, no engine label); V1 engines
with an `engine` label (data-parallel engines are summed) and V0 engines without one; current and
legacy names (`gpu_cache_usage_perc`, `gpu_prefix_cache_*`, `time_per_output_token_seconds`); an open
label set on `cache_config_info`. KV capacity in tokens is `kv_cache_size_tokens` when present, else
`num_gpu_blocks x block_size` while the labels show one KV-cache group (vllm_tiers.py `gpu_kv`, which
also says whether `block_size` is the allocation unit). Histogram bounds are read from the scrape.
The edges (offload and LMCache tiers, prefix hits by tier, speculative decoding, LoRA slots): vllm_tiers.py.
The reading is engine_pass.read over the table `VLLM` (which family fills which field; the special
cases are its named steps); sglang.py's `SGLANG` is the same pass.
"""
from __future__ import annotations

from typing import Iterable, Optional, Union

from monitor.kit.exposition import ParsedScrape, parse

from ..model import ReplicaReading
from . import vllm_tiers
from .engine_histograms import _histograms
from .engine_pass import SUMMED_FIELDS, Engine, Replicas, overflow_step, read, unknown_if_overflowed  # noqa: F401
from .engine_values import MAX_COUNT, MAX_REQUESTS, MAX_TOKENS, _engine, _model_of, _num, checked  # noqa: F401

P = "vllm:"

GAUGES = {
    "running": P + "num_requests_running",
    "waiting": P + "num_requests_waiting",
    "waiting_by_reason": P + "num_requests_waiting_by_reason",
    "kv_usage": P + "kv_cache_usage_perc",
    "kv_usage_legacy": P + "gpu_cache_usage_perc",
    "cache_info": P + "cache_config_info",
}

# canonical counter key -> candidate sample names, first present wins
COUNTER_NAMES = {
    "request_success": (P + "request_success_total",),
    "prompt_tokens": (P + "prompt_tokens_total",),
    "generation_tokens": (P + "generation_tokens_total",),
    "preemptions": (P + "num_preemptions_total",),
    "prefix_cache_hits": (P + "prefix_cache_hits_total", P + "gpu_prefix_cache_hits_total"),
    "prefix_cache_queries": (P + "prefix_cache_queries_total", P + "gpu_prefix_cache_queries_total"),
    "admission_rejections": (P + "admission_rejections_total",),  # no engine label: the API server's
}
ABORT = "abort"  # request_success_total's finished_reason for requests the client gave up on

# canonical histogram key -> candidate base names, first present wins
HISTOGRAM_NAMES = {
    "ttft": (P + "time_to_first_token_seconds",),
    "itl": (P + "inter_token_latency_seconds", P + "time_per_output_token_seconds"),
    "e2e": (P + "e2e_request_latency_seconds",),
    "queue": (P + "request_queue_time_seconds",),
    "prefill": (P + "request_prefill_time_seconds",),
    "decode": (P + "request_decode_time_seconds",),
    "prompt_len": (P + "request_prompt_tokens",),
    "generation_len": (P + "request_generation_tokens",),
    "render": (P + "request_render_duration_seconds",),  # 0.34; API-server side: no engine label
}


# The metric contract: the families each derived number needs (any one name of a family will do).
# A target that answers without one of them is up, and says which are missing
# (headroom_source_missing_families): the numbers they feed are unknown, not silently zero.
CONTRACT: dict[str, tuple[str, ...]] = {
    "num_requests_running": (GAUGES["running"],),  # active requests
    "num_requests_waiting": (GAUGES["waiting"],),  # queued requests
    "kv_cache_usage_perc": (GAUGES["kv_usage"], GAUGES["kv_usage_legacy"]),  # live KV tokens
    "cache_config_info": (GAUGES["cache_info"],),  # KV capacity
    "request_success_total": COUNTER_NAMES["request_success"],  # completion rate, stalls
    "generation_tokens_total": COUNTER_NAMES["generation_tokens"],  # token rate, stalls
    "e2e_request_latency_seconds": tuple(b + "_bucket" for b in HISTOGRAM_NAMES["e2e"]),  # Little's law, knee
    "time_to_first_token_seconds": tuple(b + "_bucket" for b in HISTOGRAM_NAMES["ttft"]),
    "request_queue_time_seconds": tuple(b + "_bucket" for b in HISTOGRAM_NAMES["queue"]),  # the knee's signal
}


def missing_in(contract: dict[str, tuple[str, ...]], scrape: ParsedScrape) -> tuple[str, ...]:
    """The families of an engine's metric contract with no sample in the scrape (declared but
    empty counts as missing); vllm.CONTRACT and sglang.CONTRACT."""
    return tuple(f for f, names in contract.items() if not any(scrape.samples.get(n) for n in names))


def missing_families(scrape: ParsedScrape) -> tuple[str, ...]:
    return missing_in(CONTRACT, scrape)


def families_present(contract: dict[str, tuple[str, ...]], body: Union[str, ParsedScrape]) -> int:
    """How many families of an engine's contract have a series in a body (text: a sample line
    starting with one of the names, `:` or `_` spelling; a parse: a sample). One substring search
    per name: bounded whatever the body (engine detection, when a body carries both engines' names)."""
    if isinstance(body, ParsedScrape):
        return len(contract) - len(missing_in(contract, body))
    def has(name: str) -> bool:
        under = name.replace(":", "_", 1)
        return ("\n" + name) in body or ("\n" + under) in body or body.startswith((name, under))
    return sum(1 for names in contract.values() if any(has(n) for n in names))


def sample_names(gauges: Iterable[str], counters: dict[str, tuple[str, ...]],
                 histograms: dict[str, tuple[str, ...]]) -> frozenset[str]:
    """Every sample name an engine reader reads: its gauges, its counters' candidate names, and each
    candidate histogram's _bucket, _sum and _count (the fast parser's `wanted`)."""
    names = set(gauges)
    for cands in counters.values():
        names.update(cands)
    for cands in histograms.values():
        for base in cands:
            names.update((base + "_bucket", base + "_sum", base + "_count"))
    return frozenset(names)


WANTED = sample_names(GAUGES.values(), COUNTER_NAMES, HISTOGRAM_NAMES) | vllm_tiers.WANTED


def parse_vllm(text: str, notice: tuple[str, ...] = ()) -> ParsedScrape:
    """Parse only the vLLM families headroom reads (fast path); `notice`: exposition.parse's."""
    return parse(text, wanted=WANTED, prefixes=("vllm",), notice=notice)


def _add(scrape: ParsedScrape, replicas: Replicas, attr: str, labels: dict[str, str], value: float) -> None:
    """One engine's running or waiting requests added to its model's reading (an engine once)."""
    model = _model_of(labels)
    if model is None:
        return
    engine = _engine(labels)
    if checked(scrape, value, MAX_REQUESTS) is None or not replicas.first(attr, model, engine):
        return
    r = replicas.reading(model)
    replicas.engines.setdefault(model, set()).add(engine)
    setattr(r, attr, (getattr(r, attr) or 0.0) + value)


def _requests(scrape: ParsedScrape, replicas: Replicas) -> None:
    for attr in ("running", "waiting"):
        for labels, value in scrape.get(GAUGES[attr]):
            _add(scrape, replicas, attr, labels, value)


def _waiting_by_reason(scrape: ParsedScrape, replicas: Replicas) -> None:
    for labels, value in scrape.get(GAUGES["waiting_by_reason"]):
        model = _model_of(labels)
        reason = labels.get("reason")
        if model is None or reason is None or checked(scrape, value, MAX_REQUESTS) is None:
            continue
        r = replicas.reading(model)
        r.waiting_by_reason[reason] = r.waiting_by_reason.get(reason, 0.0) + value


def _capacities(scrape: ParsedScrape) -> dict[tuple[str, str], vllm_tiers.GpuKv]:
    """KV capacity and allocation unit per (model, engine) from cache_config_info (vllm_tiers.gpu_kv)."""
    capacity: dict[tuple[str, str], vllm_tiers.GpuKv] = {}
    for labels, _value in scrape.get(GAUGES["cache_info"]):
        kv = vllm_tiers.gpu_kv(labels)
        if kv.tokens is not None and not 0 < kv.tokens <= MAX_TOKENS:
            scrape.anomaly("out_of_range")  # a KV capacity of 0 or less, or absurd: unknown
            kv = kv._replace(tokens=None, source=None)
        capacity[(labels.get("model_name") or "", _engine(labels))] = kv
    return capacity


def _kv(scrape: ParsedScrape, replicas: Replicas) -> None:
    """Each engine's KV usage with its capacity: live and capacity tokens summed over engines."""
    capacity = _capacities(scrape)
    usage_samples = scrape.get(GAUGES["kv_usage"])
    if not usage_samples:
        usage_samples = scrape.get(GAUGES["kv_usage_legacy"])
        if usage_samples:
            replicas.naming = "legacy-v1"
    for labels, value in usage_samples:
        model = _model_of(labels)
        engine = _engine(labels)
        if model is None or not replicas.first("kv_usage", model, engine):
            continue
        usage = checked(scrape, value, high=1.0)
        r = replicas.reading(model)
        replicas.engines.setdefault(model, set()).add(engine)
        # cache_config_info has no model_name in most versions: match by engine, then any
        cap = capacity.get((model, engine)) or capacity.get(("", engine))
        if cap is None and len(capacity) == 1:
            cap = next(iter(capacity.values()))
        if cap is not None and cap.tokens is not None:
            _add_capacity(r, cap, usage)
        if usage is None:
            replicas.unknown_kv.add(model)  # an engine's usage unusable: the model's live KV unknown
        r.kv_usage = usage if r.kv_usage is None else None  # recomputed by _totals for DP engines


def _add_capacity(r: ReplicaReading, cap: vllm_tiers.GpuKv, usage: Optional[float]) -> None:
    tokens = cap.tokens
    assert tokens is not None  # the caller adds only a capacity it knows
    r.kv_capacity_tokens = (r.kv_capacity_tokens or 0.0) + tokens
    if usage is not None:
        r.kv_live_tokens = (r.kv_live_tokens or 0.0) + usage * tokens
    r.block_size, r.kv_capacity_source = cap.block_size, cap.source
    r.kv_unit_exact, r.kv_unit_max = r.kv_unit_exact and cap.exact, cap.unit_max
    r.num_gpu_blocks = (r.num_gpu_blocks or 0) + (cap.blocks or 0) or None


def _add_counter(scrape: ParsedScrape, key: str, name: str, replicas: Replicas) -> None:
    """A counter summed over its series (engines, finished reasons); aborted requests counted apart too."""
    for labels, value in scrape.get(name):
        model = _model_of(labels)
        if model is None or checked(scrape, value, MAX_COUNT) is None:
            continue
        counters = replicas.reading(model).counters
        counters[key] = counters.get(key, 0.0) + value
        if key == "request_success" and labels.get("finished_reason") == ABORT:
            counters["request_aborted"] = counters.get("request_aborted", 0.0) + value


def _add_histogram(scrape: ParsedScrape, key: str, base: str, replicas: Replicas) -> None:
    for model, hist in _histograms(scrape.get(base + "_bucket"), scrape.get(base + "_sum"), scrape.get(base + "_count"),
                                   scrape).items():
        r = replicas.reading(model)
        old = r.histograms.get(key)
        r.histograms[key] = hist if old is None else (old.plus(hist) or old)


def _totals(scrape: ParsedScrape, replicas: Replicas) -> None:
    """Each reading's engines, naming (no engine label: V0) and KV usage over its engines."""
    for model, r in replicas.by_model.items():
        engine_ids = replicas.engines.get(model, {""})
        r.engines = max(1, len(engine_ids))
        naming = replicas.naming
        r.naming = "v0" if engine_ids == {""} and naming == "v1" else naming
        if model in replicas.unknown_kv:
            r.kv_usage = r.kv_live_tokens = None
        elif r.kv_capacity_tokens:
            r.kv_usage = (r.kv_live_tokens or 0.0) / r.kv_capacity_tokens


def _edges(scrape: ParsedScrape, replicas: Replicas) -> None:
    vllm_tiers.read_edges(scrape, list(replicas.by_model.values()))


# which family fills which reading field, in the order read (engine_pass.read runs it)
VLLM = Engine(naming="v1", engines_at_start=0,
              gauges=(_requests, _waiting_by_reason, _kv),
              counters=COUNTER_NAMES, counter=_add_counter,
              histograms=HISTOGRAM_NAMES, histogram=_add_histogram,
              closing=(_totals, overflow_step, _edges))


def readings_from_scrape(scrape: ParsedScrape, target: str, timestamp: float,
                         target_labels: Optional[dict[str, str]] = None) -> list[ReplicaReading]:
    """One ReplicaReading per model served by the target (engines summed)."""
    return read(VLLM, scrape, target, timestamp, target_labels)


def readings_from_text(text: str, target: str, timestamp: float,
                       target_labels: Optional[dict[str, str]] = None) -> list[ReplicaReading]:
    return readings_from_scrape(parse_vllm(text), target, timestamp, target_labels)
