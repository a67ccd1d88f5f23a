"""sources.alerts: headroom's alerts read from a Prometheus or an Alertmanager answer, and shown on the
landing page and in /api/v1/snapshot. The answers follow the documented shapes of Prometheus
`/api/v1/alerts` and Alertmanager `/api/v2/alerts`; the live proof is tests/lab/test_demo.py (the demo's
real Prometheus)."""
import json

import pytest

from monitor.config import ConfigError, from_dict
from monitor.export.landing import Trends, render
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import PoolSnapshot, Snapshot
from monitor.sources.alerts import api_url, read_alerts, ui_url

PROM = {"status": "success", "data": {"alerts": [
    {"labels": {"alertname": "HeadroomLow", "pool": "meta-llama/Llama-3.1-8B-Instruct", "severity": "warning",
                "job": "headroom"},
     "annotations": {"summary": "Capacity headroom is low.", "description": "..."},
     "state": "firing", "activeAt": "2026-12-03T09:05:30.123456789Z", "value": "-4.2e-02"},
    {"labels": {"alertname": "HeadroomQueueBuilding", "pool": "meta-llama/Llama-3.3-70B-Instruct",
                "severity": "warning"},
     "annotations": {"summary": "Requests are queueing."}, "state": "pending",
     "activeAt": "2026-12-03T09:06:00Z", "value": "12"},
    {"labels": {"alertname": "Watchdog", "severity": "none"}, "annotations": {}, "state": "firing",
     "activeAt": "2026-12-03T00:00:00Z", "value": "1"},
    {"labels": {"alertname": "HeadroomSourceDown"}, "state": "inactive"},
]}}

AM = [
    {"labels": {"alertname": "HeadroomCriticallyLow", "pool": "p", "severity": "critical"},
     "annotations": {"summary": "Capacity headroom is nearly gone."}, "startsAt": "2026-12-03T09:07:00.5+00:00",
     "status": {"state": "active", "silencedBy": [], "inhibitedBy": []}},
    {"labels": {"alertname": "HeadroomLow", "pool": "p"}, "annotations": {},
     "startsAt": "2026-12-03T09:00:00Z", "status": {"state": "suppressed", "silencedBy": ["x"]}},
]


def test_prometheus_answer_keeps_headroom_alerts_firing_first():
    alerts, cut = read_alerts(json.dumps(PROM), "prometheus")
    assert cut == 0
    assert [(a.name, a.state) for a in alerts] == [("HeadroomLow", "firing"), ("HeadroomQueueBuilding", "pending")]
    low = alerts[0]
    assert low.pool == "meta-llama/Llama-3.1-8B-Instruct" and low.severity == "warning"
    assert low.summary == "Capacity headroom is low."
    assert low.since == pytest.approx(1796288730.123456, abs=1e-5)  # nanoseconds cut to microseconds


def test_alertmanager_answer_keeps_active_only():
    alerts, _ = read_alerts(json.dumps(AM), "alertmanager")
    assert [(a.name, a.state, a.pool) for a in alerts] == [("HeadroomCriticallyLow", "firing", "p")]
    assert alerts[0].since == pytest.approx(1796288820.5)


@pytest.mark.parametrize("body,kind,match", [
    ("<html>", "prometheus", "not JSON"),
    (json.dumps({"status": "error", "error": "x"}), "prometheus", "status != success"),
    (json.dumps({"status": "success", "data": {}}), "prometheus", "data.alerts"),
    (json.dumps({"alerts": []}), "alertmanager", "Alertmanager v2 alert list"),
    ("[]", "nagios", "unknown alerts source kind"),
])
def test_bad_answers_name_the_problem(body, kind, match):
    with pytest.raises(ValueError, match=match):
        read_alerts(body, kind)


def test_a_flood_is_cut_and_counted():
    many = {"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "HeadroomLow", "pool": f"p{i}"}, "state": "firing"} for i in range(250)]}}
    alerts, cut = read_alerts(json.dumps(many), "prometheus")
    assert len(alerts) == 200 and cut == 50


def test_urls_and_config():
    assert api_url("http://prom:9090/", "prometheus") == "http://prom:9090/api/v1/alerts"
    assert api_url("http://am:9093", "alertmanager") == "http://am:9093/api/v2/alerts"
    assert ui_url("http://am:9093", "alertmanager") == "http://am:9093/#/alerts"
    base = {"sources": {"vllm": {"targets": ["http://a:1/metrics"]}}}
    cfg = from_dict({**base, "sources": {**base["sources"], "alerts": {"url": "http://am:9093", "kind": "alertmanager"}}})
    assert cfg.alerts.kind == "alertmanager"
    with pytest.raises(ConfigError, match="sources.alerts.kind"):
        from_dict({**base, "sources": {**base["sources"], "alerts": {"url": "http://x", "kind": "opsgenie"}}})


def _snapshot(alerts):
    pool = PoolSnapshot(pool="meta-llama/Llama-3.1-8B-Instruct", model="m", replicas=1, replicas_configured=1)
    return Snapshot(timestamp=1796289000.0, pools=[pool], alerts=alerts, alerts_ui="http://prom:9090/alerts")


def test_landing_page_and_json_show_the_alerts():
    alerts, _ = read_alerts(json.dumps(PROM), "prometheus")
    snap = _snapshot(alerts)
    page = render(snap, Trends(), links=(("Prometheus <alerts>", "http://prom:9090/alerts"),), has_alerts_source=True)
    assert "1 firing, 1 pending" in page
    assert "<b>HeadroomLow</b> firing for 4 min · warning · pool meta-llama/Llama-3.1-8B-Instruct" in page
    assert "alert firing</span>" in page  # the pool's card carries the badge
    assert 'href="http://prom:9090/alerts">all alerts</a>' in page
    assert "Prometheus &lt;alerts&gt;" in page  # labels are escaped
    doc = snapshot_to_dict(snap)
    assert doc["alerts"][0] == {"alertname": "HeadroomLow", "state": "firing", "severity": "warning",
                                "pool": "meta-llama/Llama-3.1-8B-Instruct", "summary": "Capacity headroom is low.",
                                "since": pytest.approx(1796288730.123456, abs=1e-5)}


def test_landing_page_without_alerts_says_why():
    assert "No alerts source: set sources.alerts" in render(_snapshot(None), Trends())
    assert "did not answer this cycle" in render(_snapshot(None), Trends(), has_alerts_source=True)
    assert "No headroom alert is firing." in render(_snapshot([]), Trends(), has_alerts_source=True)


def test_the_chart_keeps_at_most_180_points_and_the_last():
    from monitor.export.landing import MAX_CHART_POINTS, _svg
    points = [(1000.0 + 60 * k, float(k), 0.0, 0.0) for k in range(361)]
    svg = _svg(points, knee=300.0)
    active = svg.split('<polygon points="')[2].split('"')[0].split()
    assert len(active) - 2 <= MAX_CHART_POINTS + 1  # the series, then the two base corners
    assert active[-3] == "555.0,20.9"  # the newest point (value 360, the top / 1.1) at the right edge


def test_digest_route_serves_the_newest_week_only(tmp_path):
    from monitor.export.server import latest_digest
    assert latest_digest(None).status == 404
    assert latest_digest(str(tmp_path)).status == 404  # nothing written yet
    for week, text in (("2026-W47", "old"), ("2026-W49", "new"), ("notes", "x")):
        (tmp_path / week).mkdir()
        (tmp_path / week / "digest.html").write_text(f"<p>{text}</p>")
    (tmp_path / "2026-W50").mkdir()  # a week being written: no digest.html yet
    r = latest_digest(str(tmp_path))
    assert r.status == 200 and r.body == b"<p>new</p>" and r.content_type.startswith("text/html")


def test_the_landing_page_links_the_digest_when_one_is_written(tmp_path):
    from monitor.app import digest_directory
    from monitor.config import from_dict
    base = {"sources": {"vllm": {"targets": ["http://a:1/metrics"]}}, "store": {"path": str(tmp_path / "h.db")}}
    assert digest_directory(from_dict(base)) is None
    cfg = from_dict({**base, "digest": {"destinations": [{"type": "directory", "path": str(tmp_path / "d")}]}})
    assert digest_directory(cfg) == str(tmp_path / "d")


@pytest.mark.parametrize("kind, wrap", [("prometheus", lambda deep: {"status": "success", "data": deep}),
                                        ("alertmanager", lambda deep: [deep])])
def test_a_deeply_nested_answer_is_a_parse_error_not_a_stop(kind, wrap):
    deep = "[" * 100_000 + "]" * 100_000  # json.loads raised RecursionError, which stopped every cycle
    body = json.dumps(wrap("DEEP")).replace('"DEEP"', deep)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_alerts(body, kind)


def test_any_other_failure_reading_the_answer_is_a_value_error(monkeypatch):
    import monitor.sources.alerts as source

    def broken(value):
        raise TypeError("unexpected type")
    monkeypatch.setattr(source, "_when", broken)
    with pytest.raises(ValueError, match="alerts answer could not be read: TypeError: unexpected type"):
        read_alerts(json.dumps(PROM), "prometheus")


def _flood(n, summary_bytes, label_bytes=0):
    return {"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "HeadroomLow", "pool": "meta-llama/Llama-3.1-8B-Instruct", "severity": "warning",
                    "n": str(i), "junk": "j" * label_bytes},
         "annotations": {"summary": "s" * summary_bytes, "description": "d" * summary_bytes},
         "state": "firing", "activeAt": "2026-12-03T09:05:30Z"} for i in range(n)]}}


def test_big_alert_text_is_cut_per_alert_and_per_page():
    from monitor.sources.alerts import CUT_MARK, MAX_PAGE_TEXT, MAX_TEXT
    body = json.dumps(_flood(200, 100_000, label_bytes=5_000))  # 200 alerts, 40 MB of text
    alerts, cut = read_alerts(body, "prometheus")
    for a in alerts:
        assert len(a.summary) == MAX_TEXT and a.summary.endswith(CUT_MARK)
        assert sum(len(k) + len(v) for k, v in a.labels.items()) <= MAX_TEXT and "junk" not in a.labels
    text = sum(len(a.name) + len(a.summary) + sum(len(k) + len(v) for k, v in a.labels.items()) for a in alerts)
    assert 0 < len(alerts) < 200 and text <= MAX_PAGE_TEXT
    # every alert left out for the page's budget, and every one kept (each had its text cut)
    assert cut == 200
    snap = _snapshot(alerts)
    snap.anomalies["alerts_cut"] = float(cut)  # what the cycle counts (monitor/pipeline/cycle.py)
    page = render(snap, Trends(), has_alerts_source=True)
    assert f"{cut:,} alerts or alert texts cut since start" in page
    assert len(page.encode()) < 8 * MAX_PAGE_TEXT  # was the whole 40 MB, once per view
    doc = snapshot_to_dict(snap)
    assert doc["alerts_cut_total"] == float(cut) and len(json.dumps(doc)) < 2 * MAX_PAGE_TEXT


def test_small_answers_are_not_cut():
    alerts, cut = read_alerts(json.dumps(_flood(3, 200)), "prometheus")
    assert cut == 0 and len(alerts) == 3 and alerts[0].summary == "s" * 200
    assert "cut since start" not in render(_snapshot(alerts), Trends(), has_alerts_source=True)


def test_the_cycle_marks_a_deeply_nested_answer_as_a_parse_error():
    from monitor.config.inputs import pipeline_settings
    from monitor.model import SourceStatus
    from monitor.pipeline.cycle import Pipeline
    from monitor.step.cycle_state import CycleInputs
    cfg = from_dict({"sources": {"vllm": {"targets": ["http://a:1/metrics"]},
                                 "alerts": {"url": "http://prom:9090", "kind": "prometheus"}}})
    pipeline = Pipeline(pipeline_settings(cfg))
    inputs = CycleInputs(readings=[], statuses=[SourceStatus("alerts", "http://prom:9090/api/v1/alerts", True)])
    pipeline.aux._read_alerts(inputs, '{"status": "success", "data": ' + "[" * 100_000 + "]" * 100_000 + "}",
                              "http://prom:9090/api/v1/alerts")  # the cycle's own reading of the body
    assert inputs.alerts is None
    assert (inputs.statuses[-1].up, inputs.statuses[-1].error) == (False, "parse")
    assert inputs.statuses[-1].detail == "alerts answer is nested too deeply to read"
    pipeline.close()


def test_a_flood_of_90000_small_alerts_is_read_up_to_the_item_cap_and_the_cut_said():
    """90,000 small alerts of anyone's (an 8 MB answer under the byte cap) took 3.5 s to read, on the
    cycle thread: only the first MAX_ITEMS of the list are looked at, and the cut is said."""
    from monitor.sources.alerts import MAX_ITEMS
    items = [{"labels": {"alertname": "HeadroomLow", "pool": "p"}, "state": "firing"}]
    items += [{"labels": {"alertname": f"Other{i}"}, "state": "firing"} for i in range(90_000)]
    items.append({"labels": {"alertname": "HeadroomQueueBuilding", "pool": "q"}, "state": "firing"})
    cut: list = []
    alerts, _ = read_alerts(json.dumps({"status": "success", "data": {"alerts": items}}), "prometheus", cut)
    assert [a.name for a in alerts] == ["HeadroomLow"] and cut == [True] and MAX_ITEMS < 90_000
    cut = []
    read_alerts(json.dumps(PROM), "prometheus", cut)
    assert cut == []
def test_only_this_jobs_alerts_are_listed():
    """A direct-mode and a Prometheus-mode daemon watch the same pool through one Prometheus: with
    sources.alerts.match {job: headroom-direct}, the other job's HeadroomLow for the same pool is not
    shown; an alert without a job label (a vLLM rule's) is kept."""
    pool = "meta-llama/Llama-3.1-8B-Instruct"
    answer = {"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "HeadroomLow", "pool": pool, "job": "headroom-direct"}, "state": "firing",
         "activeAt": "2026-12-03T09:05:30Z"},
        {"labels": {"alertname": "HeadroomCriticallyLow", "pool": pool, "job": "headroom-prom"},
         "state": "firing", "activeAt": "2026-12-03T09:05:30Z"},
        {"labels": {"alertname": "HeadroomQueueBuilding", "pool": pool}, "state": "pending",
         "activeAt": "2026-12-03T09:06:00Z"}]}}
    from monitor.config.inputs import pipeline_settings
    from monitor.model import SourceStatus
    from monitor.pipeline.cycle import Pipeline
    from monitor.step.cycle_state import CycleInputs
    cfg = from_dict({"sources": {"vllm": {"targets": ["http://a:1/metrics"]},
                                 "alerts": {"url": "http://prom:9090", "match": {"job": "headroom-direct"}}}})
    assert cfg.alerts.match == {"job": "headroom-direct"}
    pipeline = Pipeline(pipeline_settings(cfg))
    try:
        inputs = CycleInputs(readings=[], statuses=[SourceStatus("alerts", "http://prom:9090/api/v1/alerts", True)])
        pipeline.aux._read_alerts(inputs, json.dumps(answer), "http://prom:9090/api/v1/alerts")
    finally:
        pipeline.close()
    assert [a.name for a in inputs.alerts] == ["HeadroomLow", "HeadroomQueueBuilding"]
    page = render(_snapshot(inputs.alerts), Trends(), has_alerts_source=True)
    assert "HeadroomCriticallyLow" not in page and "1 firing, 1 pending" in page
    unfiltered = from_dict({"sources": {"vllm": {"targets": ["http://a:1/metrics"]},
                                        "alerts": {"url": "http://prom:9090"}}})
    assert unfiltered.alerts.match == {}


def _at(t: float, ratio: float) -> Snapshot:
    from monitor.model import Capacity, Scenarios
    pool = PoolSnapshot(pool="p", model="m", replicas=2, replicas_configured=2, active_requests=4.0,
                        capacity=Capacity(ratio=Scenarios(ratio, ratio - 0.5)))
    return Snapshot(timestamp=t, pools=[pool], alerts=[])


def test_the_headline_is_the_median_the_alerts_judge_with_the_instant_value_labelled():
    """Tool waits swing the instant headroom: five cycles near +69 % and a last one at -84 %. The
    capacity alerts judge the 5-minute median (+69 %), so the headline shows that, the instant -84 %
    beside it, labelled; the card is not marked bad by one cycle."""
    trends, t0 = Trends(), 1796289000.0
    for i, r in enumerate((0.70, 0.69, 0.68, 0.70, 0.69, -0.84)):
        snap = _at(t0 + 60 * i, r)
        trends.add(snap)
    page = render(snap, trends, has_alerts_source=True)
    assert '<b class="ok">69%</b><span>headroom, median of the last 5 min: the window the capacity alerts judge' in page
    assert "now (instant): -84%" in page and "N-1 now: -134%" in page
    # older samples leave the window: the median follows the last 5 minutes only
    for i in range(6, 12):
        snap = _at(t0 + 60 * i, -0.84)
        trends.add(snap)
    assert '<b class="bad">-84%</b>' in render(snap, trends)
    # the first cycles: a median of what there is, said so
    fresh = Trends()
    fresh.add(_at(t0, 0.2))
    fresh.add(_at(t0 + 15, 0.3))
    assert "median of the 2 cycles so far (0 of 5 min)" in render(_at(t0 + 15, 0.3), fresh)


def test_no_negative_zero_on_the_page_or_in_the_json():
    from monitor.kit.numbers import fixed, unsigned
    assert fixed(-0.004, ".2f") == "0.00" and fixed(-0.0, ".1f") == "0.0" and fixed(-0.2, ".0f") + "%" == "0%"
    assert fixed(-0.05, ".2f") == "-0.05" and fixed(float("-inf"), ".1f") == "-inf"
    assert str(unsigned(-0.0)) == "0.0" and unsigned(-1.5) == -1.5 and unsigned(None) is None
    page = render(_at(1796289000.0, -0.0), Trends())
    assert "-0%" not in page and "0%" in page
    doc = json.dumps(snapshot_to_dict(_at(1796289000.0, -0.0)))
    assert "-0.0" not in doc
    from monitor.export.collector import Exposition
    exp = Exposition()
    exp.update(_at(1796289000.0, -0.0))
    body = exp.body().decode()
    assert 'headroom_ratio{pool="p",scenario="current"} 0.0' in body and " -0.0\n" not in body


def test_the_first_cycle_says_its_median_is_of_one_cycle():
    trends = Trends()
    snap = _at(1796289000.0, 0.4)
    trends.add(snap)
    assert "<b class=\"ok\">40%</b><span>headroom, median of the 1 cycle so far (0 of 5 min)" in render(snap, trends)


def test_another_jobs_alerts_never_take_this_daemons_places_under_the_caps():
    # review of the merge: the caps (MAX_ALERTS) were spent before another job's alerts were left out,
    # so 300 of another job's could push this daemon's own HeadroomLow off the page
    from monitor.sources.alerts import MAX_ALERTS
    other = [{"labels": {"alertname": "HeadroomAboveKnee", "pool": f"p{i:03d}", "job": "other"}, "state": "firing"}
             for i in range(MAX_ALERTS + 100)]
    mine = [{"labels": {"alertname": "HeadroomLow", "pool": "z", "job": "mine"}, "state": "firing"}]
    answer = json.dumps({"status": "success", "data": {"alerts": other + mine}})
    alerts, cut = read_alerts(answer, "prometheus", match={"job": "mine"})
    assert [(a.name, a.pool) for a in alerts] == [("HeadroomLow", "z")] and cut == 0
    unfiltered, cut = read_alerts(answer, "prometheus")
    assert len(unfiltered) == MAX_ALERTS and cut == 101
