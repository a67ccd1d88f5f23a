"""The capacity layer against the real vLLM CPU engine and a real LiteLLM proxy in front of it.

- Agent tasks through LiteLLM (metadata task_type, as the committed config labels it; no session id
  label, which would be unbounded): calls per task type exact from the proxy's /metrics/, calls per
  task exact against the tasks the client (the application) started, no series per session, and
  per-call latency quantiles within one bucket of the client's own timings.

The stepped load sweep for the knee is in test_knee_vllm.py (its own engine and pytest session).
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter

import numpy as np
import pytest
import requests

from engine.servers import fetch_metrics
from monitor.derive import histogram as histo
from monitor.capacity.tasks import derive_tasks
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
