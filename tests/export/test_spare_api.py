"""A pool's spare capacity from its snapshot (monitor/capacity/spare_pool.py) and /api/v1/spare.

The pool: knee 10, margin 0.2 (ceiling 8); load now 5.0 of which the deferrable task type `digest`
holds 0.5 calls/s x 2 s = 1.0, so the interactive load is 4.0; the forecast is the hand-computed one
of tests/core/test_spare.py (hours holding 4, 5, 2, 0, 5, 7)."""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from monitor.capacity.spare_pool import SpareSettings, deferrable_load, spare_for
from monitor.export.collector import Exposition
from monitor.export.landing import Trends
from monitor.export.samples import snapshot_samples
from monitor.export.server import WebState, handle
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.kit.web.http11 import Request
from monitor.model import Capacity, Limits, PoolSnapshot, PoolTasks, Quantiles, Snapshot, TaskStats

NOW = 1_800_000_000.0
H = 3600.0
DAY = 86400.0


def forecast(fit=NOW - 60):
    ts = np.array([NOW + H * k for k in range(0, 6)])
    path = SimpleNamespace(timestamps=ts, upper=np.array([2.5, 2.5, 5.2, 7.9, 3.0, 1.0]))
    return SimpleNamespace(path=path, last_fit_timestamp=fit, horizons={}, exhaustion_seconds=None, as_dict=lambda: {})


def pool(name="chat", **kw) -> PoolSnapshot:
    tasks = PoolTasks(by_type={
        "digest": TaskStats("digest", call_rate=0.5, call_latency=Quantiles(mean=2.0), call_class="deferrable"),
        "policy_question": TaskStats("policy_question", call_rate=3.0, call_latency=Quantiles(mean=1.0))})
    p = PoolSnapshot(pool=name, model="m", replicas=2, active_requests=5.0, queued_requests=0.0,
                     capacity=Capacity(knee_requests=10.0, capacity_requests=Limits(knee=10.0, effective=10.0),
                                       load_requests=5.0),
                     tasks=tasks, forecast=forecast())
    for k, v in kw.items():
        setattr(p, k, v)
    p.spare = spare_for(p, SpareSettings(), NOW)
    return p


def test_deferrable_load_is_littles_law_over_the_deferrable_task_types():
    p = pool()
    assert deferrable_load(p) == pytest.approx(1.0)
    assert p.spare.interactive_requests == pytest.approx(4.0)
    assert p.spare.requests["now"] == 4.0 and p.spare.budget_ratio == pytest.approx(0.5)


def test_deferrable_load_from_the_engines_priority_bands_where_no_task_type_says():
    """SGLang with priority scheduling (monitor/sources/sglang.py): 7 running at priority 0, 1 at 5.
    With capacity.deferrable_priorities ["5"] and no task types known, 1 request is deferrable; the
    interactive load is the other 4 of the pool's 5, and the task types win where they are known."""
    p = pool(tasks=None, active_by_priority={"0": 7.0, "5": 1.0})
    assert deferrable_load(p) is None and deferrable_load(p, ("5",)) == 1.0
    p.spare = spare_for(p, SpareSettings(deferrable_priorities=("5",)), NOW)
    assert p.spare.deferrable_requests == 1.0 and p.spare.interactive_requests == pytest.approx(4.0)
    assert deferrable_load(pool(active_by_priority={"5": 3.0}), ("5",)) == pytest.approx(1.0)


def test_over_slo_now_closes_the_budget():
    c = replace(pool().capacity, capacity_requests=Limits(knee=10.0, slo=3.0, effective=3.0))
    p = pool(capacity=c)
    assert p.spare.budget_ratio == 0.0 and p.spare.reason.startswith("over SLO")


def test_a_stale_pool_exports_budget_0_and_no_spare_requests():
    p = pool(stale=True)
    samples = snapshot_samples(Snapshot(timestamp=NOW, pools=[p]))
    assert samples["headroom_deferrable_budget_ratio"] == [({"pool": "chat"}, 0.0)]
    assert "headroom_spare_requests" not in samples


def test_exported_figures_and_snapshot_windows():
    snap = Snapshot(timestamp=NOW, pools=[pool("a"), pool("b")])
    samples = snapshot_samples(snap)
    spare = {(lab["pool"], lab["horizon"]): v for lab, v in samples["headroom_spare_requests"]}
    assert spare[("a", "now")] == 4.0 and spare[("a", "6h")] == 0.0 and ("a", "1d") not in spare
    assert ({"pool": "b"}, 1.0) in samples["headroom_deferrable_requests"]
    doc = snapshot_to_dict(snap)
    assert doc["pools"][0]["spare"]["windows_24h"][0] == {"start": NOW, "end": NOW + H, "requests": 4.0}
    assert doc["spare"]["requests"]["now"] == 8.0 and doc["spare"]["pools"] == 2
    json.dumps(doc, allow_nan=False)


def get(state: WebState, target: str) -> tuple[int, dict]:
    r = handle(state, Request("GET", target, target.split("?")[0], "HTTP/1.1", {}))
    return r.status, json.loads(r.body)


@pytest.fixture()
def state() -> WebState:
    s = WebState(Exposition(), Trends())
    s.publish(Snapshot(timestamp=NOW, pools=[pool("chat"), pool("old", stale=True)]))
    return s


def test_spare_api_earliest_window(state):
    status, body = get(state, "/api/v1/spare?pool=chat&requests=5&hours=2")
    assert status == 200 and body["fits"] is True
    assert body["window"] == {"start": NOW + 4 * H, "end": NOW + 6 * H, "requests": 5.0}


def test_spare_api_none_in_the_horizon_with_the_largest(state):
    status, body = get(state, "/api/v1/spare?pool=chat&requests=9&hours=3")
    assert status == 200 and body["fits"] is False and body["reason"] == "none in the horizon"
    assert body["largest_requests"] == 2.0 and body["largest_window"]["start"] == NOW


def test_spare_api_stale_pool_promises_nothing(state):
    status, body = get(state, "/api/v1/spare?pool=old&requests=1&hours=1")
    assert status == 200 and body["fits"] is False and body["reason"].startswith("stale")


@pytest.mark.parametrize("query, named", [
    ("requests=1&hours=1", "'pool'"),
    ("pool=nope&requests=1&hours=1", "'pool'"),
    ("pool=chat&requests=x&hours=1", "'requests'"),
    ("pool=chat&requests=-1&hours=1", "'requests'"),
    ("pool=chat&requests=1&hours=0", "'hours'"),
    ("pool=chat&requests=1&hours=200", "'hours'"),
    ("pool=chat&requests=1&hours=nan", "'hours'"),
    ("pool=chat&requests=1&requests=2&hours=1", "'requests'"),
    ("pool=chat&requests=1&hours=1&when=now", "'when'"),
])
def test_spare_api_bad_parameters_are_400_naming_it(state, query, named):
    status, body = get(state, "/api/v1/spare?" + query)
    assert status == 400 and named in body["error"]


def test_landing_page_shows_the_24_hour_strip():
    from monitor.export.landing import render
    page = render(Snapshot(timestamp=NOW, pools=[pool("chat"), pool("old", stale=True)]), Trends())
    assert page.count('aria-label="spare requests for deferrable work over the next 24 hours"') == 1
    assert page.count('fill="#2a9d8f"><title>') == 5  # the five windows (hours 1, 2, 3, 5, 6)
    assert "<b>4</b> now" in page and "budget 0.50" in page
    assert "Spare for deferrable work: not known (stale: the pool&#x27;s readings are stale)" in page


def test_the_strip_draws_at_most_48_bars_however_fine_the_forecast():
    """5-minute steps alternating 2 and 3 spare: 288 windows in the day, 48 half-hour columns of 2."""
    from monitor.capacity.spare import coarse
    from monitor.export.spare_strip import spare_strip
    ts = np.array([NOW + 300.0 * k for k in range(0, 288)])
    # ceiling 8: 3 and 2 spare; the first step is held to the load now (interactive 4, the band 5
    # less the deferrable 1 running: 4 spare), so no two neighbours are equal
    band = np.array([6.0 if k % 2 else 5.0 for k in range(288)])
    fc = SimpleNamespace(path=SimpleNamespace(timestamps=ts, upper=band), last_fit_timestamp=NOW - 60,
                         horizons={}, exhaustion_seconds=None, as_dict=lambda: {})
    p = pool(forecast=fc)
    assert len(p.spare.windows) == 288
    assert [(w.start, w.end, w.requests) for w in coarse(p.spare.windows, NOW, 1800.0, 48)] == [(NOW, NOW + DAY, 2.0)]
    doc = snapshot_to_dict(Snapshot(timestamp=NOW, pools=[p]))["pools"][0]["spare"]
    assert len(doc["windows_24h"]) == 288 and doc["windows_7d_hourly"] == [{"start": NOW, "end": NOW + DAY,
                                                                            "requests": 2.0}]
    assert spare_strip(p, NOW).count("<rect") == 2  # the background and one bar of 2
