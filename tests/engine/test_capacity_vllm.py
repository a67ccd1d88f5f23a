"""The capacity layer against the real vLLM CPU engine and a real LiteLLM proxy in front of it.

- Agent tasks through LiteLLM (metadata task_type, as the committed config labels it; no session id
  label, which would be unbounded): calls per task type exact from the proxy's /metrics/, calls per
  task exact against the tasks the client (the application) started, no series per session, and
  per-call latency quantiles within one bucket of the client's own timings.
- The task window on real scrapes: 3 constant agent sessions running 3-call tasks through the proxy,
  the application's task counter and session gauge from prometheus_client; calls per task and
  sessions from the capacity layer every cycle once the window is covered; untagged calls
  `unattributed`.

The short stepped load sweep feeding the knee estimator is in test_knee_vllm.py.
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter

import numpy as np
import pytest
import requests
from servers import wait_for

from engine.servers import fetch_metrics
from monitor.capacity.tasks import derive_tasks
from monitor.derive import histogram as histo
from monitor.sources.gateway import GatewayConfig, read_gateway

pytestmark = pytest.mark.vllm

TASKS = {"policy_question": (1, 24), "document_summary": (2, 48), "search_then_email": (4, 16)}  # calls, tokens


def _run_task(gw, task_type: str, session_id: str, user: str, out: list) -> None:
    calls, tokens = TASKS[task_type]
    headers = {"Authorization": f"Bearer {gw.info['master_key']}"}
    with requests.Session() as s:
        for i in range(calls):
            body = {"model": gw.info["served_model"], "max_tokens": tokens, "temperature": 0.0,
                    "messages": [{"role": "user", "content": f"{task_type} step {i} for {session_id}"}],
                    "user": user, "metadata": {"task_type": task_type, "session_id": session_id}}
            t0 = time.time()
            r = s.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)
            out.append((task_type, session_id, time.time() - t0, r.status_code, r.text[:200]))


def test_litellm_tasks_exact_and_call_latency_within_a_bucket(litellm_gateway):
    rng = random.Random(4)
    plan = [rng.choice(list(TASKS)) for _ in range(18)]
    calls: list = []
    threads = []
    # the proxy is shared with other tests in the session: measure this test's tasks as deltas
    text0, ts0 = fetch_metrics(litellm_gateway.info["metrics_url"], path="")
    before = read_gateway(text0, GatewayConfig(kind="litellm"), ts0)
    prefix = f"cap-{int(time.time() * 1000)}-"
    for n, tt in enumerate(plan):  # 6 concurrent clients, 3 tasks each
        t = threading.Thread(target=_run_task, args=(litellm_gateway, tt, f"{prefix}{n}", f"emp-{n % 6}", calls))
        threads.append(t)
    for i in range(0, len(threads), 6):
        batch = threads[i:i + 6]
        for t in batch:
            t.start()
        for t in batch:
            t.join(600)
    assert all(c[3] == 200 for c in calls), [c for c in calls if c[3] != 200][:3]
    # the proxy records a call's metrics after answering it: wait (bounded) until it has all of ours
    cfg = GatewayConfig(kind="litellm")
    end = time.monotonic() + 60
    while True:
        text, ts = fetch_metrics(litellm_gateway.info["metrics_url"], path="")
        reading = read_gateway(text, cfg, ts)
        derived = derive_tasks(reading, before, cfg)
        if sum(d.calls or 0 for d in derived.values()) >= len(calls) or time.monotonic() > end:
            break
        time.sleep(0.5)
    # bounded: the body names no session, and every task type is one label value
    assert "metadata_session_id" not in text and not any(t.session_calls for t in reading.tasks.values())
    print(f"\n[gateway] LiteLLM /metrics/ {len(text)} bytes after {len(calls)} calls of {len(plan)} tasks "
          f"(task-type label only)")
    tasks = Counter(plan)
    assert {tt for tt, d in derived.items() if d.calls} == set(tasks)
    for tt, n in tasks.items():
        assert derived[tt].calls == n * TASKS[tt][0]  # over the client's n tasks: calls per task exact
        client = np.array([c[2] for c in calls if c[0] == tt])
        h = reading.tasks[tt].call_latency
        old = before.tasks.get(tt)
        if old is not None and old.call_latency is not None:
            h = h.minus(old.call_latency)
        assert histo.total(h) == len(client)
        for q in (0.5, 0.9):
            est, exact = histo.quantile(h, q), float(np.quantile(client, q))
            assert abs(histo.bucket_index(h.bounds, est) - histo.bucket_index(h.bounds, exact)) <= 1, (tt, q, est, exact)
        assert h.sum / h.count <= client.mean()  # the proxy's view excludes the client's HTTP time


# the agent's tool call between two model calls; it also keeps the proxy below saturation, where its
# metrics callback (run after each response) falls behind by seconds on a loaded 2-core machine
TOOL_WAIT = 0.2


def _agent_session(gw, task_type: str, started, stop: threading.Event, errors: list) -> None:
    """One session of the agent application: 3-call tasks back to back through the proxy, a tool wait
    of TOOL_WAIT between two calls, each task counted when it starts (agent_tasks_started_total), as
    the application convention asks."""
    headers = {"Authorization": f"Bearer {gw.info['master_key']}"}
    with requests.Session() as s:
        while not stop.is_set():
            started.labels(task_type=task_type).inc()
            for i in range(3):
                body = {"model": gw.info["served_model"], "max_tokens": 8, "temperature": 0.0,
                        "messages": [{"role": "user", "content": f"step {i}"}],
                        "metadata": {"task_type": task_type}}
                r = s.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)
                if r.status_code != 200:
                    errors.append(r.text[:200])
                if i < 2 and stop.wait(TOOL_WAIT):
                    return


def test_live_tasks_and_sessions_over_the_task_window(litellm_gateway, vllm_small_engine):
    """The capacity layer's task window on real scrapes: the proxy labels calls by task type only,
    the application (this test, with prometheus_client) counts tasks and sessions. Every cycle once
    the window is covered: calls per task = the proxy's call rate over the app's task rate, off 3 by
    at most the calls of the tasks in flight at the window's two edges; sessions exact; a call
    without metadata is `unattributed`, never "None"."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client import Counter as PCounter

    from monitor.capacity.enrich import CapacityState, assess
    from monitor.config import from_dict
    from monitor.config.inputs import capacity_inputs
    from monitor.model import PoolSnapshot
    from monitor.sources.gateway import UNATTRIBUTED, read_gateway_scrape
    from monitor.step.cycle_step import attach_capacity

    model, sessions, tt, window = litellm_gateway.info["served_model"], 3, f"live_{int(time.time())}", 30.0
    registry = CollectorRegistry()
    started = PCounter("agent_tasks_started", "Tasks started.", ["task_type"], registry=registry)
    Gauge("agent_sessions_active", "Sessions open.", ["task_type"], registry=registry).labels(task_type=tt).set(sessions)
    cfg = from_dict({"capacity": {"task_window": f"{window:g}s"},
                     "sources": {"vllm": {"targets": [vllm_small_engine.url + "/metrics"]},
                                 "gateways": [{"kind": "litellm", "url": litellm_gateway.info["metrics_url"], "pool": model},
                                              {"kind": "app", "url": "http://app/metrics", "pool": model}]}})
    state = CapacityState(capacity_inputs(cfg))
    gcfg = [state.gateway_config(g.kind, g.task_label, g.session_label) for g in cfg.gateways]
    # one call without metadata: the proxy writes metadata_task_type="None" for it
    r = requests.post(litellm_gateway.url + "/v1/chat/completions", timeout=300,
                      headers={"Authorization": f"Bearer {litellm_gateway.info['master_key']}"},
                      json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text[:300]
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_agent_session, args=(litellm_gateway, tt, started, stop, errors))
               for _ in range(sessions)]
    for th in threads:
        th.start()
    seen = []
    try:
        first, deadline = time.time(), time.monotonic() + 240
        while len(seen) < 8 and time.monotonic() < deadline:
            text, ts = fetch_metrics(litellm_gateway.info["metrics_url"], path="")
            app_ts = time.time()
            scrapes = [read_gateway_scrape(text, gcfg[0], ts, 0, "litellm", model),
                       read_gateway_scrape(generate_latest(registry).decode(), gcfg[1], app_ts, 1, "app", model)]
            pool = PoolSnapshot(pool=model, model=model, replicas=1)
            attach_capacity(pool, assess(state, [pool], {}, scrapes, (), app_ts)[model])
            by_type = pool.tasks.by_type
            assert "None" not in by_type and "" not in by_type
            s = by_type.get(tt)
            if s is not None and s.calls_per_task is not None:
                seen.append((app_ts - first, s, UNATTRIBUTED in by_type))
            # the next reading once the sessions moved on (two more tasks started), not after a fixed time
            begun = registry.get_sample_value("agent_tasks_started_total", {"task_type": tt}) or 0.0
            wait_for(lambda: registry.get_sample_value("agent_tasks_started_total", {"task_type": tt}) or 0.0,
                     lambda n: n >= begun + 2, timeout=60, every=0.05, what="two more tasks started")
    finally:
        stop.set()
        for th in threads:
            th.join(300)
    assert errors == []
    assert len(seen) == 8, f"the {window:g} s window was not covered in time"
    for age, s, unattributed in seen:
        assert age >= window * 0.99 and unattributed
        assert s.calls_per_task_source == "gateway_calls/app_tasks" and s.sessions == sessions
        # calls counted on completion, tasks on start: each session has at most one task in flight at
        # either edge of the window, so calls are 3 per task give or take 3 per session; LiteLLM also
        # records a call in a callback after the response, late by a varying amount on a busy
        # machine (clean-clone runs read 3.14 over 158 tasks and, with back-to-back calls that kept
        # the proxy saturated, 2.69 over 225). Within 10 %: one-cycle counting read 1 to 9 for the
        # same task; the exact 3 within 5 % is the driven-clock test's (tests/core/test_task_window.py)
        assert abs(s.calls_per_task - 3.0) <= 0.3, (age, s.calls_per_task, s.tasks)
    print(f"\n[tasks] calls per task over {window:g} s windows: "
          f"{', '.join(f'{s.calls_per_task:.2f} ({s.tasks:.0f} tasks)' for _a, s, _u in seen)}")
