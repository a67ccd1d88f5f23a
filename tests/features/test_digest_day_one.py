"""The digest on a fresh install (20 minutes of history) and after 14 days, from the same simulated
fleet written into headroom's real HistoryStore: the knee headroom learned (else a prior, said so),
costs over the hours covered, one whole task count everywhere, no cost per task below the minimum,
and charts with a data line and a sane time axis (checked on the figures and on the PNGs)."""
from __future__ import annotations

import base64
import io
import json
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from headroom_lab.sim.fleet import load_config
from headroom_lab.sim.history import generate_history, schema_history
from monitor.capacity.settings import PoolSettings
from monitor.digest.charts import ACTUAL, NEXT, charts_for, forecast_figure, headroom_figure
from monitor.digest.content import build_digest
from monitor.digest.coverage import MIN_TASKS_FOR_COST
from monitor.digest.knee_report import KneeReading
from monitor.digest.render import render_html, render_json, render_markdown
from monitor.digest.settings import TaskFacts, from_dict
from monitor.digest.sources import from_store
from monitor.history.store import HistoryStore

END = 1764583200.0  # Mon 2025-12-01 10:00 UTC: the 20 minutes before it are busy
STEP = 60  # the simulated daemon writes a point a minute
SHORT = 20 * 60.0
LEARNED_AT = END - 600.0
QUIET_END = END - 11 * 3600.0  # Sun 23:00: 20 quiet minutes, one pool under MIN_TASKS_FOR_COST


def _points(rows) -> zip:
    """(pool, series, ts, value) per row of a schema_history frame, read column-wise (itertuples on
    its 360,000 rows took 3 s of the fixture's 6)."""
    return zip(rows["pool"].tolist(), rows["series"].tolist(), rows["timestamp"].astype(float).tolist(),
               rows["value"].astype(float).tolist())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    cfg = load_config(None)
    df = generate_history(cfg, days=14, step_s=STEP, end=END - STEP, seed=3, level=0.8,
                          replica_series=False)
    truth = schema_history(df, cfg)
    d = tmp_path_factory.mktemp("day-one")
    stores = {}
    spans = {"short": (END - SHORT, END), "long": (-np.inf, END), "quiet": (QUIET_END - SHORT, QUIET_END)}
    for name, (since, until) in spans.items():
        st = HistoryStore(str(d / f"{name}.sqlite"), retention_seconds=None, downsample_after_seconds=None)
        rows = truth[(truth["timestamp"] >= since) & (truth["timestamp"] < until)]
        st.append(_points(rows))
        stores[name] = st
    pools = {p.model_name: p for p in cfg.pools}
    tasks = {tt.name: TaskFacts(calls_per_task=float(tt.calls_per_task),
                                input_tokens_per_call=sum(s.calls * s.prompt.mean for s in tt.steps) / tt.calls_per_task,
                                output_tokens_per_call=sum(s.calls * s.output.mean for s in tt.steps) / tt.calls_per_task)
             for tt in cfg.mix.task_types.values()}
    settings = from_dict({"forecast": {"models": ["snaive_day"]}}, "<test>",
                         pools={n: PoolSettings(replicas=p.replicas, gpus_per_replica=p.gpus_per_replica,
                                                max_num_seqs=p.max_num_seqs) for n, p in pools.items()})
    settings = type(settings)(**{**settings.__dict__, "tasks": tasks})
    learned_pool = sorted(pools)[0]  # headroom learned this pool's knee; the other has only its prior
    knees = {learned_pool: KneeReading(7.0, "learned", LEARNED_AT, "queue")}
    out = {"truth": truth, "pools": pools, "settings": settings, "learned": learned_pool}
    for name, st in stores.items():
        inp = from_store(st, spans[name][1], settings, knees=lambda start, end, step: dict(knees))
        out[name] = build_digest(inp, settings)
    yield out
    for st in stores.values():
        st.close()


@pytest.mark.parametrize("span", ["short", "long"])
def test_the_knee_is_the_learned_one_where_headroom_learned_one(fleet, span):
    d = fleet[span]
    for p in d["pools"]:
        k = p["knee"]
        if p["name"] == fleet["learned"]:
            assert (k["source"], k["requests_per_replica"]) == ("learned", 7.0)
            assert k["requests"] == 7.0 * p["replicas"]
            assert "learned by headroom" in k["note"] and "Mon 2025-12-01 09:50" in k["note"]
        else:
            assert (k["source"], k["requests_per_replica"]) == ("prior", float(fleet["pools"][p["name"]].max_num_seqs))
            assert k["note"].startswith("nothing learned yet")
    md = render_markdown(d)
    assert md.count("(7.0 per replica x") == 1 and "nothing learned yet" in md


@pytest.mark.parametrize("span, hours", [("short", 1 / 3), ("long", 168.0)])
def test_costs_are_over_the_hours_covered(fleet, span, hours):
    for p in fleet[span]["pools"]:
        c = p["cost"]
        assert c["covered_hours"] == pytest.approx(hours)
        assert p["coverage"]["hours"] == pytest.approx(hours)
        assert c["gpu_hours"] == pytest.approx(p["replicas"] * p["gpus_per_replica"] * hours)
        assert c["gpu_cost"] == pytest.approx(c["gpu_hours"] * fleet["settings"].prices.gpu_hour)
    md = render_markdown(fleet[span])
    assert md.count("| hours covered by history | " + ("0.33 h (20 min)" if span == "short" else "168 h")) == \
        len(fleet[span]["pools"])


def test_costs_are_over_the_hours_the_tasks_were_counted_in(fleet, tmp_path):
    """A Prometheus holding a week of vLLM load and 20 minutes of headroom's task counts: the load
    covers 168 h, the cost is over the 20 minutes the tasks were counted in."""
    truth, s = fleet["truth"], fleet["settings"]
    tasks = truth["series"].str.startswith("task_arrivals:")
    rows = truth[(~tasks & (truth["timestamp"] >= END - 7 * 86400.0)) | (tasks & (truth["timestamp"] >= END - SHORT))]
    with HistoryStore(str(tmp_path / "mixed.sqlite"), retention_seconds=None, downsample_after_seconds=None) as st:
        st.append(_points(rows))
        d = build_digest(from_store(st, END, s), s)
    short = {p["name"]: p for p in fleet["short"]["pools"]}
    for p in d["pools"]:
        assert p["coverage"]["hours"] == pytest.approx(168.0)
        c, c20 = p["cost"], short[p["name"]]["cost"]
        assert c["covered_hours"] == pytest.approx(1 / 3) and c["tasks"] == c20["tasks"]
        assert c["gpu_hours"] == pytest.approx(c20["gpu_hours"]) and c["private_per_1000"] == pytest.approx(
            c["private_cost"] / c["tasks"] * 1000.0)


def _pool_sections(md: str) -> dict[str, str]:
    parts = re.split(r"^## Pool (.+)$", md, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.mark.parametrize("span", ["short", "long"])
def test_one_task_count_everywhere(fleet, span):
    d, truth = fleet[span], fleet["truth"]
    doc = json.loads(render_json(d))
    md = _pool_sections(render_markdown(d))
    html = render_html(d, {})
    since = END - (SHORT if span == "short" else 7 * 86400.0)
    for p, pj in zip(d["pools"], doc["pools"]):
        # independently: the simulated per-minute task arrivals of the covered week, summed
        rows = truth[(truth["pool"] == p["name"]) & truth["series"].str.startswith("task_arrivals:")
                     & (truth["timestamp"] >= since)]
        expected = {s.split(":", 1)[1]: int(round(g["value"].sum() * STEP)) for s, g in rows.groupby("series")}
        per_type = {t["name"]: t["tasks"] for t in p["tasks"]}
        assert per_type == expected and all(isinstance(v, int) for v in per_type.values())
        total = sum(per_type.values())
        # the simulated history has task starts, no completions: the digest says "started", never "completed"
        assert p["task_count"] == p["cost"]["tasks"] == total and p["cost"]["counted"] == "started"
        assert pj["task_count"] == pj["cost"]["tasks"] == total and pj["completed_tasks"] is None
        assert [t["tasks"] for t in pj["tasks"]] == [per_type[t["name"]] for t in pj["tasks"]]
        sec = md[p["name"]]
        assert f"| tasks started | {total:,d} |" in sec and "per 1,000 tasks started" in sec
        for name, n in per_type.items():
            assert f"| {name} | n/a | {n:,d} |" in sec
        assert f"<td>tasks started</td><td>{total:,d}</td>" in html


@pytest.mark.parametrize("span, under", [("short", 0), ("long", 0), ("quiet", 1)])
def test_no_cost_per_task_below_the_minimum(fleet, span, under):
    d = fleet[span]
    md = _pool_sections(render_markdown(d))
    below = 0
    for p in d["pools"]:
        c = p["cost"]
        if c["tasks"] < MIN_TASKS_FOR_COST:
            below += 1
            assert c["private_per_1000"] is None and c["api_per_1000"] is None and c["private_over_api"] is None
            assert all(t["private_cost_per_1000"] is None for t in p["tasks"])
            assert f"too few tasks ({c['tasks']} started; a cost per task needs {MIN_TASKS_FOR_COST})" in md[p["name"]]
        else:
            assert c["private_per_1000"] == pytest.approx(c["private_cost"] / c["tasks"] * 1000.0)
            assert c["api_per_1000"] is not None and "too few tasks" not in md[p["name"]]
    # 20 busy minutes and two weeks have enough tasks in every pool; 20 quiet minutes do not
    assert below == under


def _line_points(ax, colour: str) -> np.ndarray:
    pts = [ln.get_xydata() for ln in ax.get_lines() if ln.get_color() == colour]
    return np.concatenate(pts) if pts else np.empty((0, 2))


@pytest.mark.parametrize("span, days", [("short", (SHORT - 300) / 86400), ("long", 21.0 - 1 / 24)])
def test_charts_have_a_data_line_and_a_sane_axis(fleet, span, days):
    d = fleet[span]
    for p in d["pools"]:
        for figure, colour, least in ((forecast_figure, ACTUAL, 4), (headroom_figure, NEXT, 4)):
            fig = figure(p, d["timezone"])
            try:
                ax = fig.axes[0]
                pts = _line_points(ax, colour)
                assert len(pts) >= least and np.isfinite(pts).all()
                lo, hi = ax.get_xlim()  # matplotlib date numbers: days
                assert 0 < hi - lo and (hi - lo) == pytest.approx(days, rel=1e-6) \
                    if figure is forecast_figure else 0 < hi - lo <= 7.0 + 1e-9
                ticks = ax.xaxis.get_majorticklocs()
                assert 2 <= len(ticks) <= 12 and lo - 1e-9 <= min(ticks) and max(ticks) <= hi + 1e-9
                years = {int(t // 365.2425) for t in ticks}  # within the digest's own year, not 2024-2029
                assert years == {int(lo // 365.2425)} or years == {int(lo // 365.2425), int(hi // 365.2425)}
            finally:
                plt.close(fig)


def _is(colour: str, px: np.ndarray) -> np.ndarray:
    """Pixels of a line drawn in `colour`, antialiasing included: the dark grey of the actual
    load (nothing else in the plot area is dark), the saturated blue of the headroom line."""
    r, b = px[..., 0], px[..., 2]
    if colour == ACTUAL:
        return px.max(axis=2) <= 120
    assert colour == NEXT
    return (b >= 150) & (r <= 130) & (b - r >= 80)


def _axes_box(figure, pool: dict, tz: str) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) pixel rows / columns of the chart's axes in its PNG (dpi 100)."""
    fig = figure(pool, tz)
    try:
        fig.canvas.draw()
        b = fig.axes[0].get_window_extent()
        height = fig.get_figheight() * fig.dpi
        return int(height - b.y1) + 2, int(height - b.y0) - 2, int(b.x0) + 2, int(b.x1) - 2
    finally:
        plt.close(fig)


@pytest.mark.parametrize("span, share", [("short", 0.9), ("long", 0.6)])
def test_rendered_pngs_and_html_carry_the_lines(fleet, span, share):
    d = fleet[span]
    charts = charts_for(d)
    html = render_html(d, charts)
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(uris) == len(charts) == 2 * len(d["pools"])
    for i, p in enumerate(d["pools"]):
        for kind, figure, colour, least in (("forecast", forecast_figure, ACTUAL, share),
                                            ("headroom", headroom_figure, NEXT, 0.9)):
            png = charts[f"pool{i}-{kind}"]
            assert base64.b64encode(png).decode() in uris
            img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
            top, bottom, left, right = _axes_box(figure, p, d["timezone"])
            plot = img[top:bottom, left:right]
            near = _is(colour, plot)
            # a line across the plot area: the line's colour in most columns (the legend is outside)
            assert near.any(axis=0).mean() >= least, (span, p["name"], kind)
