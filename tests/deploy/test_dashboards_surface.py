"""The SRE's daily surface (issue 30) in grafana/dashboards/, checked on the JSON:

- every family in monitor/model/catalogue.py is on some panel, or named with its reason in
  grafana/README.md ("Exported but on no panel", at most a handful);
- engine panels read vLLM and SGLang alike (each `pool:vllm_*` rule has its `pool:sglang_*` pair);
- the per-replica dashboard, its `replica` variable, and the data links from the pool panels;
- the cluster / namespace / pool variables on every dashboard;
- SLO target lines on the latency panels, and the what-to-do dashboard's panels.
The live checks are in tests/deploy/test_alert_path.py (every query, every replica) and
tests/sources/test_sglang_live.py (an SGLang pool).
"""
from __future__ import annotations

import re

from test_dashboards import DASH_DIR, DASHBOARD_FILES, GRAFANA, _dash, _panels, _targets, names, substitute

from monitor.model.catalogue import CATALOGUE


def _used_names() -> dict[str, set[str]]:
    """metric name -> dashboard files whose panels query it."""
    used: dict[str, set[str]] = {}
    for path in DASHBOARD_FILES:
        for _title, t in _targets(_dash(path)):
            for n in names.selector_names(substitute(t["expr"])):
                if n:
                    used.setdefault(n, set()).add(path.name)
    return used


def _not_on_a_panel() -> dict[str, str]:
    """The families grafana/README.md names, under "Exported but on no panel", with their reason."""
    text = (GRAFANA / "README.md").read_text()
    section = text.split("## Exported but on no panel", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^- `(headroom_\w+)`: (.+)$", section, flags=re.M))


def test_every_exported_family_is_on_a_panel_or_named_in_the_readme():
    used = _used_names()
    excused = _not_on_a_panel()
    assert 0 < len(excused) <= 5, "at most a handful of families may stay off the dashboards"
    missing = sorted(m.exposed_name for m in CATALOGUE if m.exposed_name not in used and m.exposed_name not in excused)
    assert not missing, f"exported families on no panel and not named in grafana/README.md: {missing}"
    stale = sorted(n for n in excused if n in used or n not in {m.exposed_name for m in CATALOGUE})
    assert not stale, f"grafana/README.md excuses families that are on a panel or not exported: {stale}"
    assert all(len(reason) > 10 for reason in excused.values())


def test_engine_panels_read_vllm_and_sglang():
    """A panel that reads an engine recording rule has a target for vLLM and one for SGLang, the same
    rule of each engine (pool:vllm_X beside pool:sglang_Y, legends saying which), so a pool of either
    engine shows; the rules exist."""
    rules = names.recording_rule_names()
    vllm_only = {"pool:vllm_num_requests_waiting_by_reason:sum"}  # SGLang reports no reason
    pairs = 0
    for path in DASHBOARD_FILES:
        for p in _panels(_dash(path)):
            v, s_ = [], []
            for t in p.get("targets", []):
                found = [n for n in names.selector_names(substitute(t["expr"])) if n]
                for n in found:
                    if ":vllm_" in n and n not in vllm_only:
                        v.append(n)
                        assert t["legendFormat"].endswith("(vLLM)"), (path.name, p["title"])
                    elif ":sglang_" in n:
                        s_.append(n)
                        assert t["legendFormat"].endswith("(SGLang)"), (path.name, p["title"])
            assert len(v) == len(s_), (path.name, p["title"], v, s_)
            assert all(n in rules for n in v + s_), (path.name, p["title"])
            pairs += len(v)
    assert pairs >= 15


def test_replica_dashboard_and_the_links_to_it():
    d = _dash(DASH_DIR / "headroom-replicas.json")
    variables = [v["name"] for v in d["templating"]["list"]]
    assert variables[:5] == ["datasource", "cluster", "namespace", "pool", "replica"]
    replica_var = d["templating"]["list"][4]
    assert replica_var["query"] == 'label_values(headroom_replica_up{cluster=~"$cluster",pool=~"$pool"}, replica)'
    used = {n for _t, t in _targets(d) for n in names.selector_names(substitute(t["expr"])) if n}
    for family in ("headroom_replica_active_requests", "headroom_replica_queued_requests", "headroom_replica_kv_tokens",
                   "headroom_replica_kv_capacity_tokens", "headroom_replica_up", "headroom_replica_stalled",
                   "headroom_replica_slow", "headroom_replica_latency_ratio", "headroom_replica_lead_time_seconds",
                   "headroom_source_missing_families"):
        assert family in used, family
    # one click from a pool's line to its replicas, time range and variables kept
    links = [(p["title"], link) for path in DASHBOARD_FILES for p in _panels(_dash(path))
             for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])]
    titles = {title for title, _ in links}
    assert {"Load vs knee", "Active vs queued requests", "KV cache: live vs capacity"} <= titles
    for _title, link in links:
        assert link["url"].startswith("/d/headroom-replicas/")
        assert "var-pool=${__field.labels.pool}" in link["url"] and "${__url_time_range}" in link["url"]
        assert "${datasource:queryparam}" in link["url"] and "${cluster:queryparam}" in link["url"]


def test_every_dashboard_has_the_cluster_namespace_and_pool_variables():
    for path in DASHBOARD_FILES:
        variables = {v["name"]: v for v in _dash(path)["templating"]["list"]}
        for name in ("cluster", "namespace", "pool"):
            v = variables[name]
            assert v["includeAll"] and v["allValue"] == ".*" and v["multi"], (path.name, name)
        assert variables["cluster"]["query"] == "label_values(headroom_active_requests, cluster)"
        assert variables["namespace"]["query"] == "label_values(up, namespace)"


def test_latency_panels_carry_target_lines():
    """SLO targets are drawn on the latency panels (a dashed series from a textbox variable)."""
    for file, title, var in (("headroom-fleet-capacity.json", "Engine latency p95 (vLLM, SGLang)", "ttft_target_seconds"),
                             ("headroom-fleet-capacity.json", "Engine latency (headroom)", "ttft_target_seconds"),
                             ("headroom-tasks-sessions.json", "Task latency p95 by task type", "task_target_seconds")):
        d = _dash(DASH_DIR / file)
        (panel,) = [p for p in _panels(d) if p["title"] == title]
        line = [t for t in panel["targets"] if t["expr"] == f"vector(${var})"]
        assert len(line) == 1, (file, title)
        variable = {v["name"]: v for v in d["templating"]["list"]}[var]
        assert variable["type"] == "textbox" and float(variable["query"]) > 0
        dashed = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == line[0]["legendFormat"]]
        assert dashed and {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}} in dashed[0]["properties"]


def test_what_to_do_dashboard():
    d = _dash(DASH_DIR / "headroom-actions.json")
    by_title = {p["title"]: p for p in _panels(d)}

    def names_in(title):
        return {n for t in by_title[title]["targets"] for n in names.selector_names(substitute(t["expr"])) if n}

    assert {"headroom_recommended_replicas", "headroom_replicas"} <= names_in("Recommended vs running replicas")
    assert {"headroom_exhaustion_seconds", "headroom_replica_lead_time_seconds"} <= names_in("Time to exhaustion vs lead time")
    assert {"headroom_gateway_queued_requests", "headroom_queued_requests"} <= names_in("Gateway queue vs engine queue")
    assert {"headroom_knee_info"} <= names_in("Knee source and signal")
    assert {"headroom_knee_confidence_ratio"} <= names_in("Knee confidence")
    assert {"headroom_shed_requests_rate", "headroom_completion_rate"} <= names_in("Share of arrivals shed")
    cost = by_title["Cost per 1,000 tasks"]["targets"][0]["expr"]
    assert "$gpu_hour_price" in cost and "headroom_task_arrival_rate" in cost and "* 1000" in cost
