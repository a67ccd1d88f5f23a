"""Demand, not only service: requests turned away by reason, the offered load, and forecasts of it.

Exact checks on the definitions (monitor/model.py `shed_rate`, `offered_requests`; the gateways'
classification), then the simulator: an overloaded pool whose engines reject past a queue limit and
whose clients give up after 5 s in a queue, read through the cycle as a real fleet would be (the
offered load against the simulator's own arrivals x service time), and two weeks of history whose
weekday peaks overload the fleet (the forecast of the offered load against the simulator's true
offered load at the next day's peak, the served-load forecast beside it)."""
from __future__ import annotations

import pandas as pd
import pytest

from monitor.capacity.shed import gateway_shed_rates
from monitor.config import Config, Target
from monitor.cycle import CycleInputs, CycleState, step
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.forecast.backtest import ForecastSettings
from monitor.forecast.pool import PoolSettings, forecast_pool
from monitor.model import PoolSnapshot, Quantiles, SourceStatus
from headroom_lab.sim.exposition import render_vllm
from headroom_lab.sim.fleet import Fleet, config_from_dict, load_config
from headroom_lab.sim.history import generate_history, schema_history
from monitor.sources.gateway_schema import GatewayReading, TaskCumulative, shed_reason
from monitor.sources.vllm import readings_from_text

START = 1_790_000_000.0


def pool(**kw) -> PoolSnapshot:
    p = PoolSnapshot(pool="p", model="m", replicas=2, active_requests=10.0, queued_requests=4.0)
    p.latency = {"e2e": Quantiles(mean=6.0), "queue": Quantiles(mean=1.0)}
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_offered_is_active_plus_unserved_arrivals_times_service_time():
    assert pool().offered_requests is None  # no source reports shed requests: unknown, not the served load
    assert pool(shed_rates={"rejected": 0.0, "aborted": 0.0}).offered_requests == 10.0  # a steady queue adds nothing
    assert pool(shed_rates={"rejected": 1.5, "aborted": 0.5}).offered_requests == 10.0 + 2.0 * (6.0 - 1.0)
    assert pool(shed_rates={"aborted": 0.0}, queue_growth_rate=0.4).offered_requests == pytest.approx(12.0)
    assert pool(shed_rates={"aborted": 0.0}, queue_growth_rate=-3.0).offered_requests == 10.0
    # a gateway in front relays the engines' rejections: the larger sum, never both
    both = pool(shed_rates={"rejected": 1.0, "aborted": 1.0, "gateway_rate_limited": 1.5, "gateway_timeout": 1.0})
    assert both.shed_rate == 2.5 and both.offered_requests == 10.0 + 2.5 * 5.0
    no_latency = pool(shed_rates={"rejected": 1.0})
    no_latency.latency = {}
    assert no_latency.offered_requests is None


@pytest.mark.parametrize("labels, reason", [
    ({"exception_status": "429", "exception_class": "RateLimitError"}, "gateway_rate_limited"),
    ({"exception_status": "504"}, "gateway_timeout"),
    ({"exception_class": "litellm.Timeout"}, "gateway_timeout"),
    ({"exception_status": "500", "exception_class": "InternalServerError"}, "gateway_error"),
    ({"error_type": "_OTHER"}, "gateway_error"),
    ({"exception_status": "400", "exception_class": "BadRequestError"}, None),  # the client's own error
    ({"status_code": "401"}, None),
])
def test_gateway_failures_are_classified_by_status_and_class(labels, reason):
    assert shed_reason(labels) == reason


def test_gateway_shed_rates_are_counter_increases_per_second_per_pool():
    def reading(t, ts, by):
        tc = TaskCumulative("ask")
        tc.failed_by_reason = dict(by)
        return GatewayReading("litellm", ts, {"ask": tc})
    older = reading("ask", START, {"gateway_rate_limited": 10.0})
    newer = reading("ask", START + 20, {"gateway_rate_limited": 50.0, "gateway_timeout": 4.0})
    rates = gateway_shed_rates([("p", None, newer, older, True, {})], {"p"})
    assert rates == {"p": {"gateway_rate_limited": 2.0, "gateway_timeout": 0.2}}
    assert gateway_shed_rates([("p", None, newer, None, False, {})], {"p"}) == {}  # one reading: nothing yet
    moved = gateway_shed_rates([("p", None, newer, older, True, {"ask": "q"})], {"p", "q"})
    assert set(moved) == {"q"}  # capacity.task_pools sends the task type's calls elsewhere


def overloaded_fleet():
    sim = config_from_dict({
        "seed": 5,
        "pools": {"p": {"model_name": "m", "replicas": 2, "max_num_seqs": 4, "max_num_queued_reqs": 12,
                        "num_gpu_blocks": 2048, "block_size": 16, "enable_prefix_caching": False,
                        "max_model_len": 4096}},
        "gateway": {"session_label": False, "task_type_label": True},
        "scenarios": {"steady": {"level": 1.0, "request_timeout_s": 5.0}},
        "mix": {"task_types": {"ask": {"pool": "p", "rate_per_s": 6.0, "retries": {"max_retries": 0}, "steps": [
            {"calls": 1, "prompt": {"mean": 300, "cv": 0.3, "max": 1000},
             "output": {"mean": 300, "cv": 0.3, "max": 1000}}]}}},
    })
    return Fleet(sim, "steady", seed=5, start_time=START)


def test_an_overloaded_simulated_pool_sheds_and_its_offered_load_is_the_demand():
    fleet = overloaded_fleet()
    urls = {r.name: f"http://{r.name}:8000/metrics" for r in fleet.pools["p"]}
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()], latency_window=300.0)
    state = CycleState(cfg)
    for _ in range(40):  # 10 minutes of 15-s cycles
        fleet.advance(15.0)
        readings = [readings_from_text(render_vllm(r, fleet.t), urls[r.name], fleet.t)[0] for r in fleet.pools["p"]]
        state, snap = step(state, CycleInputs(readings, [SourceStatus("vllm", u, True) for u in urls.values()]),
                           fleet.t)
    [p] = snap.pools
    assert p.shed_rates["rejected"] > 0.5 and p.shed_rates["aborted"] > 0.1, p.shed_rates
    # the truth: every arrival (6 calls/s, Poisson: what headroom never sees) holding the service
    # time the engines gave the requests they served (end-to-end less queue time, over the run)
    e2e = sum(r.stats.h["e2e_request_latency_seconds"].sum for r in fleet.pools["p"])
    queue = sum(r.stats.h["request_queue_time_seconds"].sum for r in fleet.pools["p"])
    served = sum(r.stats.h["e2e_request_latency_seconds"].count for r in fleet.pools["p"])
    assert served > 500
    truth = 6.0 * (e2e - queue) / served
    assert p.offered_requests == pytest.approx(truth, rel=0.15), (p.offered_requests, truth, p.shed_rates)
    assert p.active_requests == 8 and p.active_requests < 0.8 * truth  # every slot busy: service is capped
    samples = Renderer().render(snap)
    assert {lb["reason"] for lb, _ in samples["headroom_shed_requests_rate"]} == {"rejected", "aborted"}
    assert samples["headroom_offered_requests"] == [({"pool": "m"}, p.offered_requests)]
    js = snapshot_to_dict(snap)["pools"][0]
    assert js["offered_requests"] == p.offered_requests and js["shed_rates"] == p.shed_rates


def test_the_offered_load_forecast_holds_the_peak_the_served_one_misses():
    cfg = load_config(None)
    cfg.scenarios["morning"] = {**cfg.scenarios["morning"], "history_noise": 0.0}  # the forecast's error, not the days'
    end = START // 3600 * 3600
    cut = end - 86400.0
    df = generate_history(cfg, days=15, step_s=300, end=end, seed=4, level=1.4, scenario="morning", origin=end)
    history = schema_history(df, cfg)
    fast = PoolSettings(horizons=("1d",), forecast=ForecastSettings(models=("snaive_week_level", "snaive_week")))
    for p in cfg.pools:
        mine = history[history["pool"] == p.model_name]
        series = {k: pd.Series(g["value"].to_numpy(), index=g["timestamp"].to_numpy())
                  for k, g in mine.groupby("series") if k in ("load", "offered")}
        fc = forecast_pool({k: s[s.index <= cut] for k, s in series.items()}, 100.0, cut, fast)
        truth = df[(df["pool"] == p.name) & (df["series"] == "offered_true") & (df["timestamp"] > cut)]["value"]
        peak = float(truth.max())
        offered, served = fc.horizons["1d"].peak, fc.series["load"].horizons["1d"].peak
        assert fc.capacity_series == "offered" and fc.as_dict()["capacity_series"] == "offered"
        assert offered == pytest.approx(peak, rel=0.15), (p.name, offered, served, peak)
        assert served < 0.85 * peak, (p.name, served, peak)  # capped by the capacity it should predict
