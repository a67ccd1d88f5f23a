"""Issue 2 against the real vLLM CPU engine: headroom's live pipeline reads what the engine reports.

One engine with max-num-seqs 8 and 24 KV blocks of 128 tokens (3,072 tokens), shared by the session:
`vllm_small_engine`, serving the `small` model (engine-bound: requests wait in the engine, not in its
HTTP frontend; tests/engine/README.md), also behind the LiteLLM gateway.
- Under a burst of 32 concurrent completions (on `small`), every check scrapes /metrics ONCE and holds
  headroom's derived active / queued / live KV tokens against the engine's own gauges parsed
  independently (prometheus_client's parser) from the SAME text; requests must queue at least once.
- Under 16 closed-loop clients (on `small`), headroom's Little's-law inputs (completion rate, mean
  concurrency) equal the engine's counters and gauges read independently; how well the law closes
  is measured over repeated runs by `make bench-engine`.
- `headroom once --vllm URL --json` end to end under load (on `small`: 24 clients keep it full).
"""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time

import pytest
from servers import wait_for

from engine.load import ClosedLoop, start_batch, token_prompt
from engine.measure import littles_law_window
from engine.reference import engine_gauges, histogram_buckets, promql_quantile
from engine.servers import REPO, fetch_metrics
from monitor.derive.core import derive_pools
from monitor.sources.vllm import readings_from_text

pytestmark = pytest.mark.vllm

MODEL = "tiny"
CAPACITY_TOKENS = 24 * 128
# the CLI runs under headroom's own venv (the one running these tests, normally <repo>/.venv)
HEADROOM_PYTHON = (os.path.join(REPO, ".venv", "bin", "python")
                   if os.path.exists(os.path.join(REPO, ".venv", "bin", "python")) else sys.executable)


def headroom_pool(history: list, target: str, now: float, window: float = 600.0):
    pools = derive_pools({target: history}, now=now, window_seconds=window)
    assert [p.pool for p in pools] == [MODEL]
    return pools[0]


def reading_of(text: str, target: str, ts: float):
    readings = readings_from_text(text, target, ts)
    assert [r.model for r in readings] == [MODEL], "one model, one reading per scrape"
    return readings[0]


def test_live_gauges_equal_engine_gauges_under_burst(vllm_small_engine):
    # on `small`: on `tiny` the burst was over in 4 scrapes in one full run (each /metrics scrape
    # waits behind the saturated HTTP frontend), fewer than the 5 this test needs
    url = vllm_small_engine.url
    target = url + "/metrics"
    vocab = vllm_small_engine.info["vocab_size"]
    rng = random.Random(2)
    n = 32
    max_tokens = [rng.choice([50, 100, 150, 200, 300]) for _ in range(n)]
    prompts = [token_prompt(rng, rng.randint(16, 200), vocab) for _ in range(n)]

    before_text, before_ts = fetch_metrics(url)
    before = reading_of(before_text, target, before_ts)
    run = start_batch(url, max_tokens, prompts)

    checks = []  # (running, waiting, kv_live) as both sides saw them
    while not run.done():
        text, ts = fetch_metrics(url)  # ONE scrape per check: both sides read this text
        ref = engine_gauges(text)[MODEL]
        pool = headroom_pool([reading_of(text, target, ts)], target, ts)
        assert pool.active_requests == ref["running"]
        assert pool.queued_requests == ref["waiting"]
        assert pool.kv_tokens_capacity == ref["kv_capacity_tokens"] == CAPACITY_TOKENS
        # what block usage implies is the engine's own usage x capacity; the band below it is
        # block_size - 1 tokens per running request wide, the estimate half a block per request in
        assert pool.kv_tokens_live_high == pytest.approx(ref["kv_live_tokens"], rel=1e-9, abs=1e-6)
        assert ref["kv_live_tokens"] == pytest.approx(ref["kv_usage"] * CAPACITY_TOKENS)
        assert pool.kv_tokens_live_low == pytest.approx(max(0.0, ref["kv_live_tokens"] - ref["running"] * 127))
        assert pool.kv_tokens_live == pytest.approx(max(pool.kv_tokens_live_low,
                                                        ref["kv_live_tokens"] - ref["running"] * 63.5))
        assert 0 <= pool.active_requests <= 8, "running is capped by max-num-seqs"
        assert pool.kv_tokens_live_low <= pool.kv_tokens_live <= pool.kv_tokens_live_high <= CAPACITY_TOKENS
        checks.append((ref["running"], ref["waiting"], ref["kv_live_tokens"]))
        time.sleep(0.1)
    records = run.join(timeout=600)

    assert [r.error for r in records if not r.ok] == []
    assert len(records) == n
    assert all(r.completion_tokens == r.max_tokens for r in records), "ignore_eos: exactly max_tokens"
    assert checks, "no scrape while the burst ran"
    assert max(c[1] for c in checks) > 0, "no request was ever seen queued"
    assert max(c[0] for c in checks) == 8, "the running batch never filled up to max-num-seqs"
    assert max(c[2] for c in checks) > 0

    # counters: headroom's completion count over the burst is exactly the requests sent
    after_text, after_ts = fetch_metrics(url)
    after = reading_of(after_text, target, after_ts)
    pool = headroom_pool([before, after], target, after_ts)
    assert pool.completion_rate * (after_ts - before_ts) == pytest.approx(n, abs=1e-6)
    ref_before, ref_after = engine_gauges(before_text)[MODEL], engine_gauges(after_text)[MODEL]
    assert ref_after["request_success"] - ref_before["request_success"] == n
    assert pool.latency["queue"].count == n and pool.latency["e2e"].count == n
    assert pool.latency["queue"].mean > 0
    # quantiles: headroom's, from its own parser and bucket deltas, equal an independent
    # histogram_quantile over the same buckets read with prometheus_client
    for kind, family in (("e2e", "vllm:e2e_request_latency_seconds"), ("ttft", "vllm:time_to_first_token_seconds"),
                         ("queue", "vllm:request_queue_time_seconds")):
        b0, b1 = (histogram_buckets(t, family, MODEL) for t in (before_text, after_text))
        delta = {le: b1[le] - b0.get(le, 0.0) for le in b1}
        assert delta[math.inf] == n, (kind, delta[math.inf])
        for q, got in ((0.5, pool.latency[kind].p50), (0.9, pool.latency[kind].p90), (0.99, pool.latency[kind].p99)):
            assert got == pytest.approx(promql_quantile(q, delta), rel=1e-9), (kind, q)
    ttfts = sorted(r.ttft for r in records)
    print(f"\n[burst] {n} requests, {len(checks)} checks, max running {max(c[0] for c in checks):.0f}, "
          f"max waiting {max(c[1] for c in checks):.0f}, max live KV {max(c[2] for c in checks):.0f} "
          f"tokens; engine mean queue time {pool.latency['queue'].mean:.2f} s, mean e2e "
          f"{pool.latency['e2e'].mean:.2f} s; client TTFT median {ttfts[n // 2]:.2f} s, "
          f"max {ttfts[-1]:.2f} s; burst wall {after_ts - before_ts:.1f} s")


def test_littles_law_inputs_equal_the_engines_own_under_steady_closed_loop(vllm_small_engine):
    """16 closed-loop clients (constant concurrency; tests/engine/measure.py `littles_law_window`).
    Over the steady window headroom's Little's-law inputs equal the engine's own counters and gauges
    read independently from the same scrapes: the completion rate exactly, the mean concurrency as
    the time-weighted mean of running + waiting. How closely the law closes (near 1: 1.04 idle, 1.13
    with a core busy) is an accuracy figure of repeated runs: `make bench-engine`."""
    # a window of 15 completions and 30 scrapes (the benchmark's 100 and 40): the equalities are
    # exact on any window, and the shorter one saves about 15 s
    m = littles_law_window(vllm_small_engine.url, vllm_small_engine.info["vocab_size"], want_completions=15,
                           want_samples=30)
    print(f"\n[little] {json.dumps(m)}")
    assert m["errors"] == []
    assert m["window_open"], "the clients never all completed two requests"
    assert m["pools"] == [MODEL]
    assert m["samples"] >= 30, f"only {m['samples']} samples in the steady window"
    assert m["completed"] > 0
    assert m["headroom_completion_rate"] == pytest.approx(m["completion_rate_engine"], rel=1e-9)
    assert m["headroom_mean_concurrency"] == pytest.approx(m["mean_concurrency_engine"], rel=1e-9)
    assert m["ratio_headroom"] is not None and m["ratio_headroom"] > 0
    # the engine never holds more requests than the clients have open (a session has one call)
    assert m["mean_concurrency_engine"] <= m["clients"]
    assert m["client_in_flight"] <= m["clients"]


def test_cli_once_reports_the_engine_under_load(vllm_small_engine):
    # on `tiny`, 24 clients sometimes left the engine momentarily empty while their requests sat in
    # the HTTP frontend (the CLI then read 0 active, or the after-check 0 waiting)
    url = vllm_small_engine.url
    vocab = vllm_small_engine.info["vocab_size"]
    # the loop runs until stopped below (its duration is only a backstop, so a slow CLI start-up
    # cannot outlast it)
    # 80-160 tokens a call (was 150-250): 24 clients on 8 slots queue all the same, and the calls in
    # flight when the load stops end sooner
    loop = ClosedLoop(url, clients=24, duration=600.0, max_tokens=[80, 160],
                      prompt=lambda rng: token_prompt(rng, rng.randint(16, 64), vocab), seed=11)
    loop.start()
    try:
        # up to five CLI runs, each after the engine showed a full batch and a queue: on 2 loaded
        # cores the engine's own queue can empty for a moment while requests sit in the HTTP
        # frontend (a clean-clone run read 0 waiting once; with the cores loaded to 18, three runs
        # read (0, 0), (3, 0), (0, 0) active and queued); the first run that sees both counts
        tries = []
        for _ in range(5):
            wait_for(lambda: engine_gauges(fetch_metrics(url)[0])[MODEL],
                     lambda g: g["running"] == 8 and g["waiting"] > 0, timeout=60, every=0.2,
                     what="the engine with a full batch and a queue")
            queued_after = time.time() - loop.started_at
            proc = subprocess.run(
                [HEADROOM_PYTHON, "-m", "monitor", "once", "--vllm", url + "/metrics", "--json",
                 "--interval", "2"],
                cwd=REPO, capture_output=True, text=True, timeout=120,
            )
            cli_done_after = time.time() - loop.started_at
            # the load still saturates the engine after the CLI ran: a queue again within a deadline
            # (the engine's own queue can empty for a moment while requests sit in its HTTP frontend)
            wait_for(lambda: engine_gauges(fetch_metrics(url)[0])[MODEL], lambda g: g["waiting"] > 0,
                             timeout=30, every=0.2, what="the engine queue after the CLI ran")
            assert proc.returncode == 0, proc.stderr[-2000:]
            snap = json.loads(proc.stdout)
            pools = snap["pools"]
            tries.append((pools[0]["active_requests"], pools[0]["queued_requests"]) if pools else None)
            # a run counts when it read the engine loaded: on loaded cores one read 0 running beside
            # a queue (the engine between two steps), another 0 waiting
            if tries[-1] and all(tries[-1]):
                break
    finally:
        loop.stop()
        records = loop.join(timeout=300)
    print(f"\n[cli] (active, queued) per CLI run: {tries}")
    assert len(snap["pools"]) == 1
    pool = snap["pools"][0]
    assert pool["pool"] == MODEL and pool["replicas"] == 1 and pool["stale"] is False
    assert snap["sources"][0]["up"] is True
    assert snap["sources"][0]["target"] == url + "/metrics"
    assert pool["kv_tokens_capacity"] == CAPACITY_TOKENS
    assert 1 <= pool["active_requests"] <= 8
    assert pool["queued_requests"] > 0, f"24 clients on 8 slots must queue (CLI runs read {tries})"
    assert pool["active_requests"] + pool["queued_requests"] <= 24
    assert 0 < pool["kv_tokens_live_high"] <= CAPACITY_TOKENS
    assert pool["kv_tokens_live_low"] <= pool["kv_tokens_live"] <= pool["kv_tokens_live_high"]
    assert pool["slow_replicas"] == 0 and pool["replica_detail"][0]["slow"] is False  # one engine: no peer
    assert pool["kv_usage_ratio"] == pytest.approx(pool["kv_tokens_live_high"] / CAPACITY_TOKENS)
    assert pool["completion_rate"] is not None, "two readings 2 s apart give a rate"
    # block usage is block granular: usage x capacity is a whole number of usable blocks' worth
    blocks = pool["kv_tokens_live_high"] / CAPACITY_TOKENS * 23  # 24 blocks, one is vLLM's null block
    assert abs(blocks - round(blocks)) < 1e-6
    assert [r.error for r in records if not r.ok] == []
    print(f"\n[cli] once: active {pool['active_requests']}, queued {pool['queued_requests']}, KV "
          f"{pool['kv_tokens_live']:.0f}/{pool['kv_tokens_capacity']:.0f}, completion rate "
          f"{pool.get('completion_rate')}; queue {queued_after:.0f} s, CLI done {cli_done_after:.0f} s "
          f"after the load started")


def test_gateway_in_front_of_the_engine_counts_task_requests(vllm_small_engine, litellm_gateway):
    """The harness' LiteLLM proxy forwards to the engine and labels its metrics by task type."""
    import requests

    key = litellm_gateway.info["master_key"]
    before = engine_gauges(fetch_metrics(vllm_small_engine.url)[0])[MODEL]["request_success"]
    calls = [("policy_question", "s-1"), ("policy_question", "s-2"), ("document_summary", "s-3")]
    for task_type, session in calls:
        r = requests.post(
            litellm_gateway.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "Summarise the report."}],
                  "max_tokens": 8, "user": "tester",
                  "metadata": {"task_type": task_type, "session_id": session}},
            timeout=120,
        )
        assert r.status_code == 200, r.text[:500]
        assert r.json()["usage"]["completion_tokens"] >= 1
    after = engine_gauges(fetch_metrics(vllm_small_engine.url)[0])[MODEL]["request_success"]
    assert after - before == len(calls), "every gateway call reached the engine"

    from prometheus_client.parser import text_string_to_metric_families

    def by_task() -> dict[str, float]:
        text, _ = fetch_metrics(litellm_gateway.url, "/metrics/")
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "litellm_proxy_total_requests_metric_total":
                    task = s.labels.get("metadata_task_type", "")
                    out[task] = out.get(task, 0.0) + s.value
        return out
    # the proxy records metrics after the response is sent: wait for them, with a deadline
    wait_for(by_task, lambda got: got == {"policy_question": 2.0, "document_summary": 1.0}, timeout=30,
             every=0.5, what="LiteLLM's request counters by task type")


def test_one_pool_of_a_real_engine_an_sglang_replica_and_a_router_queue(vllm_small_engine, tmp_path):
    """`headroom once` over one pool: the real vLLM engine (under 8 closed-loop clients), an SGLang
    replica serving the same model and an llm-d router whose flow-control queue holds requests for
    it. The SGLang and router bodies are rendered from those projects' metric definitions
    (tests/fixtures/*/SOURCES.md; neither runs here), with the model renamed to the engine's. The
    pool is the sum of its parts: each replica's numbers in the same JSON, the SGLang replica's equal
    its body read on its own, the router queue its body's."""
    import re
    from pathlib import Path

    from servers import MetricsServer

    from monitor.sources.gateway_queue import read_gateway_queues
    from monitor.sources.sglang import readings_from_text as sglang_readings

    fixtures = Path(__file__).parents[1] / "fixtures"
    rename = lambda text: re.sub(r'(model_name|target_model_name)="[^"]*"', rf'\1="{MODEL}"', text)  # noqa: E731
    sglang_text = rename((fixtures / "sglang" / "sglang-under-load.prom").read_text())
    router_text = rename((fixtures / "gateway" / "llm-d-router-flow-control.prom").read_text())
    srv = MetricsServer()
    srv.bodies["/sglang"] = sglang_text
    srv.bodies["/epp"] = router_text
    [sg] = sglang_readings(sglang_text, "sglang", 0.0)
    router_queued = sum(read_gateway_queues(router_text, "llm-d").queued_by_model().values())
    url = vllm_small_engine.url
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(f"""sources:
  vllm:
    targets: [{url}/metrics, {srv.url('/sglang')}]
  gateways:
    - {{kind: llm-d, url: "{srv.url('/epp')}"}}
""")
    vocab = vllm_small_engine.info["vocab_size"]
    loop = ClosedLoop(url, clients=8, duration=300.0, max_tokens=[100, 200],
                      prompt=lambda rng: token_prompt(rng, rng.randint(16, 64), vocab), seed=5)
    loop.start()
    try:
        wait_for(lambda: engine_gauges(fetch_metrics(url)[0])[MODEL], lambda g: g["running"] > 0,
                 timeout=60, every=0.2, what="the engine running requests")
        proc = subprocess.run([HEADROOM_PYTHON, "-m", "monitor", "once", "--config.file", str(cfg), "--json",
                               "--interval", "0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        loop.stop()
        loop.join(timeout=300)
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    [pool] = json.loads(proc.stdout)["pools"]
    assert pool["pool"] == MODEL and pool["engines"] == ["sglang", "vllm"] and pool["replicas"] == 2
    by = {r["replica"]: r for r in pool["replica_detail"]}
    engine, sglang = by[url + "/metrics"], by[srv.url("/sglang")]
    assert (sglang["active_requests"], sglang["queued_requests"]) == (sg.running, sg.waiting)
    assert sglang["kv_tokens_capacity"] == sg.kv_capacity_tokens
    assert engine["kv_tokens_capacity"] == CAPACITY_TOKENS and 0 <= engine["active_requests"] <= 8
    assert pool["active_requests"] == engine["active_requests"] + sg.running
    assert pool["queued_requests"] == engine["queued_requests"] + sg.waiting
    assert pool["kv_tokens_capacity"] == CAPACITY_TOKENS + sg.kv_capacity_tokens
    assert pool["gateway_queued_requests"] == router_queued > 0
    assert pool["load_requests"] == pool["active_requests"] + pool["queued_requests"] + router_queued
