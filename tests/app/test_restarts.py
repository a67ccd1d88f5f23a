"""Restarts: a real daemon writing its history store is killed with SIGKILL again and again; every
point committed before a kill is still there after the next restarts, exactly once."""
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import requests
from bodies import vllm_gauges as body
from servers import MetricsServer, free_port

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def _points(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT pool, series, res, ts FROM points").fetchall()
    finally:
        db.close()
    return rows


def test_kill_9_during_writes_loses_and_duplicates_nothing(tmp_path):
    vllm = MetricsServer()
    n = {"i": 0}

    def changing():
        n["i"] += 1
        return body(n["i"] % 9, n["i"] % 4, 0.1 * (n["i"] % 10), success=100 + n["i"])
    vllm.bodies["/metrics"] = changing
    store = tmp_path / "history.sqlite"
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(f"global:\n  interval: 0.2s\nsources:\n  vllm:\n    targets: ['{vllm.url('/metrics')}']\n"
                   f"store:\n  path: {store}\n")
    rng = random.Random(7)
    committed: set = set()
    kills = 0
    try:
        for _ in range(6):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", str(cfg),
                                     "--web.listen-address", f"127.0.0.1:{port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            end = time.monotonic() + 90
            while time.monotonic() < end:  # wait until this process is up and serving
                try:
                    if requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
            # ...and has committed points of its own (ready comes with the first cycle, which may
            # not have reached the store yet): a condition, not a guess at how long that takes
            while len(_points(store)) <= len(committed):
                assert proc.poll() is None, "the daemon exited"
                assert time.monotonic() < end, "the restarted daemon wrote nothing"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.3, 2.0))  # kill at an arbitrary moment, usually mid-write
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            rows = _points(store)
            assert len(rows) == len(set(rows)), "a point was stored twice"
            now = set(rows)
            lost = committed - now
            assert not lost, f"{len(lost)} committed points lost after kill {kills}"
            assert len(now) > len(committed), "the restarted daemon wrote nothing"
            committed = now
    finally:
        vllm.stop()
    assert kills == 6
    series = {r[1] for r in committed}
    assert {"active_requests", "queued_requests", "kv_tokens"} <= series
