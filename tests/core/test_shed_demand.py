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

from headroom_lab.sim.exposition import render_vllm
from headroom_lab.sim.fleet import Fleet, config_from_dict, load_config
from headroom_lab.sim.history import generate_history, schema_history
from monitor.capacity.shed import add_gateway_shed, gateway_shed_rates
from monitor.config import Config, Target
from monitor.config.inputs import step_settings
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.forecast.pool import PoolSettings, forecast_pool
from monitor.forecast.rolling_origin import ForecastSettings
from monitor.model import PoolSnapshot, Quantiles, SourceStatus
from monitor.sources.gateway_schema import GatewayReading, TaskCumulative, shed_reason
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

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


def test_the_application_s_give_ups_are_read_by_task_type_as_abandoned():
    """agent_calls_abandoned_total{task_type} (docs/capacity.md): read from an application's body as
    the shed reason `abandoned` of its task type, not as a gateway failure."""
    from monitor.sources.gateway import read_gateway
    from monitor.sources.gateway_schema import GatewayConfig
    body = ("# TYPE agent_calls_abandoned_total counter\n"
            'agent_calls_abandoned_total{task_type="chat"} 394\n'
            'agent_calls_abandoned_total{task_type="draft"} 12\n'
            "# TYPE agent_tasks_started_total counter\n"
            'agent_tasks_started_total{task_type="chat"} 1628\n')
    r = read_gateway(body, GatewayConfig(kind="app"), START)
    assert r.tasks["chat"].failed_by_reason == {"abandoned": 394.0}
    assert r.tasks["draft"].failed_by_reason == {"abandoned": 12.0}
    assert r.tasks["chat"].failed_calls == 0.0 and r.tasks["chat"].tasks_started == 1628.0
    # over a window: the 394 give-ups in 25 minutes are 0.2627 calls/s
    older = read_gateway(body.replace(" 394", " 0").replace(" 12", " 0"),
                         GatewayConfig(kind="app"), START - 1500)
    rates = gateway_shed_rates([("p", None, r, older, True, {})], {"p"})
    assert rates == {"p": {"abandoned": pytest.approx((394 + 12) / 1500)}}


def test_give_ups_the_engine_aborted_are_counted_once():
    """The application counts every give-up; the engine counts those it noticed as aborted. The pool
    keeps `aborted` and only the give-ups beyond it as `abandoned`, so summing reasons (the alert,
    shed_rate) counts each give-up once."""
    engine = {"rejected": 0.5, "aborted": 0.1}
    merged = add_gateway_shed(engine, {"abandoned": 0.4, "gateway_timeout": 0.2})
    assert merged == {"rejected": 0.5, "aborted": 0.1, "abandoned": pytest.approx(0.3), "gateway_timeout": 0.2}
    assert engine == {"rejected": 0.5, "aborted": 0.1}  # the engines' rates are not changed in place
    # the engine aborted more than the application counted (another client): nothing beyond
    assert add_gateway_shed({"aborted": 0.6}, {"abandoned": 0.4}) == {"aborted": 0.6, "abandoned": 0.0}
    # no engine abort counter (or LiteLLM in front of vLLM finishing every call: 0 aborts): all of them
    assert add_gateway_shed({}, {"abandoned": 0.2627}) == {"abandoned": 0.2627}
    # shed_rate: rejected + aborted + abandoned beyond = 0.5 + 0.1 + 0.3 = 0.9 > the gateway's 0.2;
    # offered = 10 active + 0.9/s x (6 - 1) s of service
    p = pool(shed_rates=merged)
    assert p.shed_rate == pytest.approx(0.9)
    assert p.offered_requests == pytest.approx(10.0 + 0.9 * 5.0)


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
    state = CycleState(step_settings(cfg))
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


def test_the_simulated_application_s_give_ups_reach_the_pool_once():
    """The overloaded simulated pool read through the cycle with its gateway and application pages:
    the application counts each call its client gave up on (agent_calls_abandoned_total), the engine
    counts the same calls as aborted; the pool keeps them in `aborted` and exports `abandoned` as the
    give-ups beyond it (near 0 here, where the engine sees every give-up), never twice."""
    from simfleet import GATEWAYS, cycle_inputs

    from monitor.capacity.enrich import CapacityState
    from monitor.config import Capacity, PoolSettings
    from monitor.config.inputs import capacity_inputs
    from monitor.step.cycle_state import CycleState as State
    fleet = overloaded_fleet()
    urls = {r.name: f"http://{r.name}:8000/metrics" for r in fleet.pools["p"]}
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()], gateways=list(GATEWAYS), latency_window=300.0,
                 pools={"m": PoolSettings(max_num_seqs=4)}, capacity=Capacity())
    capacity = CapacityState(capacity_inputs(cfg))
    state = State(step_settings(cfg), capacity)
    for _ in range(40):  # 10 minutes of 15-s cycles
        fleet.advance(15.0)
        state, snap = step(state, cycle_inputs(fleet, urls, cfg, capacity), fleet.t)
    assert not [k for k in state.errors if k[0] == "enricher"], state.errors
    [p] = snap.pools
    given_up = fleet.app.abandoned["ask"]
    aborted_by_engines = sum(r.stats.success["abort"] for r in fleet.pools["p"])
    assert given_up > 100 and given_up == aborted_by_engines  # the simulator's truth: one give-up, two counters
    assert "abandoned" in p.shed_rates and p.shed_rates["aborted"] > 0.1, p.shed_rates
    # the application's and the engines' rates cover different windows (task window, rate window),
    # so a little is left over; never the whole give-up rate a second time
    assert 0.0 <= p.shed_rates["abandoned"] < 0.25 * p.shed_rates["aborted"], p.shed_rates
    engine_side = p.shed_rates["rejected"] + p.shed_rates["aborted"] + p.shed_rates["abandoned"]
    assert p.shed_rate == pytest.approx(max(engine_side, sum(v for k, v in p.shed_rates.items() if k.startswith("gateway_"))))
    reasons = {lb["reason"] for lb, _ in Renderer().render(snap)["headroom_shed_requests_rate"]}
    assert {"rejected", "aborted", "abandoned"} <= reasons
