"""The daemon under libfaketime (Debian's `faketime`): its wall clock stepped back an hour, forward a
day and back again while it runs against two loopback replicas.

Under APScheduler 3.x the step back stopped every cycle for the hour (`headroom_cycles_total` stayed
put, `/-/ready` said 200); the day forward then corrected left a snapshot and store points stamped a
day ahead. Here the cycles go on through every step, each step is counted once, /-/ready stays 200,
the snapshot's time follows the wall clock, and no store point is stamped after it. The monotonic
clocks are left alone (FAKETIME_DONT_FAKE_MONOTONIC), as with an NTP step."""
from __future__ import annotations

import glob
import os
import sqlite3
import subprocess
import sys
import time

import pytest
import requests
from servers import free_port, wait_for
from servers import metric as _metric

from monitor.kit.process import stop_process

pytestmark = pytest.mark.live

HOUR, DAY = 3600, 86400


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1") + glob.glob("/usr/lib/faketime/libfaketimeMT.so.1"))
    if not found:
        pytest.fail("libfaketime is missing: apt-get install faketime (.ci/setup.sh installs it)")
    return found[0]


def faked_daemon(tmp_path, config_text: str):
    """`headroom run` on `config_text` with its wall clock under libfaketime, at the offset written to
    the returned spec file: (spec, process, its log file, base URL, a function reading /metrics)."""
    spec = tmp_path / "faketime.spec"
    spec.write_text("+0\n")
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(config_text)
    port = free_port()
    env = {**os.environ, "LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(spec),
           "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    log = open(tmp_path / "daemon.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", str(cfg),
                             "--web.listen-address", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    base = f"http://127.0.0.1:{port}"

    def metrics():
        assert proc.poll() is None, open(tmp_path / "daemon.log").read()[-3000:]
        return requests.get(base + "/metrics", timeout=5).text

    return spec, proc, log, base, metrics


def test_cycles_keep_their_cadence_through_wall_clock_steps(tmp_path, good):
    store = tmp_path / "history.sqlite"
    spec, proc, log, base, metrics = faked_daemon(
        tmp_path, "global:\n  interval: 1s\n  scrape_timeout: 0.8s\nsources:\n  vllm:\n    targets:\n"
        + "".join(f"      - {s.url('/metrics')}\n" for s in good) + f"store:\n  path: {store}\n")

    def cycles():
        return _metric(metrics(), "headroom_cycles_total") or 0.0

    def snapshot_time():
        return requests.get(base + "/api/v1/snapshot", timeout=5).json()["timestamp"]

    def moves_on(what, offset, steps):
        """Three more cycles after the step; the snapshot's time is the faked wall clock's now."""
        n = cycles()
        wait_for(cycles, lambda c: c >= n + 3, timeout=60, what=f"three cycles after {what}")
        assert requests.get(base + "/-/ready", timeout=5).status_code == 200
        assert abs(snapshot_time() - (time.time() + offset)) < 15, what
        body = metrics()
        assert _metric(body, "headroom_clock_steps_total", clock="headroom", direction="back") == steps[0], what
        assert _metric(body, "headroom_clock_steps_total", clock="headroom", direction="forward") == steps[1], what
        assert _metric(body, "headroom_last_cycle_age_seconds") < 5.0, what  # cycling (/-/ready said so too)
        assert _metric(body, "headroom_cycle_interval_seconds") == 1.0

    try:
        wait_for(lambda: requests.get(base + "/-/ready", timeout=2).status_code, lambda c: c == 200, timeout=120,
                 what="the daemon ready")
        moves_on("the start", 0, (0, 0))
        spec.write_text(f"-{HOUR}\n")
        moves_on("a step back of an hour", -HOUR, (1, 0))
        spec.write_text(f"+{DAY - HOUR}\n")  # from -1 h to +1 d - 1 h: a day forward
        moves_on("a step forward of a day", DAY - HOUR, (1, 1))
        spec.write_text("+0\n")  # corrected: back by (a day - an hour)
        moves_on("the correction back", 0, (2, 1))
    finally:
        stop_process(proc)
        log.seek(0)
        text = log.read()
        log.close()
    assert text.count("the wall clock stepped back") == 2 and text.count("the wall clock stepped forward") == 1, text
    assert "points stamped after the stepped-back clock dropped" in text
    assert "Traceback" not in text, text[-3000:]
    with sqlite3.connect(store) as db:
        newest = db.execute("SELECT MAX(ts) FROM points").fetchone()[0] / 1000.0
    assert newest <= time.time() + 5  # no point stamped a day (or an hour) ahead survived


def test_prometheus_mode_reads_at_the_query_layer_s_time_after_headroom_s_clock_steps_back(tmp_path):
    """Issue 38: Prometheus mode sent `time=now` from headroom's clock, so after a step back of 60 s
    every query read the past: `active_requests 7` exported while Prometheus said 50, with the source
    up and nothing stale. Here the daemon (its clock under libfaketime) steps back 60 s, then the
    replica's running requests go from 7 to 50: headroom must export 50 as soon as Prometheus holds it
    (the old reading would take 60 s), count the step once, and see no step of the query layer."""
    from bodies import VLLM_AFTER_LOAD
    from servers import MetricsServer, Prometheus, scrape_config
    running = ["7"]
    replica = MetricsServer()
    replica.bodies["/metrics"] = lambda: VLLM_AFTER_LOAD.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running[0]}')
    prom = Prometheus(str(tmp_path), scrape_config({"vllm": [(f"127.0.0.1:{replica.port}", None)]}))
    spec, proc, log, base, metrics = faked_daemon(
        tmp_path, f"global:\n  interval: 2s\nsources:\n  prometheus:\n    url: {prom.url}\n    timeout: 1.5s\n")

    def active():
        return _metric(metrics(), "headroom_active_requests", pool="tiny")

    try:
        wait_for(active, lambda v: v == 7.0, timeout=120, what="headroom exports 7 running requests")
        spec.write_text("-60\n")
        wait_for(metrics, lambda m: _metric(m, "headroom_clock_steps_total", clock="headroom", direction="back") == 1,
                 timeout=60, what="the step back counted")
        running[0] = "50"
        prom.wait_for('vllm:num_requests_running{model_name="tiny"} == 50', timeout=60)
        wait_for(active, lambda v: v == 50.0, timeout=30, what="headroom exports what Prometheus holds now")
        body = metrics()
        assert _metric(body, "headroom_source_up", source="prometheus") == 1.0
        assert _metric(body, "headroom_clock_steps_total", clock="query_layer", direction="back") == 0.0
        assert _metric(body, "headroom_clock_steps_total", clock="query_layer", direction="forward") == 0.0
        snapshot = requests.get(base + "/api/v1/snapshot", timeout=5).json()
        assert abs(snapshot["timestamp"] - (time.time() - 60)) < 15  # the cycle state is on headroom's (stepped) clock
    finally:
        stop_process(proc)
        prom.stop()
        replica.stop()
        log.seek(0)
        text = log.read()
        log.close()
    assert text.count("the wall clock stepped back") == 1, text[-3000:]
    assert "query layer's clock stepped" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
