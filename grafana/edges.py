"""The engines' edges on headroom / Fleet capacity (grafana/build.py) and headroom / Replicas: KV
capacity by tier (GPU, CPU offload, LMCache), prefix-cache hits by the tier that supplied them,
speculative decoding's acceptance and LoRA adapter slots (monitor/derive/edges.py)."""
from __future__ import annotations

from blocks import P, R, row, table, target, timeseries


def edges() -> list[dict]:
    return [
        row("KV tiers, prefix hits by tier, speculative decoding, LoRA"),
        timeseries("KV capacity by tier", [
            target(f"headroom_kv_tier_capacity_tokens{{{P}}}", "{{pool}} {{tier}} ({{source}})"),
        ], description="KV tokens each tier holds: gpu (kv_cache_size_tokens, group-aware), cpu (the offload tier, "
                       "vllm:kv_offload_config_info, tokens at max_model_len). Method hybrid on "
                       "headroom_kv_tokens_method_info: the block size is only a lower bound of the allocation unit "
                       "(hybrid KV) and the live KV band is wider.", w=8),
        timeseries("KV tier bytes: held vs capacity", [
            target(f"headroom_kv_tier_used_bytes{{{P}}}", "{{pool}} {{tier}} held"),
            target(f"headroom_kv_tier_capacity_bytes{{{P}}}", "{{pool}} {{tier}} capacity ({{source}})"),
            target(f"headroom_kv_offload_allocation_failures_rate{{{P}}}", "{{pool}} CPU tier full (stores refused/s)"),
        ], unit="bytes", description="LMCache's bytes held (no capacity gauge: capacity only where configured, "
                                     "pools.<pool>.lmcache_cpu_bytes_per_replica) and the CPU offload tier's size; "
                                     "stores the CPU tier refused say it is full.", w=8),
        timeseries("Prefix-cache hits by tier (share of prompt tokens)", [
            target(f"headroom_prefix_cache_hit_share_ratio{{{P}}}", "{{pool}} {{tier}}"),
        ], unit="percentunit", stack=True, min_=0, w=8,
            description="Share of prompt tokens each cache tier supplied (device, host, disk, p2p, "
                        "external_unspecified); the rest was computed."),
        timeseries("Prefix-cache hit tokens per second by tier", [
            target(f"headroom_prefix_cache_hit_tokens_rate{{{P}}}", "{{pool}} {{tier}}"),
        ], stack=True, min_=0, w=8, description="Prompt tokens served from each cache tier per second."),
        timeseries("LMCache hit ratio", [
            target(f"headroom_lmcache_hit_ratio{{{P}}}", "{{pool}}"),
        ], unit="percentunit", min_=0, w=8, description="LMCache hit over requested tokens (its token counters; "
                                                         "its hit-rate gauges restart each log interval)."),
        table("How live KV is estimated", [
            target(f"headroom_kv_tokens_method_info{{{P}}}", "", instant=True, table=True),
        ], description="Method hybrid: the block size is a lower bound of the allocation unit (hybrid KV): the "
                       "live KV band is widened with the largest unit the engine names.", w=8, h=8),
        timeseries("Speculative decoding acceptance", [
            target(f"headroom_spec_decode_acceptance_ratio{{{P}}}", "{{pool}} accepted / draft tokens"),
            target(f"headroom_spec_decode_acceptance_length{{{P}}}", "{{pool}} tokens per step"),
            target(f"headroom_spec_decode_position_acceptance_ratio{{{P}}}", "{{pool}} position {{position}}"),
            target(f"headroom_knee_suspect{{{P}}}", "{{pool}} knee suspect"),
        ], min_=0, w=12, description="A change in acceptance changes decode speed at the same batch: the learned "
                                     "knee is then marked suspect (headroom_knee_suspect) until a new one is learned."),
        timeseries("LoRA adapter slots", [
            target(f"headroom_lora_adapters{{{P}}}", "{{pool}} adapters {{state}}"),
            target(f'headroom_capacity_requests{{limit="lora",{P}}}', "{{pool}} lora limit (requests)"),
        ], min_=0, w=12, description="Adapter slots (--max-loras per engine) against adapters running and waiting; "
                                     "the lora limit in requests is the slots x running requests per running "
                                     "adapter."),
    ]


def replica_tiers() -> dict:
    return timeseries("KV capacity by tier per replica", [
        target(f"headroom_replica_kv_tier_capacity_tokens{{{R}}}", "{{replica}} {{tier}}"),
    ], w=8, description="Each replica's KV capacity by tier (gpu, cpu offload), with where it was read.")
