"""A headroom daemon watching one engine, for benchmarks/priority_protection.py's `budget` case:
its headroom_deferrable_budget_ratio{pool} is the budget the deferrable calls follow.

A fresh daemon has no forecast of the pool's load, so its budget is 0 ("stale: no forecast of the
pool's load", monitor/capacity/spare.py). The least demanding forecast model, `snaive_day`, needs
one day and a quarter of 5-minute points (monitor/forecast/naive.py `min_history`: 360 points,
30 h): no warm-up of a benchmark's length reaches it. So the daemon's history is seeded, from the
daemon's own readings:

  1. the daemon (fresh store) watches the engine while the interactive questions run alone for a
     warm-up (`warmup()`: the `alone` case's load, not counted as a trial);
  2. the daemon is stopped, and its store given `days` of past `load` readings before the warm-up,
     one every `interval` seconds, each drawn with replacement from the `load` readings the daemon
     took during the warm-up (`seed()`): a past in which the interactive load was what it is now,
     with no deferrable work in it. Only the `load` series is seeded (the forecasts' capacity series,
     monitor/forecast/pool.py); the daemon's live readings follow it;
  3. the daemon is started again on that store: its first refit (at start) fits the seeded history.

The pool's TTFT target (pools.<pool>.slo ttft_p95_seconds) is the benchmark's interactive TTFT
target, so "over its SLO now" (the budget's other fall to 0) is the benchmark's own bar;
global.latency_window is 1m (the default 5m would still hold the alone case's TTFTs well into a
60 s budget case).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import requests
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

from servers import free_port, wait_for  # noqa: E402

from monitor.history.store import HistoryStore  # noqa: E402

INTERVAL_SECONDS = 5
LATENCY_WINDOW = "1m"


def daemon_config(path: str, engine, pool: str, ttft_target: float, store_path: str, address: str) -> None:
    cfg = {
        "global": {"interval": f"{INTERVAL_SECONDS}s", "latency_window": LATENCY_WINDOW},
        "sources": {"vllm": {"targets": [engine.url + "/metrics"]}},
        "pools": {pool: {"max_num_seqs": engine.info["max_num_seqs"],
                         "slo": {"ttft_p95_seconds": float(ttft_target)}}},
        "store": {"path": store_path},
        "web": {"listen_address": address},
    }
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


class Daemon:
    """`python -m monitor run --config.file X` in its own process group; `url` its web root."""

    def __init__(self, workdir: str, engine, pool: str):
        self.workdir, self.engine, self.pool = workdir, engine, pool
        self.store_path = os.path.join(workdir, "history.sqlite")
        self.address = f"127.0.0.1:{free_port()}"
        self.url = "http://" + self.address
        self.config = os.path.join(workdir, "headroom.yml")
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def start(self, ttft_target: float, timeout: float = 120.0) -> None:
        daemon_config(self.config, self.engine, self.pool, ttft_target, self.store_path, self.address)
        self.starts += 1
        log = open(os.path.join(self.workdir, f"headroom-{self.starts}.log"), "w", encoding="utf-8")
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": REPO}
        self.proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", self.config],
                                     cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for(lambda: self._get("/metrics"), lambda r: r is not None and r.status_code == 200, timeout,
                 "headroom daemon /metrics", every=0.5)

    def _get(self, path: str):
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"headroom daemon exited {self.proc.returncode}: see {self.workdir}/headroom-*.log")
        try:
            return requests.get(self.url + path, timeout=3)
        except requests.RequestException:
            return None

    def spare(self) -> dict:
        """The daemon's /api/v1/spare answer for the pool (its budget and the reason)."""
        r = self._get(f"/api/v1/spare?pool={self.pool}&requests=1&hours=0.25")
        return r.json() if r is not None and r.status_code == 200 else {}

    def limits(self) -> dict:
        """The pool's capacity figures behind the budget, from /api/v1/snapshot: its limit (the
        least of slots, KV and knee), the load now (averaged) and the `slo` signal."""
        r = self._get("/api/v1/snapshot")
        pools = [p for p in (r.json().get("pools") or []) if p.get("pool") == self.pool] if r is not None else []
        c = (pools[0].get("capacity") or {}) if pools else {}
        lim = c.get("capacity_requests") or {}
        return {"load": c.get("load_requests"), "knee": c.get("knee_requests"), "knee_source": c.get("knee_source"), "knee_limit": lim.get("knee"),
                "slots": lim.get("slots"), "kv": lim.get("kv"), "slo": lim.get("slo"),
                "limiting": c.get("limiting_factor")}

    def wait_forecast(self, timeout: float = 300.0) -> dict:
        """Until the pool's budget is no longer stale for want of a forecast (the first refit done)."""
        def reason(a: dict) -> str:
            return a.get("budget_reason") or a.get("reason") or ""
        return wait_for(self.spare, lambda a: a and "budget_ratio" in a and not reason(a).startswith("stale"),
                        timeout, "headroom's forecast of the pool's load", every=2.0)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # the daemon's own process (its fork server follows it)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def seed(store_path: str, pool: str, since: float, until: float, days: float, interval: float = INTERVAL_SECONDS,
         rng_seed: int = 0) -> dict:
    """`days` of `load` readings before `since`, drawn with replacement from the store's `load`
    readings in [since, until] (module docstring, step 2); what was seeded."""
    with HistoryStore(store_path) as store:
        live = store.query(pool, "load", since, until)
        if len(live) < 5:
            raise RuntimeError(f"seed: only {len(live)} load readings of pool {pool!r} in the warm-up")
        values = live.to_numpy(dtype=float)
        rng = np.random.default_rng(rng_seed)
        ts = np.arange(since - days * 86400.0, since - interval / 2, interval)
        draws = rng.choice(values, size=len(ts), replace=True)
        store.append((pool, "load", float(t), float(v)) for t, v in zip(ts, draws))
    counts = {str(v): int((values == v).sum()) for v in np.unique(values)}
    return {"series": "load", "days": days, "interval_seconds": interval, "points": int(len(ts)),
            "from": float(ts[0]), "to": float(ts[-1]), "drawn_from_readings": int(len(values)),
            "warmup_load_readings": counts, "warmup_load_mean": round(float(values.mean()), 3)}


class DaemonBudget:
    """The follower's source: the daemon's headroom_deferrable_budget_ratio{pool} from its /metrics
    (lab/headroom_lab/loadtest/follower.py HttpBudget), each reading logged with the daemon's reason
    (its /api/v1/spare budget_reason) for the results' timeline."""

    def __init__(self, daemon: Daemon):
        from headroom_lab.loadtest.follower import HttpBudget  # lab/ on sys.path by the caller
        self.daemon = daemon
        self.source = HttpBudget(daemon.metrics_url, daemon.pool)
        self.label = f"headroom daemon budget: {daemon.metrics_url} pool {daemon.pool}"
        self.log: list[tuple[float, Optional[float], str, dict]] = []

    def __call__(self):
        reading = self.source()
        try:
            a, lim = self.daemon.spare(), self.daemon.limits()
        except (RuntimeError, ValueError, AttributeError) as exc:
            a, lim = {"reason": f"{type(exc).__name__}: {exc}"}, {}
        self.log.append((time.time(), reading.budget, a.get("budget_reason") or a.get("reason") or reading.note, lim))
        return reading

    def timeline(self, t0: float, t1: float) -> list:
        """[seconds since t0, budget, reason, the pool's limits] of the readings in [t0, t1)."""
        return [[round(t - t0, 1), None if b is None else round(b, 4), why,
                 {k: (round(v, 3) if isinstance(v, float) else v) for k, v in lim.items()}]
                for t, b, why, lim in self.log if t0 <= t < t1]
