"""The per-replica drill-down and the "what to do" dashboards (grafana/build.py writes them).

- `replicas` (headroom-replicas): one pool's replicas, chosen with the `replica` variable: active,
  queued, KV live (with its band) vs capacity, latency at load vs the pool, up, stalled, slow, KV
  capacity changes, the pool's lead time, and the metric families a replica's target lacks. The pool
  panels of headroom-fleet-capacity link here (blocks.replicas_link) with the pool filled in.
- `actions` (headroom-actions): what an SRE acts on: recommended replicas beside replicas running,
  time to exhaustion against the lead time, the gateway queue beside the engine queue, load shed by
  reason, knee source and confidence, and GPU-hours and cost per 1,000 tasks from the prices typed
  into the dashboard's variables.
"""
from __future__ import annotations

from blocks import (
    HA_LABELS,
    M,
    P,
    R,
    by_name,
    dashboard,
    engine,
    replica_variable,
    row,
    stat,
    table,
    target,
    target_variable,
    timeseries,
)
from edges import replica_tiers

DASH = ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})
NO_FILL = ("custom.fillOpacity", 0)


def _stacked_per_replica(title: str, family: str, description: str) -> dict:
    """One series per replica of the chosen ones, stacked: the pool's total is the top line."""
    return timeseries(title, [target(f"{family}{{{R}}}", "{{replica}}")], description=description, stack=True)


def replicas() -> dict:
    rt = 'target=~"$replica"'  # a replica is its engine target (the /metrics URL)
    panels = [
        row("Replicas of $pool"),
        timeseries("Replica up", [target(f"headroom_replica_up{{{R}}}", "{{replica}}")], min_=0, w=8,
                   description="1 when the replica answered in the last cycle."),
        timeseries("Replica stalled or slow", [
            target(f"headroom_replica_stalled{{{R}}}", "{{replica}} stalled"),
            target(f"headroom_replica_slow{{{R}}}", "{{replica}} slow"),
        ], min_=0, w=8, description="Stalled: holds work, completes none (HeadroomReplicaStalled; left out of the "
                                    "pool's capacity). Slow: latency at its load well above the pool's "
                                    "(HeadroomReplicaSlow)."),
        timeseries("Latency at load vs the pool", [
            target(f"headroom_replica_latency_ratio{{{R}}}", "{{replica}}"),
        ], w=8, description="The replica's latency at its load over its pool's; 1 = like the rest of the pool.",
            thresholds=[(None, "green"), (1.5, "orange"), (2, "red")], show_thresholds=True, min_=0),
        _stacked_per_replica("Active requests per replica", "headroom_replica_active_requests",
                             "Requests in each replica's running batch."),
        _stacked_per_replica("Queued requests per replica", "headroom_replica_queued_requests",
                             "Requests waiting in each replica's engine queue."),
        timeseries("KV cache per replica: live vs capacity", [
            target(f"headroom_replica_kv_tokens{{{R}}}", "{{replica}} live"),
            target(f"headroom_replica_kv_tokens_low{{{R}}}", "{{replica}} live, low"),
            target(f"headroom_replica_kv_tokens_high{{{R}}}", "{{replica}} live, high (block usage)"),
            target(f"headroom_replica_kv_capacity_tokens{{{R}}}", "{{replica}} capacity"),
        ], description="headroom's estimate of live KV tokens with its band, against the replica's KV capacity.",
            overrides=[by_name(".* capacity$", DASH, NO_FILL)]),
        replica_tiers(),
        timeseries("KV capacity changes per replica", [
            target(f"sum by (pool, replica) (max without ({HA_LABELS}) "
                   f"(increase(headroom_replica_kv_capacity_changes_total{{{R}}}[1h])))", "{{replica}}",
                   dedup_ha=False),
        ], description="KV capacity changes seen in the last hour (a restart with other settings, a resized cache).",
            min_=0, w=8),
        timeseries("Lead time of a new replica", [
            target(f"headroom_replica_lead_time_seconds{{{P}}}", "{{pool}}"),
        ], unit="s", w=8, description="How long a new replica takes to serve (configured, else measured)."),
        timeseries("Metric families missing per replica", [
            target(f'headroom_source_missing_families{{source="vllm",{rt}}}', "{{target}}"),
        ], min_=0, w=8, description="Contract families an answering target did not expose (HeadroomMetricsMissing)."),
        table("Which families are missing", [
            target(f'headroom_source_missing_family_info{{source="vllm",{rt}}}', "", instant=True, table=True),
        ], description="One row per family a replica's target lacks (renamed in a new engine version, or turned off).",
            w=24, h=6),
    ]
    return dashboard("replicas", "headroom / Replicas",
                     "One pool's replicas: load, KV cache, latency at load, up, stalled, slow, lead time, missing "
                     "metrics. Reached from the pool panels of headroom / Fleet capacity.", panels, [replica_variable()])


def _shed_share() -> str:
    shed = f"sum by (pool) (headroom_shed_requests_rate{{{P}}})"
    return f"{shed} / ({shed} + sum by (pool) (headroom_completion_rate{{{P}}}))"


def actions() -> dict:
    gpus = f"headroom_replicas{{{P}}} * $gpus_per_replica"
    tasks_per_s = f"sum by (pool) (headroom_task_arrival_rate{{{P}}})"
    panels = [
        row("Replicas to run"),
        timeseries("Recommended vs running replicas", [
            target(f"headroom_recommended_replicas{{{P}}}", "{{pool}} recommended ({{horizon}})"),
            target(f"headroom_replicas{{{P}}}", "{{pool}} running"),
            target(f"headroom_replicas_configured{{{P}}}", "{{pool}} configured"),
        ], description="Fewest replicas whose knee capacity, with one replica lost, covers the forecast's 95% upper "
                       "band over each horizon, beside the replicas answering now.",
            overrides=[by_name(".* recommended .*", DASH, NO_FILL)], w=12),
        timeseries("Time to exhaustion vs lead time", [
            target(f"headroom_exhaustion_seconds{{{P}}}", "{{pool}} to exhaustion"),
            target(f"headroom_replica_lead_time_seconds{{{P}}}", "{{pool}} lead time of a new replica"),
        ], unit="s", description="Act before the first line falls below the second: a replica started then still "
                                 "arrives in time (HeadroomExhaustionWithinLeadTime).",
            overrides=[by_name(".* lead time .*", DASH, NO_FILL)], w=12),
        timeseries("Gateway queue vs engine queue", [
            target(f"sum by (pool) (headroom_gateway_queued_requests{{{P}}})", "{{pool}} queued at the gateway"),
            target(f'headroom_queued_requests{{where!="gateway",{P}}}', "{{pool}} queued in the engines"),
            *engine(f"pool:vllm_num_requests_waiting:sum{{{M}}}", f"pool:sglang_num_queue_reqs:sum{{{M}}}",
                   "{{model_name}} queued in the engines"),
            target(f"headroom_queued_requests_by_reason{{{P}}}", "{{pool}} queued: {{reason}}"),
        ], description="What waits in front of the engines, by source: a router's or gateway's queue (llm-d, inference "
                       "gateway, Dynamo), or a gateway's requests in flight beyond the engines' running + waiting "
                       "(LiteLLM); beside the engines' own queue, by reason where the engine says (capacity, deferred).",
            w=12),
        timeseries("What the gateway adds to a call", [
            target(f'headroom_gateway_added_latency_seconds{{q="mean",{P}}}', "{{pool}} mean"),
            target(f'headroom_gateway_added_latency_seconds{{q="0.95",{P}}}', "{{pool}} p95 less p95"),
        ], unit="s", description="The gateway's call latency less the engines' end-to-end latency: its queue, a "
                                 "starved front end, the network (headroom_gateway_added_latency_seconds).", w=12),
        timeseries("Offered vs served load", [
            target(f"headroom_offered_requests{{{P}}}", "{{pool}} offered"),
            target(f"headroom_active_requests{{{P}}}", "{{pool}} served (active)"),
            target(f"headroom_knee_requests{{{P}}}", "{{pool}} knee"),
        ], description="Offered = served active requests plus shed arrivals x their mean service time: the load "
                       "the pool would carry had nothing been turned away.",
            overrides=[by_name(".* knee$", DASH, NO_FILL)], w=12),
        row("Shed load"),
        timeseries("Requests shed per second by reason", [
            target(f"headroom_shed_requests_rate{{{P}}}", "{{pool}} {{reason}}"),
        ], unit="reqps", stack=True, description="Turned away: rejected (engine admission), aborted (given up while "
                                                 "queued), gateway_rate_limited (429), gateway_error (5xx), "
                                                 "gateway_timeout."),
        timeseries("Share of arrivals shed", [target(_shed_share(), "{{pool}}")], unit="percentunit", min_=0,
                   description="Shed / (shed + completed); HeadroomLoadShed fires above 5% for 5 minutes.",
                   thresholds=[(None, "green"), (0.05, "red")], show_thresholds=True),
        row("Knee"),
        table("Knee source and signal", [
            target(f"headroom_knee_info{{{P}}}", "", instant=True, table=True),
        ], description="learned (fitted on the pool's own latency) or prior (configured); the signal it was found on.",
            w=8),
        timeseries("Knee confidence", [target(f"headroom_knee_confidence_ratio{{{P}}}", "{{pool}}"),
                                        target(f"headroom_knee_implausible{{{P}}}", "{{pool}} implausible")],
                   unit="percentunit", min_=0, w=8,
                   description="Confidence of the learned knee fit; 0 for a prior (HeadroomKneeConfidenceLost). "
                               "'implausible' at 100%: a learned knee was refused or withdrawn (HeadroomKneeImplausible).",
                   thresholds=[(None, "red"), (0.3, "orange"), (0.6, "green")], show_thresholds=True),
        timeseries("Knee in KV tokens", [
            target(f"headroom_knee_kv_tokens{{{P}}}", "{{pool}} at knee"),
            target(f"headroom_kv_tokens{{{P}}}", "{{pool}} live"),
        ], w=8, description="Live KV tokens at the knee, beside live KV tokens now."),
        row("Cost"),
        stat("GPU-hours in the range", [
            target(f"max without ({HA_LABELS}) (avg_over_time(headroom_replicas{{{P}}}[$__range])) "
                   "* $__range_s / 3600 * $gpus_per_replica", "{{pool}}", instant=True, dedup_ha=False),
        ], unit="short", decimals=1, w=8,
            description="Mean replicas answering over the time range x its hours x GPUs per replica."),
        timeseries("Cost per hour", [target(f"{gpus} * $gpu_hour_price", "{{pool}}")], unit="currencyUSD", w=8,
                   description="GPUs in use x the GPU-hour price (variables; digest.prices.gpu_hour)."),
        timeseries("Cost per 1,000 tasks", [
            target(f"{gpus} * $gpu_hour_price / ({tasks_per_s} * 3600) * 1000", "{{pool}}"),
        ], unit="currencyUSD", w=8, description="GPU cost per hour over tasks started per hour, x 1,000."),
    ]
    variables = [
        target_variable("gpu_hour_price", "GPU-hour price", "2.5", "price of one GPU-hour (digest.prices.gpu_hour)"),
        target_variable("gpus_per_replica", "GPUs per replica", "1", "GPUs of one replica (pools.<pool>.gpus_per_replica)"),
    ]
    return dashboard("actions", "headroom / What to do",
                     "What to act on: replicas to run, time to exhaustion against the lead time, queues, shed load, "
                     "knee confidence, GPU-hours and cost.", panels, variables)
