"""SGLang's priorities, hybrid KV pools and LoRA slots (issue 40, item 3 and SGLang's part of item 4),
each on a fixture rendered from SGLang's own metric definitions (tests/fixtures/sglang/SOURCES.md),
with the expected numbers worked out by hand from those definitions."""
import os

import pytest
from servers import fixture

from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.knee import Knee
from monitor.capacity.lora import lora_limit
from monitor.derive.core import derive_pools
from monitor.export.samples import snapshot_samples
from monitor.export.snapshot_json import pool_to_dict
from monitor.model import LoraSlots, Snapshot
from monitor.sources import sglang

TARGET = "http://sglang:30000/metrics"


def body(name):
    return fixture(os.path.join("sglang", name + ".prom"))


def read(text):
    scrape = sglang.parse_sglang(text)
    readings = sglang.readings_from_scrape(scrape, TARGET, 100.0)
    assert len(readings) == 1
    return readings[0], scrape


def without(text, *names):
    return "".join(line for line in text.splitlines(keepends=True)
                   if not any(line.startswith(n + "{") or line.startswith(n + " ") for n in names))


def pool_of(reading):
    (pool,) = derive_pools({reading.target: [reading]}, now=100.0, window_seconds=60.0)
    return pool


def exported(pool, name):
    """{frozenset of the labels other than pool: value} of one exported family."""
    rows = snapshot_samples(Snapshot(timestamp=100.0, pools=[pool])).get(name, [])
    return {frozenset((k, v) for k, v in labels.items() if k != "pool"): value for labels, value in rows}


# ------------------------------------------------------------------ priority scheduling

def test_priority_totals_equal_the_same_fleet_without_priorities():
    # sglang-dp2-priority is sglang-dp2 with --enable-priority-scheduling: SGLang writes each gauge's
    # total under priority="" and each priority under priority="<n>" (QueueCount). dp 0: running 5
    # (priority 0: 4, priority 5: 1), queued 2 (priority 0: 2, priority 5: 0, a priority seen once
    # keeps its series); dp 1: running 3 (priority 0: 3), queued 0 (priority 0: 0).
    # Totals: running 5 + 3 = 8, queued 2 + 0 = 2, as without priorities. Adding every series would
    # count them twice: running (5 + 4 + 1) + (3 + 3) = 16, queued (2 + 2 + 0) + (0 + 0) = 4.
    plain, _ = read(body("sglang-dp2"))
    prio, scrape = read(body("sglang-dp2-priority"))
    naive = sum(v for lb, v in scrape.get("sglang:num_running_reqs"))
    assert naive == 16.0
    assert (prio.running, prio.waiting) == (plain.running, plain.waiting) == (8.0, 2.0)
    assert (prio.kv_live_tokens, prio.kv_capacity_tokens, prio.engines) == \
        (plain.kv_live_tokens, plain.kv_capacity_tokens, plain.engines) == (29952.0, 92160.0, 2)
    assert prio.counters == plain.counters
    assert prio.histograms["queue"] == plain.histograms["queue"]  # priority="" on the scheduler histogram
    assert plain.running_by_priority == {} and plain.waiting_by_priority == {}
    assert scrape.anomalies == {}


def test_per_priority_running_and_queued_are_summed_over_engines():
    # running: priority 0 = 4 (dp 0) + 3 (dp 1) = 7, priority 5 = 1 (dp 0 only); 7 + 1 = 8 = total
    # queued: priority 0 = 2 + 0 = 2, priority 5 = 0 (dp 0's kept series); 2 + 0 = 2 = total
    r, _ = read(body("sglang-dp2-priority"))
    assert r.running_by_priority == {"0": 7.0, "5": 1.0}
    assert r.waiting_by_priority == {"0": 2.0, "5": 0.0}
    assert sum(r.running_by_priority.values()) == r.running and sum(r.waiting_by_priority.values()) == r.waiting


def test_per_priority_requests_are_exported_beside_the_totals():
    pool = pool_of(read(body("sglang-dp2-priority"))[0])
    assert (pool.active_requests, pool.queued_requests) == (8.0, 2.0)
    assert (pool.active_by_priority, pool.queued_by_priority) == ({"0": 7.0, "5": 1.0}, {"0": 2.0, "5": 0.0})
    rows = exported(pool, "headroom_priority_requests")
    assert rows == {frozenset({("priority", "0"), ("state", "running")}): 7.0,
                    frozenset({("priority", "5"), ("state", "running")}): 1.0,
                    frozenset({("priority", "0"), ("state", "queued")}): 2.0,
                    frozenset({("priority", "5"), ("state", "queued")}): 0.0}
    assert exported(pool, "headroom_active_requests") == {frozenset(): 8.0}
    doc = pool_to_dict(pool)
    assert (doc["active_by_priority"], doc["queued_by_priority"]) == ({"0": 7.0, "5": 1.0}, {"0": 2.0, "5": 0.0})
    plain = pool_of(read(body("sglang-dp2"))[0])
    assert exported(plain, "headroom_priority_requests") == {}


def test_an_unusable_priority_series_is_left_out_not_partly_summed():
    # dp 1's priority-0 running series NaN: priority 0's sum is unknown, priority 5 still 1
    text = body("sglang-dp2-priority").replace(
        'sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",'
        'moe_ep_rank="0",pp_rank="0",priority="0",tp_rank="0"} 3.0',
        'sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",'
        'moe_ep_rank="0",pp_rank="0",priority="0",tp_rank="0"} NaN')
    r, scrape = read(text)
    assert r.running_by_priority == {"5": 1.0} and r.running == 8.0
    assert scrape.anomalies == {"non_finite": 1}


# ------------------------------------------------------------------ hybrid KV pools

def test_hybrid_swa_reads_the_full_attention_pool_not_the_mix():
    # SGLang: full pool size max_total_num_tokens 40960, kv_used_tokens 32000 (= 40960 - 6912
    # available - 2048 evictable), usage 32000 / 40960 = 0.78125; SWA pool size
    # max_total_num_tokens_swa 65536, swa_used_tokens 36864 (= 65536 - 24576 - 4096), usage
    # 36864 / 65536 = 0.5625. num_used_tokens = max(32000, 36864) = 36864 is the SWA pool's: read
    # against the full pool it would say 36864 / 40960 = 0.9 in use.
    r, scrape = read(body("sglang-hybrid-swa"))
    assert (r.kv_live_tokens, r.kv_capacity_tokens) == (32000.0, 40960.0)
    assert r.kv_usage == pytest.approx(0.78125)
    assert r.kv_pools == {"full": (32000.0, 40960.0), "swa": (36864.0, 65536.0)}
    assert scrape.get("sglang:num_used_tokens")[0][1] == 36864.0  # the mix, not read
    assert scrape.anomalies == {}
    pool = pool_of(r)
    assert pool.kv_pool_usage == {"full": pytest.approx(0.78125), "swa": pytest.approx(0.5625)}
    assert exported(pool, "headroom_kv_pool_usage_ratio") == {
        frozenset({("kv_pool", "full")}): pytest.approx(0.78125), frozenset({("kv_pool", "swa")}): pytest.approx(0.5625)}
    assert pool_to_dict(pool)["kv_pool_usage"] == {"full": pytest.approx(0.78125), "swa": pytest.approx(0.5625)}


def test_hybrid_swa_without_the_full_pool_gauges_is_unknown_not_the_mix():
    # an SGLang with only num_used_tokens (max of the pools) and token_usage on a hybrid SWA model:
    # the full pool's live tokens cannot be told apart, so they are unknown (never 36864)
    r, _ = read(without(body("sglang-hybrid-swa"), "sglang:kv_used_tokens", "sglang:full_token_usage"))
    assert r.kv_live_tokens is None and r.kv_capacity_tokens == 40960.0


def test_hybrid_mamba_reads_the_full_pool_and_the_state_slots():
    # full pool: 46080 tokens, kv_used_tokens 9216, usage 0.2. Mamba state pool: used 8, available
    # 1, evictable 1 -> size 8 + 1 + 1 = 10 slots (SGLang emits no size gauge), usage 8 / 10 = 0.8.
    # token_usage = max(0.2, 0.8) = 0.8: token_usage x capacity would say 0.8 x 46080 = 36864 tokens.
    r, scrape = read(body("sglang-hybrid-mamba"))
    assert scrape.get("sglang:token_usage")[0][1] == pytest.approx(0.8)
    assert (r.kv_live_tokens, r.kv_capacity_tokens) == (9216.0, 46080.0)
    assert r.kv_usage == pytest.approx(0.2)
    assert r.kv_pools == {"full": (9216.0, 46080.0), "mamba": (8.0, 10.0)}
    assert pool_of(r).kv_pool_usage == {"full": pytest.approx(0.2), "mamba": pytest.approx(0.8)}
    # without the full pool's own gauges: num_used_tokens is the full pool's on a mamba model (only
    # SWA is mixed into it); without it too, unknown rather than token_usage x capacity
    text = without(body("sglang-hybrid-mamba"), "sglang:kv_used_tokens", "sglang:full_token_usage")
    assert read(text)[0].kv_live_tokens == 9216.0
    assert read(without(text, "sglang:num_used_tokens"))[0].kv_live_tokens is None


def test_one_pool_engines_have_no_pool_breakdown():
    # SGLang logs the swa_* and mamba_* gauges at 0 on a model without those pools
    for name in ("sglang-idle", "sglang-under-load", "sglang-dp2", "sglang-lora"):
        r, _ = read(body(name))
        assert r.kv_pools == {}, name
    assert pool_of(read(body("sglang-under-load"))[0]).kv_pool_usage == {}


# ------------------------------------------------------------------ LoRA slots

def with_lora_used(used: float) -> str:
    """The sglang-lora server with `used` adapters in the running batch."""
    lines = []
    for line in body("sglang-lora").splitlines(keepends=True):
        if line.startswith("sglang:lora_pool_slots_used{"):
            line = line.rsplit(" ", 1)[0] + f" {used}\n"
        lines.append(line)
    return "".join(lines)


def test_lora_slots_read_and_a_limit_only_while_they_bind():
    # --enable-lora, max_loras_per_batch 4: lora_pool_slots_total 4, 2 adapters in the running batch
    # (lora_pool_slots_used 2), 8 running requests. Two slots are free: more requests for these
    # adapters or two more adapters fit, so the slots limit nothing (SGLang does not say which
    # adapters wait: `waiting` unknown)
    r, _ = read(body("sglang-lora"))
    assert r.lora == LoraSlots(max_loras=4.0, running=2.0, waiting=None) and r.running == 8.0
    pool = pool_of(r)
    assert pool.lora == LoraSlots(4.0, 2.0, None)
    assert lora_limit(pool) is None
    cap = pool_capacity(pool, Knee(None, None, "prior", "limits"), CapacitySettings(max_num_seqs=32))
    assert cap.capacity_requests.lora is None and cap.limiting_factor == "kv"
    # every slot in use (4 of 4) and requests queued (the fixture's 2 waiting): the slots hold what
    # runs now, 8, and none of the queue is known to fit: lora 8 < kv 18.432 (46080 tokens / (20000
    # live / 8 running = 2500 per request)) < slots 32
    full = pool_of(read(with_lora_used(4.0))[0])
    assert full.queued_requests == 2.0 and lora_limit(full) == 8.0
    cap = pool_capacity(full, Knee(None, None, "prior", "limits"), CapacitySettings(max_num_seqs=32))
    assert cap.capacity_requests.lora == 8.0 and cap.capacity_requests.kv == pytest.approx(18.432)
    assert cap.capacity_requests.effective == 8.0 and cap.limiting_factor == "lora"
    full.capacity = cap
    assert exported(full, "headroom_capacity_requests")[frozenset({("limit", "lora")})] == 8.0


def test_no_lora_limit_without_adapters_in_use_or_without_lora():
    r, _ = read(with_lora_used(0.0))
    assert r.lora == LoraSlots(4.0, 0.0, None)
    assert lora_limit(pool_of(r)) is None  # no adapter in use
    plain = pool_of(read(body("sglang-under-load"))[0])
    assert plain.lora is None and lora_limit(plain) is None
    assert pool_capacity(plain, Knee(None, None, "prior", "limits"), CapacitySettings()).capacity_requests.lora is None


# ------------------------------------------------------------------ max_running_requests_under_SLO

def test_max_running_requests_under_slo_is_never_read():
    # SGLang declares the gauge but its scheduler never passes a value, so no sample is written; were
    # one there, nothing headroom reads would change
    assert not any("max_running_requests_under_SLO" in n for n in sglang.WANTED)
    text = body("sglang-under-load")
    labels = '{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"}'
    with_it = text + ("# HELP sglang:max_running_requests_under_SLO The maximum number of running requests under SLO.\n"
                      "# TYPE sglang:max_running_requests_under_SLO gauge\n"
                      f"sglang:max_running_requests_under_SLO{labels} 3.0\n")
    assert read(with_it)[0] == read(text)[0]


# ------------------------------------------------------------------ Prometheus mode

def as_query_answer(text, instance):
    """The body's series as the per-replica query answers them (monitor/sources/prometheus_queries.py
    replica_selector: the reader's gauges, counters, histogram sums and counts), `instance` added."""
    from monitor.kit.exposition import parse
    from monitor.sources.prometheus_queries import replica_names
    wanted = {"sglang:" + n for n in replica_names()["sglang"]}
    return [({**labels, "__name__": name, "instance": instance}, value)
            for name, rows in parse(text).samples.items() if name in wanted for labels, value in rows]


def test_prometheus_mode_reads_priorities_hybrid_pools_and_lora_alike():
    from monitor.sources.prometheus import scrapes_from_vector
    for name in ("sglang-dp2-priority", "sglang-hybrid-swa", "sglang-hybrid-mamba", "sglang-lora"):
        direct, _ = read(body(name))
        (via,) = sglang.readings_from_scrape(scrapes_from_vector(as_query_answer(body(name), "a"))["a"], "a", 100.0)
        for field in ("running", "waiting", "running_by_priority", "waiting_by_priority", "kv_live_tokens",
                      "kv_capacity_tokens", "kv_usage", "kv_pools", "lora"):
            assert getattr(via, field) == getattr(direct, field), (name, field)
