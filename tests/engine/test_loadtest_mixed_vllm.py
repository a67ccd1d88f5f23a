"""`headroom loadtest --pattern mixed` against the real vLLM CPU engine: structure only (how well
priorities protect interactive work is a benchmark: benchmarks/priority_protection.py).

The session's `vllm_priority_engine` (tests/conftest.py): `--scheduling-policy priority` (vLLM 0.32:
the request body's `priority`, lower runs first) on the `small` model, max-num-seqs 4, shared with
the loadtest compare and the LoRA test. Checked exactly:
- the engine honours the priority the load tester sends: with its 4 slots held by long calls, a
  deferrable call (priority 10) that queued first is overtaken by an interactive one (priority 0)
  sent after it; on the FCFS reference engine (8 slots) the same two calls keep their order;
- the CLI's four cases, 5 s each (8 s took 12 s more), the budget read over HTTP from an exposition holding
  headroom_deferrable_budget_ratio 0.5 (a fixed page: the daemon's metric is another item):
  both classes ran (deferrable only outside `alone`), every call of both classes succeeded, the
  gate never let more than floor(0.5 x 4) = 2 deferrable calls fly, and mixed.json carries each
  case's interactive quantiles, share over target and deferrable throughput.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from servers import wait_for

from engine.measure import write_mixed_mix
from headroom_lab.loadtest.mixed import CASES
from monitor.commands.cli import main
from monitor.kit.exposition import parse

pytestmark = pytest.mark.vllm

def _gauge(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(v for _, v in parse(text, wanted=[name]).get(name))


def _stream(url: str, model: str, prompt: list, max_tokens: int, priority: int, out: dict, key: str) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "temperature": 0, "priority": priority}
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=180) as r:
        out[key + "_status"] = r.status_code
        for line in r.iter_lines():
            if line.startswith(b"data:") and b'"choices"' in line and key not in out:
                out[key] = time.monotonic()
    out[key + "_done"] = time.monotonic()


def overtaken(engine, slots: int) -> dict:
    """Hold every slot with long calls of different lengths (they end one at a time, 20 tokens apart,
    and fit the KV cache together: no preemption), queue a
    deferrable call (priority 10), then an interactive one (priority 0); the first-token times."""
    url, model, vocab = engine.url, engine.info["served_model"], engine.info["vocab_size"]
    out: dict = {}
    threads = [threading.Thread(target=_stream, args=(url, model, [5 + i] * 32, 120 + 20 * i, 10, out, f"fill{i}"))
               for i in range(slots)]
    for th in threads:
        th.start()
    wait_for(lambda: _gauge(url, "vllm:num_requests_running"), lambda n: n >= slots, 90, f"{slots} calls running", 0.1)
    threads.append(threading.Thread(target=_stream, args=(url, model, [7] * 16, 4, 10, out, "deferrable")))
    threads[-1].start()
    wait_for(lambda: _gauge(url, "vllm:num_requests_waiting"), lambda n: n >= 1, 90, "the deferrable call waiting", 0.1)
    threads.append(threading.Thread(target=_stream, args=(url, model, [min(9, vocab - 1)] * 16, 4, 0, out,
                                                          "interactive")))
    threads[-1].start()
    wait_for(lambda: _gauge(url, "vllm:num_requests_waiting"), lambda n: n >= 2, 90, "the interactive call waiting", 0.1)
    for th in threads:
        th.join(timeout=240)
    assert all(not th.is_alive() for th in threads), "a call did not finish"
    assert {v for k, v in out.items() if k.endswith("_status")} == {200}, out
    return out


def test_the_engine_honours_the_priority_sent(vllm_priority_engine, vllm_small_engine):
    prio = vllm_priority_engine
    t = overtaken(prio, 4)
    assert t["interactive"] < t["deferrable"], f"priority 0 did not overtake priority 10: {t}"
    fcfs = overtaken(vllm_small_engine, 8)  # the same calls on vLLM's default policy keep their order
    assert fcfs["deferrable"] < fcfs["interactive"], f"FCFS reordered the calls: {fcfs}"


class _Budget(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'# TYPE headroom_deferrable_budget_ratio gauge\nheadroom_deferrable_budget_ratio{pool="p"} 0.5\n'
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_four_cases_through_the_cli(vllm_priority_engine, tmp_path):
    prio = vllm_priority_engine
    mix = write_mixed_mix(str(tmp_path / "mix.yaml"), prio.info["vocab_size"], deferrable_concurrency=4,
                          interactive_per_second=1.0, ttft_seconds=2.0, budget_interval=0.5, pause=1.0,
                          deferrable_output=32)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Budget)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        rc = main(["loadtest", "--target", prio.url, "--mix", mix, "--pattern", "mixed", "--duration", "5s",
                   "--model", prio.info["served_model"], "--probes", "2", "--out", str(tmp_path / "out"),
                   "--budget-url", f"http://127.0.0.1:{server.server_port}/metrics", "--budget-pool", "p"])
    finally:
        server.shutdown()
        server.server_close()
        th.join(5)
    assert rc == 0
    rep = json.loads((tmp_path / "out" / "mixed.json").read_text())
    assert rep["cases_run"] == list(CASES) and set(rep["cases"]) == set(CASES)
    for case in CASES:
        assert (tmp_path / "out" / case / "report.json").is_file()
        c = rep["cases"][case]
        i, d = c["interactive"], c["deferrable"]
        assert i["calls"] > 0 and i["failed"] == 0, c["errors"]
        assert i["ttft_seconds"]["p95"] > 0 and i["e2e_seconds"]["p95"] >= i["ttft_seconds"]["p95"]
        assert i["over_target"] is not None and 0 <= i["over_target"] <= 1
        assert d["failed"] == 0, c["errors"]
        if case == "alone":
            assert d["calls"] == 0
        else:
            assert d["succeeded"] > 0 and d["calls_per_second"] > 0 and d["output_tokens_per_second"] > 0, case
    assert rep["cases"]["priority"]["priorities_sent"] == {"ask": 0, "summarise": 10}
    assert rep["cases"]["unmanaged"]["priorities_sent"] is None
    b = rep["cases"]["budget"]["budget"]
    assert b["max_concurrency"] == 4 and b["unknown_readings"] == 0 and b["readings"] >= 6  # one each 0.5 s over 5 s, 16 seen at 8 s
    assert b["allowed_mean"] == pytest.approx(2.0, abs=0.05) and b["gate_peak_in_flight"] <= 2
    assert rep["target"] == {"ttft_seconds": 2.0, "source": "mix slo.ttft_seconds"}
