"""`headroom backtest` on a real trace slice: JSON shape, plot, clear errors."""
import argparse
import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest

from monitor.commands import backtest as cli

SLICE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "traces", "azure_code_2024_5min_mon-wed.csv")


def run(argv):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return cli.run(p.parse_args(argv))


def test_json_backtest_of_every_model_on_the_azure_slice(capsys, tmp_path):
    png = tmp_path / "bt.png"
    rc = run(["--csv", SLICE, "--horizon", "6h", "--origins", "2", "--models",
              "snaive_day,sarimax,snaive_week", "--json", "--plot", str(png)])
    out = capsys.readouterr()
    assert rc == 0
    res = json.loads(out.out)
    assert res["selected"] in ("snaive_day", "sarimax")
    for name in ("snaive_day", "sarimax"):
        m = res["models"][name]
        assert set(m) >= {"mase", "smape", "coverage80", "coverage95"}
        assert 0 < m["mase"] < 2 and 0 <= m["coverage80"] <= m["coverage95"] <= 1
        assert m["folds"] == 2 and m["points"] == 144
    assert res["models"]["snaive_week"]["mase"] is None  # 3.5 days cannot hold a weekly season
    assert "needs" in res["models"]["snaive_week"]["undefined"]
    best = min(("snaive_day", "sarimax"), key=lambda k: res["models"][k]["mase"])
    assert res["models"][res["selected"]]["mase"] <= res["models"][best]["mase"] * 1.1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[#" not in out.err  # no progress bar when stderr is not a terminal


def test_mase_is_scaled_by_the_in_sample_one_day_seasonal_naive(capsys):
    rc = run(["--csv", SLICE, "--horizon", "6h", "--origins", "1", "--models", "snaive_day", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0
    df = pd.read_csv(SLICE)
    y = df["requests_per_second"].to_numpy()
    o = len(y) - 72
    scale = np.mean(np.abs(y[288:o] - y[:o - 288]))
    assert res["mase_scale"] == pytest.approx(scale, rel=1e-6)
    mae = np.mean(np.abs(y[o:] - y[o - 288:o - 288 + 72]))
    assert res["models"]["snaive_day"]["mase"] == pytest.approx(mae / scale, rel=1e-6)


def test_named_columns_unix_seconds_and_gzip(tmp_path, capsys):
    t = 1_700_000_000 + 3600 * np.arange(24 * 5)
    y = 10 + 5 * np.sin(2 * np.pi * np.arange(len(t)) / 24)
    path = tmp_path / "s.csv.gz"
    with gzip.open(path, "wt") as f:
        pd.DataFrame({"host": "x", "ts": t, "rate": y}).to_csv(f, index=False)
    rc = run(["--csv", str(path), "--time-column", "ts", "--value-column", "rate", "--horizon", "1d",
              "--origins", "1", "--models", "snaive_day", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["step_seconds"] == 3600
    # an exactly periodic series: the seasonal naive is perfect and MASE has no scale (null)
    assert res["mase_scale"] is None and res["models"]["snaive_day"]["mase"] is None
    assert res["models"]["snaive_day"]["smape"] == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("content, extra, message", [
    ("time,v\n2024-01-01T00:00:00Z,1\n", ["--value-column", "rate"], "no value column 'rate'"),
    ("time,v\n2024-01-01T00:00:00Z,1\n", ["--time-column", "when"], "no time column 'when'"),
    ("time,v\nyesterday,1\n2024-01-01T00:05:00Z,2\n", [], "unparseable time"),
    ("time,v\n2024-01-01T00:00:00Z,a\n2024-01-01T00:05:00Z,b\n", [], "no numeric value column"),
    ("time,v\n" + "".join(f"2024-01-01T{h:02d}:00:00Z,{h}\n" for h in range(20)), [], "series too short"),
])
def test_bad_input_gives_a_clear_error(tmp_path, capsys, content, extra, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    rc = run(["--csv", str(path), "--horizon", "1h", "--json"] + extra)
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.startswith("headroom backtest: error:")


def test_missing_file_bad_horizon_and_unknown_model(capsys, tmp_path):
    assert run(["--csv", str(tmp_path / "nope.csv")]) == 2
    assert "CSV file not found" in capsys.readouterr().err
    assert run(["--csv", SLICE, "--horizon", "soon"]) == 2
    assert "cannot parse duration 'soon'" in capsys.readouterr().err
    assert run(["--csv", SLICE, "--models", "prophet"]) == 2
    assert "unknown forecast model 'prophet'" in capsys.readouterr().err


def test_registered_in_the_headroom_cli(capsys):
    from monitor.commands.cli import main
    rc = main(["backtest", "--csv", SLICE, "--horizon", "6h", "--origins", "1",
               "--models", "snaive_day"])
    out = capsys.readouterr().out
    assert rc == 0 and "selected: snaive_day" in out


def test_no_model_with_skill_selects_the_average_with_its_members(tmp_path, capsys):
    # a clean daily shape, then two days of large noise: no model beats the in-sample naive
    rng = np.random.default_rng(11)
    i = np.arange(24 * 8)
    y = 40 * (1 + 0.5 * np.sin(2 * np.pi * i / 24)) * rng.normal(1, 0.01, len(i))
    y[-48:] *= rng.lognormal(0, 0.5, 48)
    path = tmp_path / "noisy.csv"
    pd.DataFrame({"timestamp": 1_700_000_000 + 3600 * i, "value": y}).to_csv(path, index=False)
    rc = run(["--csv", str(path), "--horizon", "1d", "--origins", "2", "--models", "ets,snaive_day",
              "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and all(res["models"][m]["mase"] >= 1 for m in ("ets", "snaive_day"))
    avg = res["models"]["average"]
    assert res["selected"] == "average" and avg["members"] == ["ets", "snaive_day"] and avg["folds"] == 2
    assert avg["mase"] <= max(res["models"][m]["mase"] for m in ("ets", "snaive_day"))  # MAE is convex
    assert res["why"]["average"] == "selected: no candidate reached MASE 1; the average of ets+snaive_day"
    assert set(res["why"]) == {"ets", "snaive_day", "average"}
    assert all(not res["why"][m].startswith("selected") for m in ("ets", "snaive_day"))


def test_selection_and_reasons_are_those_of_forecast_series_on_the_same_origins(capsys):
    from monitor.forecast.rolling_origin import ForecastSettings, forecast_series
    from monitor.forecast.series import prepare
    models = ["ets_1h", "sarimax", "snaive_day"]
    rc = run(["--csv", SLICE, "--horizon", "6h", "--origins", "2", "--models", ",".join(models), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0
    # the daemon's refit with a 6-hour horizon backtests two 6-hour folds at the same origins
    prep = prepare(cli.load_csv(SLICE, None, None))
    r = forecast_series(prep, 72, ForecastSettings(models=tuple(models)))
    assert {m: r.skill[m]["folds"] for m in models} == {m: 2 for m in models}
    for m in models:
        assert res["models"][m]["mase"] == pytest.approx(r.skill[m]["mase"])
    assert res["selected"] == r.model
    assert res["why"] == r.why
