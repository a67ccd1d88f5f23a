"""headroom's capacity layer against the simulated fleet (lab/headroom_lab/sim), whose truth is known:
the knee by construction (theoretical_knee), every task's true duration and model calls."""
from __future__ import annotations

import numpy as np
import pytest
import simfleet

from headroom_lab.sim.exposition import render_app, render_dcgm, render_gateway, render_vllm
from headroom_lab.sim.fleet import Fleet, load_config, theoretical_knee
from monitor.capacity.headroom import CapacitySettings, compute_capacity
from monitor.capacity.knee import KneeEstimator, prior_knee
from monitor.capacity.power import key_map, power_by_pool
from monitor.capacity.tasks import derive_tasks
from monitor.derive import histogram as histo
from monitor.derive.core import derive_pools
from monitor.sources.gateway import GatewayConfig, iter_samples, read_gateway
from monitor.sources.vllm import readings_from_text

SCRAPE = 5.0  # simulated seconds between scrapes
# a stepped load sweep in tasks/s: up past the knee, back down (the queue drains), and again
LEVELS = [4, 8, 12, 16, 18, 20, 22, 24, 26, 4, 4, 6, 10, 14, 18, 22, 26, 28, 4, 4]


def one_pool(max_num_seqs: int, num_gpu_blocks: int, seed: int):
    return simfleet.one_pool(seed, {"q": simfleet.task(1.0)}, max_num_seqs=max_num_seqs, num_gpu_blocks=num_gpu_blocks)


def sweep(cfg, seed: int, signals: tuple[str, ...]):
    """Scrape every replica's /metrics text through the stepped sweep; feed one estimator per signal
    (the fleet is the same for each: one sweep serves them all).

    Load per replica and interval = concurrency by Little's law from the e2e histogram
    (sum of e2e seconds finished in the interval / interval: time-averaged active + queued);
    latency = the interval's mean of the signal's histogram."""
    pool = cfg.pools[0]
    fleet = Fleet(cfg, "steady", seed=seed, start_time=0.0)
    ests = {signal: KneeEstimator(signal, prior_knee(max_num_seqs=pool.max_num_seqs)) for signal in signals}
    prev, history = {}, {}
    published: dict[str, list] = {signal: [] for signal in signals}
    for level in LEVELS:
        fleet.sp["level"] = level  # the scenario's rate multiplier, stepped by hand
        for _ in range(6):
            fleet.advance(SCRAPE)
            for r in fleet.pools["p"]:
                rd = readings_from_text(render_vllm(r, fleet.t), f"http://{r.name}:8000/metrics", fleet.t)[0]
                history.setdefault(rd.target, []).append(rd)
                p = prev.get(r.name)
                if p is not None:
                    e2e = rd.histograms["e2e"].minus(p.histograms["e2e"])
                    for signal, est in ests.items():
                        sig = rd.histograms[signal].minus(p.histograms[signal])
                        if sig is not None and sig.count > 0:
                            est.observe(e2e.sum / (rd.timestamp - p.timestamp), rd.kv_live_tokens,
                                        sig.sum / sig.count)
                prev[r.name] = rd
        for signal, est in ests.items():
            published[signal].append(est.estimate())
    return fleet, published, history


@pytest.fixture(scope="module")
def queue_and_ttft():
    """The (16 slots, 4,096 blocks, seed 1) sweep once for both tests that read it: the knee on the
    queue signal and the knee on TTFT (each test used to run the same simulated sweep again)."""
    cfg = one_pool(16, 4096, 1)
    return (cfg, *sweep(cfg, 1, ("queue", "ttft")))


@pytest.mark.parametrize("max_num_seqs, blocks, seed", [
    (16, 4096, 1), (16, 4096, 2),  # bound by max_num_seqs: knee 16 per replica
    (64, 700, 1), (64, 700, 2),  # bound by the KV cache: knee ~16.4 per replica
])
def test_sim_knee_within_10_percent_of_construction(max_num_seqs, blocks, seed, request):
    if (max_num_seqs, blocks, seed) == (16, 4096, 1):
        cfg, _, by_signal, _ = request.getfixturevalue("queue_and_ttft")
    else:
        cfg = one_pool(max_num_seqs, blocks, seed)
        _, by_signal, _ = sweep(cfg, seed, ("queue",))
    truth = theoretical_knee(cfg.pools[0], cfg.mix)
    assert truth["bound"] == ("max_num_seqs" if max_num_seqs == 16 else "kv_cache")
    published = by_signal["queue"]
    k = published[-1]
    assert k.source == "learned", k.detail
    assert k.requests == pytest.approx(truth["per_replica"], rel=0.10)
    # before the sweep went past the knee, the prior answered and said so
    assert published[0].source == "prior" and published[0].requests == max_num_seqs
    # once learned, the knee did not jump around on noise
    learned = {round(x.requests, 9) for x in published if x.source == "learned"}
    assert len(learned) <= 2


def test_sim_knee_on_ttft_and_capacity_end_to_end(queue_and_ttft):
    cfg, fleet, by_signal, history = queue_and_ttft
    truth = theoretical_knee(cfg.pools[0], cfg.mix)
    knee = by_signal["ttft"][-1]
    assert knee.source == "learned" and knee.signal == "ttft"
    assert knee.requests == pytest.approx(truth["per_replica"], rel=0.10)
    # the pool snapshot from the live pipeline's derivation, then capacity on top of it
    snap = derive_pools(history, fleet.t, 30.0)[0]
    assert snap.replicas == 2
    targets = {f"http://{r.name}:8000/metrics": r for r in fleet.pools["p"]}
    watts, unmatched = power_by_pool(iter_samples(render_dcgm(fleet, fleet.t)),
                                     key_map(("p", t, {"pod": r.name}) for t, r in targets.items()))
    assert unmatched == 0 and watts["p"] >= 2 * cfg.pools[0].idle_watts
    c = compute_capacity(snap, knee, CapacitySettings(max_num_seqs=16), power_watts=watts["p"], sessions=None)
    assert c["knee_requests"] == pytest.approx(truth["pool"], rel=0.10)
    assert c["capacity_requests"]["slots"] == 32
    load = snap.active_requests + snap.queued_requests
    assert c["utilisation_ratio"] == pytest.approx(load / c["capacity_requests"]["effective"])
    assert c["ratio"]["n_minus_1"] == pytest.approx(1 - load / (c["capacity_requests"]["effective"] / 2))
    assert c["power_watts"] == watts["p"] and c["power_source"] == "dcgm"


def test_sim_tasks_calls_exact_and_latency_within_one_bucket():
    cfg = load_config()  # the default mix: four task types, multi-step agents, retries, two pools
    fleet = Fleet(cfg, "steady", seed=2, start_time=0.0, scenario_overrides={"level": 0.3})
    app, gw = GatewayConfig(kind="app"), GatewayConfig(kind="envoy")
    fleet.advance(120)
    t0 = fleet.t
    a0, g0 = read_gateway(render_app(fleet, t0), app, t0), read_gateway(render_gateway(fleet, t0), gw, t0)
    fleet.advance(600)
    t1 = fleet.t
    a1, g1 = read_gateway(render_app(fleet, t1), app, t1), read_gateway(render_gateway(fleet, t1), gw, t1)
    derived = derive_tasks(a1, a0, app)
    assert set(derived) == set(cfg.mix.task_types)
    for tt, d in derived.items():
        done = [r for r in fleet.truth if r.task_type == tt and t0 < r.end <= t1 and not r.failed]
        assert done, tt
        assert d.completed_tasks == len(done)
        # calls per completed task: exact
        assert d.calls_per_task == pytest.approx(sum(r.model_calls for r in done) / len(done), rel=1e-12)
        started = [r for r in fleet.truth if r.task_type == tt and t0 < r.start <= t1]
        assert d.tasks >= len(started)  # started in the window (some are still running)
        assert d.arrival_rate == pytest.approx(d.tasks / (t1 - t0))
        durations = np.array([r.duration for r in done])
        h = a1.tasks[tt].task_duration.minus(a0.tasks[tt].task_duration)
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")):
            exact = float(np.quantile(durations, q))
            est = getattr(d.task_latency, key)
            assert abs(histo.bucket_index(h.bounds, est) - histo.bucket_index(h.bounds, exact)) <= 1, (tt, q, est, exact)
    # the gateway view (Envoy style, task_type header label) sees the calls of every task type
    g = derive_tasks(g1, g0, gw)
    for tt in cfg.mix.task_types:
        assert g[tt].calls > 0 and g[tt].call_latency.count == g[tt].calls
    multi = [tt for tt, t in cfg.mix.task_types.items() if sum(s.calls for s in t.steps) > 1]
    for tt in multi:  # calls per completed task > 1 where the mix says so
        assert derived[tt].calls_per_task > 1
