"""The demo's past is its present: the history `headroom demo` seeds (lab/headroom_lab/commands/demo.py
`demo_history`) is the same fleet, workload and scenario clock as the live fleet it starts.

- per pool, the history's daily peak of active + queued sits at 0.6-1.3x the pool's knee capacity on
  every working day of the simulated clock (a busy fleet: brief excursions past the knee, not
  thousands queued), and weekends are quiet;
- the daemon's 1-day forecast of that history (the same pure call the forecaster makes) peaks at
  0.5-1.5x the history's largest daily peak;
- the live fleet starts where the history ends: at the same simulated moment (a Tuesday 09:00), with
  its load within the history's range of that morning.

The knee capacity is the simulated pool's knee by construction (headroom_lab.sim.fleet.theoretical_knee:
min(max_num_seqs, KV bound) x replicas), which headroom's prior also follows.
"""
import numpy as np
import pandas as pd
import pytest

from headroom_lab.commands.demo import demo_history, demo_rules, scale_windows, seed_history
from headroom_lab.sim.fleet import Fleet, load_config, theoretical_knee
from headroom_lab.sim.history import scenario_clock_shift
from monitor.forecast.pool import forecast_pool
from monitor.history.store import HistoryStore, StoreHistory

NOW = 1796306400.0 + 17 * 3600 + 23 * 60  # a Thursday 17:23 UTC on the wall clock: not a morning


@pytest.fixture(scope="module")
def story():
    cfg = load_config(None)
    return cfg, demo_history(cfg, "morning", 15.0, NOW)


def _load(df, pool):
    w = df[(df["pool"] == pool) & (df["instance"] == "")].pivot_table(
        index="timestamp", columns="series", values="value")
    return w["active_requests"] + w["queued_requests"]


def test_the_history_ends_on_the_live_clock(story):
    cfg, df = story
    shift = scenario_clock_shift(cfg, "morning", NOW)
    last = pd.Timestamp(df["timestamp"].max() + shift, unit="s", tz="UTC")
    assert (last.day_name(), last.hour, last.minute) == ("Tuesday", 9, 0)
    assert df["timestamp"].max() == NOW // 60 * 60
    fleet = Fleet(cfg, "morning", seed=1, start_time=NOW - 120, scenario_origin=NOW)
    assert fleet.profile_time(NOW) == (1, pytest.approx(9.0))


@pytest.mark.parametrize("pool", ["chat-8b", "agent-70b"])
def test_daily_peaks_sit_at_the_knee_on_working_days(story, pool):
    cfg, df = story
    params = next(p for p in cfg.pools if p.name == pool)
    cap = theoretical_knee(params, cfg.mix)["pool"]
    load = _load(df, pool)
    shift = scenario_clock_shift(cfg, "morning", NOW)
    days = pd.to_datetime(load.index + shift, unit="s", utc=True)
    full = load.groupby(days.date).filter(lambda g: len(g) == 1440)  # whole simulated days only
    fdays = pd.to_datetime(full.index + shift, unit="s", utc=True)
    peaks = full.groupby(fdays.date).max() / cap
    weekday = np.array([pd.Timestamp(d).weekday() for d in peaks.index])
    working, weekend = peaks[weekday < 5], peaks[weekday >= 5]
    assert len(working) >= 9 and len(weekend) >= 4
    assert working.between(0.6, 1.3).all(), working.round(2).to_dict()
    assert (working > 1.0).any(), "no working day goes past the knee"
    assert (weekend < 0.3).all(), weekend.round(2).to_dict()


def test_the_forecast_of_that_history_is_near_its_peaks(story, tmp_path):
    cfg, df = story
    store = str(tmp_path / "h.sqlite")
    seed_history(df, cfg, store)
    with HistoryStore(store) as s:  # what the daemon's forecaster reads
        history = StoreHistory(s).load(None, NOW - 16 * 86400, NOW + 300, 300.0, ["load"])
    for params in cfg.pools:
        pool = params.model_name
        load = history[pool]["load"]
        assert (np.diff(load.index.to_numpy()) == 300).all()  # the store's 5-minute grid
        daily_max = load.max()
        cap = theoretical_knee(params, cfg.mix)["pool"]
        fc = forecast_pool({"load": load}, cap, NOW)
        day = fc.horizons["1d"]
        assert day is not None, fc.series["load"].reason
        assert 0.5 * daily_max <= day.peak <= 1.5 * daily_max, (pool, day.peak, daily_max)


def test_the_live_fleet_continues_the_history(story):
    cfg, df = story
    fleet = Fleet(cfg, "morning", seed=1, start_time=NOW - 120, scenario_origin=NOW)
    fleet.advance_to(NOW)
    for params in cfg.pools:
        state = fleet.pool_state(params.name)
        live = state["running"] + state["waiting"]
        load = _load(df, params.name)
        morning = load[load.index >= NOW - 3600]  # the history's last hour: the ramp into the burst
        assert morning.min() * 0.5 <= live <= morning.max() * 1.5, (params.name, live, morning.min(), morning.max())


def test_demo_rules_shorten_every_for_and_keep_the_rest(tmp_path):
    import glob
    import os

    import yaml
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    src = sorted(glob.glob(os.path.join(repo, "rules", "*.yaml")))
    out = demo_rules(src, str(tmp_path), factor=30)
    for a, b in zip(src, out):
        orig, demo = yaml.safe_load(open(a)), yaml.safe_load(open(b))
        for g1, g2 in zip(orig["groups"], demo["groups"]):
            for r1, r2 in zip(g1["rules"], g2["rules"]):
                assert {k: v for k, v in r1.items() if k not in ("for", "expr")} == \
                    {k: v for k, v in r2.items() if k not in ("for", "expr")}
                if "for" in r1:
                    assert r2["for"].endswith("s")
                # an alert's windows shrink with its `for:`; a recording rule is kept as it is
                assert r2["expr"] == (scale_windows(r1["expr"], 30) if "alert" in r1 else r1["expr"])
    alerts_file = next(o for o in out if o.endswith("headroom.alerts.yaml"))
    low = next(r for g in yaml.safe_load(open(alerts_file))["groups"] for r in g["rules"]
               if r.get("alert") == "HeadroomLow")
    assert low["for"] == "20s"  # 10m / 30
    assert "headroom_ratio{scenario=\"current\"}[10s]" in low["expr"]  # the 5m mean window / 30
    assert scale_windows("rate(x[5m]) + y[1h] + z[1d] + w[30s]", 30) == "rate(x[10s]) + y[120s] + z[2880s] + w[10s]"
