"""Which metric names a PromQL expression in headroom's rules or dashboards may use.

Allowed: headroom's own catalogue (monitor.catalogue.exposed_names()), the recording rules in
rules/*.rules.yaml, and the external names listed in tests/rules/external_metrics.txt (vLLM,
gateways, DCGM, Prometheus `up`). Shared by tests/test_rules.py and tests/test_dashboards.py, which
load this file by path.
"""
from __future__ import annotations

from pathlib import Path

import promql_parser as pp
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "rules"
RECORDING_FILES = sorted(RULES_DIR.glob("*.rules.yaml"))
ALERT_FILES = sorted(RULES_DIR.glob("*.alerts.yaml"))

_registered = False


def register_prometheus2_functions() -> None:
    """promql-parser follows Prometheus 3; Prometheus 2.42 (what headroom targets) still has
    holt_winters, so register it (shared/docs/infrastructure.md section 7)."""
    global _registered
    if not _registered:
        v = pp.ValueType
        pp.register_extra_functions([pp.Function("holt_winters", [v.Matrix, v.Scalar, v.Scalar], v.Vector)])
        _registered = True


def parse(expr: str):
    register_prometheus2_functions()
    return pp.parse(expr)


def selector_names(expr: str) -> list:
    """Metric names of every vector selector (inside range selectors and subqueries too);
    None for a selector without a metric name."""
    names: list = []

    def visit(node):
        if isinstance(node, pp.VectorSelector):
            names.append(node.name)

    pp.walk(parse(expr), pre_visit=visit)
    return names


def external_names() -> set[str]:
    path = Path(__file__).with_name("external_metrics.txt")
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(line)
    return out


def load_groups(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


def recording_rule_names() -> set[str]:
    return {r["record"] for f in RECORDING_FILES for g in load_groups(f) for r in g["rules"] if "record" in r}


def catalogue_names() -> set[str]:
    from monitor.catalogue import exposed_names

    return set(exposed_names())


def allowed_names() -> set[str]:
    return catalogue_names() | recording_rule_names() | external_names()
