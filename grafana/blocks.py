"""Building blocks of headroom's Grafana dashboards (grafana/build.py assembles the dashboards).

Conventions (monitoring-mixin style):

- one file per dashboard, stable uid `headroom-<name>` (the file name), tag `headroom`;
- variables, in this order: `datasource` (type prometheus, used by every panel and target),
  `cluster` (the label the scale issue's list-valued `global.pool_by` adds, e.g. `[cluster,
  model_name]`; empty and "All" = `.*` when no series carries it, so every matcher still matches),
  `namespace` (Kubernetes namespace of the engine targets, from `up`; engine series only: headroom's
  own series do not carry it), `pool` (multi-select, "All" = `.*`), and `replica` on the per-replica
  dashboard. headroom metrics are filtered with `P` (cluster, pool), the engine recording rules
  (rules/) with `M` (cluster, namespace, model_name = pool: a pool is the engine's `model_name`), so
  the engine panels keep working when the headroom daemon is down;
- engine panels read vLLM and SGLang alike: `engine(vllm_rule, sglang_rule, legend)` gives a target
  for each engine's recording rule (rules/headroom.rules.yaml has both groups, with the same labels);
- queries name only metrics from monitor/model/catalogue.py, the recording rules, vLLM / SGLang / gateway /
  DCGM metrics (tests/rules/promql_names.py);
- HA pairs: with Helm `replicaCount: 2` two pods export the same headroom_* series, stored twice
  under different `instance` / `pod`. `target()` therefore wraps every instant headroom_* selector in
  `max without (instance, pod) (...)` (`min` for the metrics in DEDUP_MIN, where lower is worse, as the
  alerts do), so no panel shows a pool twice or sums a pool twice; range selectors (`rate(...)`) are
  wrapped by hand (`dedup=False`). docs/runbook.md, "Adapting the rules", explains the min/max choice;
- schemaVersion 42, what @grafana/schema 13.2.3 (grafana/dashboard.schema.json) expects.
"""
from __future__ import annotations

import re

SCHEMA_VERSION = 42
DS = {"type": "prometheus", "uid": "${datasource}"}
P = 'cluster=~"$cluster",pool=~"$pool"'  # headroom metrics
M = 'cluster=~"$cluster",namespace=~"$namespace",model_name=~"$pool"'  # engine recording rules
R = 'cluster=~"$cluster",pool=~"$pool",replica=~"$replica"'  # headroom per-replica metrics
# labels a list-valued global.pool_by puts on every pool and replica series (beside those the
# catalogue declares); the dashboards filter on them
POOL_BY_LABELS = ("cluster",)

DASHBOARD_UIDS = {
    "fleet-capacity": "headroom-fleet-capacity",
    "replicas": "headroom-replicas",
    "actions": "headroom-actions",
    "tasks-sessions": "headroom-tasks-sessions",
    "forecast": "headroom-forecast",
    "efficiency": "headroom-efficiency",
}


def engine(vllm_expr: str, sglang_expr: str, legend: str) -> list[dict]:
    """The same engine number from vLLM and from SGLang: two targets on the same recording-rule labels,
    so a pool of either engine shows (legend + " (vLLM)" or " (SGLang)")."""
    return [target(vllm_expr, legend + " (vLLM)"), target(sglang_expr, legend + " (SGLang)")]


def replicas_link(label: str = "pool") -> dict:
    """Data link from a pool's series to the per-replica dashboard, keeping time range and variables."""
    return {"title": f"Replicas of ${{__field.labels.{label}}}", "targetBlank": False,
            "url": (f"/d/{DASHBOARD_UIDS['replicas']}/headroom-replicas?var-pool=${{__field.labels.{label}}}"
                    "&${datasource:queryparam}&${cluster:queryparam}&${__url_time_range}")}


HA_LABELS = "instance, pod"  # the target labels in which the two pods of an HA pair differ
# Lower is worse (or, for headroom_pool_stale, stale only when both pods withhold the pool): the
# pessimistic copy is the smaller one. The alerts in rules/headroom.alerts.yaml use the same choice.
DEDUP_MIN = {"headroom_ratio", "headroom_headroom_requests", "headroom_exhaustion_seconds", "headroom_knee_requests",
             "headroom_knee_kv_tokens", "headroom_capacity_requests", "headroom_session_capacity",
             "headroom_pool_stale", "headroom_knee_confidence_ratio"}
# an instant headroom_* selector (not part of a longer name, not followed by a range `[...]`)
_HEADROOM_SELECTOR = re.compile(r"(?<![\w:])(headroom_\w+)(\{[^}]*\})?(?![\w\[{])")


def ha(name: str, matchers: str = "") -> str:
    """One copy of an HA pair's duplicated series: `max|min without (instance, pod) (name{matchers})`."""
    agg = "min" if name in DEDUP_MIN else "max"
    return f"{agg} without ({HA_LABELS}) ({name}{matchers})"


def dedup(expr: str) -> str:
    """Wrap every instant headroom_* selector of `expr` with ha()."""
    return _HEADROOM_SELECTOR.sub(lambda m: ha(m.group(1), m.group(2) or ""), expr)


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False, dedup_ha: bool = True) -> dict:
    if dedup_ha:
        expr = dedup(expr)
    t = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    return t


def _thresholds(steps: list[tuple[float | None, str]]) -> dict:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


GREEN = [(None, "green")]


def timeseries(title: str, targets: list[dict], *, unit: str = "short", description: str = "",
               thresholds: list[tuple[float | None, str]] | None = None, show_thresholds: bool = False,
               overrides: list[dict] | None = None, w: int = 12, h: int = 8, min_: float | None = None,
               stack: bool = False, links: list[dict] | None = None, **extra) -> dict:
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10 if not stack else 30,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "dashed" if show_thresholds else "off"},
    }
    defaults: dict = {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"},
                      "thresholds": _thresholds(thresholds or GREEN)}
    if min_ is not None:
        defaults["min"] = min_
    if links:
        defaults["links"] = links
    panel = {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                               "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "_size": (w, h),
    }
    panel.update(extra)
    return panel


def stat(title: str, targets: list[dict], *, unit: str = "short", description: str = "",
         thresholds: list[tuple[float | None, str]] | None = None, w: int = 6, h: int = 4,
         decimals: int | None = None, links: list[dict] | None = None) -> dict:
    defaults: dict = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": _thresholds(thresholds or GREEN)}
    if links:
        defaults["links"] = links
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "textMode": "value_and_name",
                    "justifyMode": "auto", "orientation": "auto"},
        "_size": (w, h),
    }


def table(title: str, targets: list[dict], *, description: str = "", w: int = 12, h: int = 8) -> dict:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": "short", "thresholds": _thresholds(GREEN)}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}}}],
        "_size": (w, h),
    }


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def by_name(name_regex: str, *props: tuple[str, object]) -> dict:
    return {"matcher": {"id": "byRegexp", "options": name_regex},
            "properties": [{"id": k, "value": v} for k, v in props]}


def layout(panels: list[dict]) -> list[dict]:
    """Give panels ids, gridPos (left to right, wrapping at 24 columns) and target refIds."""
    x = y = row_h = 0
    out = []
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_size")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p = {"id": i, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **p}
        for n, t in enumerate(p.get("targets", [])):
            t["refId"] = chr(ord("A") + n)
        out.append(p)
        x += w
        row_h = max(row_h, h)
    return out


def query_variable(name: str, label: str, query: str, description: str) -> dict:
    """A multi-select query variable, "All" = `.*` (which also matches series without the label)."""
    return {"name": name, "label": label, "type": "query", "datasource": DS, "query": query, "refresh": 2,
            "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": ["All"], "value": ["$__all"]},
            "sort": 1, "description": description}


def cluster_variable() -> dict:
    return query_variable("cluster", "Cluster", "label_values(headroom_active_requests, cluster)",
                          "The cluster label a list-valued global.pool_by ([cluster, model_name]) adds; empty, and "
                          "'All' matches everything, when the series do not carry it.")


def namespace_variable() -> dict:
    return query_variable("namespace", "Namespace", "label_values(up, namespace)",
                          "Kubernetes namespace of the engine targets (engine panels only; headroom's own series "
                          "carry no namespace). Empty outside Kubernetes.")


def pool_variable() -> dict:
    return query_variable("pool", "Pool", 'label_values(headroom_active_requests{cluster=~"$cluster"}, pool)',
                          "headroom pools (the engine's model_name). 'All' also matches pools headroom does not "
                          "know, so the engine panels keep working without the daemon.")


def replica_variable() -> dict:
    return query_variable("replica", "Replica",
                          'label_values(headroom_replica_up{cluster=~"$cluster",pool=~"$pool"}, replica)',
                          "Replicas (engine targets) of the selected pools.")


def target_variable(name: str, label: str, default: str, description: str) -> dict:
    """A number the operator types in (an SLO target, a price): headroom does not export its configured
    targets and prices, so the dashboard carries them, defaulting to the configuration's defaults."""
    return {"name": name, "label": label, "type": "textbox", "query": default,
            "current": {"text": default, "value": default}, "description": description}


def datasource_variable() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "refresh": 1, "regex": "", "hide": 0}


def dashboard(key: str, title: str, description: str, panels: list[dict], extra_vars: list[dict] | None = None,
              time_from: str = "now-6h") -> dict:
    return {
        "uid": DASHBOARD_UIDS[key],
        "title": title,
        "description": description,
        "tags": ["headroom"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "links": [{"title": "headroom dashboards", "type": "dashboards", "tags": ["headroom"], "asDropdown": True,
                   "icon": "external link", "includeVars": True, "keepTime": True, "targetBlank": False,
                   "tooltip": ""}],
        "templating": {"list": [datasource_variable(), cluster_variable(), namespace_variable(), pool_variable(),
                               *(extra_vars or [])]},
        "panels": layout(panels),
    }


# ------------------------------------------------------------------ dashboards
