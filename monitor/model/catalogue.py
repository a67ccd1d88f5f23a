"""The one catalogue of metrics headroom exports on its own /metrics.

Everything else (the collector, docs/metrics.md, the rules, the dashboards, the Helm chart) takes
names from here. Add a metric here first; `python -m monitor.model.catalogue > docs/metrics.md` renders the
documentation and a test fails when the committed file is not current.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class MetricDef:
    name: str
    type: str  # "gauge" or "counter" (counters are declared without _total)
    help: str
    labels: tuple[str, ...] = ()
    group: str = "pipeline"

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name


def _m(name: str, type_: str, help_: str, labels: Iterable[str] = (), group: str = "pipeline") -> MetricDef:
    return MetricDef(name, type_, help_, tuple(labels), group)


CATALOGUE: tuple[MetricDef, ...] = (
    # --- the live pipeline (issue: live pipeline)
    _m("headroom_active_requests", "gauge", "Requests in the running batch (vllm num_requests_running), summed over the pool.", ["pool"]),
    _m("headroom_queued_requests", "gauge", "Queued requests of the pool by where they wait: where=engine, in the engine queues (vllm num_requests_waiting, SGLang num_queue_reqs), summed over the pool; where=gateway, in front of the engines (the sum over gateways of headroom_gateway_queued_requests; absent when no gateway says). Both are part of the load headroom counts. Select where!=\"gateway\" for the engine queue (series written before the label have none).", ["pool", "where"]),
    _m("headroom_gateway_queued_requests", "gauge", "Requests waiting in front of the engines, by gateway; part of the load headroom counts. source=queue: the router's or gateway's own queue gauge (llm-d / inference gateway flow control, Dynamo router); source=in_flight: the gateway's requests in flight (LiteLLM litellm_in_flight_requests less its own scrape, llm-d llm_d_epp_request_running) beyond what the pool's engines report running and waiting and the queue gauges already count, shared among the gateways feeding the pool (a gateway feeding several pools: unmapped, counted nowhere); source=estimate, a gateway with neither gauge (Envoy AI Gateway): its calls' latency seconds finished per second over the task window (arrival rate x latency) less the engines' completion rate x mean e2e, an average over the window.", ["pool", "gateway", "source"]),
    _m("headroom_gateway_added_latency_seconds", "gauge", "What the gateways add to a call: their call latency (over the task window, every task type fed to the pool) less the engines' end-to-end latency (over the latency window); q 0.5, 0.9, 0.95, 0.99 are differences of the quantiles (not the quantile of each call's difference), mean the mean added time. Negative when the calls measured differ (calls sent around the gateway).", ["pool", "q"]),
    _m("headroom_priority_requests", "gauge", "Requests of the pool by scheduling priority where the engine gives them (SGLang with --enable-priority-scheduling: num_running_reqs / num_queue_reqs{priority=\"<n>\"}; a priority seen once stays listed, at 0 without requests), state running or queued, summed over the replicas that report them. A breakdown of headroom_active_requests and headroom_queued_requests{where=\"engine\"}, never added to them (the engine's totals are its priority=\"\" series).", ["pool", "priority", "state"]),
    _m("headroom_queued_requests_by_reason", "gauge", "Waiting requests by reason (capacity, deferred) where the engine reports it.", ["pool", "reason"]),
    _m("headroom_kv_tokens", "gauge", "Live KV-cache tokens, the estimate: KV block usage times KV capacity less half a block per running request (each one's partly filled last block; when requests fit in one block, running requests times their mean prompt plus half their mean generation), kept within headroom_kv_tokens_low..high; summed over the pool. Capacity, the KV limit and sessions per MW use it.", ["pool"]),
    _m("headroom_kv_tokens_low", "gauge", "Lower bound of live KV-cache tokens: headroom_kv_tokens_high less block_size - 1 per running request (every last block holding one token), summed over the pool.", ["pool"]),
    _m("headroom_kv_tokens_high", "gauge", "Upper bound of live KV-cache tokens: what block usage implies (KV usage times KV capacity, every last block counted full), summed over the pool.", ["pool"]),
    _m("headroom_shed_requests_rate", "gauge", "Requests per second turned away over the rate window, by reason: rejected (engine admission rejections, vllm:admission_rejections_total), aborted (vllm:request_success_total{finished_reason=\"abort\"}: given up, mostly while queued), abandoned (calls the application gave up on, agent_calls_abandoned_total, beyond those the engines counted as aborted), gateway_rate_limited (429), gateway_error (5xx), gateway_timeout (408, 504, a timeout class) over the task window. Absent when no source reports the reason. A gateway's 429 relaying an engine rejection is counted at both (headroom_offered_requests takes the larger of the engines' and the gateways' sums, never both).", ["pool", "reason"]),
    _m("headroom_offered_requests", "gauge", "Offered load in concurrent requests: the served active requests plus the arrivals not served (the shed ones, the larger of the engines' and the gateways' shed rates, and the engine queue's growth over the rate window) times their mean service time (mean end-to-end latency less mean queue time); a steady queue adds nothing (its requests are served in turn or shed). Forecasts, time to exhaustion and the recommended replicas use it when it is known.", ["pool"]),
    _m("headroom_rendering_requests", "gauge", "Requests in chat templating / tokenisation before admission (vLLM 0.34 vllm:request_render_duration_seconds: rate x mean duration over the rate window), summed over the pool.", ["pool"]),
    _m("headroom_kv_capacity_tokens", "gauge", "KV-cache capacity in tokens, summed over the pool.", ["pool"]),
    _m("headroom_kv_tokens_method_info", "gauge", "How headroom_kv_tokens and its band were found, always 1: method half_block or tokens_per_request (the block size is the allocation unit), hybrid (a hybrid-KV model: vLLM's block_size label is the smallest block size over its KV-cache groups, a lower bound of the allocation unit; the band is widened with the largest unit the labels name, and with mamba or sliding-window layers even that low edge bounds only the last blocks' waste), exact (no block rounding), mixed (replicas differ).", ["pool", "method"]),
    _m("headroom_kv_tier_capacity_tokens", "gauge", "KV-cache capacity in tokens by tier, summed over the pool: tier gpu (source kv_cache_size_tokens, group-aware; or blocks_x_block_size where the labels show one KV-cache group, blocks_x_block_size_approx with a sliding window and no kv_cache_size_tokens), cpu (the offload tier: vllm:kv_offload_config_info cpu_kv_cache_size_tokens, the tokens it holds for requests of max_model_len).", ["pool", "tier", "source"]),
    _m("headroom_kv_tier_capacity_bytes", "gauge", "KV-cache tier capacity in bytes, summed over the pool: tier cpu (vllm:kv_offload_config_info cpu_kv_cache_size_bytes; before vLLM 0.34, cache_config_info kv_offloading_size GiB, source kv_offloading_size), lmcache_cpu (source configured: pools.<pool>.lmcache_cpu_bytes_per_replica x replicas; LMCache has no capacity gauge).", ["pool", "tier", "source"]),
    _m("headroom_kv_tier_used_bytes", "gauge", "Bytes held by LMCache beside the engines, by tier (lmcache_cpu: lmcache:local_cache_usage, lmcache_disk: local_storage_usage, lmcache_remote: remote_cache_usage), summed over the pool. vLLM's own vllm:kv_offload_cpu_cache_usage_perc is not read: it is space pinned by transfers, not occupancy (a full idle tier reads about 0).", ["pool", "tier"]),
    _m("headroom_kv_offload_allocation_failures_rate", "gauge", "KV stores the CPU offload tier refused for want of room, per second over the rate window (vllm:kv_offload_allocation_failure_total): above 0, the tier is full.", ["pool"]),
    _m("headroom_prefix_cache_hit_tokens_rate", "gauge", "Prompt tokens per second served from a prefix cache, by the tier that supplied them (vllm:prompt_tokens_cached_by_source_total{source}: device, host, p2p, disk, external_unspecified), over the rate window, summed over the pool.", ["pool", "tier"]),
    _m("headroom_prefix_cache_hit_share_ratio", "gauge", "Share of the pool's prompt tokens each prefix-cache tier supplied over the rate window (its cached tokens over vllm:prompt_tokens_total, which counts cached ones): 1 less their sum is the prompt KV computed.", ["pool", "tier"]),
    _m("headroom_lmcache_hit_ratio", "gauge", "LMCache hit tokens over requested tokens over the rate window (lmcache:num_hit_tokens_total / num_requested_tokens_total; its *_hit_rate gauges restart at each log interval and are not read).", ["pool"]),
    _m("headroom_spec_decode_acceptance_ratio", "gauge", "Speculative decoding: accepted over draft tokens over the rate window (vllm:spec_decode_num_accepted_tokens_total / _num_draft_tokens_total), summed over the pool. A change marks a learned knee suspect (headroom_knee_suspect).", ["pool"]),
    _m("headroom_spec_decode_acceptance_length", "gauge", "Speculative decoding: tokens per decode step, 1 + accepted tokens / drafts over the rate window.", ["pool"]),
    _m("headroom_spec_decode_position_acceptance_ratio", "gauge", "Speculative decoding: the share of drafts whose token at this draft position was accepted, over the rate window (vllm:spec_decode_num_accepted_tokens_per_pos_total{position} / _num_drafts_total).", ["pool", "position"]),
    _m("headroom_lora_adapters", "gauge", "LoRA adapter slots of the pool (vllm:lora_requests_info, the newest series of each replica): state max (--max-loras per engine, summed), running and waiting (adapters of the running and waiting requests).", ["pool", "state"]),
    _m("headroom_replica_kv_tier_capacity_tokens", "gauge", "KV-cache capacity in tokens of one replica by tier (as headroom_kv_tier_capacity_tokens).", ["pool", "replica", "tier", "source"]),
    _m("headroom_kv_usage_ratio", "gauge", "Live KV tokens over KV capacity tokens (0-1).", ["pool"]),
    _m("headroom_kv_pool_usage_ratio", "gauge", "Usage of each KV pool of hybrid models (0-1), used over size summed over the pool's replicas that have it: kv_pool full (full-attention tokens, what the KV tokens and capacity above count), swa (sliding-window tokens), mamba (state slots, one per request). SGLang: kv_used_tokens / max_total_num_tokens, swa_used_tokens / max_total_num_tokens_swa, mamba_used_tokens / (mamba used + available + evictable); sglang:token_usage is the largest of them. The fullest pool bounds how many requests fit. Absent for engines with one KV pool.", ["pool", "kv_pool"]),
    _m("headroom_replicas", "gauge", "Replicas of the pool that answered in the last cycle (Prometheus mode, while the query layer does not answer: the last read's replicas, and the pool is stale).", ["pool"]),
    _m("headroom_replicas_configured", "gauge", "Replicas of the pool headroom knows about (answering or not).", ["pool"]),
    _m("headroom_replica_active_requests", "gauge", "Running requests of one replica.", ["pool", "replica"]),
    _m("headroom_replica_queued_requests", "gauge", "Waiting requests of one replica.", ["pool", "replica"]),
    _m("headroom_replica_kv_tokens", "gauge", "Live KV-cache tokens of one replica: the estimate, partial last blocks corrected (as headroom_kv_tokens).", ["pool", "replica"]),
    _m("headroom_replica_kv_tokens_low", "gauge", "Lower bound of one replica's live KV-cache tokens (as headroom_kv_tokens_low).", ["pool", "replica"]),
    _m("headroom_replica_kv_tokens_high", "gauge", "Upper bound of one replica's live KV-cache tokens: what its block usage implies (as headroom_kv_tokens_high).", ["pool", "replica"]),
    _m("headroom_replica_kv_capacity_changes", "counter", "KV capacity changes seen on one replica (vLLM 0.34's extensible KV cache is sized after warm-up: capacity can differ between identical replicas and across restarts); each change is logged once.", ["pool", "replica"]),
    _m("headroom_replica_kv_capacity_tokens", "gauge", "KV-cache capacity in tokens of one replica.", ["pool", "replica"]),
    _m("headroom_replica_slow", "gauge", "1 when the replica is named slow: its inter-token latency over the last 120 s (at least 50 tokens) has stayed >= 1.5x the median of its pool's other replicas' for 60 s; its share of the knee is discounted by 1 - 1 / headroom_replica_latency_ratio. Else 0 (also with no peer to compare with).", ["pool", "replica"]),
    _m("headroom_replica_latency_ratio", "gauge", "The replica's latency at its load over its pool's: its mean inter-token latency over the last 120 s over the median of its peers' (absent with fewer than 50 tokens, or no peer).", ["pool", "replica"]),
    _m("headroom_replica_up", "gauge", "1 when the replica answered in the last cycle.", ["pool", "replica"]),
    _m("headroom_replica_stalled", "gauge", "1 when the replica holds work (running or waiting) but completed no request and generated no token over global.stall_window (60 s): its capacity is left out of the pool's, as a lost replica's.", ["pool", "replica"]),
    _m("headroom_completion_rate", "gauge", "Finished requests per second over the rate window (all finish reasons).", ["pool"]),
    _m("headroom_prompt_tokens_rate", "gauge", "Prompt tokens per second over the rate window.", ["pool"]),
    _m("headroom_generation_tokens_rate", "gauge", "Generated tokens per second over the rate window.", ["pool"]),
    _m("headroom_prefix_cache_hit_ratio", "gauge", "Prefix-cache hit tokens over queried tokens in the rate window.", ["pool"]),
    _m("headroom_preemption_rate", "gauge", "Preemptions per second over the rate window.", ["pool"]),
    _m("headroom_latency_seconds", "gauge", "Latency quantile over the latency window from histogram bucket deltas; kind is ttft, itl, e2e or queue; q is 0.5, 0.9, 0.95, 0.99 or mean (q, not quantile: that label is reserved for summaries).", ["pool", "kind", "q"]),
    _m("headroom_littles_law_ratio", "gauge", "Completion rate x mean end-to-end latency over mean observed (active + queued): a planning check near 1, not a limit.", ["pool"]),
    _m("headroom_pool_stale", "gauge", "1 when no replica of the pool answered in the last cycle; its values are then withheld (a pool with some replicas down is not stale: it has less capacity).", ["pool"]),
    _m("headroom_pool_last_fresh_timestamp_seconds", "gauge", "When the pool's values were last fresh (Unix time).", ["pool"]),
    _m("headroom_source_up", "gauge", "1 when the source target answered and parsed in the last cycle.", ["source", "target"]),
    _m("headroom_source_duration_seconds", "gauge", "How long the source target's request of the last cycle took (an answer, a failure or the cycle deadline).", ["source", "target"]),
    _m("headroom_source_slow", "counter", "Cycles in which the source target was slow but not down: a gateway that answered after global.scrape_timeout, or after the cycle deadline (its answer read the next cycle), or that missed a cycle by a timeout while its last reading is kept (at most 2 cycles in a row: then it is down). headroom_source_up stays 1.", ["source", "target"]),
    _m("headroom_source_missing_families", "gauge", "Families of the metric contract (the vLLM families headroom's numbers need: running, waiting, KV usage and capacity, completions, generated tokens, e2e / TTFT / queue-time histograms) that an answering target did not expose; the numbers they feed are unknown.", ["source", "target"]),
    _m("headroom_source_missing_family_info", "gauge", "1 for each contract family an answering target did not expose (renamed in a new engine version, or turned off).", ["source", "target", "family"]),
    _m("headroom_source_stale_seconds", "gauge", "Prometheus mode: the age of the values in use for each part of the read (part: replicas, the per-replica gauges and counters, 0 when this cycle's query answered; histograms, the pools' latency histograms summed by the query layer over global.latency_window, asked again once a tenth of the window has passed since they answered, so up to that age (30 s at 5m) while they answer; totals, with a pool SLO, the pools' cumulative buckets its burn windows read, asked every cycle, 0 when this cycle's query answered, else the last ones are reused and no new point of the burn windows is taken). A part that could not be read keeps its last values, marked stale, and says so once in the log: an age above those is a failed read.", ["source", "part"]),
    _m("headroom_source_errors", "counter", "Source failures by reason (timeout, connect, http, parse, ...).", ["source", "reason"]),
    _m("headroom_cycle_duration_seconds", "gauge", "Wall time of the last collection cycle."),
    _m("headroom_last_success_timestamp_seconds", "gauge", "When the last cycle with at least one answering source ended (Unix time)."),
    _m("headroom_cycles", "counter", "Collection cycles run."),
    _m("headroom_last_cycle_age_seconds", "gauge", "Seconds since the last collection cycle finished, on the monotonic clock, computed when /metrics is scraped: it grows while cycles are stopped, whatever the wall clock does."),
    _m("headroom_cycle_interval_seconds", "gauge", "The configured collection interval (global.interval)."),
    _m("headroom_clock_steps", "counter", "Clock steps found between two cycles, by clock and direction (back, forward): clock=\"headroom\", headroom's wall clock moved more than 1 s apart from the boot-time clock (the cycle state is moved onto the new clock); clock=\"query_layer\" (Prometheus mode), the time the query layer answered at moved more than 1 s apart from it, beyond the requests' own durations. Prometheus mode reads every query at the query layer's time, never headroom's.", ["clock", "direction"]),
    _m("headroom_dropped_series", "counter", "Series dropped by the cardinality caps, by what was capped.", ["what"]),
    _m("headroom_input_anomalies", "counter", "Malformed but usable input seen in source bodies, by kind (duplicate_series, duplicate_engine, non_finite, negative, out_of_range, histogram_without_inf, histogram_not_cumulative, unknown_type, native_histogram (a native-histogram item where a value goes: that item skipped, the rest of the body read), partial_response, stale_sample: a sample timestamped over 5 minutes ago; alerts_cut: headroom's alerts left out of the landing page and /api/v1/snapshot past 200 alerts or 64 KiB of text, or kept with a summary or labels cut to 1 KiB; overflow and gateway_queue_overflow: a sum of finite values past the largest float, unknown rather than +Inf, gateway_too_large: a gateway body over 8 MiB, not parsed; aux_rows_cut: a gateway, router or DCGM body past 20,000 sample rows, or an alerts answer past 5,000 alerts, read up to there (once per body and cycle); gateway_unattributed: a cycle's gateway reading that two pools the gateway may feed answer to (a gateway without sources.gateways[].labels in front of two clusters serving the same model), given to neither; gateway_queue_unmapped: a gateway queue row no one pool of the gateway's scope takes; invalid_text: a label value, alert text or source detail that cannot be written as UTF-8 (a lone surrogate such as \\ud800 in a JSON answer), used with U+FFFD in its place, one per text); the value is dropped for that replica (unknown, never 0) or used as documented, never fatal.", ["kind"]),
    _m("headroom_render_errors", "counter", "Parts of headroom's own /metrics renders dropped by a failure, by family: a metric name (a sample the catalogue refuses, e.g. a pool key's label clashing with the metric's own), pool (one pool's series), forecast (the forecasts' series), snapshot (the cycle's other series), status (the process status), or all (the whole render failed: /metrics keeps serving the previous body, /-/ready answers 503 and headroom_last_cycle_age_seconds counts from that body). Everything else is served. Rendered at each scrape. Alert: HeadroomRenderErrors.", ["family"]),
    _m("headroom_build_info", "gauge", "Build information, always 1.", ["version"]),
    _m("headroom_shards", "gauge", "How many shards split the pools (global.shard TOTAL; 1 unsharded); `shard` is this daemon's index. The alert HeadroomShardDown compares the shards that export it with this number.", ["shard"]),
    _m("headroom_web_events", "counter", "headroom's own web server, by event: connections_accepted, connections_refused, connections_evicted (a connection that had not sent a whole request, shed at the connection cap), client_disconnects, header_timeouts, idle_timeouts, write_timeouts, tls_handshake_timeouts, tls_handshake_errors, tls_client_cert_rejected, bad_requests, overloaded (503: every worker busy), requests, handler_errors, auth_throttled (429 at once, no password check: a client address that asked for too many checks of credentials not known good; monitor/kit/web/auth.py).", ["event"]),
    _m("headroom_web_open_connections", "gauge", "Connections open on headroom's own web server."),
    _m("headroom_store_errors", "counter", "Failed operations of the embedded history store, by operation (open: 1 when the store could not be opened as configured at start-up, said in one log line: a corrupt file moved aside and a fresh store started, one that cannot be written read only, one that cannot be read not used; append: a cycle's points not written, one whose store another process held locked for over 0.5 s kept and written with the next append; maintain: expiry and downsampling; restore: saved SLO-window rows of the wrong type left out at start-up). The cycle and the other pools' numbers go on; history has a gap.", ["operation"]),
    # --- capacity model
    _m("headroom_knee_requests", "gauge", "Concurrent requests (active + queued) per pool at the utilisation knee, where latency turns up; source says learned or prior.", ["pool"], "capacity"),
    _m("headroom_knee_kv_tokens", "gauge", "Live KV tokens at the utilisation knee.", ["pool"], "capacity"),
    _m("headroom_knee_info", "gauge", "How the knee was found (source=learned|prior, signal), always 1; confidence in headroom_knee_confidence_ratio.", ["pool", "source", "signal"], "capacity"),
    _m("headroom_knee_confidence_ratio", "gauge", "Confidence of the learned knee fit (0-1); 0 for a prior.", ["pool"], "capacity"),
    _m("headroom_knee_implausible", "gauge", "1 when the knee learned for the pool was refused or withdrawn as implausible: far under the engine's slot and KV limits, or contradicted by load well past it without latency turning up (the prior, or the knee published before, answers; knee_detail says why). Else 0.", ["pool"], "capacity"),
    _m("headroom_knee_suspect", "gauge", "1 when the learned knee may no longer hold: since it was learned, the KV capacity per replica changed by more than 1 % or speculative decoding's acceptance by more than 20 % (relative), or speculative decoding began; the knee is kept until a new one is learned (knee_suspect in the JSON says why). 0 otherwise, and for a prior.", ["pool"], "capacity"),
    _m("headroom_utilisation_ratio", "gauge", "Load (active + engine queued + gateway queued, averaged over the latency window) over the effective capacity.", ["pool"], "capacity"),
    _m("headroom_ratio", "gauge", "Headroom: 1 - load / effective capacity (the smallest of headroom_capacity_requests' limits). scenario current: the load averaged over the latency window (the engines' by Little's law, completion rate x mean e2e over the rate window, plus the gateway-queued requests' time-weighted mean; the mean of the cycles' active + engine queued + gateway queued while Little's law is unknown): what the alerts judge; n_minus_1: the same with the largest replica lost; instant: this cycle's load (it swings with agent tool waits). May go negative: below 0 while a latency target is over its allowed share (limit slo).", ["pool", "scenario"], "capacity"),
    _m("headroom_headroom_requests", "gauge", "Further concurrent requests that fit within the effective capacity; scenario current, n_minus_1 (on the load averaged over the latency window) or instant (this cycle's load).", ["pool", "scenario"], "capacity"),
    _m("headroom_capacity_requests", "gauge", "Capacity in concurrent requests by limiting factor: slots (max_num_seqs), kv (KV tokens / tokens per request), knee, slo (only while a latency target of the pool, engine or gateway or task, has more than its allowed share over target in the latency window, at least 20 observations: the load scaled down by allowed / over, below the load), lora (only while requests wait for a LoRA adapter slot: active requests x slots / adapters wanted, vLLM; SGLang: the active requests while every slot is in use and requests queue), and effective (the smallest). No SLO targets configured: no slo limit.", ["pool", "limit"], "capacity"),
    _m("headroom_sessions", "gauge", "Concurrent agent sessions (the application's agent_sessions_active; else, with an opt-in gateway session label, sessions active in the task window).", ["pool"], "capacity"),
    _m("headroom_session_capacity", "gauge", "Agent sessions sustainable within the SLO: knee concurrency / active requests per session.", ["pool"], "capacity"),
    _m("headroom_power_watts", "gauge", "GPU power of the pool (DCGM_FI_DEV_POWER_USAGE summed, or configured watts per replica).", ["pool"], "capacity"),
    _m("headroom_sessions_per_megawatt", "gauge", "Sustainable concurrent agent sessions per megawatt of GPU power.", ["pool"], "capacity"),
    _m("headroom_slo_violation_ratio", "gauge", "Fraction of tasks (or calls) over their latency target in the SLO window.", ["pool", "task_type"], "capacity"),
    _m("headroom_slo_objective_ratio", "gauge", "The SLO's objective: the share of tasks (or calls) that must finish at or under their latency target (1 - it is the error budget); beside headroom_slo_violation_ratio, which HeadroomLatencyOverTarget compares with the budget.", ["pool", "task_type"], "capacity"),
    _m("headroom_slo_burn_rate", "gauge", "Error-budget burn rate over a window (1 = spending the budget exactly); absent until the history covers the window.", ["pool", "task_type", "window"], "capacity"),
    _m("headroom_task_arrival_rate", "gauge", "Tasks started per second over the task window (capacity.task_window), by task type.", ["pool", "task_type"], "capacity"),
    _m("headroom_task_completion_rate", "gauge", "Tasks completed per second over the task window (capacity.task_window), by task type: the application's task-duration histogram's count (absent without it).", ["pool", "task_type"], "capacity"),
    _m("headroom_task_calls_per_task", "gauge", "Model calls per completed task over the task window (capacity.task_window), by task type.", ["pool", "task_type"], "capacity"),
    _m("headroom_task_latency_seconds", "gauge", "Task completion latency quantile by task type (q 0.5, 0.9, 0.95, 0.99).", ["pool", "task_type", "q"], "capacity"),
    _m("headroom_call_latency_seconds", "gauge", "Per-call latency quantile by class (interactive, deferrable or its older name batch, as capacity.task_classes or a class label says; q 0.5, 0.9, 0.95, 0.99).", ["pool", "class", "q"], "capacity"),
    # --- spare capacity for deferrable work (issue 39; docs/spare-capacity.md)
    _m("headroom_spare_requests", "gauge", "Concurrent deferrable requests that fit below the knee x (1 - capacity.spare_margin) beside the interactive load's forecast 95% upper band (and its load now): the fewest from now to the horizon's end (now, 1h, 6h, 1d). Absent when not known (stale data, no forecast reaching the horizon).", ["pool", "horizon"], "spare"),
    _m("headroom_deferrable_budget_ratio", "gauge", "The deferrable budget D in [0, 1] for a batch dispatcher's gate (llm-d async processor prometheus-query): the fewest spare requests over capacity.spare_budget_horizon over the knee x (1 - margin); 0 when the data behind it is stale or the pool is over its SLO now.", ["pool"], "spare"),
    _m("headroom_deferrable_requests", "gauge", "Concurrent deferrable requests now: per deferrable task type (capacity.task_classes) its calls per second x their mean latency over the task window; absent without task types.", ["pool"], "spare"),
    # --- forecasts
    _m("headroom_forecast_requests", "gauge", "Forecast mean of concurrent requests at the horizon (1h, 1d, 1w); recomputed on the refit schedule.", ["pool", "horizon"], "forecast"),
    _m("headroom_forecast_peak_requests", "gauge", "Forecast peak of concurrent requests within the horizon (mean path).", ["pool", "horizon"], "forecast"),
    _m("headroom_forecast_peak_requests_upper", "gauge", "Upper bound (95%) of the forecast peak of concurrent requests within the horizon.", ["pool", "horizon"], "forecast"),
    _m("headroom_forecast_peak_timestamp_seconds", "gauge", "When the forecast peak within the horizon falls (Unix time).", ["pool", "horizon"], "forecast"),
    _m("headroom_recommended_replicas", "gauge", "Fewest replicas for which the forecast's 95% upper band over the horizon stays at or below the knee capacity with one replica lost (knee per replica = the pool's knee / its replicas answering).", ["pool", "horizon"], "forecast"),
    _m("headroom_replica_lead_time_seconds", "gauge", "How long a new replica of the pool takes to serve: pools.<pool>.replica_lead_time when configured, else measured from a new replica's first successful scrape to its first completed request; HeadroomExhaustionWithinLeadTime compares it with headroom_exhaustion_seconds.", ["pool"], "forecast"),
    _m("headroom_exhaustion_seconds", "gauge", "Seconds until the forecast upper bound first crosses capacity at the knee; +Inf when not within the horizon.", ["pool"], "forecast"),
    _m("headroom_forecast_mase", "gauge", "Rolling-origin backtest MASE of the forecast model (scaled by the one-day seasonal naive); below 1 beats the baseline.", ["pool", "series", "model"], "forecast"),
    _m("headroom_forecast_coverage_ratio", "gauge", "Backtest share of actual points inside the forecast interval (level 0.8 or 0.95).", ["pool", "series", "model", "level"], "forecast"),
    _m("headroom_forecast_selected_info", "gauge", "The model selected for the series by backtest, always 1.", ["pool", "series", "model"], "forecast"),
    _m("headroom_forecast_last_fit_timestamp_seconds", "gauge", "When the forecasts were last refitted (Unix time).", [], "forecast"),
    _m("headroom_history_points", "gauge", "Points held in the history store per series.", ["pool", "series"], "forecast"),
    # --- digest
    _m("headroom_digest_last_success_timestamp_seconds", "gauge", "When the weekly digest was last delivered to every destination (Unix time).", [], "digest"),
    _m("headroom_digest_pending_deliveries", "gauge", "Digest deliveries waiting in the outbox.", [], "digest"),
)

BY_NAME = {m.name: m for m in CATALOGUE}


# labels the exposition format itself gives a meaning (histogram buckets, summary quantiles, the name)
FORMAT_LABELS = ("le", "quantile", "__name__")


def own_labels() -> dict[str, str]:
    """Every label headroom itself puts on its series, each with the first metric that carries it
    (`global.pool_by`'s extra labels are exported beside these, so none may be one of them)."""
    out: dict[str, str] = {label: "the exposition format" for label in FORMAT_LABELS}
    for mdef in CATALOGUE:
        for label in mdef.labels:
            out.setdefault(label, mdef.name)
    return out


def exposed_names() -> set[str]:
    """Every sample name that can appear on /metrics (counters with _total)."""
    return {m.exposed_name for m in CATALOGUE}


def render_markdown() -> str:
    lines = [
        "# Metrics exported by headroom",
        "",
        "Generated from `monitor/model/catalogue.py` by `python -m monitor.model.catalogue`; do not edit by hand.",
        "",
        "Every series with a `pool` label also carries the other labels of `global.pool_by` when it lists",
        "more than one: with `pool_by: [cluster, model_name]`, `pool` is the model (the last label) and",
        "`cluster` stands beside it (`headroom_active_requests{pool=\"m\",cluster=\"a\"}`); with one label",
        "(the default) the labels are exactly those listed here.",
        "",
    ]
    groups: dict[str, list[MetricDef]] = {}
    for m in CATALOGUE:
        groups.setdefault(m.group, []).append(m)
    for group, metrics in groups.items():
        lines += [f"## {group}", "", "| name | type | labels | meaning |", "| --- | --- | --- | --- |"]
        for m in metrics:
            labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
            lines.append(f"| `{m.exposed_name}` | {m.type} | {labels} | {m.help} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown(), end="")
