"""The digest's counts and figures on a hand-made week (pure): tasks completed, not started, and
"started" said where only starts are known; the forecast chart and its tables on the same series."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from monitor.digest.content import WEEK, build_digest
from monitor.digest.inputs import DigestInput, PoolInput
from monitor.digest.render import render_markdown
from monitor.digest.settings import from_dict
from monitor.history.query_range import headroom_queries

END = 1764547200.0  # Mon 2025-12-01 00:00 UTC
STEP = 300.0
TIMES = np.arange(END - WEEK, END, STEP)


def _flat(value: float) -> pd.Series:
    return pd.Series(np.full(len(TIMES), value), index=TIMES)


def _rate(total: float) -> pd.Series:
    """A tasks-per-second series whose week sums to `total` tasks."""
    return _flat(total / (len(TIMES) * STEP))


def _digest(series_by_pool: dict) -> dict:
    settings = from_dict({"forecast": {"models": ["snaive_day"]}}, "<test>")
    pools = [PoolInput(name=name, series=series, replicas=2, knee_requests_per_replica=8.0)
             for name, series in series_by_pool.items()]
    return build_digest(DigestInput(END, pools, step=STEP), settings)


def test_tasks_completed_not_started_and_the_cost_divides_by_them():
    """The journey's overload: 444 draft tasks started, 270 completed."""
    d = _digest({"p": {"load": _flat(3.0), "task_arrivals:draft": _rate(444),
                       "task_completions:draft": _rate(270)}})
    p = d["pools"][0]
    (t,) = p["tasks"]
    assert (t["started"], t["completed"], t["tasks"], t["counted"]) == (444, 270, 270, "completed")
    c = p["cost"]
    assert c["tasks"] == 270 and c["counted"] == "completed" and p["completed_tasks"] == 270
    assert c["private_per_1000"] == pytest.approx(c["private_cost"] / 270 * 1000.0)
    md = render_markdown(d)
    assert "| tasks completed | 270 |" in md and "| draft | 270 | 444 |" in md
    assert "private cost per 1,000 tasks completed" in md and "tasks started |" not in md


def test_started_is_said_where_completions_are_not_measured():
    d = _digest({"p": {"load": _flat(3.0), "task_arrivals:draft": _rate(444),
                       "task_arrivals:chat": _rate(300), "task_completions:chat": _rate(290)}})
    p = d["pools"][0]
    by = {t["name"]: t for t in p["tasks"]}
    assert by["draft"]["counted"] == "started" and by["draft"]["completed"] is None
    assert by["draft"]["tasks"] == 444 and by["chat"]["tasks"] == 290
    assert p["cost"]["tasks"] == 734 and p["cost"]["counted"] == "completed and started"
    md = render_markdown(d)
    assert "| tasks completed and started | 734 |" in md and "| draft | n/a | 444 |" in md


def test_prometheus_history_reads_the_completions():
    q = headroom_queries()
    assert "headroom_task_completion_rate" in q["task_completions"].expr


def test_the_forecast_chart_and_the_tables_show_the_same_figure():
    """An overload with a queue and nothing turned away: the offered series reads the active requests
    (5) while active + queued is 12. The chart's actual line, last week's forecast check and the
    peaks table all use the demand (12), not the active requests alone."""
    import matplotlib.pyplot as plt

    from monitor.digest.charts import forecast_figure
    weeks = np.arange(END - 3 * WEEK, END, STEP)
    hour = (weeks % 86400) // 3600
    busy = (hour >= 9) & (hour < 17)
    active = pd.Series(np.where(busy, 5.0, 1.0), index=weeks)
    queued = pd.Series(np.where(busy, 7.0, 0.0), index=weeks)
    d = _digest({"p": {"active_requests": active, "queued_requests": queued, "load": active + queued,
                       "offered": active.copy()}})
    p = d["pools"][0]
    assert p["forecast_series"] == "offered"
    assert p["peaks"]["load"]["value"] == p["peaks"]["offered"]["value"] == 12.0
    assert float(p["_actual"].max()) == 12.0  # the chart's actual line
    assert p["forecast_last_week"]["actual_peak"] == 12.0
    fig = forecast_figure(p, "UTC")
    try:
        lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
        actual = lines["actual offered load (hourly peak)"]
        assert float(np.nanmax(actual.get_ydata())) == 12.0
    finally:
        plt.close(fig)
    assert "| offered load (the forecasts' series) | 12.0 |" in render_markdown(d)


def test_a_rerun_in_the_same_week_keeps_the_first_and_versions_the_second(tmp_path):
    from monitor.digest.deliver import directory_sender, free_dir, write_dir
    from monitor.digest.settings import DirectoryDestination
    first = {"digest.md": b"# first", "digest.json": b'{"n": 1}', "pool0-forecast.png": b"png1"}
    second = {"digest.md": b"# second", "digest.json": b'{"n": 2}', "pool0-forecast.png": b"png2"}
    out = str(tmp_path / "out")
    assert free_dir(out, first) == out
    write_dir(out, first)
    assert free_dir(out, first) == out  # the same digest again (a retried write): same place
    again = free_dir(out, second)
    assert again == out + "-2"
    write_dir(again, second)
    assert (tmp_path / "out" / "digest.md").read_bytes() == b"# first"  # kept
    assert (tmp_path / "out-2" / "digest.md").read_bytes() == b"# second"
    assert free_dir(out, {"digest.md": b"# third", "digest.json": b"{}"}) == out + "-3"
    # a directory destination: the week's folder is versioned the same way
    send = directory_sender(DirectoryDestination(name="archive", type="directory", path=str(tmp_path / "archive"),
                                                 formats=("md", "json")))
    send("2025-W48:archive", "2025-W48", first)
    send("2025-W48:archive", "2025-W48", second)
    assert (tmp_path / "archive" / "2025-W48" / "digest.md").read_bytes() == b"# first"
    assert (tmp_path / "archive" / "2025-W48-2" / "digest.md").read_bytes() == b"# second"


def test_the_command_says_it_kept_the_first(tmp_path, capsys):
    from monitor.commands.digest import _versioned
    from monitor.digest.deliver import write_dir
    out = str(tmp_path / "d")
    write_dir(out, {"digest.md": b"# first"})
    assert _versioned(out, {"digest.md": b"# second"}) == out + "-2"
    assert capsys.readouterr().err == (f"headroom digest: {out} holds another digest (an earlier run); kept it, "
                                       f"writing this one to {out}-2\n")


def test_completions_that_cover_fewer_hours_than_the_starts_are_not_the_weeks_count():
    """A daemon upgraded mid-week exported completions for the last day only: the week's count is
    the tasks started (said so), not one day's completions."""
    late = _rate(270)[TIMES >= END - 86400.0]
    d = _digest({"p": {"load": _flat(3.0), "task_arrivals:draft": _rate(444), "task_completions:draft": late}})
    (t,) = d["pools"][0]["tasks"]
    assert (t["tasks"], t["counted"], t["completed"]) == (444, "started", None)
