"""The queue the engine cannot see, live (issue 37): a gateway on loopback that holds its callers'
requests in front of a simulated vLLM engine (headroom-lab's fleet, nearly idle: one task every 1,000 s),
N clients waiting on it, and the headroom daemon reading both over HTTP every second. The gateway answers /metrics as
LiteLLM does (`litellm_in_flight_requests`, its own /metrics request counted, as LiteLLM's ASGI
middleware counts every HTTP request): headroom must find the N held requests queued at the gateway,
within one request (the engine may run one of its own tasks meanwhile), on /metrics as
`headroom_queued_requests{where="gateway"}` and in the snapshot, and none once they are answered."""
from __future__ import annotations

import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, headroom_run, stop_process, wait_for, wait_http
from simfleet import one_pool, task

pytestmark = pytest.mark.live
CLIENTS = 7


class HoldingGateway(ThreadingHTTPServer):
    """Every POST is held until `release` is set; GET /metrics counts the requests in flight."""

    def __init__(self, port: int):
        self.in_flight = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: HoldingGateway

    def log_message(self, *args) -> None:  # quiet
        pass

    def _enter(self) -> None:
        with self.server.lock:
            self.server.in_flight += 1

    def _leave(self) -> None:
        with self.server.lock:
            self.server.in_flight -= 1

    def do_POST(self) -> None:
        self._enter()
        try:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.server.release.wait(120)
            self._answer(b'{"choices": []}', "application/json")
        finally:
            self._leave()

    def do_GET(self) -> None:
        self._enter()  # LiteLLM counts the scrape that reads the gauge
        try:
            with self.server.lock:
                n = self.server.in_flight
            body = (f"# HELP litellm_in_flight_requests Number of HTTP requests currently in-flight on this uvicorn worker\n"
                    f"# TYPE litellm_in_flight_requests gauge\nlitellm_in_flight_requests {float(n)}\n").encode()
            self._answer(body, "text/plain; version=0.0.4")
        finally:
            self._leave()

    def _answer(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _call(url: str, out: list) -> None:
    req = urllib.request.Request(url, data=b'{"model": "m", "messages": []}', method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=130) as r:
        out.append(r.status)


def _queued(base: str) -> dict:
    """headroom_queued_requests of the daemon's /metrics, by where."""
    text = requests.get(base + "/metrics", timeout=5).text
    return {s.labels["where"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "headroom_queued_requests"}


def test_requests_held_at_the_gateway_are_queued_where_gateway(tmp_path):
    from headroom_lab.sim.server import start_fleet
    fleet = start_fleet(one_pool(1, {"ask": task(0.001)}, replicas=1), scenario="steady", seed=1, warmup_s=0,
                        record_truth=False)
    gw = HoldingGateway(free_port())
    serving = threading.Thread(target=gw.serve_forever, name="holding-gateway")
    serving.start()
    answers: list = []
    clients = [threading.Thread(target=_call, args=(f"http://127.0.0.1:{gw.server_port}/v1/chat/completions", answers),
                                name=f"client-{i}") for i in range(CLIENTS)]
    (engine,) = fleet.replica_urls["p"]
    gw_url = f"http://127.0.0.1:{gw.server_port}/metrics"
    daemon, base = headroom_run(tmp_path, f"global: {{interval: 1s}}\nsources:\n  vllm:\n    targets: [{engine}]\n"
                                f"  gateways:\n    - {{kind: litellm, url: '{gw_url}'}}\n", 300)
    try:
        wait_http(base + "/-/ready", timeout=90)
        # nothing held yet: the gateway's own scrape is not a queue
        wait_for(lambda: _queued(base), lambda q: q.get("gateway") == 0.0, timeout=60, what="an empty gateway queue")
        for c in clients:
            c.start()
        wait_for(lambda: gw.in_flight, lambda n: n >= CLIENTS, timeout=60, what=f"{CLIENTS} clients at the gateway")
        held = wait_for(lambda: _queued(base), lambda q: abs(q.get("gateway", -99) - CLIENTS) <= 1, timeout=60,
                        what=f"headroom_queued_requests{{where=\"gateway\"}} within one of {CLIENTS}")
        assert held["engine"] <= 1  # the simulated engine runs at most one task of its own meanwhile
        doc = requests.get(base + "/api/v1/snapshot", timeout=5).json()
        (pool,) = doc["pools"]
        assert pool["gateway_queued_source"] == {gw_url: "in_flight"}
        assert abs(pool["gateway_queued_requests"] - CLIENTS) <= 1
        # what the engine holds and what waits in front of it, together, are the load headroom judges
        assert pool["load_requests"] == pool["active_requests"] + pool["queued_requests"] + pool["gateway_queued_requests"]
        assert pool["capacity"]["load_requests_instant"] == pool["load_requests"]
        gw.release.set()  # the callers are answered: the queue is gone
        wait_for(lambda: _queued(base), lambda q: q.get("gateway") == 0.0, timeout=60, what="the gateway queue cleared")
    finally:
        gw.release.set()
        for c in clients:
            c.join(timeout=30)
        stop_process(daemon, 20)
        gw.shutdown()
        serving.join(timeout=30)
        gw.server_close()
        fleet.stop()
    assert answers == [200] * CLIENTS
