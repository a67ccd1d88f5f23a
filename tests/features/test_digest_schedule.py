"""The digest from headroom's real HistoryStore, and on its weekly schedule (monitor/kit/weekly.py) on the daemon's ticker."""
from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from headroom_lab.digest_demo import demo_input
from headroom_lab.sim.history import generate_history
from monitor.capacity.settings import PoolSettings
from monitor.digest.content import build_digest
from monitor.digest.schedule import open_outbox, run_digest, schedule_digest
from monitor.digest.settings import from_dict
from monitor.digest.sources import from_prometheus, from_store
from monitor.history.store import HistoryStore

WEEK_END = 1764547200.0  # Mon 2025-12-01 00:00 UTC
FAST = {"forecast": {"models": ["snaive_day"]}}

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def test_digest_from_the_history_store_matches_the_history(tmp_path):
    df = generate_history(None, days=9, step_s=300, end=WEEK_END - 300, replica_series=False)
    pools = df[df["instance"] == ""]
    # stored the way the daemon stores it (monitor/history/store.py points_from_snapshot): active and
    # queued apart, load = active + queued
    wide = pools.pivot_table(index=["pool", "timestamp"], columns="series", values="value").reset_index()
    points = []
    for r in wide.itertuples(index=False):
        points.append((r.pool, "active_requests", float(r.timestamp), float(r.active_requests)))
        points.append((r.pool, "queued_requests", float(r.timestamp), float(r.queued_requests)))
        points.append((r.pool, "load", float(r.timestamp), float(r.active_requests + r.queued_requests)))
        points.append((r.pool, "kv_tokens", float(r.timestamp), float(r.kv_tokens)))
        points.append((r.pool, "sessions", float(r.timestamp), float(r.sessions)))
    with HistoryStore(str(tmp_path / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None) as st:
        st.append(points)
        settings = from_dict(FAST, "<t>", pools={"chat-8b": PoolSettings(replicas=4, knee_requests_per_replica=86),
                                                 "agent-70b": PoolSettings(replicas=2, max_num_seqs=128)})
        inp = from_store(st, WEEK_END, settings)
    d = build_digest(inp, settings)
    week = pools[(pools["timestamp"] >= WEEK_END - 7 * 86400) & (pools["timestamp"] < WEEK_END)]
    for p in d["pools"]:
        for s in ("active_requests", "queued_requests", "kv_tokens", "sessions"):
            rows = week[(week["pool"] == p["name"]) & (week["series"] == s)]
            assert p["peaks"][s]["value"] == pytest.approx(rows["value"].max(), abs=1e-6)
        a = week[(week["pool"] == p["name"]) & (week["series"] == "active_requests")].set_index("timestamp")["value"]
        q = week[(week["pool"] == p["name"]) & (week["series"] == "queued_requests")].set_index("timestamp")["value"]
        assert p["peaks"]["load"]["value"] == pytest.approx((a + q).max())
    (chat,) = [p for p in d["pools"] if p["name"] == "chat-8b"]
    (agent,) = [p for p in d["pools"] if p["name"] == "agent-70b"]
    assert chat["knee"]["requests"] == 344 and chat["knee"]["source"] == "configured"
    assert agent["knee"]["requests"] == 256 and agent["knee"]["source"] == "prior"  # max_num_seqs x 2
    assert chat["forecast_next_week"]["defined"]


def test_store_without_replicas_is_a_clear_error(tmp_path):
    from monitor.digest.content import DigestError
    with HistoryStore(str(tmp_path / "h.sqlite")) as st:
        st.append([("p", "active_requests", WEEK_END - 600, 3.0)])
        with pytest.raises(DigestError, match=r"set pools.p.replicas"):
            from_store(st, WEEK_END, from_dict({}, "<t>"))


def test_replicas_come_from_the_daemons_config_then_its_newest_cycle(tmp_path):
    """No digest.pools: pools.<pool> of the daemon's file, else the replicas headroom saw with its knee."""
    from monitor import config
    from monitor.digest.knee_report import KneeReading
    cfg = config.from_dict({"sources": {"vllm": {"targets": ["http://127.0.0.1:9/metrics"]}},
                            "store": {"path": str(tmp_path / "h.sqlite")},
                            "pools": {"a": {"replicas": 5, "gpus_per_replica": 2}},
                            "digest": {"forecast": {"models": ["snaive_day"]}}}, "t.yaml")
    with HistoryStore(str(tmp_path / "h.sqlite")) as st:
        st.append([(p, "active_requests", WEEK_END - 600, 3.0) for p in ("a", "b")])
        seen = {"a": KneeReading(4.0, "learned", WEEK_END, replicas=9), "b": KneeReading(4.0, "learned", WEEK_END, replicas=3)}
        inp = from_store(st, WEEK_END, cfg.digest, knees=lambda start, end, step: seen)
    got = {p.name: (p.replicas, p.gpus_per_replica) for p in inp.pools}
    assert got == {"a": (5, 2), "b": (3, 1)}


def test_schedule_digest_cron_and_delivery(tmp_path):
    from monitor.kit.ticker import Ticker
    settings = from_dict({**FAST, "outbox": str(tmp_path / "outbox.sqlite"),
                          "schedule": {"day_of_week": "tue", "hour": 9, "minute": 30, "timezone": "Europe/Berlin"},
                          "destinations": [{"name": "dir", "type": "directory", "path": str(tmp_path / "out")}]},
                         "<t>")
    built = threading.Event()
    weeks = []

    def build_fn(week_end):
        weeks.append(week_end)
        built.set()
        return demo_input(WEEK_END, days=9)[0]

    sched = Ticker()
    box = open_outbox(settings)
    try:
        ids = schedule_digest(sched, settings, build_fn, outbox=box, clock=lambda: WEEK_END + 5400)
        assert ids == ["headroom-digest", "headroom-digest-retry"]
        job = sched.get_job("headroom-digest")
        nxt = datetime.fromtimestamp(job.next_wall, timezone.utc).astimezone(ZoneInfo("Europe/Berlin"))
        assert nxt.weekday() == 1 and (nxt.hour, nxt.minute) == (9, 30)
        assert 0 < job.next_wall - time.time() <= 7 * 86400
        sched.start()
        # fire it now, as the schedule would
        job.run_now()
        assert built.wait(600)
        deadline = time.monotonic() + 600
        while not box.deliveries("done"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        sched.shutdown(wait=30)
    assert weeks == [WEEK_END + 3600]  # clock WEEK_END + 1.5 h: the week ends at the top of that hour
    (d,) = box.deliveries()
    assert d.key == "2025-W48:dir" and d.state == "done"
    assert os.path.isfile(tmp_path / "out" / "2025-W48" / "digest.html")
    # a second run in the same week builds nothing and sends nothing
    r = run_digest(settings, build_fn, WEEK_END + 7200, box)
    assert r["queued"] == [] and r["outcomes"] == {} and weeks == [WEEK_END + 3600]
    box.close()


def test_the_built_daemon_schedules_the_digest_and_exports(tmp_path):
    import urllib.request

    from monitor import config
    from monitor.app import build
    cfg = config.from_dict({
        "sources": {"prometheus": {"url": "http://127.0.0.1:9"}}, "store": {"path": str(tmp_path / "h.sqlite")},
        "digest": {"outbox": str(tmp_path / "o.sqlite"),
                   "schedule": {"day_of_week": "wed", "hour": 7, "timezone": "Asia/Tokyo"},
                   # nothing listens on port 9: the delivery stays pending even if the retry job runs
                   "destinations": [{"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/x"}]}},
        "t.yaml")
    daemon = build(cfg, "127.0.0.1:0")
    try:
        assert [c.name for c in daemon.components] == ["cycle", "gc", "store", "forecaster", "digest", "web"]
        box = daemon.digest_outbox
        box.enqueue("2025-W48", {"slack.json": b"{}"}, ["hook"], now=0.0)  # one pending delivery
        daemon.start()
        job = daemon.scheduler.get_job("headroom-digest")
        assert job is not None and daemon.scheduler.get_job("headroom-digest-retry") is not None
        nxt = datetime.fromtimestamp(job.next_wall, timezone.utc).astimezone(ZoneInfo("Asia/Tokyo"))
        assert nxt.weekday() == 2 and (nxt.hour, nxt.minute) == (7, 0)
        deadline = time.monotonic() + 300
        while True:
            body = urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=30).read().decode()
            if "headroom_digest_pending_deliveries" in body:
                break
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert "headroom_digest_pending_deliveries 1.0" in body
        assert "headroom_digest_last_success_timestamp_seconds" not in body  # nothing delivered yet
    finally:
        daemon.stop()


def test_digest_from_a_real_backfilled_prometheus(prometheus_on_history):
    from headroom_lab.digest_demo import last_monday
    from monitor.sources.prometheus import PrometheusClient
    week_end = last_monday(time.time())  # recent: inside Prometheus' default retention
    df = generate_history(None, days=9, step_s=300, end=week_end - 300, replica_series=False)
    pools = df[df["instance"] == ""]
    names = {"active_requests": "headroom_active_requests", "queued_requests": "headroom_queued_requests",
             "kv_tokens": "headroom_kv_tokens", "sessions": "headroom_sessions"}
    lines = []
    for series, metric in names.items():
        for r in pools[pools["series"] == series].itertuples(index=False):
            lines.append(f'{metric}{{pool="{r.pool}"}} {r.value!r} {int(r.timestamp)}')
    for r in pools[pools["series"].str.startswith("task_arrivals:")].itertuples(index=False):
        task = r.series.split(":", 1)[1]
        lines.append(f'headroom_task_arrival_rate{{pool="{r.pool}",task_type="{task}"}} {r.value / 300!r} {int(r.timestamp)}')
    lines.sort(key=lambda s: s.split("{")[0])  # OpenMetrics: one family's samples together
    prom = prometheus_on_history("\n".join(lines) + "\n# EOF\n")
    try:
        settings = from_dict(FAST, "<t>", pools={"chat-8b": PoolSettings(replicas=4, knee_requests_per_replica=86),
                                                 "agent-70b": PoolSettings(replicas=2, knee_requests_per_replica=52)})
        inp = from_prometheus(PrometheusClient(prom.url), week_end, settings)
    finally:
        prom.stop()
    d = build_digest(inp, settings)
    week = pools[(pools["timestamp"] >= week_end - 7 * 86400) & (pools["timestamp"] < week_end)]
    assert sorted(p["name"] for p in d["pools"]) == ["agent-70b", "chat-8b"]
    for p in d["pools"]:
        for s in names:
            rows = week[(week["pool"] == p["name"]) & (week["series"] == s)]
            i = int(np.argmax(rows["value"].to_numpy()))
            assert p["peaks"][s]["value"] == pytest.approx(rows["value"].iloc[i], rel=1e-9, abs=1e-9)
            assert abs(p["peaks"][s]["timestamp"] - rows["timestamp"].iloc[i]) <= 300  # 5 min windows
        assert {t["name"] for t in p["tasks"]} and p["forecast_next_week"]["defined"]


def test_the_daemons_digest_reports_the_knee_of_its_newest_cycle(tmp_path):
    """Direct mode: the store carries no knee; the digest component reads the knee of the daemon's
    newest snapshot (learned there, so the digest says learned, not the max_num_seqs prior)."""
    from monitor import config
    from monitor.app import build
    from monitor.capacity.headroom import CapacitySettings, pool_capacity
    from monitor.capacity.knee import Knee
    from monitor.model import PoolSnapshot, Snapshot
    cfg = config.from_dict({
        "sources": {"prometheus": {"url": "http://127.0.0.1:9"}}, "store": {"path": str(tmp_path / "h.sqlite")},
        "pools": {"tiny": {"replicas": 1, "max_num_seqs": 8}},
        "digest": {"outbox": str(tmp_path / "o.sqlite"), "forecast": {"models": ["snaive_day"]}}}, "t.yaml")
    daemon = build(cfg, "127.0.0.1:0")
    try:
        daemon.store.append([("tiny", "load", WEEK_END - 600 + 10 * i, 3.0 + i % 4) for i in range(60)])
        build_fn = daemon.digest.build_fn
        assert build_fn(WEEK_END).pools[0].knee_source == "prior"  # no cycle yet: nothing learned
        pool = PoolSnapshot(pool="tiny", model="m", replicas=1, active_requests=5.0, queued_requests=0.0)
        pool.capacity = pool_capacity(pool, Knee(7.0, None, "learned", "queue", confidence=0.8), CapacitySettings())
        daemon.pipeline.latest = Snapshot(timestamp=WEEK_END - 10, pools=[pool])
        d = build_digest(build_fn(WEEK_END), daemon.digest.settings)
        (p,) = d["pools"]
        assert (p["knee"]["source"], p["knee"]["requests"]) == ("learned", 7.0)
        assert p["knee"]["note"].startswith("learned by headroom from latency on queue")
        assert p["cost"]["covered_hours"] == pytest.approx(10 / 60)
    finally:
        daemon.stop()
