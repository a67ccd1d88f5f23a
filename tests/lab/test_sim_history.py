"""History generator: seasonality, consistency with the fleet model, real promtool backfill."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from headroom_lab.sim.fleet import load_config, theoretical_knee
from headroom_lab.sim.history import generate_history, pool_series, write_openmetrics

END = 1_790_000_000 // 60 * 60


@pytest.fixture(scope="module")
def two_weeks():
    return generate_history(None, days=15, step_s=60, end=END, seed=3)


def test_shape_and_columns(two_weeks):
    df = two_weeks
    assert list(df.columns) == ["timestamp", "pool", "series", "value", "instance"]
    pool_rows = df[df["instance"] == ""]
    for pool in ("chat-8b", "agent-70b"):
        for series in ("call_arrival_rate", "active_requests", "queued_requests", "kv_tokens",
                       "sessions"):
            s = pool_series(df, pool, series)
            assert len(s) == 15 * 1440
            assert s.index[-1].timestamp() == END
            assert (np.diff(s.index.asi8) == np.diff(s.index.asi8)[0]).all()
            assert (s.index[1] - s.index[0]).total_seconds() == 60
            assert (s >= 0).all()
    assert {"task_arrivals:policy_question", "task_arrivals:search_then_email"} <= set(
        pool_rows["series"])
    reps = df[df["instance"] != ""]
    assert set(reps["instance"]) == {f"chat-8b-{i}" for i in range(4)} | {"agent-70b-0",
                                                                          "agent-70b-1"}


def test_daily_and_weekly_seasonality(two_weeks):
    s = pool_series(two_weeks, "chat-8b", "call_arrival_rate").resample("1h").mean()
    x = s.to_numpy() - s.mean()
    acf = lambda lag: float(np.dot(x[:-lag], x[lag:]) / np.dot(x, x))  # noqa: E731
    assert acf(24) > 0.5
    assert acf(12) < acf(24)
    by_hour = s.groupby(s.index.hour).mean()
    assert by_hour.loc[10] > 5 * by_hour.loc[3]
    wk = s[s.index.day_of_week < 5].mean()
    we = s[s.index.day_of_week >= 5].mean()
    assert wk > 2.5 * we
    # a mild upward trend: the second week is busier than the first
    d = pool_series(two_weeks, "chat-8b", "call_arrival_rate")
    assert d.iloc[-7 * 1440:].mean() > d.iloc[:7 * 1440].mean()


def test_consistent_with_the_pool_limits(two_weeks):
    cfg = load_config()
    for pool in cfg.pools:
        knee = theoretical_knee(pool, cfg.mix)["pool"]
        running = pool_series(two_weeks, pool.name, "active_requests")
        queued = pool_series(two_weeks, pool.name, "queued_requests")
        kv = pool_series(two_weeks, pool.name, "kv_tokens")
        assert running.max() <= knee + 1e-6
        assert kv.max() <= pool.kv_capacity_tokens * pool.replicas
        # queues only where the pool is at its knee
        assert (running[queued > 0] >= knee * 0.99).all()
        # busy but mostly not saturated
        assert 0 < (queued > 0).mean() < 0.1


def test_deterministic_and_validated():
    a = generate_history(None, days=1, step_s=300, end=END, seed=9)
    b = generate_history(None, days=1, step_s=300, end=END, seed=9)
    assert a.equals(b)
    with pytest.raises(ValueError, match="days"):
        generate_history(None, days=0)
    with pytest.raises(ValueError, match="step_s"):
        generate_history(None, days=1, step_s=0)


@pytest.mark.live  # runs a subprocess (tests/tiers.py)
def test_openmetrics_loads_with_real_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    df = generate_history(None, days=2, step_s=300, seed=4)  # ends 1 h before now
    path = tmp_path / "hist.om"
    n = write_openmetrics(df, str(path))
    text = path.read_text()
    assert text.endswith("# EOF\n")
    assert n == (6 * 3 + 6) * 2 * 288
    assert 'vllm:num_requests_running{engine="0",instance="chat-8b-0",job="vllm",' in text
    out = tmp_path / "blocks"
    out.mkdir()
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                           "--max-block-duration=24h", str(path), str(out)],
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    blocks = [d for d in os.listdir(out) if (out / d / "meta.json").exists()]
    assert blocks
    dump = subprocess.run([promtool, "tsdb", "list", str(out)], capture_output=True, text=True,
                          timeout=30)
    assert dump.returncode == 0
    # every sample made it into the blocks
    total = 0
    for line in dump.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 5 and cols[4].isdigit():
            total += int(cols[4])
    assert total == n


def test_fluid_model_agrees_with_the_simulator_at_a_flat_load():
    """Same config, flat profiles, level 1: the history's mean running requests and KV usage
    are within 25% of what the request-level simulator shows."""
    from headroom_lab.sim.fleet import Fleet
    from headroom_lab.sim.workload import Profile

    cfg = load_config()
    for tt in cfg.mix.task_types.values():
        tt.profile = Profile("flat")
    df = generate_history(cfg, days=0.25, step_s=60, end=END, noise=0.0, weekly_growth=0.0)
    f = Fleet(cfg, "steady", seed=3, start_time=float(END))
    f.advance(120)
    run = {p: 0.0 for p in f.pools}
    kv = {p: 0.0 for p in f.pools}
    for _ in range(90):
        f.advance(2)
        for p in f.pools:
            s = f.pool_state(p)
            run[p] += s["running"] / 90
            kv[p] += s["kv_usage"] / 90
    for pool in cfg.pools:
        hist_run = pool_series(df, pool.name, "active_requests").mean()
        hist_kv = pool_series(df, pool.name, "kv_tokens").mean() / (
            pool.kv_capacity_tokens * pool.replicas)
        assert abs(hist_run - run[pool.name]) / run[pool.name] < 0.25, (pool.name, hist_run,
                                                                        run[pool.name])
        assert abs(hist_kv - kv[pool.name]) / kv[pool.name] < 0.25
