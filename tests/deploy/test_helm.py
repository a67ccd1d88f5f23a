"""The Helm chart (helm/headroom) rendered by the real Helm engine, and the Dockerfile it runs.

Helm v4 is embedded by helm-python-sdk (no helm binary); manifests are checked with
kubernetes-validate (k8s 1.30 schemas, strict), the Prometheus Operator objects with the
@kubernetes-models/prometheus-operator models (tests/k8s-models/validate.mjs), the rule groups with
promtool. Skips happen only when one of those optional tools is absent, and say which.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from servers import free_port

from monitor.kit.process import stop_process

helm_chart = pytest.importorskip("helm_python.chart", reason="pip install helm-python-sdk")
from helm_python.chart import Chart, lint  # noqa: E402
from helm_python.errors import HelmError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "headroom"
MODELS_DIR = REPO / "tests" / "k8s-models"
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "demo", "monitoring"


pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def _load_sync_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("headroom_helm_sync", REPO / "helm" / "sync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chart_sync = _load_sync_module()  # helm/sync.py

VALUE_SETS: dict[str, dict] = {"chart-defaults": {}}
for _path in sorted((CHART_DIR / "ci").glob("*-values.yaml")):
    VALUE_SETS[_path.stem] = yaml.safe_load(_path.read_text()) or {}

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
OPERATOR_KINDS = ("PrometheusRule", "ServiceMonitor", "ScaledObject")  # CRDs: checked by tests/k8s-models


# ------------------------------------------------------------------ helpers


@pytest.fixture(scope="module")
def chart():
    with Chart.load(CHART_DIR) as loaded:
        yield loaded


def render(chart_or_dir, values: dict) -> dict[str, str]:
    if isinstance(chart_or_dir, Chart):
        return chart_or_dir.render(values, name=RELEASE, namespace=NAMESPACE)
    with Chart.load(chart_or_dir) as loaded:
        return loaded.render(values, name=RELEASE, namespace=NAMESPACE)


def objects(manifests: dict[str, str], include_tests: bool = True) -> list[dict]:
    out = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt") or (not include_tests and "/templates/tests/" in path):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def of_kind(objs: list[dict], *kinds: str) -> list[dict]:
    return [o for o in objs if o["kind"] in kinds]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def headroom_container(workload: dict) -> dict:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "headroom")


def write_docs(path: Path, docs: list[dict]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def merged(chart, values: dict) -> dict:
    return chart.merge_values(values)


@pytest.fixture(scope="module")
def rendered(chart) -> dict[str, list[dict]]:
    return {name: objects(render(chart, values)) for name, values in VALUE_SETS.items()}


# ------------------------------------------------------------------ lint + schema


def test_every_feature_has_a_ci_value_set():
    names = set(VALUE_SETS)
    for wanted in ("default-values", "monitoring-values", "persistence-values",
                   "existing-secrets-values", "sharded-ha-values"):
        assert wanted in names


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_strict_lint_has_no_warnings_or_errors(value_set):
    report = lint(CHART_DIR, VALUE_SETS[value_set], strict=True, namespace=NAMESPACE,
                  kube_version="v" + KUBE_VERSION)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == []


def test_lint_catches_a_schema_violation():
    report = lint(CHART_DIR, {"replicaCount": "two"}, strict=True, kube_version="v" + KUBE_VERSION)
    assert report["errors"] or any(m["severity"] >= 3 for m in report["messages"])


@pytest.mark.parametrize("bad,where", [
    ({"replicaCount": "two"}, "replicaCount"),
    ({"replicaCount": -1}, "replicaCount"),
    ({"replicas": 2}, "replicas"),  # a typo is an error, not silently ignored
    ({"sharding": {"shards": 0}}, "shards"),
    ({"serviceMonitor": {"enabled": "yes"}}, "enabled"),
    ({"serviceMonitor": {"enabled": True, "interval": "30 seconds"}}, "interval"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"persistence": {"enabled": True, "size": "lots"}}, "size"),
    ({"logLevel": "verbose"}, "logLevel"),
    ({"dashboards": {"enabled": True, "labels": {"team": 7}}}, "team"),
])
def test_values_schema_rejects_bad_values(chart, bad, where):
    with pytest.raises(HelmError) as err:
        chart.validate_schema(bad)
    assert where in str(err.value)
    with pytest.raises(HelmError):
        render(chart, bad)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_values_schema_accepts_every_ci_value_set(chart, value_set):
    chart.validate_schema(VALUE_SETS[value_set])


def test_chart_versions_and_default_image(chart, rendered):
    meta = chart.metadata
    pyproject = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    assert meta["appVersion"] == version, "Chart appVersion should follow the package version"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    values = chart.values
    assert values["image"]["tag"] == ""
    image = headroom_container(one(rendered["chart-defaults"], "Deployment"))["image"]
    assert image == f"{values['image']['registry']}/{values['image']['repository']}:{version}"
    pinned = render(chart, {"image": {"tag": "9.9.9", "digest": "sha256:" + "a" * 64}})
    image = headroom_container(one(objects(pinned), "Deployment"))["image"]
    assert image.endswith(":9.9.9@sha256:" + "a" * 64)


# ------------------------------------------------------------------ kubernetes-validate


def _kubernetes_validate() -> str:
    exe = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubernetes-validate")
    if not exe:
        pytest.skip("kubernetes-validate not installed (pip install kubernetes-validate)")
    return exe


def _validate(exe: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "-k", KUBE_VERSION, "--strict", str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_manifests_pass_kubernetes_validate_strict(rendered, value_set, tmp_path):
    exe = _kubernetes_validate()
    docs = [d for d in rendered[value_set] if d["kind"] not in OPERATOR_KINDS]
    result = _validate(exe, write_docs(tmp_path / "rendered.yaml", docs))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    passed = re.findall(r"passed for resource (\S+)", output)
    assert len(passed) == len(docs), output
    assert "ERROR" not in output


def test_kubernetes_validate_rejects_a_broken_workload(rendered, tmp_path):
    exe = _kubernetes_validate()
    broken = copy.deepcopy(one(rendered["chart-defaults"], "Deployment"))
    headroom_container(broken)["ports"][0]["containerPort"] = "nine"
    headroom_container(broken)["securityContext"]["readOnlyRootFilesytem"] = True  # typo: strict
    result = _validate(exe, write_docs(tmp_path / "broken.yaml", [broken]))
    assert result.returncode != 0
    assert "containerPort" in result.stdout + result.stderr


# ------------------------------------------------------------------ Prometheus Operator models


def _node_validator() -> list[str]:
    node = shutil.which("node")
    if not node:
        pytest.skip("node not installed: cannot validate PrometheusRule/ServiceMonitor models")
    if not (MODELS_DIR / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        pytest.skip("npm modules absent: run `npm ci --prefix tests/k8s-models`")
    return [node, str(MODELS_DIR / "validate.mjs")]


def _run_models(cmd: list[str], files: list[Path]) -> tuple[int, dict]:
    result = subprocess.run(cmd + [str(f) for f in files], capture_output=True, text=True,
                            timeout=120, cwd=MODELS_DIR)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_operator_objects_pass_the_prometheus_operator_models(rendered, tmp_path):
    cmd = _node_validator()
    files, expected = [], 0
    for name, objs in rendered.items():
        docs = of_kind(objs, *OPERATOR_KINDS)
        if docs:
            files.append(write_docs(tmp_path / f"{name}.yaml", docs))
            expected += len(docs)
    kinds = {d["kind"] for objs in rendered.values() for d in of_kind(objs, *OPERATOR_KINDS)}
    assert kinds == set(OPERATOR_KINDS), "some ci value set must enable each operator object"
    code, report = _run_models(cmd, files)
    invalid = [c for c in report["checked"] if not c["valid"]]
    assert invalid == [] and code == 0
    assert len(report["checked"]) == expected


def test_operator_models_reject_broken_objects(rendered, tmp_path):
    cmd = _node_validator()
    rule = copy.deepcopy(of_kind(rendered["monitoring-values"], "PrometheusRule")[0])
    alerting = [r for g in rule["spec"]["groups"] for r in g["rules"] if "for" in r]
    assert alerting, "expected at least one alert with `for:` in the shipped rules"
    alerting[0]["for"] = "10 minutes"
    monitor = copy.deepcopy(one(rendered["monitoring-values"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "every 30s"
    code, report = _run_models(cmd, [write_docs(tmp_path / "bad.yaml", [rule, monitor])])
    assert code == 1
    assert [c["valid"] for c in report["checked"]] == [False, False]
    assert "pattern" in report["checked"][0]["error"]


# ------------------------------------------------------------------ KEDA (advisory autoscaling)

def test_scaled_objects_ask_for_exactly_the_recommended_replicas(rendered):
    assert of_kind(rendered["chart-defaults"], "ScaledObject") == []  # off by default
    objs = {o["spec"]["scaleTargetRef"]["name"]: o for o in of_kind(rendered["keda-values"], "ScaledObject")}
    assert set(objs) == {"vllm-llama-8b", "vllm-llama-70b"}
    small, big = objs["vllm-llama-8b"], objs["vllm-llama-70b"]
    [trigger] = small["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"  # desired = ceil(value / 1) = the recommendation
    assert trigger["metadata"]["query"] == \
        'max(headroom_recommended_replicas{pool="meta-llama/Llama-3.1-8B-Instruct",horizon="1h"})'
    assert big["spec"]["triggers"][0]["metadata"]["query"].endswith('horizon="1d"})')  # its own horizon
    assert (small["spec"]["minReplicaCount"], small["spec"]["maxReplicaCount"]) == (2, 8)
    assert (big["spec"]["minReplicaCount"], big["spec"]["maxReplicaCount"]) == (1, 4)
    from monitor.model.catalogue import CATALOGUE
    assert "headroom_recommended_replicas" in {m.name for m in CATALOGUE}


def test_keda_model_rejects_a_broken_scaled_object(rendered, tmp_path):
    cmd = _node_validator()
    broken = copy.deepcopy(of_kind(rendered["keda-values"], "ScaledObject")[0])
    del broken["spec"]["scaleTargetRef"]
    code, report = _run_models(cmd, [write_docs(tmp_path / "bad.yaml", [broken])])
    assert code == 1 and [c["valid"] for c in report["checked"]] == [False]


# ------------------------------------------------------------------ PrometheusRule content


def test_one_prometheus_rule_per_rules_file_with_the_same_groups(rendered):
    sources = chart_sync.rule_sources()
    assert sources, "rules/ has no rule files"
    rules = of_kind(rendered["monitoring-values"], "PrometheusRule")
    by_source = {r["metadata"]["annotations"]["headroom/source"]: r for r in rules}
    assert sorted(by_source) == sorted(f"rules/{p.name}" for p in sources)
    for path in sources:
        rule = by_source[f"rules/{path.name}"]
        assert rule["spec"]["groups"] == yaml.safe_load(path.read_text())["groups"]
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert len({r["metadata"]["name"] for r in rules}) == len(rules)
    assert of_kind(rendered["chart-defaults"], "PrometheusRule") == []


def test_prometheus_rule_groups_pass_promtool(rendered, tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for rule in of_kind(rendered["monitoring-values"], "PrometheusRule"):
        path = tmp_path / f"{rule['metadata']['name']}.yml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
        assert f"{count} rules found" in result.stdout


# ------------------------------------------------------------------ dashboards


def _dashboard_configmaps(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"].get("labels", {})]


def test_dashboard_configmaps_carry_every_dashboard(rendered):
    sources = chart_sync.dashboard_sources()
    maps = _dashboard_configmaps(rendered["monitoring-values"])
    assert len(maps) == len(sources)
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "Headroom"
        shipped.update(cm["data"])
    assert sorted(shipped) == sorted(p.name for p in sources)
    for path in sources:
        assert shipped[path.name] == path.read_text()
        json.loads(shipped[path.name])
    assert _dashboard_configmaps(rendered["chart-defaults"]) == []


@pytest.fixture()
def chart_copy(tmp_path) -> Path:
    """A throw-away copy of the chart whose files/ the test may change."""
    target = tmp_path / "headroom"
    shutil.copytree(CHART_DIR, target)
    return target


def test_dashboard_template_handles_any_dashboard_file(chart_copy):
    # independent of what grafana/dashboards/ holds today: two dashboards of our own
    dash_dir = chart_copy / "files" / "dashboards"
    dash_dir.mkdir(parents=True, exist_ok=True)
    for old in dash_dir.glob("*.json"):
        old.unlink()
    first = {"title": "Fleet <capacity> & headroom", "uid": "hr-fleet", "panels": [{"id": 1}]}
    (dash_dir / "Fleet_Overview.json").write_text(json.dumps(first, indent=2) + "\n")
    (dash_dir / "pools.json").write_text('{"title": "Pools",\n  "uid": "hr-pools", "panels": []}')  # no final newline
    objs = objects(render(chart_copy, {"dashboards": {"enabled": True, "labelValue": "yes"}}))
    maps = {cm["metadata"]["name"]: cm for cm in of_kind(objs, "ConfigMap")
            if cm["metadata"]["labels"].get("grafana_dashboard") == "yes"}
    assert sorted(maps) == [f"{RELEASE}-headroom-fleet-overview-dashboard", f"{RELEASE}-headroom-pools-dashboard"]
    fleet = maps[f"{RELEASE}-headroom-fleet-overview-dashboard"]["data"]["Fleet_Overview.json"]
    assert json.loads(fleet) == first and fleet == (dash_dir / "Fleet_Overview.json").read_text()
    pools = maps[f"{RELEASE}-headroom-pools-dashboard"]["data"]["pools.json"]
    assert pools == (dash_dir / "pools.json").read_text()
    (dash_dir / "broken.json").write_text('{"title": ')
    with pytest.raises(HelmError, match="broken.json"):
        render(chart_copy, {"dashboards": {"enabled": True}})


def test_rule_template_handles_any_rules_file(chart_copy):
    rules_dir = chart_copy / "files" / "rules"
    for old in rules_dir.glob("*"):
        old.unlink()
    (rules_dir / "extra_rules.yml").write_text(
        "groups:\n  - name: a\n    rules:\n      - record: x:up:sum\n        expr: sum(up)\n")
    objs = objects(render(chart_copy, {"prometheusRule": {"enabled": True}}))
    rule = one(objs, "PrometheusRule")
    assert rule["metadata"]["name"] == f"{RELEASE}-headroom-extra-rules"
    assert rule["spec"]["groups"] == [{"name": "a", "rules": [{"record": "x:up:sum", "expr": "sum(up)"}]}]
    (rules_dir / "empty.yaml").write_text("groups: []\n")
    with pytest.raises(HelmError, match="no rule groups"):
        render(chart_copy, {"prometheusRule": {"enabled": True}})


# ------------------------------------------------------------------ drift between sources and chart copies


def test_chart_copies_equal_the_sources_byte_for_byte():
    problems = chart_sync.drift()
    assert problems == [], "run `python helm/sync.py`:\n" + "\n".join(problems)
    copies = sorted(p.name for p in (CHART_DIR / "files" / "rules").glob("*"))
    assert copies == sorted(p.name for p in chart_sync.rule_sources())


def test_drift_check_notices_changes_and_sync_repairs_them(tmp_path):
    repo, chart_dir = tmp_path / "repo", tmp_path / "repo" / "helm" / "headroom"
    (repo / "rules" / "tests").mkdir(parents=True)
    (repo / "grafana" / "dashboards").mkdir(parents=True)
    (repo / "rules" / "a.rules.yml").write_text("groups: []\n")
    (repo / "rules" / "a_test.yml").write_text("rule_files: [a.rules.yml]\ntests: []\n")  # not a rule file
    (repo / "grafana" / "dashboards" / "d.json").write_text('{"title": "d"}')
    assert len(chart_sync.drift(repo, chart_dir)) == 2  # both copies missing
    assert len(chart_sync.sync(repo, chart_dir)) == 2
    assert chart_sync.drift(repo, chart_dir) == []
    assert not (chart_dir / "files" / "rules" / "a_test.yml").exists()
    (repo / "rules" / "a.rules.yml").write_text("groups: []  # edited\n")
    (chart_dir / "files" / "dashboards" / "gone.json").write_text("{}")
    problems = chart_sync.drift(repo, chart_dir)
    assert any("a.rules.yml: differs" in p for p in problems)
    assert any("gone.json: stale" in p for p in problems)
    chart_sync.sync(repo, chart_dir)
    assert chart_sync.drift(repo, chart_dir) == []
    assert (chart_dir / "files" / "rules" / "a.rules.yml").read_bytes() == b"groups: []  # edited\n"


def test_sync_check_cli_exit_code():
    result = subprocess.run([sys.executable, str(REPO / "helm" / "sync.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ workload shape


def _pod_specs(objs: list[dict]) -> list[dict]:
    specs = [w["spec"]["template"]["spec"] for w in of_kind(objs, *WORKLOAD_KINDS)]
    specs += [p["spec"] for p in of_kind(objs, "Pod")]
    return specs


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_pod_is_non_root_read_only_and_unprivileged(rendered, value_set):
    specs = _pod_specs(rendered[value_set])
    assert len(specs) >= 2  # the workload(s) and the helm test pod
    for spec in specs:
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True
        assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        assert spec.get("automountServiceAccountToken") is False
        for container in spec["containers"]:
            sc = container["securityContext"]
            user = sc.get("runAsUser", pod.get("runAsUser"))
            assert isinstance(user, int) and user != 0
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert not sc["capabilities"].get("add")
            assert "limits" in container["resources"] and "memory" in container["resources"]["limits"]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_workload_args_probes_ports_and_mounts(rendered, value_set):
    workloads = of_kind(rendered[value_set], *WORKLOAD_KINDS)
    assert workloads
    for workload in workloads:
        container = headroom_container(workload)
        assert container["args"][:3] == ["run", "--config.file=/etc/headroom/headroom.yml",
                                         "--web.listen-address=:9880"]
        assert container["ports"] == [{"name": "http-metrics", "containerPort": 9880, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "http-metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "http-metrics"}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/etc/headroom/headroom.yml"]["subPath"] == "headroom.yml"
        assert mounts["/etc/headroom/headroom.yml"]["readOnly"] is True
        # the read-only root filesystem leaves exactly these writable places
        assert "/var/lib/headroom" in mounts and "/tmp" in mounts
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes or mount["name"] in claims


def test_configmap_renders_the_config_value(chart, rendered):
    for value_set, objs in rendered.items():
        cm = one(objs, "ConfigMap", f"{RELEASE}-headroom")
        config = yaml.safe_load(cm["data"]["headroom.yml"])
        assert config == merged(chart, VALUE_SETS[value_set])["config"], value_set
    defaults = yaml.safe_load(one(rendered["chart-defaults"], "ConfigMap")["data"]["headroom.yml"])
    assert defaults["store"]["path"] == "/var/lib/headroom"


SECRETS_ROOT = "/etc/headroom/secrets/"


def _load_with_secrets_under(config_text: str, tmp_path: Path, mounted: dict[str, list[str]]):
    """Load a rendered headroom.yml with the real loader; the secret files the pod would see are
    created under tmp_path (one per key of each mounted Secret) and the paths rewritten there."""
    from monitor.config import from_dict

    for secret, keys in mounted.items():
        for key in keys:
            path = tmp_path / secret / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("s3cret\n")
    return from_dict(yaml.safe_load(config_text.replace(SECRETS_ROOT, f"{tmp_path}/")), "headroom.yml")


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_config_passes_the_headroom_config_loader(rendered, value_set, tmp_path):
    cm = one(rendered[value_set], "ConfigMap", f"{RELEASE}-headroom")
    cfg = _load_with_secrets_under(cm["data"]["headroom.yml"], tmp_path,
                                   {"prometheus": ["token", "password"], "smtp": ["password"]})
    assert cfg.store_path == "/var/lib/headroom"  # where the chart mounts the PVC / emptyDir
    assert cfg.prometheus is not None or cfg.vllm_targets


def test_config_loader_rejects_a_secret_the_pod_would_not_have(rendered, tmp_path):
    from monitor.config import ConfigError

    cm = one(rendered["existing-secrets-values"], "ConfigMap", f"{RELEASE}-headroom")
    with pytest.raises(ConfigError, match="bearer_token_file"):
        _load_with_secrets_under(cm["data"]["headroom.yml"], tmp_path, {"prometheus": ["password"]})


def test_basic_auth_password_from_an_existing_secret(chart, tmp_path):
    values = {"secrets": {"prometheus": {"existingSecret": "prom-basic"}},
              "config": {"sources": {"prometheus": {
                  "url": "https://mimir.example.com/prometheus",
                  "basic_auth": {"username": "headroom",
                                 "password_file": SECRETS_ROOT + "prometheus/password"}}}}}
    objs = objects(render(chart, values))
    workload = one(objs, "Deployment")
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["secret-prometheus"]["secret"]["secretName"] == "prom-basic"
    assert "secret-smtp" not in volumes
    cfg = _load_with_secrets_under(one(objs, "ConfigMap")["data"]["headroom.yml"], tmp_path,
                                   {"prometheus": ["password"]})
    assert cfg.prometheus.auth.username == "headroom"
    assert cfg.prometheus.auth.password() == "s3cret"


def test_config_change_rolls_the_pods(chart):
    before = one(objects(render(chart, {})), "Deployment")
    after = one(objects(render(chart, {"config": {"prometheus": {"url": "http://vm:8428"}}})), "Deployment")
    key = "checksum/config"
    assert before["spec"]["template"]["metadata"]["annotations"][key] != \
        after["spec"]["template"]["metadata"]["annotations"][key]


def test_default_history_store_is_an_empty_dir(rendered):
    workload = one(rendered["chart-defaults"], "Deployment")
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert of_kind(rendered["chart-defaults"], "PersistentVolumeClaim", "StatefulSet") == []
    assert workload["spec"]["replicas"] == 1
    assert not any(a.startswith("--shard") for a in headroom_container(workload)["args"])


def test_persistence_gives_every_pod_its_own_claim(rendered):
    objs = rendered["persistence-values"]
    assert of_kind(objs, "Deployment") == []
    sts = one(objs, "StatefulSet")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "standard"
    assert claim["metadata"]["annotations"] == {"example.com/backup": "daily"}
    headless = one(objs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert "data" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


def test_existing_claim_runs_one_pod_with_recreate(chart, rendered):
    workload = one(rendered["existing-claim-values"], "Deployment")
    assert workload["spec"]["strategy"]["type"] == "Recreate"
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "headroom-history"}
    for extra in ({"replicaCount": 2}, {"sharding": {"shards": 2}}):
        with pytest.raises(HelmError, match="existingClaim"):
            render(chart, {**VALUE_SETS["existing-claim-values"], **extra})


def test_storage_class_dash_means_no_dynamic_provisioning(chart):
    sts = one(objects(render(chart, {"persistence": {"enabled": True, "storageClass": "-"}})), "StatefulSet")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == ""


def _file_refs(node, key=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _file_refs(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _file_refs(v, key)
    elif key.endswith("_file"):
        yield key, node


def test_existing_secrets_are_mounted_where_the_config_points(rendered):
    objs = rendered["existing-secrets-values"]
    workload = one(objs, "Deployment")
    spec = workload["spec"]["template"]["spec"]
    secret_volumes = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    assert {v["secretName"] for v in secret_volumes.values()} == {"headroom-prometheus", "headroom-smtp"}
    assert all(v["defaultMode"] == 0o440 for v in secret_volumes.values())
    mounted = {m["mountPath"]: m for m in headroom_container(workload)["volumeMounts"] if m["name"] in secret_volumes}
    assert sorted(mounted) == ["/etc/headroom/secrets/prometheus", "/etc/headroom/secrets/smtp"]
    assert all(m["readOnly"] for m in mounted.values())
    config = yaml.safe_load(one(objs, "ConfigMap", f"{RELEASE}-headroom")["data"]["headroom.yml"])
    refs = dict(_file_refs(config))
    assert {"bearer_token_file", "password_file"} <= set(refs)
    for key, path in refs.items():
        assert any(path.startswith(d + "/") for d in mounted), f"{key}: {path} is not in a mounted secret"
    # the chart never renders a Secret of its own: credentials stay out of values and release history
    for value_set, objs in rendered.items():
        assert of_kind(objs, "Secret") == [], value_set
    assert not any("secret" in v for v in one(rendered["chart-defaults"], "Deployment")
                   ["spec"]["template"]["spec"]["volumes"])


# ------------------------------------------------------------------ sharding and HA


def test_sharded_ha_renders_one_workload_per_shard(rendered):
    from monitor.model.shard import parse_shard

    objs = rendered["sharded-ha-values"]
    workloads = of_kind(objs, *WORKLOAD_KINDS)
    assert len(workloads) == 3
    seen = []
    for workload in workloads:
        assert workload["spec"]["replicas"] == 2
        shard_args = [a for a in headroom_container(workload)["args"] if a.startswith("--shard=")]
        assert len(shard_args) == 1
        index, total = parse_shard(shard_args[0].split("=", 1)[1])
        assert total == 3
        label = workload["spec"]["selector"]["matchLabels"]["headroom/shard"]
        assert label == str(index) == workload["spec"]["template"]["metadata"]["labels"]["headroom/shard"]
        anti = workload["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
            "labelSelector"]["matchLabels"]["headroom/shard"] == label
        seen.append(index)
    assert sorted(seen) == [0, 1, 2]
    assert len({w["metadata"]["name"] for w in workloads}) == 3
    # one Service and one ServiceMonitor reach every pod of every shard
    service = one(objs, "Service")
    for workload in workloads:
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(objs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["podTargetLabels"] == ["headroom/shard"]
    pdbs = of_kind(objs, "PodDisruptionBudget")
    assert sorted(p["spec"]["selector"]["matchLabels"]["headroom/shard"] for p in pdbs) == ["0", "1", "2"]


def test_sharded_persistence_uses_statefulsets_with_claims(rendered):
    workloads = of_kind(rendered["sharded-persistence-values"], *WORKLOAD_KINDS)
    assert [w["kind"] for w in workloads] == ["StatefulSet", "StatefulSet"]
    assert all(w["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data" for w in workloads)
    assert sorted(a for w in workloads for a in headroom_container(w)["args"] if a.startswith("--shard")) == \
        ["--shard=0/2", "--shard=1/2"]


def test_service_monitor_targets_the_service_port(rendered):
    objs = rendered["monitoring-values"]
    monitor, service = one(objs, "ServiceMonitor"), one(objs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    port_names = {p["name"] for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


def test_helm_test_pod_curls_ready_through_the_service(rendered):
    pod = one(rendered["chart-defaults"], "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = one(rendered["chart-defaults"], "Service")
    url = pod["spec"]["containers"][0]["args"][-1]
    assert url == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:9880/-/ready"
    assert pod["spec"]["containers"][0]["command"] == ["curl"]
    assert "--fail" in pod["spec"]["containers"][0]["args"]


def test_notes_explain_access_and_ha(chart):
    notes = render(chart, VALUE_SETS["sharded-ha-values"])["headroom/templates/NOTES.txt"]
    assert "port-forward svc/demo-headroom 9880:9880" in notes
    assert "max without (instance, pod)" in notes
    assert "serviceMonitorSelector" in notes


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_yaml_passes_yamllint(chart, value_set, tmp_path):
    linter = shutil.which("yamllint", path=str(Path(sys.executable).parent)) or shutil.which("yamllint")
    if not linter:
        pytest.skip("yamllint not installed")
    manifests = render(chart, VALUE_SETS[value_set])
    files, dashboards = [], []
    for path, text in manifests.items():
        if path.endswith(".yaml") and text.strip():
            # the dashboards' ConfigMaps carry generated Grafana JSON byte for byte (one PromQL query a
            # line, validated by tests/deploy/test_dashboards.py): linted with a longer line limit
            out = tmp_path / path.replace("/", "_")
            out.write_text(text)
            (dashboards if path.endswith("dashboards.yaml") else files).append(out)

    def config(max_line: int) -> str:
        return ("{extends: default, rules: {line-length: {max: %d}, document-start: disable, "
                "indentation: {indent-sequences: whatever}, comments: {min-spaces-from-content: 1}, "
                "empty-lines: {max-start: 1, max-end: 2}}}" % max_line)
    result = subprocess.run([linter, "-s", "-d", config(200), *map(str, files),
                             str(CHART_DIR / "values.yaml"), *map(str, (CHART_DIR / "ci").glob("*.yaml"))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    if dashboards:
        result = subprocess.run([linter, "-s", "-d", config(400), *map(str, dashboards)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout


# ------------------------------------------------------------------ Dockerfile (no engine here: static checks)


def _dockerfile() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _final_stage(instructions):
    starts = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    return instructions[starts[-1]:]


def test_dockerfile_builds_on_the_base_image_build_sh_makes():
    instructions = _dockerfile()
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    froms = [rest.split()[0] for word, rest in instructions if word == "FROM"]
    assert froms == ["${BASE}"], "one stage, FROM the base that image/build.sh makes from Debian packages"
    assert args["BASE"].startswith("localhost/headroom-base:")
    build = (REPO / "image" / "build.sh").read_text()
    assert '--build-arg "BASE=$BASE_IMAGE"' in build and 'BASE_IMAGE="localhost/headroom-base:$key"' in build


def test_dockerfile_final_stage_runs_headroom_as_the_charts_non_root_user(chart):
    final = _final_stage(_dockerfile())
    users = [rest for word, rest in final if word == "USER"]
    assert users, "USER missing in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be numeric (runAsNonRoot checks it) and not root"
    values = chart.values
    assert int(uid) == values["securityContext"]["runAsUser"] == values["podSecurityContext"]["runAsUser"]
    assert int(gid) == values["podSecurityContext"]["runAsGroup"]
    entry = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"]
    assert entry == [["headroom"]]
    assert "headroom = \"monitor.commands.cli:main\"" in (REPO / "pyproject.toml").read_text()
    (cmd,) = [json.loads(rest) for word, rest in final if word == "CMD"]
    assert cmd == ["run", "--config.file=/etc/headroom/headroom.yml", "--web.listen-address=:9880"]
    assert [rest for word, rest in final if word == "EXPOSE"] == [str(values["service"]["port"])]


def test_dockerfile_installs_only_pinned_wheels_and_leaves_no_build_tools():
    final = _final_stage(_dockerfile())
    runs = " ".join(rest for word, rest in final if word == "RUN")
    for tool in ("gcc", "build-essential", "g++", "make ", "python3-dev", "libffi-dev", "apt-get"):
        assert tool not in runs
    for flag in ("--only-binary=:all:", "--no-index", "--constraint /context/constraints.txt"):
        assert flag in runs  # nothing compiled, nothing downloaded, every version pinned
    assert re.search(r"pip uninstall --yes[^&]*\bpip\b", runs), "pip should be removed from the final image"
    copies = [rest for word, rest in final if word in ("COPY", "ADD")]
    assert copies == [], "the image takes only the wheels (bind mount), no sources"


def test_image_constraints_pin_every_runtime_dependency():
    """image/constraints.txt (image/lock.sh) pins each dependency of pyproject.toml to one version."""
    project = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", project, re.M | re.S).group(1)
    wanted = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower().replace("_", "-")
              for d in re.findall(r'"([^"]+)"', deps)}
    pins = {}
    for line in (REPO / "image" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[\w.+]+", version), f"image/constraints.txt: not an exact pin: {line!r}"
            pins[name.lower().replace("_", "-")] = version
    assert wanted and wanted <= set(pins), f"not pinned in image/constraints.txt: {sorted(wanted - set(pins))}"
    assert "headroom" not in pins  # the runtime wheel is built from this tree, not pinned


def test_direct_scrape_mode_replaces_the_default_prometheus_source(chart, tmp_path):
    # Helm merges `config` into the defaults; `prometheus: null` removes the default source
    values = {"config": {"sources": {"prometheus": None,
                                     "vllm": {"targets": ["http://vllm-0.llm.svc:8000/metrics"]}}}}
    cm = one(objects(render(chart, values)), "ConfigMap")
    cfg = _load_with_secrets_under(cm["data"]["headroom.yml"], tmp_path, {})
    assert cfg.prometheus is None
    assert [t.url for t in cfg.vllm_targets] == ["http://vllm-0.llm.svc:8000/metrics"]
    from monitor.config import ConfigError

    both = {"config": {"sources": {"vllm": {"targets": ["http://vllm-0.llm.svc:8000/metrics"]}}}}
    cm = one(objects(render(chart, both)), "ConfigMap")
    with pytest.raises(ConfigError, match="not both"):
        _load_with_secrets_under(cm["data"]["headroom.yml"], tmp_path, {})


# ------------------------------------------------------------------ the rendered pod spec runs the real daemon


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def _start_sim(tmp_path: Path) -> tuple[subprocess.Popen, dict]:
    import time

    # the demo fleet, one replica per pool, with model names (headroom's pool key) that two shards
    # split between them; the demo's own two model names both hash to shard 0 of 2
    from monitor.model.shard import owner

    sim_dir = REPO / "lab" / "headroom_lab" / "sim"
    fleet = yaml.safe_load((sim_dir / "default_fleet.yaml").read_text())
    fleet["mix_file"] = str(sim_dir / fleet["mix_file"])
    candidates = (f"example/model-{k}" for k in range(100))
    wanted_owner = iter(range(2))
    for pool, want in zip(fleet["pools"].values(), wanted_owner):
        pool["replicas"] = 1
        pool["model_name"] = next(c for c in candidates if owner(c, 2) == want)
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    out = open(tmp_path / "sim.out", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "sim", "--status-every", "0", "--warmup", "30",
                             "--config", str(tmp_path / "fleet.yaml")],
                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out.seek(0)
        text = out.read()
        try:
            return proc, json.loads(text[text.index("{"):])
        except ValueError:
            if proc.poll() is not None:
                raise AssertionError(f"headroom sim exited: {text[-2000:]}") from None
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("headroom sim did not print its replica URLs")


def _series(body: str) -> set[tuple[str, str]]:
    """(name, labels) of every per-pool headroom sample in an exposition, values left out."""
    return set(re.findall(r'^(headroom_\w+)\{([^}]*pool="[^"]*"[^}]*)\}', body, re.M))


def _cycles(body: str) -> float:
    found = re.search(r"^headroom_cycles_total (\S+)", body, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_rendered_shards_start_the_daemon_and_split_the_pools(chart, tmp_path):
    """Run the container args the chart renders (config path and port moved to the test's) against
    the simulated fleet: two shards, shard 0 as an HA pair. The probe paths answer, the shards export
    disjoint pools that together are all pools, and the HA twins export the same series."""
    import time

    from monitor.model.shard import owns, parse_shard

    sim, fleet = _start_sim(tmp_path)
    daemons = []
    try:
        targets = [url for urls in fleet["replicas"].values() for url in urls]
        values = {"sharding": {"shards": 2}, "replicaCount": 2,
                  "config": {"global": {"interval": "1s"},
                             "sources": {"prometheus": None, "vllm": {"targets": targets}}}}
        objs = objects(render(chart, values))
        config = yaml.safe_load(one(objs, "ConfigMap")["data"]["headroom.yml"])
        for workload in of_kind(objs, "Deployment"):
            container = headroom_container(workload)
            shard = parse_shard(next(a for a in container["args"] if a.startswith("--shard=")).split("=", 1)[1])
            assert workload["spec"]["replicas"] == 2
            for twin in range(2 if shard[0] == 0 else 1):  # the pair for shard 0 only, to spare the CPUs
                name = f"shard{shard[0]}-{twin}"
                port = free_port()
                # each pod has its own /var/lib/headroom
                (tmp_path / name).mkdir()  # the pod's /var/lib/headroom volume
                own = {**config, "store": {"path": str(tmp_path / name / "store")}}
                (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(own))
                args = [a.replace("/etc/headroom/headroom.yml", str(tmp_path / f"{name}.yml"))
                         .replace("--web.listen-address=:9880", f"--web.listen-address=127.0.0.1:{port}")
                        for a in container["args"]]
                env = {**os.environ, **{e["name"]: e["value"] for e in container["env"] if "value" in e}}
                env["MPLCONFIGDIR"] = str(tmp_path / name / "mpl")
                log = open(tmp_path / f"{name}.log", "w")
                proc = subprocess.Popen([sys.executable, "-m", "monitor", *args, "--duration", "150"],
                                        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
                probes = {k: container[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe")}
                daemons.append((proc, port, shard, name, probes))

        bodies: dict[str, str] = {}
        for proc, port, _shard, name, probes in daemons:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{name} never became ready with 3 cycles done"
                if _get(base + probes["readinessProbe"])[0] == 200:
                    status, body = _get(base + "/metrics")
                    if status == 200 and _cycles(body) >= 3:
                        break
                time.sleep(0.3)
            assert _get(base + probes["livenessProbe"])[0] == 200
            bodies[name] = body
        owned = {}
        for _proc, _port, shard, name, _probes in daemons:
            owned[name] = {dict(re.findall(r'(\w+)="([^"]*)"', labels))["pool"]
                           for _, labels in _series(bodies[name])}
            assert all(owns(pool, shard) for pool in owned[name]), (name, owned[name])
        assert owned["shard0-0"] and owned["shard1-0"], owned
        assert not owned["shard0-0"] & owned["shard1-0"], owned
        assert len(owned["shard0-0"] | owned["shard1-0"]) == len(fleet["replicas"]) == 2, owned
        # the HA twins: same pools, same series (names and labels); dedup happens downstream
        twin_a, twin_b = _series(bodies["shard0-0"]), _series(bodies["shard0-1"])
        assert twin_a and twin_a == twin_b, sorted(twin_a ^ twin_b)[:10]
    finally:
        for proc in [d[0] for d in daemons] + [sim]:
            stop_process(proc, 20)


# ------------------------------------------------------------------ documentation of the values

_OPAQUE_VALUES = {"config", "podSecurityContext", "securityContext", "resources", "livenessProbe",
                  "readinessProbe", "affinity", "commonLabels", "podAnnotations", "podLabels", "nodeSelector"}


def _value_keys(node: dict, prefix: str = ""):
    for key, value in node.items():
        path = prefix + key
        if isinstance(value, dict) and value and key not in _OPAQUE_VALUES and key not in ("annotations", "labels"):
            yield from _value_keys(value, path + ".")
        else:
            yield path


def test_every_value_is_documented_in_the_chart_readme_and_the_schema(chart):
    readme = (CHART_DIR / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    keys = set(_value_keys(chart.values))
    assert keys - documented == set(), "values missing from helm/headroom/README.md"
    assert documented - keys == set(), "README documents values that do not exist"
    schema = chart.schema
    for key in keys:
        node = schema
        for part in key.split("."):
            assert part in node.get("properties", {}), f"{key} is not in values.schema.json"
            node = node["properties"][part]


def test_scraped_job_label_is_the_one_the_rules_expect(rendered):
    # the shipped alerts watch `up{job="headroom"}`: the ServiceMonitor takes `job` from a Service label
    objs = rendered["monitoring-values"]
    monitor, service = one(objs, "ServiceMonitor"), one(objs, "Service")
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert job == "headroom"
    exprs = [r.get("expr", "") for rule in of_kind(objs, "PrometheusRule")
             for g in rule["spec"]["groups"] for r in g["rules"]]
    jobs_in_rules = {m for e in exprs for m in re.findall(r'\bup\{[^}]*job="([^"]+)"', e)}
    assert jobs_in_rules <= {job}, jobs_in_rules
