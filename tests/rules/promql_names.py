"""Which metric names a PromQL expression in headroom's rules or dashboards may use.

Allowed: headroom's own catalogue (monitor.model.catalogue.exposed_names()), the recording rules in
rules/*.rules.yaml, and the external names listed in tests/rules/external_metrics.txt (vLLM,
gateways, DCGM, Prometheus `up`). Shared by tests/deploy/test_rules.py and tests/deploy/test_dashboards.py, which
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
    from monitor.model.catalogue import exposed_names

    return set(exposed_names())


# The label a list-valued global.pool_by ([cluster, model_name]) adds to every pool and replica
# series; not in the catalogue (it depends on the configuration).
POOL_BY_LABELS = ("cluster",)


def labels_of(name: str) -> tuple[str, ...] | None:
    """Labels a headroom family may carry (its catalogue labels), with the pool_by labels on pool
    series; None for a name that is not headroom's."""
    from monitor.model.catalogue import CATALOGUE

    by_exposed = {m.exposed_name: m.labels for m in CATALOGUE}
    labels = by_exposed.get(name)
    if labels is None:
        return None
    return tuple(labels) + (POOL_BY_LABELS if "pool" in labels else ())


def allowed_names() -> set[str]:
    return catalogue_names() | recording_rule_names() | external_names()


# ------------------------------------------------------------------ HA pairs
# Two headroom pods of a shard (Helm `replicaCount: 2`) export the same headroom_* series, stored
# twice under different target labels. Every selector of a headroom_* metric in a rule or dashboard
# must first go through a deduplicating aggregation: min, max or avg (never sum or count, which
# would double) whose grouping drops these labels.
HA_LABELS = ("instance", "pod")
DEDUP_OPS = {"min", "max", "avg"}


def _agg_drops(node, labels) -> bool:
    m = node.modifier
    if m is None:
        return True  # max(x): every label goes
    kind = str(m.type).rsplit(".", 1)[-1].lower()
    if kind == "without":
        return set(labels) <= set(m.labels)
    return not set(labels) & set(m.labels)


def undeduplicated_selectors(expr: str, prefix: str = "headroom_", labels=HA_LABELS) -> list[str]:
    """Names of `prefix*` metric selectors whose nearest enclosing aggregation is not min/max/avg
    dropping every label in `labels` (empty: the expression is HA-safe)."""
    bad: list[str] = []

    def visit(node, agg):
        if isinstance(node, pp.VectorSelector):
            if node.name and node.name.startswith(prefix):
                ok = agg is not None and str(agg.op) in DEDUP_OPS and _agg_drops(agg, labels)
                if not ok:
                    bad.append(node.name)
        elif isinstance(node, pp.MatrixSelector):
            visit(node.vector_selector, agg)
        elif isinstance(node, pp.AggregateExpr):
            if node.param is not None:
                visit(node.param, agg)
            visit(node.expr, node)
        elif isinstance(node, pp.BinaryExpr):
            visit(node.lhs, agg)
            visit(node.rhs, agg)
        elif isinstance(node, pp.Call):
            for a in node.args:
                visit(a, agg)
        elif isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
            visit(node.expr, agg)

    visit(parse(expr), None)
    return bad
