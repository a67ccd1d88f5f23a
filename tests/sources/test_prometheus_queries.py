"""Prometheus mode's queries and their answers, unit by unit (the live agreement with direct mode is
tests/sources/test_prometheus_query_layer.py): what is asked per replica and per pool, how the pool
histograms are read back, and the tenant headers' configuration."""
import math

import pytest

from monitor.config import ConfigError, from_dict
from monitor.derive.histogram import quantiles
from monitor.sources.prometheus import PrometheusClient, scrapes_from_vector
from monitor.sources.prometheus_pool_totals import lacking_kinds
from monitor.sources.prometheus_queries import (
    needed_bases,
    needed_les,
    pool_bucket_les,
    pool_histogram_query,
    pool_histograms,
    pool_total_queries,
    present_bases,
    replica_selector,
)
from monitor.sources.vllm import readings_from_scrape


def test_the_replica_selector_asks_for_no_bucket_and_every_gauge_and_counter():
    sel = replica_selector('job="vllm"')
    assert "_bucket" not in sel and sel.endswith(',job="vllm"}')
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "cache_config_info",
                 "request_success_total", "generation_tokens_total", "e2e_request_latency_seconds_sum",
                 "request_queue_time_seconds_count", "num_running_reqs", "max_total_num_tokens"):
        assert name in sel, name
    assert "request_prompt_tokens_sum" not in sel  # a histogram none of headroom's numbers reads per replica


def test_the_pool_query_sums_bucket_increases_by_pool_labels_for_the_histograms_present():
    q = pool_histogram_query('job="vllm"', ["team"], 300)
    assert 'sum by (team, model_name, le) (increase({__name__=~"vllm[:_]e2e_request_latency_seconds_bucket",job="vllm"}[300s]))' in q
    assert '"hr_part", "total"' not in q  # the cumulative buckets are pool_total_queries', asked apart
    assert "_sum" not in q and "_count" not in q and "request_prompt_tokens" not in q
    lb = {"instance": "r", "model_name": "m"}
    present = present_bases([({"__name__": "vllm_e2e_request_latency_seconds_count", **lb}, 1.0),
                             ({"__name__": "vllm:request_queue_time_seconds_count", **lb}, 1.0),
                             ({"__name__": "vllm:request_prompt_tokens_count", **lb}, 1.0),
                             ({"__name__": "vllm:num_requests_running", **lb}, 1.0)])
    assert present == {"vllm:e2e_request_latency_seconds": "vllm_e2e_request_latency_seconds",
                       "vllm:request_queue_time_seconds": "vllm:request_queue_time_seconds"}
    q = pool_histogram_query("", ["model_name"], 60, present=present)
    assert q.count("increase(") == 2 and 'increase(vllm_e2e_request_latency_seconds_bucket[60s])' in q


def _row(base, part, value, le=None, **labels):
    out = {"hr_base": base, "hr_part": part, "model_name": "m", **labels}
    if le is not None:
        out["le"] = le
    return out, value


def test_pool_histograms_are_read_back_and_the_first_candidate_name_wins():
    itl, legacy = "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
    rows = [_row(itl, "bucket", 2.0, "0.1"), _row(itl, "bucket", 6.0, "1"), _row(itl, "bucket", 8.0, "+Inf"),
            _row(legacy, "bucket", 1.0, "0.1"), _row(legacy, "bucket", 1.0, "+Inf"),
            _row("vllm:e2e_request_latency_seconds", "total", 5.0, "+Inf", team="a")]
    window, total = pool_histograms(rows, ["model_name"])
    h = window["m"]["itl"]
    assert h.bounds == (0.1, 1.0, math.inf) and h.counts == (2.0, 6.0, 8.0) and h.count == 8.0
    assert quantiles(h).p50 == pytest.approx(0.1 + 0.9 * (4 - 2) / 4)
    assert total["m"]["e2e"].counts == (5.0,)
    # keyed by the last pool_by label; one missing it falls back to the model
    assert set(pool_histograms(rows, ["team"])[1]) == {"a"} and set(pool_histograms(rows, ["team"])[0]) == {"m"}


def test_a_pool_slo_s_cumulative_buckets_are_asked_apart_and_only_around_its_targets():
    """`pool_total_queries`: per histogram of the kinds with a pool SLO, the pool's cumulative buckets,
    every one or only the `le` values given (each a literal: dots and the plus escaped)."""
    ttft, e2e = "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"
    present = {ttft: "vllm:time_to_first_token_seconds", e2e: "vllm_e2e_request_latency_seconds"}
    whole = pool_total_queries('job="vllm"', ["model_name"], ["ttft"], present)
    assert list(whole) == [ttft] and "increase(" not in whole[ttft] and whole[ttft].count('"hr_part", "total"') == 1
    assert 'sum by (model_name, le) (vllm:time_to_first_token_seconds_bucket{job="vllm"})' in whole[ttft]
    some = pool_total_queries("", ["model_name"], ["ttft", "e2e"], present, {e2e: ["+Inf", "0.5", "1.0"]})
    assert some[ttft] == pool_total_queries("", ["model_name"], ["ttft"], present)[ttft]  # not given: every bucket
    assert 'vllm_e2e_request_latency_seconds_bucket{le=~"\\\\+Inf|0\\\\.5|1\\\\.0"})' in some[e2e]
    assert '"hr_part", "total"' not in pool_histogram_query("", ["model_name"], 60, present)  # the increases alone


def test_the_buckets_around_the_targets_give_the_same_total_and_bad_count_as_every_bucket():
    """`needed_les`: per threshold the bucket bounds around it, and the last: the histogram of only
    those gives what a pool SLO reads (total, share over the target) exactly as the whole one."""
    from monitor.derive import histogram as histo
    les = ["0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1.0", "2.5", "5.0", "10.0", "+Inf"]
    counts = [0.0, 1.0, 4.0, 9.0, 20.0, 41.0, 70.0, 88.0, 95.0, 99.0, 100.0]
    rows = [_row("vllm:time_to_first_token_seconds", "total", c, le) for le, c in zip(les, counts)]
    learned = pool_bucket_les(rows, ["model_name"])
    assert learned == {"vllm:time_to_first_token_seconds": {"m": tuple(sorted((float(le), le) for le in les))}}
    bounds = learned["vllm:time_to_first_token_seconds"]["m"]
    assert needed_les(bounds, [0.7]) == {"0.5", "1.0", "+Inf"}
    assert needed_les(bounds, [1.0, 0.0005]) == {"0.5", "1.0", "0.001", "+Inf"}  # on a bound; below the first
    assert needed_les(bounds, [20.0]) == {"10.0", "+Inf"} and needed_les((), [1.0]) == set()
    full = pool_histograms(rows, ["model_name"])[1]["m"]["ttft"]
    for thresholds in ([0.7], [1.0], [0.0005], [20.0], [0.003, 0.7, 7.0]):
        keep = needed_les(bounds, thresholds)
        part = pool_histograms([r for r in rows if r[0]["le"] in keep], ["model_name"])[1]["m"]["ttft"]
        assert len(part.bounds) < len(full.bounds) and histo.total(part) == histo.total(full)
        for t in thresholds:
            assert histo.fraction_above(part, t) == histo.fraction_above(full, t), (thresholds, t)


def test_a_later_candidate_is_asked_only_for_a_replica_without_an_earlier_one():
    itl, legacy = "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
    e2e, sg_itl = "vllm:e2e_request_latency_seconds", "sglang:inter_token_latency_seconds"
    both = {itl: itl, legacy: legacy, e2e: "vllm_e2e_request_latency_seconds"}
    assert needed_bases([both, both]) == {itl: itl, e2e: "vllm_e2e_request_latency_seconds"}  # both ITL names
    assert needed_bases([both, {legacy: legacy}]) == {itl: itl, legacy: legacy, e2e: "vllm_e2e_request_latency_seconds"}
    assert needed_bases([{legacy: legacy}, {sg_itl: sg_itl}]) == {legacy: legacy, sg_itl: sg_itl}  # one per engine
    assert needed_bases([]) == {}
    # the spare candidate is asked after all when a pool read lacks its kind (the earlier one's buckets dropped)
    h = pool_histograms([_row(e2e, "bucket", 1.0, "+Inf"), _row(itl, "bucket", 1.0, "+Inf")], ["model_name"])
    assert h[1] == {}  # the increases alone: the window's histograms are what is judged
    assert not lacking_kinds(h[0], {legacy: legacy}, None)
    assert lacking_kinds(h[0], {"vllm:e2e_request_latency_seconds": "x"}, None) is False
    h = pool_histograms([_row(e2e, "bucket", 1.0, "+Inf")], ["model_name"])
    assert lacking_kinds(h[0], {legacy: legacy}, None)


def test_a_non_finite_pool_histogram_is_unknown_and_rounding_keeps_buckets_cumulative():
    e2e = "vllm:e2e_request_latency_seconds"
    rows = [_row(e2e, "bucket", 3.0000001, "1"), _row(e2e, "bucket", 3.0, "+Inf")]
    window, _ = pool_histograms(rows, ["model_name"])
    assert window["m"]["e2e"].counts == (3.0000001, 3.0000001)
    window, _ = pool_histograms([_row(e2e, "bucket", math.nan, "+Inf")], ["model_name"])
    assert "e2e" not in window.get("m", {})


def test_a_replica_read_without_buckets_keeps_each_histograms_sum_and_count():
    lb = {"instance": "r1", "model_name": "m", "engine": "0", "job": "vllm"}
    vector = [({"__name__": "vllm:e2e_request_latency_seconds_sum", **lb}, 12.0),
              ({"__name__": "vllm:e2e_request_latency_seconds_count", **lb}, 4.0),
              ({"__name__": "vllm:num_requests_running", **lb, "cluster": "a"}, 2.0)]
    [(scrape, kept)] = scrapes_from_vector(vector, keep=["cluster"]).values()
    assert kept == {"cluster": "a"}
    [r] = readings_from_scrape(scrape, "r1", 0.0, kept)
    e2e = r.histograms["e2e"]
    assert (e2e.sum, e2e.count, e2e.bounds) == (12.0, 4.0, (math.inf,)) and r.running == 2.0
    assert r.labels == {"cluster": "a"} and not scrape.anomalies


PROM = {"sources": {"prometheus": {"url": "http://127.0.0.1:9090"}}}


def _prom(**extra):
    return {"sources": {"prometheus": {**PROM["sources"]["prometheus"], **extra}}}


def test_tenant_headers_come_inline_from_a_file_or_the_environment(tmp_path, monkeypatch):
    secret = tmp_path / "tenant"
    secret.write_text("team-b\n")
    monkeypatch.setenv("HEADROOM_TEST_TENANT", "team-c")
    cfg = from_dict(_prom(headers={"X-Scope-OrgID": "team-a", "X-From-File": {"file": str(secret)},
                                   "X-From-Env": {"env": "HEADROOM_TEST_TENANT"}}), "f.yml")
    assert cfg.prometheus.header_values() == {"X-Scope-OrgID": "team-a", "X-From-File": "team-b",
                                              "X-From-Env": "team-c"}
    secret.write_text("team-d\n")  # rotated: read again on use
    client = PrometheusClient.from_config(cfg.prometheus)
    assert client.headers()["X-From-File"] == "team-d"


@pytest.mark.parametrize("headers,where,problem", [
    ({"Authorization": "Bearer x"}, "sources.prometheus.headers.Authorization", "set by headroom"),
    ({"X Scope": "a"}, "sources.prometheus.headers.X Scope", "not an HTTP header name"),
    ({"X-Scope-OrgID": {"value": "a", "env": "HOME"}}, "sources.prometheus.headers.X-Scope-OrgID", "exactly one"),
    ({"X-Scope-OrgID": "a\r\nX-Evil: 1"}, "sources.prometheus.headers.X-Scope-OrgID", "control characters"),
    ({"X-Scope-OrgID": 3}, "sources.prometheus.headers.X-Scope-OrgID", "expected a string"),
])
def test_bad_tenant_headers_are_refused_naming_the_key(headers, where, problem):
    with pytest.raises(ConfigError) as err:
        from_dict(_prom(headers=headers), "f.yml")
    assert err.value.key == where and problem in err.value.problem
    assert "X-Evil" not in str(err.value)


def test_a_tenant_header_http_cannot_carry_is_refused_at_load_naming_the_key(tmp_path, monkeypatch):
    """Issue 38: a non-Latin-1 tenant value passed check-config, then every query failed."""
    with pytest.raises(ConfigError) as err:
        from_dict(_prom(headers={"X-Scope-OrgID": "team-\u2603"}), "f.yml")
    assert err.value.key == "sources.prometheus.headers.X-Scope-OrgID" and "Latin-1" in err.value.problem
    assert "\u2603" not in str(err.value) and "U+2603" in str(err.value)
    secret = tmp_path / "tenant"
    secret.write_text("\u0442\u0435\u043d\u0430\u043d\u0442\n")
    monkeypatch.setenv("HEADROOM_TEST_TENANT", "\u79df\u6237")
    for given, key in (({"file": str(secret)}, "file"), ({"env": "HEADROOM_TEST_TENANT"}, "env")):
        with pytest.raises(ConfigError) as err:
            from_dict(_prom(headers={"X-Scope-OrgID": given}), "f.yml")
        assert err.value.file == "f.yml" and err.value.key == f"sources.prometheus.headers.X-Scope-OrgID.{key}"
        assert "Latin-1" in err.value.problem and "\u0442" not in str(err.value) and "\u79df" not in str(err.value)
    assert from_dict(_prom(headers={"X-Scope-OrgID": "caf\u00e9"}), "f.yml")  # Latin-1 is sent as such


def _reading(target, t, running, model="m"):
    from monitor.model import ReplicaReading
    return ReplicaReading(target=target, model=model, timestamp=t, running=running, waiting=1.0,
                          counters={"request_success": 10.0 * t})


def test_a_blind_cycle_keeps_the_last_replicas_stale_and_a_replica_gone_before_stays_gone():
    """step(): the query layer did not answer (the prometheus source down): the pool keeps the last
    read's replicas and values, stale, last fresh at the last read; a replica that had already gone
    from the read before is not counted back."""
    from monitor.config import PrometheusSource
    from monitor.config.inputs import step_settings
    from monitor.model import SourceStatus
    from monitor.step.cycle_state import CycleInputs, CycleState
    from monitor.step.cycle_step import step
    cfg = from_dict({"sources": {"prometheus": {"url": "http://prom:9090"}}}, "f.yml")
    state = CycleState(step_settings(cfg))
    up = [SourceStatus("prometheus", "http://prom:9090", True)]
    step(state, CycleInputs([_reading(t, 0.0, 2.0) for t in ("a", "b", "c")], up), 0.0)
    _, fresh = step(state, CycleInputs([_reading(t, 15.0, 3.0) for t in ("a", "b")], up), 15.0)
    assert fresh.pools[0].replicas == 2 and not fresh.pools[0].stale
    down = [SourceStatus("prometheus", "http://prom:9090", False, "deadline", "late")]
    _, blind = step(state, CycleInputs([], down, stale_seconds={"replicas": 15.0}), 30.0)
    p = blind.pools[0]
    assert p.stale and p.replicas == 2 and p.active_requests == 6.0 and p.queued_requests == 2.0
    assert p.last_fresh_timestamp == 15.0 and blind.source_stale_seconds == {"replicas": 15.0}
    _, back = step(state, CycleInputs([_reading(t, 45.0, 1.0) for t in ("a", "b")], up), 45.0)
    assert not back.pools[0].stale and back.pools[0].replicas == 2 and back.pools[0].active_requests == 2.0
    assert isinstance(cfg.prometheus, PrometheusSource)
