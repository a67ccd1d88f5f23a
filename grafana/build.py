"""Build headroom's Grafana dashboards: `python grafana/build.py` writes grafana/dashboards/*.json.

The JSON files are committed; tests/test_dashboards.py fails when they differ from what this script
generates, so edit here and re-run. Conventions (monitoring-mixin style):

- one file per dashboard, stable uid `headroom-<name>` (the file name), tag `headroom`;
- a `datasource` variable of type prometheus, used by every panel and target (`${datasource}`);
- a `pool` variable, `label_values(headroom_active_requests, pool)`, multi-select with "All" = `.*`;
  headroom metrics are filtered with `pool=~"$pool"`, the vLLM recording rules (rules/) with
  `model_name=~"$pool"` (a pool is the vLLM `model_name`), so the vLLM panels keep working when the
  headroom daemon is down;
- queries name only metrics from monitor/catalogue.py, the recording rules, or vLLM / gateway / DCGM
  metrics (checked by the test);
- HA pairs: with Helm `replicaCount: 2` two pods export the same headroom_* series, stored twice
  under different `instance` / `pod`. `target()` therefore wraps every instant headroom_* selector in
  `max without (instance, pod) (...)` (`min` for the metrics in DEDUP_MIN, where lower is worse, as the
  alerts do), so no panel shows a pool twice or sums a pool twice; range selectors (`rate(...)`) are
  wrapped by hand (`dedup=False`). docs/runbook.md, "Adapting the rules", explains the min/max choice;
- schemaVersion 42, what @grafana/schema 13.2.3 (grafana/dashboard.schema.json) expects.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SCHEMA_VERSION = 42
OUT_DIR = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
P = 'pool=~"$pool"'  # headroom metrics
M = 'model_name=~"$pool"'  # vLLM recording rules

DASHBOARD_UIDS = {
    "fleet-capacity": "headroom-fleet-capacity",
    "tasks-sessions": "headroom-tasks-sessions",
    "forecast": "headroom-forecast",
    "efficiency": "headroom-efficiency",
}


# ------------------------------------------------------------------ building blocks


HA_LABELS = "instance, pod"  # the target labels in which the two pods of an HA pair differ
# Lower is worse (or, for headroom_pool_stale, stale only when both pods withhold the pool): the
# pessimistic copy is the smaller one. The alerts in rules/headroom.alerts.yaml use the same choice.
DEDUP_MIN = {"headroom_ratio", "headroom_headroom_requests", "headroom_exhaustion_seconds", "headroom_knee_requests",
             "headroom_knee_kv_tokens", "headroom_capacity_requests", "headroom_session_capacity",
             "headroom_pool_stale"}
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
               stack: bool = False, **extra) -> dict:
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
         decimals: int | None = None) -> dict:
    defaults: dict = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": _thresholds(thresholds or GREEN)}
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


def pool_variable() -> dict:
    return {
        "name": "pool",
        "label": "Pool",
        "type": "query",
        "datasource": DS,
        "query": "label_values(headroom_active_requests, pool)",
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "description": "headroom pools (the vLLM model_name). 'All' also matches pools headroom does not know, "
                       "so the vLLM panels keep working without the daemon.",
    }


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
        "templating": {"list": [datasource_variable(), pool_variable(), *(extra_vars or [])]},
        "panels": layout(panels),
    }


# ------------------------------------------------------------------ dashboards


def fleet_capacity() -> dict:
    q_load = f"headroom_active_requests{{{P}}} + headroom_queued_requests{{{P}}}"
    panels = [
        row("Headroom"),
        stat("Headroom now", [target(f'headroom_ratio{{scenario="current",{P}}}', "{{pool}}")], unit="percentunit",
             description="1 - load / capacity at the utilisation knee (headroom_ratio, scenario current).",
             thresholds=[(None, "red"), (0.05, "orange"), (0.2, "green")]),
        stat("Headroom if the largest replica is lost (N-1)",
             [target(f'headroom_ratio{{scenario="n_minus_1",{P}}}', "{{pool}}")], unit="percentunit",
             description="Headroom without the pool's largest replica; below 0 the pool has no redundancy.",
             thresholds=[(None, "red"), (0, "orange"), (0.1, "green")]),
        stat("Utilisation of the knee", [target(f"headroom_utilisation_ratio{{{P}}}", "{{pool}}")],
             unit="percentunit", description="Load over load at the utilisation knee.",
             thresholds=[(None, "green"), (0.8, "orange"), (1, "red")]),
        stat("Replicas answering", [target(f"headroom_replicas{{{P}}}", "{{pool}} answering"),
                                    target(f"headroom_replicas_configured{{{P}}}", "{{pool}} configured")],
             description="Replicas that answered in the last cycle vs replicas headroom knows about."),
        timeseries("Headroom ratio", [target(f"headroom_ratio{{{P}}}", "{{pool}} {{scenario}}")], unit="percentunit",
                   description="Current and N-1 headroom. Alerts: HeadroomLow (< 20%), HeadroomCriticallyLow (< 5%), "
                               "HeadroomNMinus1Lost (N-1 < 0).",
                   thresholds=[(None, "red"), (0, "orange"), (0.2, "green")], show_thresholds=True),
        timeseries("Load vs knee", [
            target(q_load, "{{pool}} load (active + queued)"),
            target(f"sum by (pool) (headroom_gateway_queued_requests{{{P}}})", "{{pool}} + queued at the gateway"),
            target(f"headroom_knee_requests{{{P}}}", "{{pool}} knee"),
            target(f'headroom_capacity_requests{{limit="effective",{P}}}', "{{pool}} effective capacity"),
        ], description="Concurrent requests against the knee and the effective capacity (smallest limit).",
            overrides=[by_name(".* knee$", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                               ("custom.fillOpacity", 0))]),
        row("Load"),
        timeseries("Active vs queued requests", [
            target(f"headroom_active_requests{{{P}}}", "{{pool}} active"),
            target(f"headroom_queued_requests{{{P}}}", "{{pool}} queued"),
            target(f"pool:vllm_num_requests_running:sum{{{M}}}", "{{model_name}} running (vLLM)"),
            target(f"pool:vllm_num_requests_waiting:sum{{{M}}}", "{{model_name}} waiting (vLLM)"),
            target(f"sum by (pool) (headroom_gateway_queued_requests{{{P}}})", "{{pool}} queued in front (gateway)"),
        ], description="headroom's view, the same from vLLM (recording rules: they work while headroom is down), "
                       "and requests in a router's queue (llm-d, Dynamo)."),
        timeseries("Utilisation vs knee", [target(f"headroom_utilisation_ratio{{{P}}}", "{{pool}}")],
                   unit="percentunit", description="Above 100% the pool is past its knee (HeadroomAboveKnee).",
                   thresholds=[(None, "green"), (1, "red")], show_thresholds=True, min_=0),
        timeseries("Capacity by limit", [target(f"headroom_capacity_requests{{{P}}}", "{{pool}} {{limit}}")],
                   description="Concurrent requests the pool can take by limiting factor: slots (max_num_seqs), "
                               "kv (KV tokens / tokens per request), knee, and effective (the smallest)."),
        timeseries("Queue by reason", [
            target(f"pool:vllm_num_requests_waiting_by_reason:sum{{{M}}}", "{{model_name}} {{reason}} (vLLM)"),
            target(f"headroom_queued_requests_by_reason{{{P}}}", "{{pool}} {{reason}}"),
        ], description="capacity = waiting for batch or KV space; deferred = LoRA budget, KV transfer.", stack=False),
        row("KV cache"),
        timeseries("KV cache: live vs capacity", [
            target(f"headroom_kv_tokens{{{P}}}", "{{pool}} live"),
            target(f"headroom_kv_capacity_tokens{{{P}}}", "{{pool}} capacity"),
            target(f"headroom_knee_kv_tokens{{{P}}}", "{{pool}} at knee"),
            target(f"pool:vllm_kv_cache_tokens:sum{{{M}}}", "{{model_name}} live (vLLM)"),
            target(f"pool:vllm_kv_cache_capacity_tokens:sum{{{M}}}", "{{model_name}} capacity (vLLM)"),
        ], description="Live KV tokens = KV usage x KV capacity (vLLM cache_config_info kv_cache_size_tokens)."),
        timeseries("KV cache usage", [
            target(f"headroom_kv_usage_ratio{{{P}}}", "{{pool}}"),
            target(f"pool:vllm_kv_cache_usage:avg{{{M}}}", "{{model_name}} mean of engines (vLLM)"),
            target(f"pool:vllm_kv_cache_usage:max{{{M}}}", "{{model_name}} fullest engine (vLLM)"),
        ], unit="percentunit", description="HeadroomKVCachePressure fires above 90% (mean of engines).",
            thresholds=[(None, "green"), (0.9, "red")], show_thresholds=True, min_=0),
        timeseries("Preemptions", [
            target(f"pool:vllm_num_preemptions:rate5m{{{M}}}", "{{model_name}} (vLLM)"),
            target(f"headroom_preemption_rate{{{P}}}", "{{pool}}"),
        ], unit="reqps", description="Requests evicted from the running batch per second (HeadroomPreemptions)."),
        timeseries("Replicas", [
            target(f"headroom_replicas{{{P}}}", "{{pool}} answering"),
            target(f"headroom_replicas_configured{{{P}}}", "{{pool}} configured"),
            target(f"pool:vllm_engines:count{{{M}}}", "{{model_name}} engines reporting (vLLM)"),
        ]),
        row("Latency"),
        timeseries("Engine latency p95 (vLLM)", [
            target(f'pool_quantile:vllm_time_to_first_token_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} TTFT"),
            target(f'pool_quantile:vllm_inter_token_latency_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} ITL"),
            target(f'pool_quantile:vllm_e2e_request_latency_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} end to end"),
            target(f'pool_quantile:vllm_request_queue_time_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} queue"),
        ], unit="s", description="From vLLM histogram buckets over 5 minutes (recording rules)."),
        timeseries("Engine latency (headroom)", [
            target(f'headroom_latency_seconds{{q=~"0.5|0.95",{P}}}', "{{pool}} {{kind}} p{{q}}"),
        ], unit="s", description="headroom's latency quantiles from histogram bucket deltas."),
        timeseries("Little's law check", [target(f"headroom_littles_law_ratio{{{P}}}", "{{pool}}")],
                   description="Completion rate x mean latency over mean observed concurrency; near 1 when the "
                               "counts are consistent.", w=12),
        timeseries("Completions per second", [
            target(f"headroom_completion_rate{{{P}}}", "{{pool}}"),
            target(f"pool:vllm_request_success:rate5m{{{M}}}", "{{model_name}} (vLLM)"),
        ], unit="reqps"),
        row("headroom itself"),
        timeseries("Sources up", [
            # every pod of every shard reads every source: one line per source target, up if any pod reaches it
            target(f"max without ({HA_LABELS}, headroom_shard) (headroom_source_up)", "{{source}} {{target}}",
                   dedup_ha=False),
        ], min_=0, description="1 when some headroom pod reached and parsed the source in the last cycle "
                               "(HeadroomSourceDown).", w=8),
        stat("Seconds since the last successful cycle",
             [target("time() - headroom_last_success_timestamp_seconds", "since last success")], unit="s",
             thresholds=[(None, "green"), (120, "orange"), (300, "red")], w=4, h=8,
             description="HeadroomDataStale fires above 5 minutes."),
        timeseries("Stale pools", [target(f"headroom_pool_stale{{{P}}}", "{{pool}}")], min_=0, w=6,
                   description="1 while a pool's values are withheld (HeadroomPoolStale)."),
        timeseries("Cycle duration and source errors", [
            target("headroom_cycle_duration_seconds", "cycle duration (s)"),
            target(f"sum by (source, reason) (max without ({HA_LABELS}) "
                   "(rate(headroom_source_errors_total[$__rate_interval])))",
                   "{{source}} {{reason}} errors/s", dedup_ha=False),
            target(f"sum by (what) (max without ({HA_LABELS}) (rate(headroom_dropped_series_total[$__rate_interval])))",
                   "dropped {{what}}/s", dedup_ha=False),
        ], w=6),
    ]
    return dashboard("fleet-capacity", "headroom / Fleet capacity",
                     "Capacity headroom of each pool: load vs the utilisation knee, N-1, KV cache, queues.", panels)


def tasks_sessions() -> dict:
    T = 'task_type=~"$task_type"'
    task_var = {
        "name": "task_type", "label": "Task type", "type": "query", "datasource": DS,
        "query": 'label_values(headroom_task_latency_seconds{pool=~"$pool"}, task_type)',
        "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
        "current": {"text": ["All"], "value": ["$__all"]}, "sort": 1,
    }
    panels = [
        row("Tasks"),
        timeseries("Task latency p95 by task type", [
            target(f'headroom_task_latency_seconds{{q="0.95",{P},{T}}}', "{{pool}} {{task_type}}"),
        ], unit="s", description="Whole-task latency (all model calls and tool waits of one agent task)."),
        timeseries("Task latency quantiles", [
            target(f'headroom_task_latency_seconds{{q=~"0.5|0.9|0.99",{P},{T}}}',
                   "{{task_type}} p{{q}}"),
        ], unit="s"),
        timeseries("Model calls per task", [target(f"headroom_task_calls_per_task{{{P},{T}}}", "{{pool}} {{task_type}}")],
                   description="More calls per task multiplies per-call latency; a change here is usually an agent change."),
        timeseries("Tasks started per second", [
            target(f"headroom_task_arrival_rate{{{P},{T}}}", "{{pool}} {{task_type}}"),
        ], unit="reqps", stack=True),
        row("SLO"),
        timeseries("SLO burn rate", [
            target(f"headroom_slo_burn_rate{{{P},{T}}}", "{{task_type}} {{window}}"),
        ], description="Error-budget burn rate per window; HeadroomTaskLatencyBudgetBurn pages at 14.4 (1h and 5m) "
                       "and 6 (6h and 30m), tickets at 3 (1d and 2h) and 1 (3d and 6h).",
            thresholds=[(None, "green"), (1, "orange"), (6, "red"), (14.4, "dark-red")], show_thresholds=True, min_=0),
        timeseries("Share of tasks over their latency target", [
            target(f"headroom_slo_violation_ratio{{{P},{T}}}", "{{pool}} {{task_type}}"),
        ], unit="percentunit", min_=0),
        row("Sessions"),
        stat("Concurrent agent sessions", [target(f"headroom_sessions{{{P}}}", "{{pool}}")]),
        stat("Session capacity within SLO", [target(f"headroom_session_capacity{{{P}}}", "{{pool}}")],
             description="Knee concurrency / active requests per session."),
        stat("Sessions in use", [target(f"headroom_sessions{{{P}}} / headroom_session_capacity{{{P}}}", "{{pool}}")],
             unit="percentunit", thresholds=[(None, "green"), (0.8, "orange"), (1, "red")], w=12),
        timeseries("Sessions vs session capacity", [
            target(f"headroom_sessions{{{P}}}", "{{pool}} sessions"),
            target(f"headroom_session_capacity{{{P}}}", "{{pool}} capacity"),
        ]),
        timeseries("Call latency p95 by class", [
            target(f'headroom_call_latency_seconds{{q="0.95",{P}}}', "{{pool}} {{class}}"),
        ], unit="s", description="Per model call, interactive vs batch."),
        row("Gateway (straight from gateway metrics)"),
        timeseries("Gateway call latency p95 by task type (LiteLLM)", [
            target('model_task_quantile:litellm_request_total_latency_seconds:histogram_quantile5m'
                   '{quantile="0.95",model_group=~"$pool",metadata_task_type=~"$task_type"}',
                   "{{model_group}} {{metadata_task_type}}"),
        ], unit="s", w=8),
        timeseries("Gateway calls per second by task type (LiteLLM)", [
            target('model_task:litellm_proxy_total_requests:rate5m{requested_model=~"$pool",metadata_task_type=~"$task_type"}',
                   "{{requested_model}} {{metadata_task_type}}"),
        ], unit="reqps", w=8, stack=True),
        timeseries("Gateway request duration p95 (Envoy AI Gateway)", [
            target('model_quantile:gen_ai_server_request_duration_seconds:histogram_quantile5m'
                   '{quantile="0.95",gen_ai_request_model=~"$pool"}', "{{gen_ai_request_model}}"),
        ], unit="s", w=8),
    ]
    return dashboard("tasks-sessions", "headroom / Tasks and sessions",
                     "Agent tasks: latency by task type, calls per task, SLO burn, concurrent sessions.",
                     panels, [task_var])


def forecast() -> dict:
    H = 'horizon="$horizon"'
    horizon_var = {
        "name": "horizon", "label": "Horizon", "type": "custom", "query": "1h,1d,1w",
        "current": {"text": "1d", "value": "1d"},
        "options": [{"text": v, "value": v, "selected": v == "1d"} for v in ("1h", "1d", "1w")],
        "multi": False, "includeAll": False,
    }
    band = [
        by_name("forecast peak upper .*", ("custom.fillBelowTo", "forecast peak"), ("custom.lineWidth", 0),
                ("custom.fillOpacity", 20)),
        by_name("forecast peak", ("custom.fillOpacity", 0)),
        by_name("capacity at knee", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}), ("custom.fillOpacity", 0),
                ("color", {"mode": "fixed", "fixedColor": "red"})),
    ]
    panels = [
        row("Actual vs forecast"),
        timeseries("Load: actual vs forecast ($pool)", [
            target(f'headroom_active_requests{{pool=~"$pool"}} + headroom_queued_requests{{pool=~"$pool"}}', "actual"),
            target(f"headroom_forecast_requests{{{P},{H}}}", "forecast mean"),
            target(f"headroom_forecast_peak_requests{{{P},{H}}}", "forecast peak"),
            target(f"headroom_forecast_peak_requests_upper{{{P},{H}}}", "forecast peak upper (95%)"),
            target(f"headroom_knee_requests{{{P}}}", "capacity at knee"),
        ], description="Concurrent requests (active + queued) against the forecast for the chosen horizon; the band "
                       "runs from the forecast peak to its 95% upper bound. One panel per pool.",
            overrides=band, repeat="pool", repeatDirection="h", maxPerRow=2, w=24, h=9),
        stat("Time to exhaustion", [target(f"headroom_exhaustion_seconds{{{P}}}", "{{pool}}")], unit="s",
             description="Until the forecast upper bound crosses capacity at the knee; +Inf = not within the horizon.",
             thresholds=[(None, "red"), (86400, "orange"), (604800, "green")], w=8),
        stat("Forecast peak within the horizon", [
            target(f"headroom_forecast_peak_requests{{{P},{H}}}", "{{pool}} peak"),
            target(f"headroom_forecast_peak_requests_upper{{{P},{H}}}", "{{pool}} upper"),
        ], w=8),
        stat("When the peak falls", [
            target(f"headroom_forecast_peak_timestamp_seconds{{{P},{H}}} * 1000", "{{pool}}"),
        ], unit="dateTimeAsIso", w=8),
        timeseries("Time to exhaustion over time", [target(f"headroom_exhaustion_seconds{{{P}}}", "{{pool}}")],
                   unit="s", description="HeadroomExhaustionWithinDay below 1 day, ...WithinWeek below 1 week.",
                   thresholds=[(None, "red"), (86400, "orange"), (604800, "green")], show_thresholds=True),
        timeseries("Forecast peak upper bound by horizon", [
            target(f"headroom_forecast_peak_requests_upper{{{P}}}", "{{pool}} {{horizon}}"),
            target(f"headroom_knee_requests{{{P}}}", "{{pool}} capacity at knee"),
        ]),
        row("Forecast skill (rolling-origin backtest)"),
        timeseries("Backtest MASE", [target(f"headroom_forecast_mase{{{P}}}", "{{pool}} {{series}} {{model}}")],
                   description="Mean absolute scaled error vs the one-day seasonal naive; below 1 beats it "
                               "(HeadroomForecastSkillDegraded above 1 for the selected model).",
                   thresholds=[(None, "green"), (1, "red")], show_thresholds=True, min_=0),
        timeseries("Interval coverage", [
            target(f"headroom_forecast_coverage_ratio{{{P}}}", "{{pool}} {{series}} {{model}} {{level}}"),
        ], unit="percentunit", description="Share of actual points inside the forecast interval; should be near "
                                           "the interval level (0.8, 0.95).", min_=0),
        table("Selected model", [target(f"headroom_forecast_selected_info{{{P}}}", "", instant=True, table=True)],
              description="The model chosen per series by backtest."),
        timeseries("History points", [target(f"headroom_history_points{{{P}}}", "{{pool}} {{series}}")], w=6),
        stat("Since the last refit", [target("time() - headroom_forecast_last_fit_timestamp_seconds", "since refit")],
             unit="s", w=6, h=8),
    ]
    return dashboard("forecast", "headroom / Forecast",
                     "Load forecasts with bands, time to exhaustion, and how good the forecasts have been.",
                     panels, [horizon_var], time_from="now-7d")


def efficiency() -> dict:
    power_fleet = "fleet:dcgm_fi_dev_power_usage_watts:sum"
    panels = [
        row("Sessions per megawatt"),
        stat("Sessions per megawatt", [target(f"headroom_sessions_per_megawatt{{{P}}}", "{{pool}}")], w=8,
             description="Sustainable concurrent agent sessions per MW of GPU power."),
        stat("GPU power (headroom)", [target(f"headroom_power_watts{{{P}}}", "{{pool}}")], unit="watt", w=8),
        stat("GPU power (DCGM, fleet)", [target(power_fleet, "fleet")], unit="watt", w=8),
        timeseries("Sessions per megawatt over time", [target(f"headroom_sessions_per_megawatt{{{P}}}", "{{pool}}")]),
        timeseries("GPU power: headroom vs DCGM", [
            target(f"headroom_power_watts{{{P}}}", "{{pool}} (headroom)"),
            target(power_fleet, "fleet (DCGM)"),
            target("sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE < 1e6)", "{{Hostname}} (DCGM)"),
        ], unit="watt", description="headroom_power_watts is DCGM power summed per pool, or configured watts per "
                                    "replica when DCGM is not available."),
        row("Throughput per watt"),
        timeseries("Tokens per second", [
            target(f"headroom_generation_tokens_rate{{{P}}}", "{{pool}} generated"),
            target(f"headroom_prompt_tokens_rate{{{P}}}", "{{pool}} prompt"),
            target(f"pool:vllm_generation_tokens:rate5m{{{M}}}", "{{model_name}} generated (vLLM)"),
            target(f"pool:vllm_prompt_tokens:rate5m{{{M}}}", "{{model_name}} prompt (vLLM)"),
        ], unit="short", description="Tokens per second (prompt tokens include prefix-cache hits)."),
        timeseries("Generated tokens per joule (fleet)", [
            target(f"sum(pool:vllm_generation_tokens:rate5m) / {power_fleet}", "tokens / J"),
        ], description="Fleet generated tokens per second over fleet GPU watts."),
        timeseries("Prefix cache hit ratio", [
            target(f"headroom_prefix_cache_hit_ratio{{{P}}}", "{{pool}}"),
            target(f"pool:vllm_prefix_cache_hit:ratio_rate5m{{{M}}}", "{{model_name}} (vLLM)"),
        ], unit="percentunit", min_=0),
        timeseries("GPU utilisation (DCGM)", [
            target("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}}"),
        ], unit="percent", min_=0),
        timeseries("GPU energy rate (DCGM counter)", [
            target("sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$__rate_interval])) / 1000", "fleet"),
        ], unit="watt", description="DCGM energy counter (mJ) as average watts; cross-checks the power gauge."),
        timeseries("Sessions vs session capacity", [
            target(f"headroom_sessions{{{P}}}", "{{pool}} sessions"),
            target(f"headroom_session_capacity{{{P}}}", "{{pool}} capacity"),
        ]),
    ]
    return dashboard("efficiency", "headroom / Efficiency",
                     "Agent sessions per megawatt, GPU power (DCGM and headroom), tokens per second and per joule.",
                     panels)


BUILDERS = {"fleet-capacity": fleet_capacity, "tasks-sessions": tasks_sessions, "forecast": forecast,
            "efficiency": efficiency}


def render_all() -> dict[str, str]:
    """{file name: JSON text} for every dashboard."""
    out = {}
    for key, build in BUILDERS.items():
        d = build()
        out[f"{d['uid']}.json"] = json.dumps(d, indent=2, sort_keys=False) + "\n"
    return out


def main(argv: list[str]) -> int:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rendered = render_all()
    for stale in OUT_DIR.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    for name, text in rendered.items():
        (OUT_DIR / name).write_text(text)
        print(f"wrote {OUT_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
