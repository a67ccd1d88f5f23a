"""Prometheus text (format 0.0.4) for the simulated endpoints, built as strings.

The vLLM page reproduces the single-process exposition of a vLLM 0.32 API server (family order,
HELP texts, types, label names sorted alphabetically, ``*_created`` gauges, histogram samples
``_bucket``… ``_count`` ``_sum``, python_/process_/http_ families) with the simulated values.
``naming="v0"`` gives the legacy shape instead (multiprocess style: no ``engine`` label, no
``_created``, ``_sum`` before the buckets, ``gpu_cache_usage_perc``,
``time_per_output_token_seconds``, ``num_requests_swapped``); ``colon=False`` spells ``vllm_``.
"""
from __future__ import annotations

import math
import sys
from typing import Optional

from .engine import Histo, Replica

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def fmt(v: float) -> str:
    """Python-client style float text: 3.0, 0.25, 1.7959591146690562e+09, +Inf, NaN."""
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    s = repr(v)
    if "e" in s:
        return s
    dot = s.find(".")
    if v > 0 and dot > 6:
        digits = s[:dot] + s[dot + 1:]
        mantissa = (digits[0] + "." + digits[1:]).rstrip("0")
        if mantissa.endswith("."):
            mantissa += "0"
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labelstr(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{esc(labels[k])}"' for k in sorted(labels)) + "}"


_LES: dict[tuple, list[str]] = {}


def _bucket_les(bounds: tuple) -> list[str]:
    """The `le` label values of a histogram's buckets, +Inf last, escaped (a handful of bound sets
    recur on every page)."""
    if 0.0 in bounds:  # 0.0 and -0.0 are one key but two texts
        return [esc(fmt(b)) for b in (*bounds, math.inf)]
    les = _LES.get(bounds)
    if les is None:
        les = _LES[bounds] = [esc(fmt(b)) for b in (*bounds, math.inf)]
    return les


class Page:
    """Accumulates exposition lines."""

    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, typ: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {typ}")

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.lines.append(f"{name}{labelstr(labels)} {fmt(value)}")

    def histogram(self, name: str, labels: dict[str, str], h: Histo, sum_first: bool = False,
                  bounds_fmt=None) -> None:
        cum = h.cumulative()
        if sum_first:
            self.sample(name + "_sum", labels, h.sum)
        # the same lines as labelstr(labels + le) per bucket, with the labels other than `le` written once
        # per histogram and the bounds once per set of bounds (a simulated replica's page is mostly buckets)
        rest = {k: v for k, v in labels.items() if k != "le"}
        before = "".join(f'{k}="{esc(rest[k])}",' for k in sorted(rest) if k < "le")
        after = "".join(f',{k}="{esc(rest[k])}"' for k in sorted(rest) if k > "le")
        les = _bucket_les(h.bounds) if bounds_fmt is None else [esc(bounds_fmt(b)) for b in (*h.bounds, math.inf)]
        bucket = name + "_bucket{" + before + 'le="'
        self.lines.extend(f'{bucket}{le}"{after}}} {fmt(c)}' for le, c in zip(les, cum))
        self.sample(name + "_count", labels, h.count)
        if not sum_first:
            self.sample(name + "_sum", labels, h.sum)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# ---------------------------------------------------------------------------- vLLM
_H = {
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": (
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
        "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
        "blocked status). Sum of all reasons equals vllm:num_requests_waiting."),
    "engine_sleep_state": (
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
        "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."),
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "estimated_flops_per_gpu": ("Estimated number of floating point operations per GPU (for Model "
                                "Flops Utilization calculations)."),
    "estimated_read_bytes_per_gpu": ("Estimated number of bytes read from memory per GPU (for Model "
                                     "Flops Utilization calculations)."),
    "estimated_write_bytes_per_gpu": ("Estimated number of bytes written to memory per GPU (for "
                                      "Model Flops Utilization calculations)."),
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "external_prefix_cache_queries": ("External prefix cache queries from KV connector "
                                      "cross-instance cache sharing, in terms of number of "
                                      "queried tokens."),
    "external_prefix_cache_hits": ("External prefix cache hits from KV connector cross-instance "
                                   "cache sharing, in terms of number of cached tokens."),
    "mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "prompt_tokens_by_source": "Number of prompt tokens by source.",
    "prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "prompt_tokens_cached_by_source": (
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
        "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
        "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
        "vllm:external_prefix_cache_hits."),
    "generation_tokens": "Number of generation tokens processed.",
    "request_success": "Count of successfully processed requests.",
    "admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "time_per_output_token_seconds": "Histogram of time per output token in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "request_prefill_kv_computed_tokens": ("Histogram of new KV tokens computed during prefill "
                                           "(excluding cached tokens)."),
    "cache_config_info": "Information of the LLMEngine CacheConfig",
}

_HIST_ORDER = (
    "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
    "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
    "time_to_first_token_seconds", "inter_token_latency_seconds",
    "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
    "request_queue_time_seconds", "request_inference_time_seconds",
    "request_prefill_time_seconds", "request_decode_time_seconds", "request_num_preemptions",
    "request_prefill_kv_computed_tokens",
)


def cache_config_labels(r: Replica) -> dict[str, str]:
    """The CacheConfig field set of vLLM 0.32 (open label set, values as Python str())."""
    p = r.p
    cap = p.kv_capacity_tokens + p.block_size  # vLLM reports num_gpu_blocks x block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(p.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(p.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(bool(p.enable_prefix_caching)),
        "gpu_memory_utilization": str(p.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(cap / p.max_model_len, 2)),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(cap),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(p.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


def render_vllm(r: Replica, t: float, naming: str = "v1", colon: bool = True) -> str:
    """The /metrics page of replica ``r`` at simulated time ``t``."""
    if naming not in ("v1", "v0"):
        raise ValueError(f"naming must be 'v1' or 'v0', got {naming!r}")
    v0 = naming == "v0"
    pre = "vllm:" if colon else "vllm_"
    st = r.stats
    pg = Page()
    L = {"model_name": r.p.model_name}
    if not v0:
        L["engine"] = "0"
    created = st.created

    def lab(**extra):
        d = dict(L)
        d.update(extra)
        return d

    # mid-jump view: decode steps done so far in the current jump
    s_done = r.steps_done_at(t)
    used = r.used_blocks + r._crossings(s_done)
    gen_tokens = st.generation_tokens + r.n_decode * s_done if s_done else st.generation_tokens
    kv_usage = used / r.usable_blocks

    def counter(key, value_or_series, label_sets=None, no_engine=False):
        name = pre + key
        base = {"model_name": r.p.model_name} if (no_engine or v0) else dict(L)
        pg.family(name + "_total", "counter", _H[key])
        series = value_or_series if label_sets else [({}, value_or_series)]
        for extra, v in series:
            d = dict(base)
            d.update(extra)
            pg.sample(name + "_total", d, v)
        if not v0:
            pg.family(name + "_created", "gauge", _H[key])
            for i, (extra, _) in enumerate(series):
                d = dict(base)
                d.update(extra)
                pg.sample(name + "_created", d, created + 1e-5 * i)

    def gauge(key, series, help_key=None, name=None):
        name = name or (pre + key)
        pg.family(name, "gauge", _H[help_key or key])
        for extra, v in series:
            pg.sample(name, lab(**extra), v)

    if not v0:
        _process_families(pg, r, t)
        for key in ("estimated_flops_per_gpu", "estimated_read_bytes_per_gpu",
                    "estimated_write_bytes_per_gpu"):
            counter(key, 0.0)
    gauge("num_requests_running", [({}, r.num_running)])
    gauge("num_requests_waiting", [({}, r.num_waiting)])
    if v0:
        pg.family(pre + "num_requests_swapped", "gauge", "Number of requests swapped to CPU.")
        pg.sample(pre + "num_requests_swapped", L, 0.0)
        pg.family(pre + "gpu_cache_usage_perc", "gauge",
                  "GPU KV-cache usage. 1 means 100 percent usage.")
        pg.sample(pre + "gpu_cache_usage_perc", L, kv_usage)
    else:
        gauge("num_requests_waiting_by_reason",
              [({"reason": "capacity"}, r.num_waiting), ({"reason": "deferred"}, 0.0)])
        gauge("engine_sleep_state", [({"sleep_state": "awake"}, 1.0),
                                     ({"sleep_state": "weights_offloaded"}, 0.0),
                                     ({"sleep_state": "discard_all"}, 0.0)])
        gauge("kv_cache_usage_perc", [({}, kv_usage)])
        counter("prefix_cache_queries", float(st.prefix_queries))
        counter("prefix_cache_hits", float(st.prefix_hits))
        counter("external_prefix_cache_queries", 0.0)
        counter("external_prefix_cache_hits", 0.0)
        counter("mm_cache_queries", 0.0)
        counter("mm_cache_hits", 0.0)
    counter("num_preemptions", float(st.preemptions))
    counter("prompt_tokens", float(st.prompt_tokens))
    if not v0:
        counter("prompt_tokens_by_source", [({"source": "local_compute"}, st.prompt_local_compute),
                                            ({"source": "local_cache_hit"}, st.prompt_cache_hit),
                                            ({"source": "external_kv_transfer"}, 0.0)], True)
        counter("prompt_tokens_cached", float(st.prompt_cache_hit))
        counter("prompt_tokens_cached_by_source",
                [({"source": "device"}, st.prompt_cache_hit), ({"source": "host"}, 0.0),
                 ({"source": "p2p"}, 0.0), ({"source": "disk"}, 0.0),
                 ({"source": "external_unspecified"}, 0.0)], True)
    counter("generation_tokens", float(gen_tokens))
    reasons = ("stop", "length", "abort") if v0 else ("stop", "length", "abort", "error",
                                                      "repetition")
    counter("request_success", [({"finished_reason": k}, st.success[k]) for k in reasons], True)
    if not v0:
        counter("admission_rejections", [({"reason": "max_num_queued_reqs"}, float(st.admission_rejections)),
                                         ({"reason": "max_num_queued_tokens"}, 0.0)], True,
                no_engine=True)
    for key in _HIST_ORDER:
        if v0 and key in ("request_time_per_output_token_seconds", "request_num_preemptions",
                          "request_prefill_kv_computed_tokens"):
            continue
        h = st.h[key]
        name = pre + key
        help_text = _H[key]
        if v0 and key == "inter_token_latency_seconds":
            name = pre + "time_per_output_token_seconds"
            help_text = _H["time_per_output_token_seconds"]
        pg.family(name, "histogram", help_text)
        pg.histogram(name, L, h, sum_first=v0)
        if not v0:
            pg.family(name + "_created", "gauge", help_text)
            pg.sample(name + "_created", L, created)
    pg.family(pre + "cache_config_info", "gauge", _H["cache_config_info"])
    cc = cache_config_labels(r)
    if v0:
        cc = {k: v for k, v in cc.items() if k in (
            "block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization",
            "is_attention_free", "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
            "sliding_window")}
    else:
        cc["engine"] = "0"
    pg.sample(pre + "cache_config_info", cc, 1.0)
    if not v0:
        _http_families(pg, r)
    return pg.text()


def _process_families(pg: Page, r: Replica, t: float) -> None:
    gen = {"0": 1500 + r.stats.http_requests // 3, "1": 130, "2": 10}
    pg.family("python_gc_objects_collected_total", "counter", "Objects collected during gc")
    for g, v in gen.items():
        pg.sample("python_gc_objects_collected_total", {"generation": g}, v * 10)
    pg.family("python_gc_objects_uncollectable_total", "counter",
              "Uncollectable objects found during GC")
    for g in gen:
        pg.sample("python_gc_objects_uncollectable_total", {"generation": g}, 0.0)
    pg.family("python_gc_collections_total", "counter",
              "Number of times this generation was collected")
    for g, v in gen.items():
        pg.sample("python_gc_collections_total", {"generation": g}, v)
    vi = sys.version_info
    pg.family("python_info", "gauge", "Python platform information")
    pg.sample("python_info", {"implementation": "CPython", "major": str(vi.major),
                              "minor": str(vi.minor), "patchlevel": str(vi.micro),
                              "version": f"{vi.major}.{vi.minor}.{vi.micro}"}, 1.0)
    for name, help_text, typ, v in (
        ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge", 2.17321472e10),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge", 6.43244032e9),
        ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
         "gauge", round(r.started, 2)),
        ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
         "counter", round(r.busy_seconds * 1.05 + 0.01 * (t - r.started), 2)),
        ("process_open_fds", "Number of open file descriptors.", "gauge", 34.0),
        ("process_max_fds", "Maximum number of open file descriptors.", "gauge", 1048576.0),
    ):
        pg.family(name, typ, help_text)
        pg.sample(name, {}, v)


def _http_families(pg: Page, r: Replica) -> None:
    st = r.stats
    created = st.created
    h = {"handler": "/v1/chat/completions"}
    hm = {"handler": "/v1/chat/completions", "method": "POST"}
    pg.family("http_requests_total", "counter",
              "Total number of requests by method, status and handler.")
    pg.sample("http_requests_total", {**hm, "status": "2xx"}, st.http_requests)
    pg.family("http_requests_created", "gauge",
              "Total number of requests by method, status and handler.")
    pg.sample("http_requests_created", {**hm, "status": "2xx"}, created)
    for name, total, text in (
        ("http_request_size_bytes", st.http_request_bytes,
         "Content length of incoming requests by handler. Only value of header is respected. "
         "Otherwise ignored. No percentile calculated. "),
        ("http_response_size_bytes", st.http_response_bytes,
         "Content length of outgoing responses by handler. Only value of header is respected. "
         "Otherwise ignored. No percentile calculated. "),
    ):
        pg.family(name, "summary", text)
        pg.sample(name + "_count", h, st.http_requests)
        pg.sample(name + "_sum", h, total)
        pg.family(name + "_created", "gauge", text)
        pg.sample(name + "_created", h, created)
    text = ("Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ")
    pg.family("http_request_duration_highr_seconds", "histogram", text)
    pg.histogram("http_request_duration_highr_seconds", {}, st.http_duration_highr)
    pg.family("http_request_duration_highr_seconds_created", "gauge", text)
    pg.sample("http_request_duration_highr_seconds_created", {}, created)
    text = ("Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ")
    pg.family("http_request_duration_seconds", "histogram", text)
    pg.histogram("http_request_duration_seconds", hm, st.http_duration)
    pg.family("http_request_duration_seconds_created", "gauge", text)
    pg.sample("http_request_duration_seconds_created", hm, created)


# ---------------------------------------------------------------------------- gateway
def render_gateway(fleet, t: float) -> str:
    """Envoy AI Gateway ext-proc style page (OTel Prometheus exporter naming).

    Labels: gen_ai_operation_name, gen_ai_original_model, gen_ai_provider_name,
    gen_ai_request_model, gen_ai_response_model, otel_scope_*; header-mapped task_type (and
    session_id when enabled); error_type="_OTHER" on failed requests; gen_ai_token_type on the
    token usage histogram."""
    gw = fleet.gateway
    opts = gw.opts
    models = {p.name: p.model_name for p in fleet.config.pools}
    pg = Page()
    pg.family("target_info", "gauge", "Target metadata")
    pg.sample("target_info", {"service_name": "ai-gateway-extproc",
                              "telemetry_sdk_language": "go", "telemetry_sdk_name": "opentelemetry",
                              "telemetry_sdk_version": "1.44.0"}, 1.0)

    def labels(key: tuple, token_type: Optional[str] = None) -> dict[str, str]:
        pool, task_type, session, error = key[:4]
        m = models.get(pool, pool)
        d = {"gen_ai_operation_name": "chat", "gen_ai_original_model": m,
             "gen_ai_provider_name": opts.provider, "gen_ai_request_model": m,
             "gen_ai_response_model": m, "otel_scope_name": "envoyproxy/ai-gateway",
             "otel_scope_schema_url": "", "otel_scope_version": ""}
        if task_type is not None:
            d["task_type"] = task_type
        if session == "__overflow__":
            d = {"otel_metric_overflow": "true"}
        elif session is not None:
            d["session_id"] = session
        if error:
            d["error_type"] = "_OTHER"
        if token_type is not None:
            d["gen_ai_token_type"] = token_type
        return d

    for name, help_text, store, tok in (
        ("gen_ai_client_token_usage", "Number of tokens processed.", gw.tokens, True),
        ("gen_ai_server_request_duration_seconds",
         "Generative AI server request duration such as time-to-last byte or last output token.",
         gw.duration, False),
        ("gen_ai_server_time_per_output_token_seconds",
         "Time per output token generated after the first token for successful responses.",
         gw.tpot, False),
        ("gen_ai_server_time_to_first_token_seconds",
         "Time to receive first token in streaming responses.", gw.ttft, False),
    ):
        pg.family(name, "histogram", help_text)
        for key in sorted(store, key=lambda k: tuple(str(x) for x in k)):
            lab = labels(key, key[4] if tok else None)
            pg.histogram(name, lab, store[key])
    return pg.text()


# ---------------------------------------------------------------------------- application
def render_app(fleet, t: float) -> str:
    """Application-side agent task metrics (convention documented in README.md)."""
    app = fleet.app
    pg = Page()
    names = sorted(app.started)
    pg.family("agent_calls_abandoned_total", "counter",
              "Model calls the application gave up on before their answer (request_timeout_s).")
    for n in names:
        pg.sample("agent_calls_abandoned_total", {"task_type": n}, app.abandoned[n])
    pg.family("agent_sessions_active", "gauge", "Agent sessions (tasks) in progress.")
    for n in names:
        pg.sample("agent_sessions_active", {"task_type": n}, app.active[n])
    pg.family("agent_task_duration_seconds", "histogram",
              "Wall time of completed agent tasks, tool waits included.")
    for n in names:
        pg.histogram("agent_task_duration_seconds", {"task_type": n}, app.duration[n])
    pg.family("agent_task_model_calls_total", "counter",
              "Model calls (gateway requests, retries included) made by completed agent tasks.")
    for n in names:
        pg.sample("agent_task_model_calls_total", {"task_type": n}, app.calls[n])
    pg.family("agent_tasks_failed_total", "counter", "Agent tasks that gave up after retries.")
    for n in names:
        pg.sample("agent_tasks_failed_total", {"task_type": n}, app.failed[n])
    pg.family("agent_tasks_started_total", "counter", "Agent tasks started.")
    for n in names:
        pg.sample("agent_tasks_started_total", {"task_type": n}, app.started[n])
    return pg.text()


# ---------------------------------------------------------------------------- DCGM
def gpu_uuid(replica_name: str, gpu: int) -> str:
    import hashlib
    h = hashlib.sha1(f"{replica_name}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _dcgm_value(v: float, integer: bool = False) -> str:
    return str(int(v)) if integer else f"{v:f}"


def render_dcgm(fleet, t: float) -> str:
    """dcgm-exporter style page: power (W) and total energy (mJ counter) per GPU of each live
    replica (labels gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION,
    pod, namespace, container)."""
    lines = []
    rows = []
    for r in fleet.replicas:
        if not r.alive:
            continue
        for g in range(r.p.gpus_per_replica):
            base = (f'gpu="{g}",UUID="{gpu_uuid(r.name, g)}",pci_bus_id="00000000:{0x18 + g:02X}:00.0",'
                    f'device="nvidia{g}",modelName="{esc(r.p.gpu_model)}",Hostname="{r.name}",'
                    f'DCGM_FI_DRIVER_VERSION="570.124.06",container="vllm",namespace="llm",'
                    f'pod="{r.name}"')
            n = (r.op.n + len(r.op.chunks)) if (r.op is not None and r.op.t0 <= t < r.op.t_end) else 0
            watts = r.power_watts(n) if n else r.p.idle_watts
            rows.append((base, watts, r.energy_at(t) * 1000.0))
    lines.append("# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).")
    lines.append("# TYPE DCGM_FI_DEV_POWER_USAGE gauge")
    for base, w, _ in rows:
        lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{base}}} {_dcgm_value(w)}")
    lines.append("# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot "
                 "(in mJ).")
    lines.append("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter")
    for base, _, mj in rows:
        lines.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{base}}} {_dcgm_value(mj, True)}")
    return "\n".join(lines) + "\n"
