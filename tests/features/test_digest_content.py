"""Digest content against the simulated history it was built from: the expected numbers are computed
here, independently, from the generator's DataFrame."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from headroom_lab.digest_demo import demo_input, demo_settings
from headroom_lab.sim.fleet import load_config
from monitor.config import ConfigError
from monitor.digest.charts import charts_for
from monitor.digest.content import WEEK, _recommend, build_digest, digest_week
from monitor.digest.outbox import Outbox
from monitor.digest.render import render_html, render_json, render_markdown, render_slack
from monitor.digest.settings import from_dict

WEEK_END = 1764547200.0  # Mon 2025-12-01 00:00 UTC


@pytest.fixture(scope="module")
def built():
    inp, df = demo_input(WEEK_END, days=21)
    settings = demo_settings()
    return build_digest(inp, settings), df, settings


def pool_of(digest, name):
    (p,) = [p for p in digest["pools"] if p["name"] == name]
    return p


def week_rows(df, pool, series):
    sub = df[(df["pool"] == pool) & (df["series"] == series) & (df["instance"] == "")]
    return sub[(sub["timestamp"] >= WEEK_END - 7 * 86400) & (sub["timestamp"] < WEEK_END)].sort_values("timestamp")


def test_week_and_identity(built):
    d, _, _ = built
    assert d["iso_week"] == "2025-W48" == digest_week(WEEK_END)
    assert d["week"]["start"] == WEEK_END - WEEK and d["week"]["end"] == WEEK_END
    assert [p["name"] for p in d["pools"]] == ["agent-70b", "chat-8b"]


@pytest.mark.parametrize("pool", ["chat-8b", "agent-70b"])
@pytest.mark.parametrize("series", ["active_requests", "queued_requests", "kv_tokens", "sessions"])
def test_last_week_peaks_match_the_simulated_history(built, pool, series):
    d, df, _ = built
    rows = week_rows(df, pool, series)
    assert len(rows) == 7 * 86400 // 300
    i = int(np.argmax(rows["value"].to_numpy()))
    peak = pool_of(d, pool)["peaks"][series]
    assert peak["value"] == pytest.approx(float(rows["value"].iloc[i]))
    assert peak["timestamp"] == float(rows["timestamp"].iloc[i])


@pytest.mark.parametrize("pool", ["chat-8b", "agent-70b"])
def test_load_peak_and_last_week_forecast_check(built, pool):
    d, df, _ = built
    a = week_rows(df, pool, "active_requests").set_index("timestamp")["value"]
    q = week_rows(df, pool, "queued_requests").set_index("timestamp")["value"]
    load = a + q
    p = pool_of(d, pool)
    assert p["peaks"]["load"]["value"] == pytest.approx(load.max())
    assert p["peaks"]["load"]["timestamp"] == float(load.idxmax())
    fl = p["forecast_last_week"]
    assert fl["defined"]
    assert fl["actual_peak"] == pytest.approx(load.max())  # hourly peaks keep the week's peak
    assert fl["error"] == pytest.approx(fl["forecast_peak"] - load.max())
    assert fl["error_ratio"] == pytest.approx(fl["error"] / load.max())
    lo80, hi80 = fl["interval80"]
    lo95, hi95 = fl["interval95"]
    assert lo95 <= lo80 <= fl["forecast_peak"] <= hi80 <= hi95
    for lv in ("0.8", "0.95"):
        assert 0.0 <= fl["coverage"][lv] <= 1.0
    assert fl["coverage"]["0.8"] <= fl["coverage"]["0.95"]


@pytest.mark.parametrize("pool", ["chat-8b", "agent-70b"])
def test_next_week_forecast_and_knee(built, pool):
    d, _, _ = built
    cfg = load_config(None)
    from headroom_lab.sim.fleet import theoretical_knee
    pp = cfg.pool(pool)
    knee = theoretical_knee(pp, cfg.mix)["per_replica"]
    p = pool_of(d, pool)
    assert p["knee"]["requests"] == pytest.approx(knee * pp.replicas)
    assert p["knee"]["requests_n_minus_1"] == pytest.approx(knee * (pp.replicas - 1))
    fn = p["forecast_next_week"]
    assert fn["defined"] and fn["model"] in ("mstl", "snaive_week")
    assert WEEK_END <= fn["peak_timestamp"] < WEEK_END + WEEK
    assert fn["interval95"][0] <= fn["interval80"][0] <= fn["peak"] <= fn["interval80"][1] <= fn["interval95"][1]
    assert fn["upper95_max"] >= fn["interval95"][1]
    ex = p["exhaustion"]
    if ex["seconds"] is not None and math.isfinite(ex["seconds"]):
        # the forecast's 95% bound first reaches the knee then
        t = p["_forecast_next"]["_times"]
        up = p["_forecast_next"]["_bands"][0.95][1]
        first = float(t[np.flatnonzero(up >= p["knee"]["requests"])[0]])
        assert ex["seconds"] == pytest.approx(first - WEEK_END)
    # headroom at last week's peak is 1 - load / knee capacity
    at_peak = p["capacity_at_peak"]
    assert at_peak["ratio"]["current"] == pytest.approx(1 - p["peaks"]["load"]["value"] / p["knee"]["requests"])


def test_recommendations_follow_the_upper_bound(built):
    d, _, _ = built
    for p in d["pools"]:
        r = p["recommendation"]
        per = p["knee"]["requests_per_replica"]
        need = math.ceil(p["forecast_next_week"]["upper95_max"] / per)
        assert r["replicas_needed"] == need
        if p["replicas"] < need:
            assert r["action"] == "add" and r["replicas_delta"] == need - p["replicas"]
            assert r["text"].startswith(f"Add {need - p['replicas']} replica")
        elif p["replicas"] == need:
            assert r["action"] == "add_for_n_minus_1"
        assert p["name"] in r["text"]
    assert d["recommendations"] == [p["recommendation"]["text"] for p in d["pools"]]


def test_recommend_rules_on_constructed_forecasts():
    t = WEEK_END + 3600.0 * np.arange(168)

    def fc(upper_peak, at_hour=33):
        up = np.full(168, upper_peak * 0.3)
        up[at_hour] = upper_peak
        return {"defined": True, "upper95_max": upper_peak, "upper80_max": upper_peak * 0.9,
                "_times": t, "_bands": {0.95: (up * 0, up), 0.8: (up * 0, up * 0.9)}}
    # 4 replicas x 100: 150 needs 2 (+1 for N-1) -> one can go
    r = _recommend("y", 4, 100.0, fc(150.0), 0.95, "UTC")
    assert r["action"] == "remove" and r["replicas_delta"] == -1 and "can lose a replica" in r["text"]
    # 350 > 300 (N-1) but <= 400: add one for N-1 before the hour it crosses 300
    r = _recommend("x", 4, 100.0, fc(350.0), 0.95, "UTC")
    assert r["action"] == "add_for_n_minus_1" and "Tuesday 09:00 UTC" in r["text"]
    # 450 > 400: add one before Tuesday 09:00 (hour 33 after Monday 00:00)
    r = _recommend("x", 4, 100.0, fc(450.0), 0.95, "UTC")
    assert r["action"] == "add" and r["text"].startswith("Add 1 replica to pool x before Tuesday 09:00 UTC")
    assert r["deadline"] == WEEK_END + 33 * 3600
    r = _recommend("x", 4, 100.0, fc(380.0), 0.95, "Europe/Berlin")
    assert "Tuesday 10:00 CET" in r["text"]
    assert _recommend("z", 4, 100.0, fc(250.0), 0.95, "UTC")["action"] == "keep"
    assert _recommend("z", 3, 100.0, fc(250.0), 0.95, "UTC")["action"] == "add_for_n_minus_1"


def test_slo_and_tasks(built):
    d, df, _ = built
    for p in d["pools"]:
        for t in p["tasks"]:
            rows = week_rows(df, p["name"], f"task_arrivals:{t['name']}")
            # the simulated history has task starts only: counted as started, never called completed
            assert t["tasks"] == t["started"] == pytest.approx(rows["value"].sum())  # counts per 300 s step
            assert t["counted"] == "started" and t["completed"] is None
            s = t["slo"]
            assert s["target_seconds"] > 0 and 0.0 <= s["violation_ratio"] <= 1.0
            assert s["met"] == (s["violation_ratio"] <= 1 - s["objective"])
            pk = t["peak_arrival_rate"]
            assert pk["value"] == pytest.approx(rows["value"].max() / 300.0)
        assert p["task_count"] == pytest.approx(sum(t["tasks"] for t in p["tasks"]))
        assert p["tasks_counted"] == "started" and p["completed_tasks"] is None
    batch = [t for t in pool_of(d, "agent-70b")["tasks"] if t["name"] == "nightly_batch"][0]
    assert batch["slo"]["violation_ratio"] == 0.0  # 120 s target, nightly load is light


def test_cost_private_vs_api(built):
    d, _, settings = built
    cfg = load_config(None)
    pr = settings.prices
    for p in d["pools"]:
        pp = cfg.pool(p["name"])
        c = p["cost"]
        assert c["gpu_hours"] == pp.replicas * pp.gpus_per_replica * 168
        # energy between all-idle and all-max GPUs for the week
        lo = pp.replicas * pp.gpus_per_replica * pp.idle_watts * 168 / 1000
        hi = pp.replicas * pp.gpus_per_replica * pp.max_watts * 168 / 1000
        assert lo < c["energy_kwh"] < hi
        assert c["private_per_1000"] == pytest.approx(
            (c["gpu_hours"] * pr.gpu_hour + c["energy_kwh"] * pr.energy_kwh) / p["task_count"] * 1000)
        api = 0.0
        for t in p["tasks"]:
            tt = cfg.mix.task_types[t["name"]]
            tin = sum(s.calls * s.prompt.mean for s in tt.steps)
            tout = sum(s.calls * s.output.mean for s in tt.steps)
            per = (tin * pr.api.input_per_million + tout * pr.api.output_per_million) / 1e6
            assert t["api_cost_per_1000"] == pytest.approx(per * 1000)
            api += per * t["tasks"]
        assert c["api_per_1000"] == pytest.approx(api / p["task_count"] * 1000)
        assert p["sessions_per_megawatt"] > 0


def test_json_is_strict_and_complete(built):
    d, _, _ = built
    j = json.loads(render_json(d))
    assert j["iso_week"] == "2025-W48"
    assert not any(k.startswith("_") for p in j["pools"] for k in p)
    for p in j["pools"]:
        assert set(p["peaks"]) == {"active_requests", "queued_requests", "kv_tokens", "sessions", "load"}
        assert p["forecast_next_week"]["defined"] and p["cost"]["private_per_1000"] > 0


def test_markdown_names_every_section(built):
    d, _, _ = built
    md = render_markdown(d)
    for s in ("## Recommendations", "### Last week's peaks", "### Capacity", "### Next week's forecast",
              "### How last week's forecast did", "### Task types", "### Cost", "## Pool chat-8b"):
        assert s in md
    peak = pool_of(d, "chat-8b")["peaks"]["kv_tokens"]
    assert f"{peak['value']:,.0f}" in md and peak["when"] in md


def test_label_values_cannot_inject_html():
    evil = "<script>alert(1)</script>"
    settings = demo_settings(from_dict({"forecast": {"models": ["snaive_day"]}}, "<t>"))
    inp, _ = demo_input(WEEK_END, days=9, rename={"chat-8b": evil, "agent-70b": 'a"><img src=x onerror=alert(2)>'})
    d = build_digest(inp, settings)
    assert {p["name"] for p in d["pools"]} == {evil, 'a"><img src=x onerror=alert(2)>'}
    html = render_html(d, charts_for(d))
    assert evil not in html and "<img src=x" not in html and "onerror=alert(2)>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script") == 0
    md = render_markdown(d)
    assert evil not in md and "&lt;script&gt;" in md
    slack = json.dumps(render_slack(d))
    assert "<script>" not in slack and "&lt;script&gt;" in slack
    assert evil in {p["name"] for p in json.loads(render_json(d))["pools"]}  # JSON keeps it as data


@pytest.mark.parametrize("bad, key", [
    ({"schedule": {"day_of_week": "funday"}}, "digest.schedule.day_of_week"),
    ({"schedule": {"hour": 24}}, "digest.schedule.hour"),
    ({"schedule": {"timezone": "Mars/Olympus"}}, "digest.schedule.timezone"),
    ({"destinations": [{"type": "pigeon"}]}, "digest.destinations[0].type"),
    ({"destinations": [{"type": "webhook", "url": "ftp://x"}]}, "digest.destinations[0].url"),
    ({"destinations": [{"type": "webhook"}]}, "digest.destinations[0]"),
    ({"destinations": [{"type": "smtp", "host": "h", "from": "a@b", "to": ["c@d"], "password": "x",
                        "username": "u"}]}, "digest.destinations[0].password"),
    ({"destinations": [{"type": "smtp", "host": "h", "from": "a@b", "to": ["c@d"], "starttls": True,
                        "ssl": True}]}, "digest.destinations[0]"),
    ({"destinations": [{"type": "directory", "path": "/x"}, {"type": "directory", "path": "/y"}]},
     "digest.destinations[1].name"),
    ({"prices": {"gpu_hour": -1}}, "digest.prices.gpu_hour"),
    ({"forecast": {"models": ["prophet"]}}, "digest.forecast.models"),
    ({"pools": {"p": {"replicas": 2}}}, "digest.pools"),  # moved to the top-level pools.<pool>
    ({"colour": "blue"}, "digest.colour"),
])
def test_bad_configuration_names_the_key(bad, key):
    with pytest.raises(ConfigError) as e:
        from_dict(bad, "headroom.yaml")
    assert e.value.key == key and str(e.value).startswith("headroom.yaml: ")


def test_slo_targets_come_from_the_slos_section():
    from monitor.config import from_dict as config_from_dict
    cfg = config_from_dict({"sources": {"vllm": {"targets": ["http://a/metrics"]}},
                            "slos": {"task_types": {"a": {"p99_seconds": 12}}, "default": {"seconds": 30}}}, "f")
    s = from_dict({}, "f", cfg.slos)
    assert s.slo_targets == {"a": 12.0, "*": 30.0} and s.slo_objectives["a"] == 0.99 and s.slo_objectives["*"] == 0.95
    with pytest.raises(ConfigError) as e:  # a bad target is the configuration's error, named where it is
        config_from_dict({"sources": {"vllm": {"targets": ["http://a/metrics"]}},
                          "slos": {"task_types": {"a": {"p95": 3}}}}, "f")
    assert e.value.key == "slos.task_types.a.p95"


def test_metric_triples_track_the_outbox(tmp_path):
    from monitor.digest.metrics import metric_samples
    with Outbox(str(tmp_path / "o.sqlite")) as box:
        assert metric_samples(box) == [("headroom_digest_pending_deliveries", {}, 0.0)]
        box.enqueue("2025-W48", {"x": b"1"}, ["a", "b"], now=10.0)
        assert metric_samples(box) == [("headroom_digest_pending_deliveries", {}, 2.0)]

        def ok(key, week, payload):
            assert payload == {"x": b"1"}
        box.drain({"a": ok, "b": ok}, now=50.0)
        assert metric_samples(box) == [("headroom_digest_pending_deliveries", {}, 0.0),
                                       ("headroom_digest_last_success_timestamp_seconds", {}, 50.0)]
    from monitor.model.catalogue import BY_NAME
    for name, labels, _ in metric_samples(Outbox(str(tmp_path / "o.sqlite"))):
        assert name in BY_NAME and tuple(labels) == BY_NAME[name].labels


def test_slack_message_stays_within_slack_limits(built):
    d, _, _ = built
    many = {**d, "pools": [dict(p, name=f"pool-{i}") for i in range(60) for p in d["pools"][:1]]}
    body = render_slack(many)
    assert len(body["blocks"]) <= 50
    assert "15 more pools" in json.dumps(body["blocks"][-1])
    assert all(len(f["text"]) <= 2000 for b in body["blocks"] for f in b.get("fields", []))


def test_the_forecast_is_of_the_offered_load_where_the_history_has_it(built):
    d, _, settings = built
    assert {p["forecast_series"] for p in d["pools"]} == {"load"}  # the demo history has no offered series
    inp, _ = demo_input(WEEK_END, days=21)
    pool = next(p for p in inp.pools if p.name == "chat-8b")
    served = pool.series["active_requests"] + pool.series["queued_requests"]
    pool.series["offered"] = served * 1.5  # half as much again was turned away
    offered = build_digest(inp, settings)
    p = pool_of(offered, "chat-8b")
    assert p["forecast_series"] == "offered"
    assert p["forecast_next_week"]["peak"] > 1.3 * pool_of(d, "chat-8b")["forecast_next_week"]["peak"]
    assert "the offered load (active + queued, or active + turned away where higher)" in render_markdown(offered)
