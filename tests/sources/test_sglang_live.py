"""An SGLang pool on the dashboards, live: two SGLang /metrics bodies (the rendered captures of
tests/fixtures/sglang, one of them data-parallel with every TP rank reporting) served over HTTP ->
the headroom daemon and a real Prometheus 2.42 with the bundled rules -> every engine panel of the
dashboards, with the pool variable set to the SGLang model.

- each engine panel query (`pool:vllm_X or pool:sglang_Y`) returns the SGLang pool;
- the SGLang recording rules count each engine once (TP ranks repeat the same numbers): running,
  queued and KV tokens equal what headroom itself reads from the same bodies;
- headroom's own pool panels (load, KV, capacity) return the SGLang pool too;
- with priority scheduling (a third body alone), the rules and headroom count the totals once.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml
from servers import MetricsServer, Prometheus, fixture, stop_all, wait_http

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen2.5-7B-Instruct"
BODIES = ("sglang-under-load", "sglang-dp2-tp2-all-schedulers")
pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not shutil.which("prometheus"), reason="needs the Debian package prometheus")]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stack(tmp_path_factory, bodies):
    """The bodies served, headroom reading them and a Prometheus with the bundled rules scraping both."""
    from monitor.app import build
    from monitor.config import from_dict

    work = tmp_path_factory.mktemp("sglang-live")
    stoppers = []
    try:
        servers = []
        for name in bodies:
            srv = MetricsServer()
            srv.bodies["/metrics"] = fixture(str(Path("sglang") / f"{name}.prom"))
            servers.append(srv)
            stoppers.append(srv.stop)
        cfg = {"global": {"interval": "1s"},
               "sources": {"vllm": {"targets": [{"url": s.url("/metrics"), "kind": "sglang"} for s in servers]}}}
        (work / "headroom.yml").write_text(yaml.safe_dump(cfg))
        daemon = build(from_dict(cfg, str(work / "headroom.yml")), "127.0.0.1:0")
        daemon.start()
        stoppers.append(daemon.stop)
        wait_http(f"http://127.0.0.1:{daemon.port}/metrics", timeout=30)
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in sorted((ROOT / "rules").glob("*.yaml"))],
            "scrape_configs": [
                {"job_name": "headroom", "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]},
                {"job_name": "sglang", "static_configs": [{"targets": [f"127.0.0.1:{s.port}" for s in servers]}]},
            ],
        }
        prom = Prometheus(str(work), yaml.safe_dump(prom_cfg, sort_keys=False))
        stoppers.append(prom.stop)
        yield prom
    finally:
        stop_all(stoppers)


@pytest.fixture(scope="module")
def sglang_stack(tmp_path_factory):
    yield from _stack(tmp_path_factory, BODIES)


@pytest.fixture(scope="module")
def priority_stack(tmp_path_factory):
    yield from _stack(tmp_path_factory, ("sglang-dp2-priority",))


def _value(prom, q: str) -> float:
    (sample,) = prom.query(q)
    return float(sample["value"][1])


def test_sglang_recording_rules_count_each_engine_once(sglang_stack):
    prom = sglang_stack
    sel = f'{{model_name="{MODEL}"}}'
    prom.wait_for(f"pool:sglang_num_running_reqs:sum{sel}", timeout=60)
    # both bodies scraped by Prometheus and read by headroom
    prom.wait_for(f"pool:sglang_engines:count{sel} == 3", timeout=60)
    prom.wait_for(f'headroom_replicas{{pool="{MODEL}"}} == 2', timeout=60)
    # what headroom reads from the same two bodies (its SGLang parser: tests/sources/test_sglang_readings.py)
    hp = f'{{pool="{MODEL}"}}'
    for rule, own in (("pool:sglang_num_running_reqs:sum", "headroom_active_requests"),
                      ("pool:sglang_num_queue_reqs:sum", "headroom_queued_requests"),
                      ("pool:sglang_kv_cache_tokens:sum", "headroom_kv_tokens"),
                      ("pool:sglang_kv_cache_capacity_tokens:sum", "headroom_kv_capacity_tokens")):
        assert _value(prom, f"{rule}{sel}") == pytest.approx(_value(prom, f"{own}{hp}")), rule
    # one engine in the first body, two data-parallel engines (4 TP-rank copies) in the second
    assert _value(prom, f"pool:sglang_engines:count{sel}") == 3
    assert _value(prom, f"count(sglang:num_running_reqs{sel})") == 5
    assert _value(prom, f"pool:sglang_num_running_reqs:sum{sel}") > 0


def test_every_engine_panel_shows_the_sglang_pool(sglang_stack):
    prom = sglang_stack
    tests_dash = _load("headroom_test_dashboards_sglang", ROOT / "tests" / "deploy" / "test_dashboards.py")
    names = tests_dash.names
    # wait for a rate over two scrapes and a quantile from the latency rules
    prom.wait_for(f'pool_quantile:sglang_time_to_first_token_seconds:histogram_quantile5m{{model_name="{MODEL}"}}',
                  timeout=90)
    prom.wait_for(f'pool:sglang_request_success:rate5m{{model_name="{MODEL}"}}', timeout=90)
    pool = MODEL.replace(".", "\\\\.")  # a regex matcher: dots literal
    variables = {**tests_dash.GRAFANA_VARS, "$__rate_interval": "1m", "$__range": "5m", "$cluster": ".*",
                 "$namespace": ".*", "$pool": pool, "${pool}": pool, "$replica": ".*"}
    engine_queries, own_queries = 0, 0
    for path in tests_dash.DASHBOARD_FILES:
        for title, t in tests_dash._targets(json.loads(path.read_text())):
            expr = t["expr"]
            for k in sorted(variables, key=len, reverse=True):
                expr = expr.replace(k, variables[k])
            found = [n for n in names.selector_names(expr) if n]
            sglang_rules = [n for n in found if ":sglang_" in n or n.startswith("sglang:")]
            own = found and all(n in ("headroom_active_requests", "headroom_queued_requests", "headroom_kv_tokens",
                                      "headroom_kv_capacity_tokens", "headroom_kv_usage_ratio", "headroom_replicas",
                                      "headroom_replicas_configured", "headroom_replica_up",
                                      "headroom_replica_active_requests", "headroom_replica_queued_requests",
                                      "headroom_replica_kv_tokens", "headroom_replica_kv_capacity_tokens")
                                for n in found)
            if not sglang_rules and not own:
                continue
            if any(n.startswith(("fleet:", "DCGM_")) for n in found):
                continue  # GPU power: no DCGM exporter in this setup (tests/deploy/test_alert_path.py has one)
            result = prom.query(expr)
            assert result, (path.name, title, expr)
            if sglang_rules and "sum(" not in t["expr"]:
                assert {r["metric"].get("model_name") for r in result} == {MODEL}, (path.name, title)
                engine_queries += 1
            own_queries += bool(own)
    assert engine_queries >= 19 and own_queries >= 8, (engine_queries, own_queries)


def test_priority_scheduling_totals_agree_with_the_rules(priority_stack):
    """With priority scheduling (the totals under priority="", each priority beside them) the recording
    rules and headroom both count 8 running and 2 queued (tests/sources/test_sglang_edges.py has the hand
    calculation); every series added would be 16 running; headroom's per-priority series sum to the totals."""
    prom = priority_stack
    sel, hp = f'{{model_name="{MODEL}"}}', f'{{pool="{MODEL}"}}'
    prom.wait_for(f"pool:sglang_num_running_reqs:sum{sel}", timeout=60)
    prom.wait_for(f"headroom_priority_requests{hp}", timeout=60)
    assert _value(prom, f"sum(sglang:num_running_reqs{sel})") == 16.0
    for rule, own, total in (("pool:sglang_num_running_reqs:sum", "headroom_active_requests", 8.0),
                             ("pool:sglang_num_queue_reqs:sum", "headroom_queued_requests", 2.0)):
        assert _value(prom, f"{rule}{sel}") == _value(prom, f'{own}{{pool="{MODEL}",where!="gateway"}}') == total
    assert _value(prom, f'sum(headroom_priority_requests{{pool="{MODEL}",state="running"}})') == 8.0
    assert _value(prom, f'sum(headroom_priority_requests{{pool="{MODEL}",state="queued"}})') == 2.0
    assert _value(prom, f'headroom_priority_requests{{pool="{MODEL}",state="running",priority="5"}}') == 1.0
