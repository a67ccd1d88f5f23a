"""`headroom backtest`: rolling-origin backtest of every forecast model on a CSV series.

    headroom backtest --csv FILE [--time-column C --value-column V] --horizon 1d --json [--plot F.png]

Every model is refitted at each origin (expanding window) and forecasts `--horizon` ahead; the
scores are pooled over the origins (monitor/forecast/rolling_origin.py `backtest_models`, as the daemon's
refit backtests). MASE is scaled by the in-sample MAE of the one-day seasonal naive on the history
before the first origin. The selected model, and the reason per model (`why`), are those of
headroom's one selection rule (monitor/forecast/selection.py `select`, as in `forecast_series`):
the earliest model within 10% of the lowest MASE among those no worse than the best seasonal naive;
when no model's MASE is below 1 (none beats the in-sample naive) it is `average`, the equal-weight
average of the plain models, scored on the same origins (its `members` listed).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

# The numeric stack (pandas, numpy, the forecast models) is imported when the command runs, not for
# `headroom backtest --help` (tests/app/test_cli_start.py).

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UsageError(ValueError):
    pass


def parse_duration(text: str) -> float:
    """'90m', '6h', '1d', '1w', '3600' (seconds) -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text))
    if not m:
        raise UsageError(f"cannot parse duration {text!r}; use e.g. 30m, 6h, 1d, 1w")
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if value <= 0:
        raise UsageError(f"duration must be positive, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--csv", required=True, help="CSV file (may be .gz) with a time and a value column")
    p.add_argument("--time-column", default=None,
                   help="column with times (ISO-8601 or Unix seconds); default: the first column")
    p.add_argument("--value-column", default=None,
                   help="column with the values; default: the first numeric column after the time")
    p.add_argument("--horizon", default="1d", help="forecast horizon per origin (e.g. 6h, 1d)")
    p.add_argument("--origins", type=int, default=4, help="rolling origins (default 4)")
    p.add_argument("--step", default=None,
                   help="resample to this step (e.g. 5m) before fitting; default: inferred")
    p.add_argument("--models", default=None, help="comma-separated models to backtest (default: all)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="write a chart of actual vs forecast with 80%%/95%% bands")


def load_csv(path: str, time_column: str | None, value_column: str | None) -> pd.Series:
    import pandas as pd  # noqa: PLC0415

    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise UsageError(f"CSV file not found: {path}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read CSV {path}: {exc}") from None
    if df.shape[1] < 2:
        raise UsageError(f"{path}: need a time column and a value column, found columns {list(df.columns)}")
    tcol = time_column or df.columns[0]
    if tcol not in df.columns:
        raise UsageError(f"{path}: no time column {tcol!r}; columns are {list(df.columns)}")
    if value_column is None:
        numeric = [c for c in df.columns if c != tcol and pd.api.types.is_numeric_dtype(df[c])]
        if not numeric:
            raise UsageError(f"{path}: no numeric value column; columns are {list(df.columns)}")
        vcol = numeric[0]
    else:
        vcol = value_column
        if vcol not in df.columns:
            raise UsageError(f"{path}: no value column {vcol!r}; columns are {list(df.columns)}")
    raw_t = df[tcol]
    if pd.api.types.is_numeric_dtype(raw_t):
        times = pd.to_datetime(raw_t.astype(float), unit="s", utc=True, errors="coerce")
    else:
        times = pd.to_datetime(raw_t, utc=True, errors="coerce", format="mixed")
    bad = times.isna() & raw_t.notna()
    if bad.any() or times.isna().all():
        first = raw_t[bad].iloc[0] if bad.any() else raw_t.iloc[0]
        raise UsageError(f"{path}: column {tcol!r} has {int(bad.sum()) or len(raw_t)} unparseable "
                         f"time(s), e.g. {first!r} (use ISO-8601 or Unix seconds)")
    values = pd.to_numeric(df[vcol], errors="coerce")
    if values.notna().sum() == 0:
        raise UsageError(f"{path}: column {vcol!r} has no numeric values")
    return pd.Series(values.to_numpy(float), index=pd.DatetimeIndex(times)).sort_index()


def _summary(score: dict) -> dict:
    """The pooled backtest scores `headroom backtest` reports per model."""
    return {k: score.get(k) for k in ("mase", "smape", "coverage80", "coverage95", "width95_ratio",
                                      "points", "folds")}


def backtest(series: pd.Series, horizon_seconds: float, n_origins: int, models: list[str],
             step: float | None = None, progress=None) -> dict:
    from monitor.forecast.models import get_model  # noqa: PLC0415
    from monitor.forecast.rolling_origin import (  # noqa: PLC0415
        AVERAGE,
        ForecastSettings,
        average_folds,
        backtest_models,
        origins_for,
        pooled_score,
        select,
    )
    from monitor.forecast.series import SeriesError, prepare  # noqa: PLC0415

    try:
        prep = prepare(series, step)
    except SeriesError as exc:
        raise UsageError(str(exc)) from None
    horizon = max(1, int(round(horizon_seconds / prep.step)))
    origins = origins_for(prep.n, horizon, n_origins)
    cheapest = min(get_model(m).min_history(prep) for m in models)
    if not origins or origins[0] < cheapest:
        need = cheapest + horizon * n_origins
        raise UsageError(
            f"series too short: {prep.n} points ({prep.n * prep.step / 3600:.1f} h) at a "
            f"{prep.step:g} s step; {n_origins} origins with a {horizon_seconds / 3600:g} h horizon "
            f"need at least {need} points ({need * prep.step / 3600:.1f} h)")
    bt = backtest_models(prep, models, horizon, origins, progress=progress)
    settings = ForecastSettings()
    sel = select(bt.skill, models, settings.selection_tolerance, settings.average_below_skill)
    out_models = {}
    for name in models:  # the order asked for
        if name in bt.skill:
            out_models[name] = _summary(bt.skill[name])
            continue
        errs = bt.errors.get(name)
        reason = errs[-1] if errs else (
            f"needs {get_model(name).min_history(prep.head(origins[-1]))} points of history")
        out_models[name] = {"mase": None, "smape": None, "coverage80": None, "coverage95": None,
                            "folds": 0, "undefined": reason}
    folds_by_model = dict(bt.folds)
    if sel.model == AVERAGE:  # no model showed skill: what the daemon would forecast is the members' average
        avg = average_folds(sel.average, bt.folds, AVERAGE)
        if avg:
            folds_by_model[AVERAGE] = avg
            out_models[AVERAGE] = {**_summary(pooled_score(avg, bt.scale)), "members": sel.average}
        else:
            out_models[AVERAGE] = {"mase": None, "smape": None, "coverage80": None, "coverage95": None,
                                   "folds": 0, "members": sel.average,
                                   "undefined": "its members were backtested at different origins"}
    why = dict(sel.why)
    for name in out_models:
        why.setdefault(name, "no backtest score: " + str(out_models[name].get("undefined")))
    scale = bt.scale
    result: dict[str, Any] = {"selected": sel.model, "models": out_models, "why": why,
              "horizon_seconds": horizon_seconds, "step_seconds": prep.step,
              "origins": [prep.start + o * prep.step for o in origins], "points": prep.n,
              "missing_points": int((~prep.observed).sum()),
              "mase_scale": scale if math.isfinite(scale) else None}
    if bt.errors:
        result["errors"] = bt.errors
    result["_plot"] = (prep, folds_by_model)
    return result


def plot(result: dict, path: str) -> None:
    import matplotlib  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    prep, folds_by_model = result["_plot"]
    name = result["selected"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    t = pd.to_datetime(prep.times(), unit="s", utc=True)
    first = min(f.origin for f in folds_by_model[name]) if name in folds_by_model else 0
    lo_i = max(0, first - 2 * prep.per_day)
    actual = np.where(prep.observed, prep.values, np.nan)
    ax.plot(t[lo_i:], actual[lo_i:], color="black", lw=0.8, label="actual")
    for k, f in enumerate(folds_by_model.get(name, [])):
        tt = t[f.origin:f.origin + len(f.forecast.mean)]
        ax.fill_between(tt, *f.forecast.bands[0.95], color="tab:blue", alpha=0.15,
                        label="95% band" if k == 0 else None)
        ax.fill_between(tt, *f.forecast.bands[0.8], color="tab:blue", alpha=0.3,
                        label="80% band" if k == 0 else None)
        ax.plot(tt, f.forecast.mean, color="tab:blue", lw=1.2, label=f"{name} forecast" if k == 0 else None)
        ax.axvline(tt[0], color="grey", lw=0.5, ls="--")
    m = result["models"].get(name, {})
    ax.set_title(f"rolling-origin backtest: {name}  MASE {m.get('mase') or float('nan'):.2f}  "
                 f"coverage 80% {m.get('coverage80') or 0:.0%}  95% {m.get('coverage95') or 0:.0%}")
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _progress_printer(stream):
    def show(i, n, name):
        width = 24
        done = int(width * i / max(n, 1))
        stream.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {name:<12}")
        if i >= n:
            stream.write("\n")
        stream.flush()
    return show


def run(args) -> int:
    from monitor.forecast.models import FALLBACK_ORDER, get_model  # noqa: PLC0415

    try:
        horizon = parse_duration(args.horizon)
        step = parse_duration(args.step) if args.step else None
        if args.origins < 1:
            raise UsageError(f"--origins must be at least 1, got {args.origins}")
        chosen = ",".join(FALLBACK_ORDER) if args.models is None else args.models
        models = [m.strip() for m in chosen.split(",") if m.strip()]
        for m in models:
            try:
                get_model(m)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if not models:
            raise UsageError("--models is empty")
        series = load_csv(args.csv, args.time_column, args.value_column)
        progress = _progress_printer(sys.stderr) if sys.stderr.isatty() else None
        result = backtest(series, horizon, args.origins, models, step, progress)
    except UsageError as exc:
        print(f"headroom backtest: error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot(result, args.plot)
    result.pop("_plot", None)
    if args.json:
        json.dump(result, sys.stdout, indent=1, allow_nan=False, default=_json_default)
        sys.stdout.write("\n")
    else:
        print(f"selected: {result['selected']}  (horizon {horizon / 3600:g} h, "
              f"{len(result['origins'])} origins, step {result['step_seconds']:g} s)")
        print(f"{'model':<17} {'MASE':>6} {'sMAPE%':>7} {'cov80':>6} {'cov95':>6}")
        for name, s in result["models"].items():
            if not s.get("folds"):
                print(f"{name:<17} undefined: {s.get('undefined')}")
                continue
            print(f"{name:<17} {s['mase']:>6.3f} {s['smape']:>7.1f} {s['coverage80']:>6.0%} "
                  f"{s['coverage95']:>6.0%}  {result['why'].get(name, '')}")
    return 0


def _json_default(o):
    import numpy as np  # noqa: PLC0415

    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(prog="headroom backtest")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
