"""Slow replicas: a replica whose tokens come slower than its peers' is named, discounted and
exported (monitor/derive/slow.py, monitor/step/cycle_step.py), and no replica of an even fleet is."""
from __future__ import annotations

import logging

import pytest

from headroom_lab.sim.exposition import render_vllm
from headroom_lab.sim.fleet import Fleet, config_from_dict, load_config
from monitor.capacity.enrich import CapacityState
from monitor.capacity.headroom import CapacitySettings, compute_capacity
from monitor.capacity.knee import Knee
from monitor.config import Config, PoolSettings, Target
from monitor.config.inputs import capacity_inputs, step_settings
from monitor.derive.slow import SLOW_HOLD, latency_ratios
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import PoolSnapshot, SourceStatus
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

START = 1_790_000_000.0


def test_the_ratio_is_over_the_median_of_the_peers():
    r = latency_ratios({"a": (0.02, 100.0), "b": (0.02, 100.0), "c": (0.04, 100.0), "d": (0.09, 10.0), "e": None})
    assert r["c"] == pytest.approx(2.0) and r["a"] == pytest.approx(0.02 / 0.03)
    assert r["d"] is None and r["e"] is None  # too few tokens in the window; no histogram
    assert latency_ratios({"only": (0.05, 1000.0)}) == {"only": None}  # no peer: nothing to compare with


def fleet_of(replicas: int, rate: float, seed: int = 2) -> Fleet:
    sim = config_from_dict({
        "seed": seed,
        "pools": {"p": {"model_name": "m", "replicas": replicas, "max_num_seqs": 32, "num_gpu_blocks": 4096,
                        "block_size": 16, "enable_prefix_caching": False, "max_model_len": 4096}},
        "gateway": {"session_label": False, "task_type_label": True},
        "mix": {"task_types": {"ask": {"pool": "p", "rate_per_s": rate, "steps": [
            {"calls": 1, "prompt": {"mean": 400, "cv": 0.3, "max": 1500},
             "output": {"mean": 150, "cv": 0.4, "max": 800}}]}}},
    })
    return Fleet(sim, "steady", seed=seed, start_time=START)


def cycles(fleet: Fleet, seconds: float, state: CycleState, urls: dict, on_cycle=None):
    snap = None
    for _ in range(int(seconds // 15)):
        fleet.advance(15.0)
        readings = [readings_from_text(render_vllm(r, fleet.t), urls[r.name], fleet.t)[0]
                    for rs in fleet.pools.values() for r in rs if r.alive]
        state, snap = step(state, CycleInputs(readings, [SourceStatus("vllm", u, True) for u in urls.values()]),
                           fleet.t)
        if on_cycle is not None:
            on_cycle(snap)
    return state, snap


def test_a_replica_slowed_2x_is_named_within_3_minutes_and_discounted(caplog):
    fleet = fleet_of(4, 4.0)
    urls = {r.name: f"http://{r.name}:8000/metrics" for r in fleet.pools["p"]}
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()], pools={"m": PoolSettings(max_num_seqs=32)})
    state = CycleState(step_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
    named: list = []

    def watch(snap):
        named.append((fleet.t, {r.replica for p in snap.pools for r in p.replica_detail if r.slow}))

    state, before = cycles(fleet, 300, state, urls, watch)
    assert all(not s for _, s in named), "no replica of the even fleet is named"
    knee_before = before.pools[0].capacity.knee_requests
    slowed = fleet.pools["p"][2]
    slowed.slow_down(2.0)
    t0 = fleet.t
    named.clear()
    with caplog.at_level(logging.WARNING, logger="monitor.step.cycle_step"):
        state, snap = cycles(fleet, 300, state, urls, watch)
    first = next(t for t, s in named if s)
    assert first - t0 <= 180, f"named {first - t0:.0f} s after the slow-down"
    assert first - t0 >= SLOW_HOLD  # held for a minute first, never on one cycle
    assert all(s <= {urls[slowed.name]} for _, s in named), "only the slowed replica is named"
    [p] = snap.pools
    rd = next(r for r in p.replica_detail if r.replica == urls[slowed.name])
    assert rd.slow and rd.latency_ratio == pytest.approx(2.0, rel=0.25)
    assert p.slow_capacity_lost == pytest.approx(1 - 1 / rd.latency_ratio)
    assert p.capacity.knee_requests is not None and knee_before is not None
    assert sum("is slow" in m for m in caplog.messages) == 1  # logged once
    samples = Renderer().render(snap)
    slow = {lb["replica"]: v for lb, v in samples["headroom_replica_slow"]}
    assert slow == {u: (1.0 if u == urls[slowed.name] else 0.0) for u in urls.values()}
    assert snapshot_to_dict(snap)["pools"][0]["slow_replicas"] == 1


def test_no_replica_of_the_even_demo_fleet_is_named():
    cfg_sim = load_config(None)
    fleet = Fleet(cfg_sim, "steady", seed=3, start_time=START)
    urls = {r.name: f"http://{r.name}:8000/metrics" for rs in fleet.pools.values() for r in rs}
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()])
    ratios: list = []

    def watch(snap):
        assert not [r.replica for p in snap.pools for r in p.replica_detail if r.slow]
        ratios.extend(r.latency_ratio for p in snap.pools for r in p.replica_detail if r.latency_ratio is not None)

    cycles(fleet, 300, CycleState(step_settings(cfg)), urls, watch)
    assert ratios and max(ratios) < 1.5, max(ratios)  # compared, and never near the line


def test_a_slow_replica_s_share_of_the_knee_is_discounted():
    knee = Knee(requests=12.0, kv_tokens=24_000.0, source="learned", signal="ttft", confidence=0.9)
    even = PoolSnapshot(pool="p", model="m", replicas=4, active_requests=30.0, queued_requests=6.0)
    slow = PoolSnapshot(pool="p", model="m", replicas=4, active_requests=30.0, queued_requests=6.0,
                        slow_capacity_lost=1 - 1 / 2.0)  # one replica at 2x its peers' latency
    a = compute_capacity(even, knee, CapacitySettings(max_num_seqs=16))
    b = compute_capacity(slow, knee, CapacitySettings(max_num_seqs=16))
    assert a["capacity_requests"]["knee"] == 48.0 and b["capacity_requests"]["knee"] == 12.0 * 3.5
    assert b["knee_kv_tokens"] == 24_000.0 * 3.5 and b["capacity_requests"]["slots"] == 64.0  # slots stay
    assert b["headroom_requests"]["current"] == pytest.approx(42.0 - 36.0)
