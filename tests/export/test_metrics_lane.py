"""/metrics never waits behind the pages (a real server on loopback, a 2,000-pool snapshot): while
every worker is taken by views of the landing page (each render of that snapshot takes a while:
seconds for every pool on one page, 0.1 s or more for the paged page of the 50 with least headroom),
every scrape is answered, within its timeout, with the snapshot's exposition. The timing figures
(scrape latency while viewed, render time) are in benchmarks/metrics_lane_bench.py."""
import threading

import pytest
import requests
from servers import wait_for

from monitor.export.collector import Exposition
from monitor.export.landing import Trends
from monitor.export.server import WebState, serve
from monitor.model import PoolSnapshot, Snapshot

pytestmark = pytest.mark.live  # starts headroom's web server on loopback

POOLS = 2000
NOW = 1_796_300_000.0


def fleet(pools: int, t: float) -> tuple[Snapshot, Trends]:
    trends = Trends()
    snaps = []
    for i in range(pools):
        name = f"pool-{i:04d}/meta-llama/Llama-3.1-8B-Instruct"
        snaps.append(PoolSnapshot(pool=name, model=name, replicas=4, replicas_configured=4, active_requests=270.0,
                                  queued_requests=12.0, kv_usage_ratio=0.75))
        trends.seed(name, [(t - 6 * 3600 + 60 * k, 200.0 + k % 50, float(k % 7), 0.7) for k in range(360)])
    return Snapshot(timestamp=t, pools=snaps), trends


def test_scrapes_answer_while_every_worker_renders_the_landing_page():
    snap, trends = fleet(POOLS, NOW)
    state = WebState(Exposition(), trends)
    state.publish(snap)
    server, _ = serve(state, "127.0.0.1:0")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    stop, views, failures, held_after = threading.Event(), [], [], []

    def viewer():
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    r = s.get(base + "/", timeout=300)
                    views.append(r.status_code)
                except requests.RequestException as exc:
                    failures.append(exc)
    threads = [threading.Thread(target=viewer, daemon=True) for _ in range(server.limits.workers * 2)]
    try:
        for t in threads:
            t.start()
        for k in range(10):
            # a new snapshot each time: the next view renders it again (rendered once per snapshot)
            state.publish(Snapshot(timestamp=NOW + 15 * (k + 1), pools=snap.pools))
            # every worker holds a view (rendering, or waiting for that render) when the scrape is sent
            wait_for(lambda: server.stats.requests_in_progress, lambda busy: busy >= server.limits.workers, 120,
                     "every worker taken by landing-page views")
            r = requests.get(base + "/metrics", timeout=10)
            assert r.status_code == 200
            assert f'headroom_active_requests{{pool="pool-{POOLS - 1:04d}/meta-llama/Llama-3.1-8B-Instruct"}} 270.0' \
                in r.text
            # views still held when the scrape's answer is in: it did not wait for them. (Between two
            # views of one viewer the count can touch 0, so this is counted over the ten scrapes.)
            held_after.append(server.stats.requests_in_progress >= 1)
        assert sum(held_after) >= 5, f"the views finished first in {held_after.count(False)} of 10 scrapes"
        wait_for(lambda: len(views), lambda n: n >= 1, 300, "a view answered")
        assert set(views) == {200} and not failures
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        for t in threads:
            t.join(60)


def test_a_page_is_rendered_once_per_snapshot():
    snap, trends = fleet(3, NOW)
    state = WebState(Exposition(), trends)
    state.publish(snap)
    calls = []

    def render(s):
        calls.append(s)
        return b"page"
    assert state.rendered("/", render) == b"page" and state.rendered("/", render) == b"page"
    assert calls == [snap]
    state.publish(Snapshot(timestamp=NOW + 15, pools=snap.pools))
    state.rendered("/", render)
    assert len(calls) == 2 and calls[1] is state.snapshot
