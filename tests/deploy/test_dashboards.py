"""Grafana dashboards in grafana/dashboards/: schema, generation, variables, queries.

- each dashboard validates (jsonschema Draft 7) against grafana/dashboard.schema.json, generated from
  @grafana/schema 13.2.3, and has the schemaVersion that package expects;
- the committed JSON is exactly what grafana/build.py generates;
- uids are unique and stable (the list below is the contract with bookmarks and the Helm chart);
- a templated prometheus datasource is used by every panel and query, and a `pool` variable exists;
- every panel query parses (Grafana variables substituted first) and names only metrics from
  headroom's catalogue, the recording rules, or vLLM / gateway / DCGM metrics; label matchers on
  headroom metrics use labels the catalogue declares, and headroom metrics with a pool label are
  filtered by the pool variable;
- the provisioning files are well-formed and point at what the README says.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from monitor.model.catalogue import BY_NAME

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASH_DIR = GRAFANA / "dashboards"
SCHEMA_PATH = GRAFANA / "dashboard.schema.json"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


names = _load("headroom_promql_names", ROOT / "tests" / "rules" / "promql_names.py")
build = _load("headroom_grafana_build", GRAFANA / "build.py")

EXPECTED_UIDS = {
    "headroom-fleet-capacity.json": "headroom-fleet-capacity",
    "headroom-replicas.json": "headroom-replicas",
    "headroom-actions.json": "headroom-actions",
    "headroom-tasks-sessions.json": "headroom-tasks-sessions",
    "headroom-forecast.json": "headroom-forecast",
    "headroom-efficiency.json": "headroom-efficiency",
}
DASHBOARD_FILES = sorted(DASH_DIR.glob("*.json"))

# What Grafana substitutes before the query reaches Prometheus (values typical of a real request).
GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "6h",
    "$__range_s": "21600",
    "${pool}": "llama",
    "$pool": "llama",
    "$cluster": ".*",  # the "All" value: the HA pair's test series carry no cluster label
    "$namespace": "inference",
    "$replica": "http://10.0.0.7:8000/metrics",
    "$ttft_target_seconds": "0.5",
    "$task_target_seconds": "30",
    "$gpu_hour_price": "2.5",
    "$gpus_per_replica": "1",
    "$task_type": "policy_question",
    "$horizon": "1d",
}


# variables used as label matcher values (the others are durations and numbers)
MATCHER_VARS = {"${pool}", "$pool", "$cluster", "$namespace", "$replica", "$task_type", "$horizon"}


def substitute(expr: str, *, keep_template_vars: bool = False) -> str:
    """Replace Grafana variables; with keep_template_vars all but the matcher variables, so matcher
    values still read `$pool` (for checking that panels filter by it)."""
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        if keep_template_vars and k in MATCHER_VARS:
            continue
        expr = expr.replace(k, GRAFANA_VARS[k])
    return expr


def _dash(path: Path) -> dict:
    return json.loads(path.read_text())


def _panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows
    return out


def _targets(d: dict) -> list[tuple[str, dict]]:
    return [(p["title"], t) for p in _panels(d) for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_the_expected_dashboards_exist():
    assert {p.name for p in DASHBOARD_FILES} == set(EXPECTED_UIDS)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_validates_against_the_grafana_schema(validator, path):
    errors = sorted(validator.iter_errors(_dash(path)), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message[:200]}" for e in errors[:10]]


def test_the_schema_catches_broken_dashboards(validator):
    """The validation above can fail: typical mistakes are rejected."""
    good = _dash(DASHBOARD_FILES[0])
    assert not list(validator.iter_errors(good))
    for mutate in (
        lambda d: d.__setitem__("title", 5),
        lambda d: d.__setitem__("refresh", 30),
        lambda d: d["panels"][1]["gridPos"].pop("w"),
        lambda d: d["panels"][1].__setitem__("bogus", True),
        lambda d: d["templating"]["list"][1].__setitem__("type", "dropdown"),
        lambda d: d.__setitem__("schemaVersion", "42"),
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert list(validator.iter_errors(bad)), "schema accepted a broken dashboard"


def test_schema_version_is_what_the_generated_schema_expects():
    comment = json.loads(SCHEMA_PATH.read_text())["$comment"]
    assert "@grafana/schema 13.2.3" in comment and "schemaVersion 42" in comment
    assert build.SCHEMA_VERSION == 42
    for path in DASHBOARD_FILES:
        assert _dash(path)["schemaVersion"] == build.SCHEMA_VERSION, path.name


def test_committed_json_equals_generated_output():
    rendered = build.render_all()
    assert set(rendered) == {p.name for p in DASHBOARD_FILES}
    for path in DASHBOARD_FILES:
        assert path.read_text() == rendered[path.name], (
            f"{path.name} differs from grafana/build.py output; run `python grafana/build.py`"
        )


def test_uids_are_unique_and_stable():
    uids = {path.name: _dash(path)["uid"] for path in DASHBOARD_FILES}
    assert uids == EXPECTED_UIDS
    assert len(set(uids.values())) == len(uids)
    for uid in uids.values():
        assert re.fullmatch(r"[a-z0-9-]{1,40}", uid), uid  # Grafana uid limit is 40 characters


def test_datasource_is_templated_everywhere():
    for path in DASHBOARD_FILES:
        d = _dash(path)
        variables = {v["name"]: v for v in d["templating"]["list"]}
        ds = variables["datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        for p in _panels(d):
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (path.name, p["title"])
            assert p["targets"], (path.name, p["title"])
            for t in p["targets"]:
                assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (path.name, p["title"])
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${datasource}", (path.name, v["name"])


def test_pool_variable():
    for path in DASHBOARD_FILES:
        variables = {v["name"]: v for v in _dash(path)["templating"]["list"]}
        pool = variables["pool"]
        assert pool["type"] == "query"
        assert pool["query"] == 'label_values(headroom_active_requests{cluster=~"$cluster"}, pool)'
        assert pool["includeAll"] and pool["allValue"] == ".*" and pool["multi"]
        assert "pool" in BY_NAME["headroom_active_requests"].labels


def test_panel_ids_unique_and_grid_sane():
    for path in DASHBOARD_FILES:
        d = _dash(path)
        ids = [p["id"] for p in _panels(d)]
        assert len(ids) == len(set(ids)), path.name
        cells = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (path.name, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{path.name}: {p['title']} overlaps another panel"
                    cells.add((x, y))
        for p in _panels(d):
            refs = [t["refId"] for t in p.get("targets", [])]
            assert len(refs) == len(set(refs)), (path.name, p["title"])


def test_titles_unique_within_a_dashboard():
    for path in DASHBOARD_FILES:
        titles = [p["title"] for p in _panels(_dash(path)) if p["type"] != "row"]
        assert len(titles) == len(set(titles)), path.name


def _selectors(expr: str) -> list:
    found = []

    def visit(node):
        if isinstance(node, names.pp.VectorSelector):
            found.append((node.name, [(m.name, str(m.op), m.value) for m in node.matchers.matchers]))

    names.pp.walk(names.parse(expr), pre_visit=visit)
    return found


def test_every_query_parses_and_names_only_known_metrics():
    allowed = names.allowed_names()
    problems = []
    count = 0
    for path in DASHBOARD_FILES:
        for title, t in _targets(_dash(path)):
            expr = substitute(t["expr"])
            assert "$" not in expr, (path.name, title, expr)
            try:
                found = names.selector_names(expr)
            except ValueError as e:
                problems.append((path.name, title, f"parse error: {e}"))
                continue
            count += 1
            for n in found:
                if n is None or n not in allowed:
                    problems.append((path.name, title, n))
    assert not problems, problems
    assert count >= 60


def test_variable_queries_name_known_metrics():
    allowed = names.allowed_names()
    for path in DASHBOARD_FILES:
        for v in _dash(path)["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"])
            assert m, v["query"]
            selector, label = m.groups()
            metric = names.selector_names(substitute(selector))[0]
            assert metric in allowed
            if metric == "up":  # a target label of every scraped series (Kubernetes service discovery)
                assert label == "namespace", v["query"]
            else:
                assert label in names.labels_of(metric), (metric, label)


def test_headroom_metric_matchers_use_declared_labels_and_the_variables():
    """Catches typos like scenario→senario and panels that ignore a variable: every headroom pool series
    is filtered by cluster and pool, every replica series also by replica, every engine recording rule
    by cluster, namespace and pool (model_name), gateway rules by cluster and namespace, GPU series
    by cluster."""
    fleet_level = {"headroom_source_up", "headroom_cycle_duration_seconds", "headroom_last_success_timestamp_seconds",
                   "headroom_forecast_last_fit_timestamp_seconds"}
    checked = {"pool": 0, "replica": 0, "engine": 0, "gateway": 0, "gpu": 0, "raw engine": 0}
    for path in DASHBOARD_FILES:
        has_replica_var = "replica" in {v["name"] for v in _dash(path)["templating"]["list"]}
        for title, t in _targets(_dash(path)):
            for name, matchers in _selectors(substitute(t["expr"], keep_template_vars=True)):
                labels = names.labels_of(name) if name else None
                if labels is None:
                    if name and name.startswith("pool") and (":vllm_" in name or ":sglang_" in name):
                        for label, var in (("model_name", "$pool"), ("cluster", "$cluster"), ("namespace", "$namespace")):
                            assert (label, "MatchOp.Re", var) in matchers, (path.name, title, name, label)
                        checked["engine"] += 1
                    elif name and name.startswith("model"):  # gateway recording rules
                        for label in ("cluster", "namespace"):
                            assert (label, "MatchOp.Re", f"${label}") in matchers, (path.name, title, name, label)
                        checked["gateway"] += 1
                    elif name and name.startswith(("vllm:", "sglang:")):  # raw engine series (workload shape)
                        for label, var in (("model_name", "$pool"), ("cluster", "$cluster"), ("namespace", "$namespace")):
                            assert (label, "MatchOp.Re", var) in matchers, (path.name, title, name, label)
                        checked["raw engine"] += 1
                    elif name and name.startswith(("DCGM_", "fleet:")):  # GPU series: no pool, no engine namespace
                        assert ("cluster", "MatchOp.Re", "$cluster") in matchers, (path.name, title, name)
                        checked["gpu"] += 1
                    continue
                for label, _op, _value in matchers:
                    assert label in labels, (path.name, title, name, label)
                if "pool" in labels and name not in fleet_level:
                    assert ("pool", "MatchOp.Re", "$pool") in matchers, (path.name, title, name)
                    assert ("cluster", "MatchOp.Re", "$cluster") in matchers, (path.name, title, name)
                    checked["pool"] += 1
                if "replica" in labels and has_replica_var:
                    assert ("replica", "MatchOp.Re", "$replica") in matchers, (path.name, title, name)
                    checked["replica"] += 1
    assert checked["pool"] >= 80 and checked["replica"] >= 10 and checked["engine"] >= 20, checked
    assert checked["gateway"] == 3 and checked["gpu"] >= 6 and checked["raw engine"] >= 9, checked


def test_headroom_queries_deduplicate_the_ha_pair():
    """With Helm `replicaCount: 2` the two pods of a shard export the same headroom_* series (stored
    twice, differing in `instance` / `pod`): every headroom selector must go through min/max/avg
    without those labels before anything else, so no pool is drawn twice and no sum counts it twice."""
    checked = 0
    for path in DASHBOARD_FILES:
        for title, t in _targets(_dash(path)):
            expr = substitute(t["expr"])
            if not any(n and n.startswith("headroom_") for n in names.selector_names(expr)):
                continue
            checked += 1
            assert names.undeduplicated_selectors(expr) == [], (path.name, title, t["expr"])
    assert checked >= 60
    # the generator's rewrite, and that the check notices what it fixes
    assert build.dedup('headroom_ratio{scenario="current"}') == 'min without (instance, pod) (headroom_ratio{scenario="current"})'
    assert build.dedup("headroom_sessions / headroom_session_capacity") == (
        "max without (instance, pod) (headroom_sessions) / min without (instance, pod) (headroom_session_capacity)")
    assert build.dedup("rate(headroom_cycles_total[5m])") == "rate(headroom_cycles_total[5m])"
    assert build.dedup("pool:vllm_num_requests_running:sum") == "pool:vllm_num_requests_running:sum"
    assert names.undeduplicated_selectors("sum by (source) (rate(headroom_source_errors_total[1m]))") == [
        "headroom_source_errors_total"]
    assert names.undeduplicated_selectors("headroom_active_requests + headroom_queued_requests") == [
        "headroom_active_requests", "headroom_queued_requests"]


@pytest.mark.live  # runs a subprocess (tests/tiers.py)
def test_ha_pair_panels_show_one_copy_in_prometheus(tmp_path):
    """Evaluate real dashboard queries with promtool on an HA pair's duplicated series: one result per
    pool, with the pessimistic copy where the pods disagree, and no doubled sums."""
    import shutil
    import subprocess
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    wanted = {
        ("headroom-fleet-capacity.json", "Headroom now"): [({"pool": "llama", "scenario": "current", "job": "headroom"}, 0.15)],
        ("headroom-fleet-capacity.json", "Load vs knee"): [({"pool": "llama", "job": "headroom"}, 12)],
        ("headroom-fleet-capacity.json", "Cycle duration and source errors"):
            [({"job": "headroom"}, 0.5), ({"source": "vllm", "reason": "timeout"}, 0.1)],
    }
    pods = [("a", "headroom-0"), ("b", "headroom-1")]
    series = []
    for inst, pod in pods:
        ha = f'job="headroom",instance="{inst}",pod="{pod}"'
        ratio = "0.15" if inst == "a" else "0.18"
        series += [
            {"series": f'headroom_ratio{{{ha},pool="llama",scenario="current"}}', "values": f"{ratio}x10"},
            {"series": f'headroom_active_requests{{{ha},pool="llama"}}', "values": "10x10"},
            {"series": f'headroom_queued_requests{{{ha},pool="llama"}}', "values": "2x10"},
            {"series": f'headroom_cycle_duration_seconds{{{ha}}}', "values": "0.5x10"},
            {"series": f'headroom_source_errors_total{{{ha},source="vllm",reason="timeout"}}', "values": "0+6x10"},
        ]
    dashboards = {p.name: _dash(p) for p in DASHBOARD_FILES}
    tests = []
    for (file, title), exp in wanted.items():
        (panel,) = [p for p in _panels(dashboards[file]) if p["title"] == title]
        for t, (labels, value) in zip(panel["targets"], exp):
            expr = substitute(t["expr"]).replace("[1m]", "[5m]")
            lbl = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            tests.append({"expr": expr, "eval_time": "8m", "exp_samples": [{"labels": lbl, "value": value}]})
    (tmp_path / "empty.rules.yaml").write_text("groups: []\n")
    doc = {"rule_files": ["empty.rules.yaml"], "evaluation_interval": "1m",
           "tests": [{"name": "HA pair", "interval": "1m", "input_series": series, "promql_expr_test": tests}]}
    (tmp_path / "ha.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "ha.test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    # without the dedup the same queries would return both pods (the check above can fail)
    for case in doc["tests"][0]["promql_expr_test"]:
        case["expr"] = re.sub(r"(?:max|min) without \(instance, pod\) ", "", case["expr"])
    (tmp_path / "ha.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "ha.test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0


def test_every_headroom_metric_group_is_on_some_dashboard():
    used = set()
    for path in DASHBOARD_FILES:
        for _title, t in _targets(_dash(path)):
            used.update(n for n in names.selector_names(substitute(t["expr"])) if n)
    for must in ("headroom_ratio", "headroom_active_requests", "headroom_queued_requests", "headroom_kv_tokens",
                 "headroom_kv_capacity_tokens", "headroom_knee_requests", "headroom_utilisation_ratio",
                 "headroom_task_latency_seconds", "headroom_task_calls_per_task", "headroom_slo_burn_rate",
                 "headroom_sessions", "headroom_forecast_requests", "headroom_forecast_peak_requests",
                 "headroom_forecast_peak_requests_upper", "headroom_exhaustion_seconds", "headroom_forecast_mase",
                 "headroom_forecast_coverage_ratio", "headroom_sessions_per_megawatt", "headroom_power_watts",
                 "DCGM_FI_DEV_POWER_USAGE", "headroom_generation_tokens_rate",
                 "pool:vllm_num_requests_running:sum", "pool:vllm_kv_cache_tokens:sum",
                 "pool_quantile:vllm_time_to_first_token_seconds:histogram_quantile5m"):
        assert must in used, must


def test_name_check_rejects_unknown_metrics():
    allowed = names.allowed_names()
    expr = substitute('sum(rate(vllm:num_request_running{model_name=~"$pool"}[$__rate_interval]))')
    assert names.selector_names(expr) == ["vllm:num_request_running"]
    assert "vllm:num_request_running" not in allowed
    with pytest.raises(ValueError):
        names.parse(substitute("sum(rate(headroom_cycles_total[$__rate_interval])"))


def test_provisioning_files():
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "headroom.yaml").read_text())
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["url"].startswith("http")
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "headroom.yaml").read_text())
    assert prov["apiVersion"] == 1
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert path in (GRAFANA / "README.md").read_text(), "README must say where to put the JSON files"


def test_panels_named_in_the_runbook_exist():
    """docs/runbook.md points at panels as *Panel title*; each must be a real panel title."""
    text = re.sub(r"`[^`]*`", "", (ROOT / "docs" / "runbook.md").read_text())
    refs = {m.replace("\n", " ") for m in re.findall(r"(?<!\*)\*([^*\s][^*]*?)\*(?!\*)", text)}
    titles = {p["title"] for path in DASHBOARD_FILES for p in _panels(_dash(path))}
    assert len(refs) >= 15
    assert not sorted(refs - titles), f"runbook names panels that do not exist: {sorted(refs - titles)}"


def test_yamllint_passes_on_provisioning(tmp_path):
    yamllint = pytest.importorskip("yamllint.cli")
    conf = tmp_path / "yamllint.yaml"
    conf.write_text("extends: default\nrules:\n  line-length: {max: 160}\n  document-start: disable\n")
    files = [str(p) for p in sorted((GRAFANA / "provisioning").rglob("*.yaml"))]
    assert len(files) == 2
    with pytest.raises(SystemExit) as exc:
        yamllint.run(["-c", str(conf), "-f", "parsable", *files])
    assert exc.value.code == 0

