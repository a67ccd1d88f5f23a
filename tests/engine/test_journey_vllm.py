"""The overload users feel pages someone: the structural version of the overload journey
(benchmarks/overload_journey.py runs it at full length, with the rules as shipped).

The session's real vLLM engine (8 slots) behind the session's real LiteLLM proxy, an agent
application (tests/engine/agent_app.py: 3-call chat tasks with tool waits, its task convention on its
own /metrics, some sessions giving up on a call after 4 s), a headroom daemon reading the engine,
LiteLLM and the application every 2 s with a 10 s task target, and a real Prometheus evaluating the
bundled rules every second.

Time scale: the rules are the demo's copies, every `for:` and alert range window SHORTENED 30x
(lab/headroom_lab/commands/demo.py `demo_rules`, as tests/engine/test_alerts_vllm.py); headroom's own SLO
burn windows are not shortened, so the fast-burn page (5m/1m) is the full-length benchmark's to show.
Asserted, waiting on conditions with deadlines:
  1. light load (3 sessions): no page, no capacity or latency alert firing for the pool;
  2. overload (20 sessions, 5 giving up): a page (a critical Headroom alert) fires for the pool, and
     the slo limit is under the load (the caller's view: tasks over their target leave no headroom);
  3. idle: every page clears.
"""
from __future__ import annotations

import sys
import time

import pytest
import requests
import yaml
from servers import Prometheus, wait_for, wait_http

from engine.agent_app import AgentApp
from engine.test_alerts_vllm import demo_scale_rules  # the demo's rules, evaluated every second

TARGET_SECONDS = 10.0
WATCHED = ("HeadroomLow", "HeadroomCriticallyLow", "HeadroomAboveKnee", "HeadroomLatencyOverTarget",
           "HeadroomTaskLatencyBudgetBurn", "HeadroomLoadShed", "HeadroomQueueBuilding")

pytestmark = pytest.mark.vllm


def _alerts(prom: Prometheus, pool: str) -> dict[str, tuple[str, str]]:
    """alertname -> (state, severity) of the watched alerts on `pool` (the worst state of its copies)."""
    r = requests.get(prom.url + "/api/v1/alerts", timeout=10)
    r.raise_for_status()
    out: dict = {}
    for a in r.json()["data"]["alerts"]:
        lab = a["labels"]
        if lab.get("pool") == pool and lab["alertname"] in WATCHED:
            if out.get(lab["alertname"], ("",))[0] != "firing":
                out[lab["alertname"]] = (a["state"], lab.get("severity"))
    return out


def _pages(alerts: dict) -> set:
    return {name for name, (state, severity) in alerts.items() if state == "firing" and severity == "critical"}


@pytest.fixture
def journey(vllm_small_engine, litellm_gateway, tmp_path):
    from monitor.app import build
    from monitor.config import from_dict
    pool = vllm_small_engine.info["served_model"]
    app = AgentApp(litellm_gateway.url, pool, litellm_gateway.info["master_key"], max_tokens=(40, 80),
                   tool_wait=(0.3, 1.0), give_up_seconds=4.0, seed=7)
    app_port = app.serve()
    cfg = {
        "global": {"interval": "2s", "latency_window": "1m"},
        "sources": {"vllm": {"targets": [vllm_small_engine.url + "/metrics"]},
                    "gateways": [{"kind": "litellm", "url": litellm_gateway.info["metrics_url"]},
                                 {"kind": "app", "url": f"http://127.0.0.1:{app_port}/metrics", "pool": pool}]},
        "pools": {pool: {"max_num_seqs": int(vllm_small_engine.info["max_num_seqs"])}},
        "capacity": {"task_window": "1m"},
        "slos": {"task_types": {"chat": {"p95_seconds": TARGET_SECONDS}}},
    }
    (tmp_path / "headroom.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    daemon = build(from_dict(cfg, str(tmp_path / "headroom.yml")), "127.0.0.1:0")
    daemon.start()
    prom = None
    try:
        wait_http(f"http://127.0.0.1:{daemon.port}/metrics", timeout=30)
        rules = tmp_path / "rules"
        rules.mkdir()
        prom_cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": demo_scale_rules(rules),
                    "scrape_configs": [{"job_name": "headroom",
                                        "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]}]}
        prom = Prometheus(str(tmp_path), yaml.safe_dump(prom_cfg, sort_keys=False))
        yield {"prom": prom, "pool": pool, "app": app}
    finally:
        app.stop()
        if prom is not None:
            prom.stop()
        daemon.stop()


def test_an_overload_through_the_gateway_pages_and_clears(journey):
    prom, pool, app = journey["prom"], journey["pool"], journey["app"]
    t0 = time.monotonic()
    # 1. light: 3 sessions until 40 s of their tasks are in the window, nothing firing
    app.set_sessions(3)
    wait_for(lambda: prom.query(f'count_over_time(headroom_task_arrival_rate{{pool="{pool}",task_type="chat"}}[40s])'),
             lambda r: r and float(r[0]["value"][1]) >= 20, timeout=180, what="40 s of light-load samples", every=1.0)
    light = _alerts(prom, pool)
    assert not any(state == "firing" for state, _ in light.values()), light

    # 2. overload: 20 sessions on 8 slots, 5 of them giving up after 4 s without a reply
    app.set_sessions(20, give_up=5)
    t1 = time.monotonic()
    fired = wait_for(lambda: _alerts(prom, pool), lambda a: bool(_pages(a)), timeout=300,
                     what=f"a page for pool {pool}", every=1.0)
    t_page = time.monotonic()
    slo_limit = prom.query(f'headroom_capacity_requests{{pool="{pool}",limit="slo"}}')
    gateway_q = prom.query(f'max_over_time(headroom_queued_requests{{pool="{pool}",where="gateway"}}[2m])')
    tasks = [t for t in app.tasks if t.end is not None and t.start >= time.time() - (t_page - t1)]
    over = sum(1 for t in tasks if not t.completed or t.end - t.start > TARGET_SECONDS)

    # 3. idle: every page clears
    app.set_sessions(0)
    wait_for(lambda: _alerts(prom, pool), lambda a: not _pages(a), timeout=300,
             what=f"every page for pool {pool} cleared at idle", every=1.0)
    t_clear = time.monotonic()
    sys.stderr.write(f"\n[journey] pages {sorted(_pages(fired))} {t_page - t1:.0f} s into the overload "
                     f"({len(tasks)} tasks, {over} over target or given up), cleared {t_clear - t_page:.0f} s "
                     f"after idle began; slo limit {slo_limit[0]['value'][1] if slo_limit else None}, "
                     f"max gateway queue {gateway_q[0]['value'][1] if gateway_q else None}; "
                     f"whole test {t_clear - t0:.0f} s\n")
    assert tasks and over / len(tasks) > 0.05, (over, len(tasks))  # the overload was one users felt
