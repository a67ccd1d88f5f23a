"""Build headroom's Grafana dashboards: `python grafana/build.py` writes grafana/dashboards/*.json.

The JSON files are committed; tests/deploy/test_dashboards.py fails when they differ from what this script
generates, so edit here (or in grafana/blocks.py, the building blocks and conventions, and
grafana/drilldown.py, the per-replica and what-to-do dashboards, grafana/health.py, headroom's own
health panels) and re-run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # blocks.py, drilldown.py beside this file

from blocks import (  # noqa: F401
    DS,
    HA_LABELS,
    SCHEMA_VERSION,
    M,
    P,
    by_name,
    dashboard,
    dedup,
    engine,
    replicas_link,
    row,
    stat,
    table,
    target,
    target_variable,
    timeseries,
)
from drilldown import actions, replicas
from edges import edges
from health import self_health
from spare import spare_panels

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
# the engines' queue: headroom_queued_requests{where="engine"} (series written before the label have none)
Q_ENGINE = f'headroom_queued_requests{{where!="gateway",{P}}}'


def fleet_capacity() -> dict:
    q_load = f"headroom_active_requests{{{P}}} + ignoring(where) {Q_ENGINE}"
    panels = [
        row("Headroom"),
        stat("Headroom now", [target(f'headroom_ratio{{scenario="current",{P}}}', "{{pool}}")], unit="percentunit",
             description="1 - load / effective capacity (headroom_ratio, scenario current: the load averaged over the "
                         "latency window, what the alerts read; scenario instant is this cycle's).",
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
        ], description="Concurrent requests against the knee and the effective capacity (smallest limit). "
                       "Click a line for the pool's replicas.", links=[replicas_link()],
            overrides=[by_name(".* knee$", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                               ("custom.fillOpacity", 0))]),
        row("Load"),
        timeseries("Active vs queued requests", [
            target(f"headroom_active_requests{{{P}}}", "{{pool}} active"),
            target(Q_ENGINE, "{{pool}} queued"),
            *engine(f"pool:vllm_num_requests_running:sum{{{M}}}", f"pool:sglang_num_running_reqs:sum{{{M}}}",
                   "{{model_name}} running"),
            *engine(f"pool:vllm_num_requests_waiting:sum{{{M}}}", f"pool:sglang_num_queue_reqs:sum{{{M}}}",
                   "{{model_name}} waiting"),
            target(f"sum by (pool) (headroom_gateway_queued_requests{{{P}}})", "{{pool}} queued in front (gateway)"),
            target(f"headroom_offered_requests{{{P}}}", "{{pool}} offered (served + shed)"),
            target(f"headroom_rendering_requests{{{P}}}", "{{pool}} rendering (templating, tokenising)"),
        ], description="headroom's view, the same from the engines (recording rules, vLLM or SGLang: they work while "
                       "headroom is down), requests in a router's queue (llm-d, Dynamo), load offered including what "
                       "was shed, and requests still being templated before admission. Click a line for the pool's "
                       "replicas.", links=[replicas_link()]),
        timeseries("Utilisation vs knee", [target(f"headroom_utilisation_ratio{{{P}}}", "{{pool}}")],
                   unit="percentunit", description="Above 100% the pool is past its knee (HeadroomAboveKnee).",
                   thresholds=[(None, "green"), (1, "red")], show_thresholds=True, min_=0),
        timeseries("Capacity by limit", [target(f"headroom_capacity_requests{{{P}}}", "{{pool}} {{limit}}")],
                   description="Concurrent requests the pool can take by limiting factor: slots (max_num_seqs), "
                               "kv (KV tokens / tokens per request), knee, slo (while a latency target is over its "
                               "allowed share: below the load), lora (while requests wait for an adapter slot), and "
                               "effective (the smallest)."),
        timeseries("Queue by reason", [
            target(f"pool:vllm_num_requests_waiting_by_reason:sum{{{M}}}", "{{model_name}} {{reason}} (vLLM)"),
            target(f"headroom_queued_requests_by_reason{{{P}}}", "{{pool}} {{reason}}"),
        ], description="capacity = waiting for batch or KV space; deferred = LoRA budget, KV transfer.", stack=False),
        timeseries("Requests by priority", [
            target(f"headroom_priority_requests{{{P}}}", "{{pool}} {{state}} priority {{priority}}"),
        ], description="Running and queued requests by scheduling priority, where the engine gives them (SGLang "
                       "with --enable-priority-scheduling): a breakdown of the pool's running and queued requests, "
                       "not added to them.", stack=False),
        *kv_and_latency(),
        *edges(),
        *self_health(),
    ]
    return dashboard("fleet-capacity", "headroom / Fleet capacity",
                     "Capacity headroom of each pool: load vs the utilisation knee, N-1, KV cache, queues.", panels,
                     [target_variable("ttft_target_seconds", "TTFT target (s)", "0.5",
                                      "TTFT p95 target drawn on the latency panels (slos.pools.<pool>.ttft_p95_seconds)")])


def kv_and_latency() -> list[dict]:
    """The KV cache and latency rows of the fleet dashboard."""
    target_line = [by_name("TTFT target", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                           ("custom.fillOpacity", 0), ("color", {"mode": "fixed", "fixedColor": "red"}))]
    return [
        row("KV cache"),
        timeseries("KV cache: live vs capacity", [
            target(f"headroom_kv_tokens{{{P}}}", "{{pool}} live"),
            target(f"headroom_kv_tokens_low{{{P}}}", "{{pool}} live, low"),
            target(f"headroom_kv_tokens_high{{{P}}}", "{{pool}} live, high (block usage)"),
            target(f"headroom_kv_capacity_tokens{{{P}}}", "{{pool}} capacity"),
            target(f"headroom_knee_kv_tokens{{{P}}}", "{{pool}} at knee"),
            *engine(f"pool:vllm_kv_cache_tokens:sum{{{M}}}", f"pool:sglang_kv_cache_tokens:sum{{{M}}}",
                   "{{model_name}} live"),
            *engine(f"pool:vllm_kv_cache_capacity_tokens:sum{{{M}}}", f"pool:sglang_kv_cache_capacity_tokens:sum{{{M}}}",
                   "{{model_name}} capacity"),
        ], description="Live KV tokens: headroom's estimate with its band (high = what block usage implies), and "
                       "KV usage x KV capacity from the engines. Click a line for the pool's replicas.",
            links=[replicas_link()]),
        timeseries("KV cache usage", [
            target(f"headroom_kv_usage_ratio{{{P}}}", "{{pool}}"),
            target(f"headroom_kv_pool_usage_ratio{{{P}}}", "{{pool}} {{kv_pool}} pool (hybrid model)"),
            *engine(f"pool:vllm_kv_cache_usage:avg{{{M}}}", f"pool:sglang_kv_cache_usage:avg{{{M}}}",
                   "{{model_name}} mean of engines"),
            *engine(f"pool:vllm_kv_cache_usage:max{{{M}}}", f"pool:sglang_kv_cache_usage:max{{{M}}}",
                   "{{model_name}} fullest engine"),
        ], unit="percentunit", description="HeadroomKVCachePressure fires above 90% (mean of engines). Hybrid "
                                           "models show each KV pool (full attention, swa, mamba): the fullest "
                                           "one bounds the requests that fit.",
            thresholds=[(None, "green"), (0.9, "red")], show_thresholds=True, min_=0),
        timeseries("Preemptions", [
            *engine(f"pool:vllm_num_preemptions:rate5m{{{M}}}", f"pool:sglang_num_retractions:rate5m{{{M}}}",
                   "{{model_name}}"),
            target(f"headroom_preemption_rate{{{P}}}", "{{pool}}"),
        ], unit="reqps", description="Requests evicted from the running batch per second (HeadroomPreemptions)."),
        timeseries("Replicas", [
            target(f"headroom_replicas{{{P}}}", "{{pool}} answering"),
            target(f"headroom_replicas_configured{{{P}}}", "{{pool}} configured"),
            *engine(f"pool:vllm_engines:count{{{M}}}", f"pool:sglang_engines:count{{{M}}}",
                   "{{model_name}} engines reporting"),
        ]),
        row("Latency"),
        timeseries("Engine latency p95 (vLLM, SGLang)", [
            *engine(f'pool_quantile:vllm_time_to_first_token_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                          f'pool_quantile:sglang_time_to_first_token_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} TTFT"),
            *engine(f'pool_quantile:vllm_inter_token_latency_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                          f'pool_quantile:sglang_inter_token_latency_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} ITL"),
            *engine(f'pool_quantile:vllm_e2e_request_latency_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                          f'pool_quantile:sglang_e2e_request_latency_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} end to end"),
            *engine(f'pool_quantile:vllm_request_queue_time_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                          f'pool_quantile:sglang_queue_time_seconds:histogram_quantile5m{{quantile="0.95",{M}}}',
                   "{{model_name}} queue"),
            target("vector($ttft_target_seconds)", "TTFT target"),
        ], unit="s", description="From vLLM or SGLang histogram buckets over 5 minutes (recording rules); the dashed "
                                 "line is the TTFT target (variable ttft_target_seconds, from slos.pools).",
            overrides=target_line),
        timeseries("Engine latency (headroom)", [
            target(f'headroom_latency_seconds{{q=~"0.5|0.95",{P}}}', "{{pool}} {{kind}} p{{q}}"),
            target("vector($ttft_target_seconds)", "TTFT target"),
        ], unit="s", description="headroom's latency quantiles from histogram bucket deltas, with the TTFT target.",
            overrides=target_line),
        timeseries("Little's law check", [target(f"headroom_littles_law_ratio{{{P}}}", "{{pool}}")],
                   description="Completion rate x mean latency over mean observed concurrency; near 1 when the "
                               "counts are consistent.", w=12),
        timeseries("Completions per second", [
            target(f"headroom_completion_rate{{{P}}}", "{{pool}}"),
            *engine(f"pool:vllm_request_success:rate5m{{{M}}}", f"pool:sglang_request_success:rate5m{{{M}}}",
                   "{{model_name}}"),
        ], unit="reqps"),
    ]


def workload_shape() -> list[dict]:
    """What the engines are sent: prompt and output lengths (vLLM and SGLang), finish reasons (vLLM)."""
    def q(quantile: str, bucket: str) -> str:
        return f"histogram_quantile({quantile}, sum by (model_name, le) (rate({bucket}{{{M}}}[$__rate_interval])))"

    def lengths(title: str, vllm_bucket: str, sglang_bucket: str) -> dict:
        return timeseries(title, [
            *engine(q("0.5", vllm_bucket), q("0.5", sglang_bucket), "{{model_name}} p50"),
            *engine(q("0.95", vllm_bucket), q("0.95", sglang_bucket), "{{model_name}} p95"),
        ], w=8, description="Tokens per request, from the engines' histograms; a shift here moves the knee and "
                            "the KV tokens per request.")

    return [
        row("Workload shape (engines)"),
        lengths("Prompt length", "vllm:request_prompt_tokens_bucket", "sglang:prompt_tokens_histogram_bucket"),
        lengths("Output length", "vllm:request_generation_tokens_bucket", "sglang:generation_tokens_histogram_bucket"),
        timeseries("Finish reasons (vLLM)", [
            target(f"sum by (model_name, finished_reason) (rate(vllm:request_success_total{{{M}}}[$__rate_interval]))",
                   "{{model_name}} {{finished_reason}}"),
        ], unit="reqps", stack=True, w=8, description="stop, length (hit max tokens), abort (client gave up), error, "
                                                      "repetition; SGLang exports no finish reason."),
    ]


def tasks_sessions() -> dict:
    T = 'task_type=~"$task_type"'
    task_var = {
        "name": "task_type", "label": "Task type", "type": "query", "datasource": DS,
        "query": 'label_values(headroom_task_latency_seconds{cluster=~"$cluster",pool=~"$pool"}, task_type)',
        "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
        "current": {"text": ["All"], "value": ["$__all"]}, "sort": 1,
    }
    panels = [
        row("Tasks"),
        timeseries("Task latency p95 by task type", [
            target(f'headroom_task_latency_seconds{{q="0.95",{P},{T}}}', "{{pool}} {{task_type}}"),
            target("vector($task_target_seconds)", "task target"),
        ], unit="s", description="Whole-task latency (all model calls and tool waits of one agent task); the dashed "
                                 "line is the task target (variable task_target_seconds, from slos.task_types).",
            overrides=[by_name("task target", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                               ("custom.fillOpacity", 0), ("color", {"mode": "fixed", "fixedColor": "red"}))]),
        timeseries("Task latency quantiles", [
            target(f'headroom_task_latency_seconds{{q=~"0.5|0.9|0.99",{P},{T}}}',
                   "{{task_type}} p{{q}}"),
        ], unit="s"),
        timeseries("Model calls per task", [target(f"headroom_task_calls_per_task{{{P},{T}}}", "{{pool}} {{task_type}}")],
                   description="More calls per task multiplies per-call latency; a change here is usually an agent change."),
        timeseries("Tasks started and completed per second", [
            target(f"headroom_task_arrival_rate{{{P},{T}}}", "{{pool}} {{task_type}} started"),
            target(f"headroom_task_completion_rate{{{P},{T}}}", "{{pool}} {{task_type}} completed"),
        ], unit="reqps", description="Started (agent_tasks_started_total) and completed (the task-duration "
                                     "histogram's count); in an overload many started tasks do not complete."),
        row("SLO"),
        timeseries("SLO burn rate", [
            target(f"headroom_slo_burn_rate{{{P},{T}}}", "{{task_type}} {{window}}"),
        ], description="Error-budget burn rate per window; HeadroomTaskLatencyBudgetBurn pages at 14.4 (5m and 1m, "
                       "1h and 5m) and 6 (6h and 30m), tickets at 3 (1d and 2h) and 1 (3d and 6h).",
            thresholds=[(None, "green"), (1, "orange"), (6, "red"), (14.4, "dark-red")], show_thresholds=True, min_=0),
        timeseries("Share of tasks over their latency target", [
            target(f"headroom_slo_violation_ratio{{{P},{T}}}", "{{pool}} {{task_type}}"),
            target(f"1 - headroom_slo_objective_ratio{{{P},{T}}}", "{{pool}} {{task_type}} budget"),
        ], unit="percentunit", min_=0,
            description="Above its budget (1 - the SLO's objective) for 5 minutes: HeadroomLatencyOverTarget."),
        *workload_shape(),
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
                   '{quantile="0.95",cluster=~"$cluster",namespace=~"$namespace",model_group=~"$pool",'
                   'metadata_task_type=~"$task_type"}',
                   "{{model_group}} {{metadata_task_type}}"),
        ], unit="s", w=8),
        timeseries("Gateway calls per second by task type (LiteLLM)", [
            target('model_task:litellm_proxy_total_requests:rate5m{cluster=~"$cluster",namespace=~"$namespace",'
                   'requested_model=~"$pool",metadata_task_type=~"$task_type"}',
                   "{{requested_model}} {{metadata_task_type}}"),
        ], unit="reqps", w=8, stack=True),
        timeseries("Gateway request duration p95 (Envoy AI Gateway)", [
            target('model_quantile:gen_ai_server_request_duration_seconds:histogram_quantile5m'
                   '{quantile="0.95",cluster=~"$cluster",namespace=~"$namespace",gen_ai_request_model=~"$pool"}',
                   "{{gen_ai_request_model}}"),
        ], unit="s", w=8),
    ]
    return dashboard("tasks-sessions", "headroom / Tasks and sessions",
                     "Agent tasks: latency by task type, calls per task, SLO burn, concurrent sessions.",
                     panels, [task_var, target_variable("task_target_seconds", "Task target (s)", "30",
                                                        "task p95 target (slos.task_types / slos.default)")])


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
            target(f"headroom_active_requests{{{P}}} + ignoring(where) {Q_ENGINE}", "actual"),
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
        *spare_panels(),
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
    power_fleet = 'fleet:dcgm_fi_dev_power_usage_watts:sum{cluster=~"$cluster"}'
    C = 'cluster=~"$cluster"'
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
            target(f"sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{{{C}}} < 1e6)", "{{Hostname}} (DCGM)"),
        ], unit="watt", description="headroom_power_watts is DCGM power summed per pool, or configured watts per "
                                    "replica when DCGM is not available."),
        row("Throughput per watt"),
        timeseries("Tokens per second", [
            target(f"headroom_generation_tokens_rate{{{P}}}", "{{pool}} generated"),
            target(f"headroom_prompt_tokens_rate{{{P}}}", "{{pool}} prompt"),
            *engine(f"pool:vllm_generation_tokens:rate5m{{{M}}}", f"pool:sglang_generation_tokens:rate5m{{{M}}}",
                   "{{model_name}} generated"),
            *engine(f"pool:vllm_prompt_tokens:rate5m{{{M}}}", f"pool:sglang_prompt_tokens:rate5m{{{M}}}",
                   "{{model_name}} prompt"),
        ], unit="short", description="Tokens per second (prompt tokens include prefix-cache hits)."),
        timeseries("Generated tokens per joule (fleet)", [
            target(f"fleet:engine_generation_tokens:rate5m{{{C}}} / {power_fleet}", "tokens / J"),
        ], description="Fleet generated tokens per second over fleet GPU watts."),
        timeseries("Prefix cache hit ratio", [
            target(f"headroom_prefix_cache_hit_ratio{{{P}}}", "{{pool}}"),
            *engine(f"pool:vllm_prefix_cache_hit:ratio_rate5m{{{M}}}", f"pool:sglang_prefix_cache_hit:ratio_rate5m{{{M}}}",
                   "{{model_name}}"),
        ], unit="percentunit", min_=0),
        timeseries("GPU utilisation (DCGM)", [
            target(f"avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{{{C}}})", "{{Hostname}}"),
        ], unit="percent", min_=0),
        timeseries("GPU energy rate (DCGM counter)", [
            target(f"sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{C}}}[$__rate_interval])) / 1000", "fleet"),
        ], unit="watt", description="DCGM energy counter (mJ) as average watts; cross-checks the power gauge."),
        timeseries("Sessions vs session capacity", [
            target(f"headroom_sessions{{{P}}}", "{{pool}} sessions"),
            target(f"headroom_session_capacity{{{P}}}", "{{pool}} capacity"),
        ]),
    ]
    return dashboard("efficiency", "headroom / Efficiency",
                     "Agent sessions per megawatt, GPU power (DCGM and headroom), tokens per second and per joule.",
                     panels)


BUILDERS = {"fleet-capacity": fleet_capacity, "replicas": replicas, "actions": actions,
            "tasks-sessions": tasks_sessions, "forecast": forecast, "efficiency": efficiency}


def render_all() -> dict[str, str]:
    """{file name: JSON text} for every dashboard."""
    out = {}
    for build in BUILDERS.values():
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
