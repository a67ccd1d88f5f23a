"""The fleet over HTTP in real time: endpoints, content type, replica loss, demo busyness."""
from __future__ import annotations

import re
import time

import pytest
import requests

from headroom_lab.sim.fleet import load_config
from headroom_lab.sim.server import start_fleet

RUNNING = re.compile(r'^vllm:num_requests_running\{[^}]*\} (\S+)$', re.M)
WAITING = re.compile(r'^vllm:num_requests_waiting\{[^}]*\} (\S+)$', re.M)

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def scrape(url: str, **kw) -> requests.Response:
    return requests.get(url, timeout=5, **kw)


@pytest.fixture()
def fleet():
    h = start_fleet(None, "steady", seed=3, warmup_s=20)
    try:
        yield h
    finally:
        h.stop()


def test_endpoints_answer_with_classic_text(fleet):
    assert set(fleet.replica_urls) == {"chat-8b", "agent-70b"}
    assert len(fleet.replica_urls["chat-8b"]) == 4 and len(fleet.replica_urls["agent-70b"]) == 2
    ports = {u.split(":")[2].split("/")[0] for u in fleet.all_urls}
    assert len(ports) == 9  # one server each, all on distinct free ports
    for url in fleet.all_urls:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        r = scrape(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "# EOF" not in r.text
    page = scrape(fleet.replica_urls["chat-8b"][0]).text
    assert 'vllm:cache_config_info{' in page and 'model_name="meta-llama/Llama-3.1-8B-Instruct"' in page
    assert "gen_ai_server_request_duration_seconds_bucket" in scrape(fleet.gateway_url).text
    assert "agent_tasks_started_total" in scrape(fleet.app_url).text
    assert "DCGM_FI_DEV_POWER_USAGE" in scrape(fleet.dcgm_url).text
    targets = fleet.prometheus_targets()
    assert len(targets["vllm"]) == 6 and all(x.startswith("127.0.0.1:") for x in targets["vllm"])
    rbase = fleet.replica_urls["agent-70b"][1].rsplit("/", 1)[0]
    models = scrape(rbase + "/v1/models").json()
    assert models["data"][0]["id"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert models["data"][0]["max_model_len"] == 32768
    assert scrape(rbase + "/load").json()["server_load"] >= 0
    base = fleet.gateway_url.rsplit("/", 1)[0]
    assert scrape(base + "/health").status_code == 200
    assert scrape(base + "/nope").status_code == 404


GEN = re.compile(r'^vllm:generation_tokens_total\{[^}]*\} (\S+)$', re.M)


def test_scrapes_follow_the_simulated_clock():
    """Every scrape brings the simulation to sim0 + (clock() - wall0) x speed, exactly: driven by an
    injected clock there is nothing to wait for and nothing to approximate."""
    wall = [1_790_000_000.0]
    h = start_fleet(None, "steady", seed=3, warmup_s=20, clock=lambda: wall[0])
    try:
        url = h.replica_urls["chat-8b"][0]
        assert h.sim0 == h.wall0 == wall[0]  # warmed up to the clock: neither ahead nor behind
        a = float(GEN.search(scrape(url).text).group(1))
        with h.lock:
            assert h.fleet.t == wall[0]
        wall[0] += 1.5
        b = float(GEN.search(scrape(url).text).group(1))
        with h.lock:
            assert h.fleet.t == wall[0]  # 1.5 s of clock = 1.5 s simulated: rate 1
        assert b > a  # the busy replica generated tokens in those 1.5 simulated seconds
        with h.lock:
            assert h.fleet.t == wall[0]  # the driver thread does not run ahead of the clock either
    finally:
        h.stop()
    wall = [1_790_000_000.0]
    fast = start_fleet(None, "steady", seed=3, warmup_s=0, speed=4.0, clock=lambda: wall[0])
    try:
        wall[0] += 1.5
        scrape(fast.replica_urls["chat-8b"][0])
        with fast.lock:
            assert fast.fleet.t == 1_790_000_000.0 + 4.0 * 1.5  # speed 4: 6 simulated seconds
    finally:
        fast.stop()


def test_the_default_clock_is_wall_time():
    """Without an injected clock the simulation follows time.time(): a scrape lands it at
    sim0 + (wall time of the scrape - wall0), so it lags wall time by at most the start-up."""
    called = time.time()
    h = start_fleet(None, "steady", seed=3, warmup_s=0)
    returned = time.time()
    try:
        assert called <= h.sim0 <= h.wall0 <= returned
        before = time.time()
        scrape(h.replica_urls["chat-8b"][0])
        with h.lock:
            t = h.fleet.t
        after = time.time()
        assert h.sim0 + (before - h.wall0) <= t <= h.sim0 + (after - h.wall0)
    finally:
        h.stop()


def test_replica_loss_stops_answering():
    wall = [1_790_000_000.0]  # the fleet's clock, driven by the test: the loss comes when told
    h = start_fleet(None, "replica-loss", seed=4, warmup_s=0, clock=lambda: wall[0],
                    scenario_overrides={"at_s": 1.0, "pool": "agent-70b", "replica": 0})
    try:
        victim = h.replica_urls["agent-70b"][0]
        assert scrape(victim).status_code == 200
        wall[0] = 1_790_000_000.999
        assert scrape(victim).status_code == 200 and h.fleet.lost_replicas == []  # not yet at 1.0 s
        wall[0] = 1_790_000_001.0
        deadline = time.monotonic() + 10
        gone = False
        while time.monotonic() < deadline and not gone:  # the port closes in a background thread
            try:
                scrape(victim)
            except requests.ConnectionError:
                gone = True
            else:
                time.sleep(0.02)
        assert gone, "lost replica still answers"
        assert [r.name for r in h.fleet.lost_replicas] == ["agent-70b-0"]
        for url in h.replica_urls["chat-8b"] + h.replica_urls["agent-70b"][1:]:
            assert scrape(url).status_code == 200
        assert 'Hostname="agent-70b-0"' not in scrape(h.dcgm_url).text
    finally:
        h.stop()


def test_legacy_and_underscore_names_over_http():
    h = start_fleet(None, "steady", seed=5, warmup_s=0, legacy_names=True, underscore_names=True)
    try:
        page = scrape(h.replica_urls["chat-8b"][0]).text
        assert "vllm_gpu_cache_usage_perc{" in page and "vllm:" not in page
        assert 'engine="' not in page
    finally:
        h.stop()


def test_default_demo_fleet_shows_running_and_waiting_in_both_pools_within_60s():
    h = start_fleet()  # the defaults the demo uses
    try:
        seen = {pool: False for pool in h.replica_urls}
        deadline = time.time() + 60
        while time.time() < deadline and not all(seen.values()):
            for pool, urls in h.replica_urls.items():
                running = waiting = 0.0
                for url in urls:
                    text = scrape(url).text
                    running += float(RUNNING.search(text).group(1))
                    waiting += float(WAITING.search(text).group(1))
                if running > 0 and waiting > 0:
                    seen[pool] = True
            time.sleep(0.25)
        assert all(seen.values()), seen
        # ...but not permanently saturated: below the KV knee on average
        with h.lock:
            state = {p: h.fleet.pool_state(p) for p in h.fleet.pools}
        assert state["chat-8b"]["kv_usage"] < 0.95
    finally:
        h.stop()


def test_bad_arguments():
    with pytest.raises(ValueError, match="speed"):
        start_fleet(None, speed=0)
    with pytest.raises(ValueError, match="unknown scenario"):
        start_fleet(load_config(), "nope")


def test_scenario_times_from_warmup_or_from_serving():
    a = start_fleet(None, "replica-loss", seed=6, warmup_s=20,
                    scenario_overrides={"at_s": 10.0})  # inside the warm-up: already gone
    b = start_fleet(None, "replica-loss", seed=6, warmup_s=20, scenario_from_serving=True,
                    scenario_overrides={"at_s": 10.0})  # 10 s after serving starts
    try:
        assert [r.name for r in a.fleet.lost_replicas] == ["chat-8b-3"]
        assert b.fleet.lost_replicas == []
        assert scrape(b.replica_urls["chat-8b"][3]).status_code == 200
    finally:
        a.stop()
        b.stop()


def test_live_diurnal_has_a_floor_so_the_demo_is_busy_at_night():
    """The demo's default scenario is diurnal on the real clock: at 03:00 a live fleet still
    shows running and waiting requests in both pools within 60 s (fast-forwarded here)."""
    from headroom_lab.sim.fleet import Fleet
    h = start_fleet(None, "diurnal", seed=7, warmup_s=0)
    try:
        assert h.fleet.sp["min_level"] == 0.4
    finally:
        h.stop()
    three_am = 1_789_960_000 // 86400 * 86400 + 3 * 3600
    f = Fleet(load_config(), "diurnal", seed=7, start_time=three_am - 30,
              scenario_overrides={"min_level": 0.4})
    f.advance(30)
    seen = {p: False for p in f.pools}
    for _ in range(60):
        f.advance(1)
        for p in f.pools:
            s = f.pool_state(p)
            seen[p] |= s["running"] > 0 and s["waiting"] > 0
    assert all(seen.values()), seen
    bare = Fleet(load_config(), "diurnal", seed=7, start_time=three_am)
    assert bare.rate_multiplier(three_am, load_config().mix.task_types["policy_question"]) < 0.1
