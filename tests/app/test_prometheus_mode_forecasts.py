"""Prometheus mode forecasts from the history Prometheus already holds (issue 16, "Prove it").

A real Prometheus 2.42 backfilled (promtool) with two weeks of vLLM replica gauges only, as a
Prometheus that scraped vLLM long before headroom was installed; a real daemon in Prometheus mode with
no history store at all. After its first refit the daemon publishes forecasts for every pool, read
from Prometheus' vLLM series, on /metrics and on /api/v1/snapshot alike.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import requests
from servers import free_port, wait_for

from headroom_lab.sim.history import generate_history, write_openmetrics

pytestmark = [pytest.mark.live, pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                                   reason="needs the prometheus and promtool binaries")]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, prometheus_on_history):
    d = tmp_path_factory.mktemp("prom-mode")
    # the last sample now, not at the last 5-minute mark: an instant query finds a replica only within
    # Prometheus' 5 m lookback, and the floored end left 0-300 s of it (a loaded run saw no pools)
    end = int(time.time())
    df = generate_history(None, days=14, step_s=300, end=end, seed=5)
    write_openmetrics(df, str(d / "h.om"))  # vLLM's own series, no headroom_* at all
    return prometheus_on_history(d / "h.om", max_block_duration="24h")


def test_a_daemon_with_no_store_forecasts_from_prometheus_after_its_first_refit(prometheus, tmp_path):
    prom = prometheus
    port = free_port()
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(f"global:\n  interval: 2s\nsources:\n  prometheus:\n    url: {prom.url}\n"
                   "forecast:\n  fit_timeout_seconds: 60\n")
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", str(cfg),
                             "--web.listen-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        metrics = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text,
                        lambda t: "headroom_forecast_peak_requests{" in t, 240, "forecasts on /metrics")
        snap = requests.get(base + "/api/v1/snapshot", timeout=5).json()
        again = requests.get(base + "/metrics", timeout=5).text
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    pools = sorted({line.split('pool="')[1].split('"')[0] for line in metrics.splitlines()
                    if line.startswith("headroom_forecast_peak_requests{")})
    # both simulated pools (named by model, as headroom pools vLLM series), from vLLM history alone
    assert len(pools) == 2, pools
    assert "headroom_forecast_last_fit_timestamp_seconds " in metrics
    assert "Traceback" not in err, err[-2000:]
    print(f"\n[prometheus-mode] forecasts for {pools}; snapshot pools "
          f"{[(p['pool'], bool(p.get('forecast'))) for p in snap['pools']]}")
    # the same refit on the snapshot: every pool of /api/v1/snapshot carries its forecast
    assert snap["pools"] and all(p.get("forecast") for p in snap["pools"]), [p["pool"] for p in snap["pools"]]
    assert again.count("headroom_forecast_peak_requests{") >= metrics.count("headroom_forecast_peak_requests{")
