"""compute_capacity, N-1, sessions, sessions per MW, DCGM power join: hand-computed numbers."""
from __future__ import annotations

import pytest

from monitor.capacity.headroom import CapacitySettings, compute_capacity
from monitor.capacity.knee import Knee, prior_knee
from monitor.capacity.power import key_map, power_by_pool
from monitor.model import PoolSnapshot, ReplicaSnapshot
from monitor.sources.gateway import iter_samples


def pool(active=30.0, queued=6.0, kv_live=60_000.0, caps=(100_000.0,) * 4):
    detail = [ReplicaSnapshot(replica=f"r{i}", pool="chat", up=True, kv_tokens_capacity=c) for i, c in enumerate(caps)]
    return PoolSnapshot(pool="chat", model="m", replicas=len(caps), replicas_configured=len(caps),
                        active_requests=active, queued_requests=queued, kv_tokens_live=kv_live,
                        kv_tokens_capacity=sum(caps), replica_detail=detail)


LEARNED = Knee(requests=12.0, kv_tokens=24_000.0, source="learned", signal="ttft", confidence=0.9)


def test_hand_computed_headroom_sessions_and_power():
    # load 36; slots 16 x 4 = 64; KV 400 000 / (60 000 / 30 = 2 000) = 200; knee 12 x 4 = 48
    c = compute_capacity(pool(), LEARNED, CapacitySettings(max_num_seqs=16), power_watts=1400.0, sessions=18)
    assert c["capacity_requests"] == {"slots": 64.0, "kv": 200.0, "knee": 48.0, "slo": None,
                                       "effective": 48.0}
    assert c["limiting_factor"] == "knee"
    assert c["knee_requests"] == 48.0 and c["knee_kv_tokens"] == 96_000.0
    assert c["knee_info"] == {"source": "learned", "signal": "ttft"} and c["knee_confidence_ratio"] == 0.9
    assert c["utilisation_ratio"] == pytest.approx(0.75)
    assert c["ratio"]["current"] == pytest.approx(0.25)
    assert c["headroom_requests"]["current"] == pytest.approx(12.0)
    # N-1 of four equal replicas: 48 x 3/4 = 36 = the load: no headroom left
    assert c["ratio"]["n_minus_1"] == pytest.approx(0.0)
    assert c["headroom_requests"]["n_minus_1"] == pytest.approx(0.0)
    # 18 sessions hold 36 requests: 2 per session; 48 / 2 = 24 sessions fit
    assert c["session_capacity"] == pytest.approx(24.0)
    # 24 sessions / 0.0014 MW
    assert c["sessions_per_megawatt"] == pytest.approx(24 / 0.0014)
    assert c["power_source"] == "dcgm" and c["kv_tokens_per_request_source"] == "measured"


def test_largest_replica_lost_and_negative_headroom():
    # one replica twice as large: it holds 200 000 / 500 000 = 40 % of the pool
    p = pool(caps=(100_000.0, 100_000.0, 100_000.0, 200_000.0))
    c = compute_capacity(p, LEARNED, CapacitySettings(max_num_seqs=16))
    assert c["n_minus_1_share"] == pytest.approx(0.4)
    assert c["headroom_requests"]["n_minus_1"] == pytest.approx(48 * 0.6 - 36)
    assert c["ratio"]["n_minus_1"] == pytest.approx(1 - 36 / 28.8)  # -0.25: over capacity
    overloaded = compute_capacity(pool(active=50, queued=22), LEARNED, CapacitySettings())
    assert overloaded["ratio"]["current"] == pytest.approx(1 - 72 / 48)
    assert overloaded["utilisation_ratio"] == pytest.approx(1.5)


def test_kv_or_slots_can_limit():
    # 10 running requests hold 60 000 KV tokens: 6 000 each; KV allows 400 000 / 6 000 = 66.7
    k = Knee(20.0, None, "learned", "queue", 0.8)
    c = compute_capacity(pool(active=10, queued=0), k, CapacitySettings(max_num_seqs=16))
    assert c["capacity_requests"]["kv"] == pytest.approx(400_000 / 6_000)
    assert c["limiting_factor"] == "slots" and c["capacity_requests"]["effective"] == 64.0
    c = compute_capacity(pool(active=10, queued=0), k, CapacitySettings(max_num_seqs=32))
    assert c["limiting_factor"] == "kv" and c["capacity_requests"]["effective"] == pytest.approx(66.6667, rel=1e-4)


def test_prior_knee_configured_power_and_idle_pool():
    prior = prior_knee(max_num_seqs=8)
    s = CapacitySettings(max_num_seqs=8, kv_tokens_per_request=4_000, watts_per_replica=700,
                         active_requests_per_session=0.5)
    c = compute_capacity(pool(active=0, queued=0, kv_live=0.0), prior, s, power_watts=None, sessions=0)
    assert c["knee_info"]["source"] == "prior" and c["knee_confidence_ratio"] == 0.0
    assert c["capacity_requests"]["kv"] == pytest.approx(400_000 / 4_000)
    assert c["kv_tokens_per_request_source"] == "configured"
    assert c["capacity_requests"]["effective"] == 32.0
    assert c["ratio"]["current"] == 1.0
    assert c["session_capacity"] == 64.0  # configured 0.5 active requests per session
    assert c["power_watts"] == 2800.0 and c["power_source"] == "configured"
    assert c["sessions_per_megawatt"] == pytest.approx(64 / 0.0028)


def test_single_replica_has_no_n_minus_1_and_unknowns_stay_none():
    p = pool(caps=(100_000.0,))
    c = compute_capacity(p, LEARNED, CapacitySettings())
    # one replica has no N-1: null, never -Inf (under load) - and the current headroom is still there
    assert c["ratio"]["n_minus_1"] is None and c["headroom_requests"]["n_minus_1"] is None
    assert c["n_minus_1_share"] is None
    assert c["ratio"]["current"] == pytest.approx(1 - 36 / 12)  # load 36 on a knee of 12: -2
    idle = compute_capacity(pool(active=0, queued=0, kv_live=0.0, caps=(100_000.0,)), LEARNED, CapacitySettings())
    assert idle["ratio"]["n_minus_1"] is None and idle["ratio"]["current"] == 1.0
    # two replicas, one stalled: one working replica left, no N-1 either
    two = pool(caps=(100_000.0, 100_000.0))
    two.stalled_replicas, two.stalled_kv_tokens_capacity = 1, 100_000.0
    assert compute_capacity(two, LEARNED, CapacitySettings())["ratio"]["n_minus_1"] is None
    # two working replicas do have one: 24 x 1/2 = 12 for a load of 36
    assert compute_capacity(pool(caps=(100_000.0,) * 2), LEARNED, CapacitySettings())["ratio"]["n_minus_1"] == \
        pytest.approx(1 - 36 / 12)
    c = compute_capacity(pool(), Knee(None, None, "prior", "limits"), CapacitySettings(), sessions=None)
    # KV still bounds the pool (measured tokens per request); nothing else is known
    assert c["capacity_requests"]["slots"] is None and c["capacity_requests"]["knee"] is None
    assert c["limiting_factor"] == "kv"
    assert c["session_capacity"] is None and c["sessions_per_megawatt"] is None
    with pytest.raises(ValueError, match="max_num_seqs"):
        CapacitySettings(max_num_seqs=0)
    with pytest.raises(ValueError, match="unknown capacity setting"):
        CapacitySettings.from_dict({"max_seqs": 3})


DCGM = """# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54"} 350.500000
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b",pci_bus_id="00000000:08:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54"} 349.500000
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-c",device="nvidia0",hostname="node-b",pod="vllm-batch-0",namespace="llm",container="vllm"} 600.000000
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-d",device="nvidia1",Hostname="node-c"} 9223372036854775794
DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-e",device="nvidia2",Hostname="node-z"} 410.000000
dcgm_power_usage{gpu="0",uuid="GPU-f",instance="10.0.0.9:9400"} 200.0
"""


def test_dcgm_power_joined_by_host_pod_and_instance():
    keys = key_map([
        ("chat", "http://node-a:8000/metrics", None),
        ("batch", "http://10.1.2.3:8000/metrics", {"pod": "vllm-batch-0"}),
        ("chat", "http://node-c:8000/metrics", None),
        ("small", "http://10.0.0.9:8000/metrics", None),
    ])
    watts, unmatched = power_by_pool(iter_samples(DCGM), keys)
    assert watts == {"chat": pytest.approx(700.0), "batch": 600.0, "small": 200.0}
    assert unmatched == 1  # node-z serves no known replica; node-c's blank sentinel is skipped


def test_node_shared_by_two_pools_falls_back_to_pod():
    keys = key_map([("chat", "http://node-b:8000", None), ("batch", "http://node-b:8001", {"pod": "vllm-batch-0"})])
    assert keys["node-b"] is None
    watts, _ = power_by_pool(iter_samples(DCGM), keys)
    assert watts == {"batch": 600.0}


def test_a_steady_kv_figure_from_the_cycle_replaces_the_snapshot_s_own():
    # the snapshot measures 60 000 / 30 = 2 000 tokens per request; the cycle's steady figure is 4 000
    from monitor.capacity.headroom import pool_capacity
    c = pool_capacity(pool(), LEARNED, CapacitySettings(max_num_seqs=16), kv_per_request=(4_000.0, "measured"))
    assert c.capacity_requests.kv == pytest.approx(400_000 / 4_000)
    assert c.kv_tokens_per_request == 4_000.0 and c.kv_tokens_per_request_source == "measured"
    assert pool_capacity(pool(), LEARNED, CapacitySettings()).capacity_requests.kv == pytest.approx(200.0)


def test_one_replica_pool_shows_no_n_minus_1_on_the_page_json_and_metrics():
    """Under load a one-replica pool used to show "-inf%" on the page and export -Inf."""
    from monitor.capacity.headroom import pool_capacity
    from monitor.export.landing import Trends, render
    from monitor.export.samples import snapshot_samples
    from monitor.export.snapshot_json import pool_to_dict
    from monitor.model import Snapshot
    one = pool(caps=(100_000.0,))
    one.capacity = pool_capacity(one, LEARNED, CapacitySettings())
    snap = Snapshot(timestamp=1796289000.0, pools=[one])
    page = render(snap, Trends())
    assert "N-1: no N-1" in page and "inf%" not in page
    assert "headroom now" in page and "-200%" in page  # current headroom 1 - 36 / 12 is still shown
    doc = pool_to_dict(one)
    assert doc["capacity"]["ratio"] == {"current": pytest.approx(-2.0), "n_minus_1": None, "instant": pytest.approx(-2.0)}
    scenarios = [lbl["scenario"] for lbl, _ in snapshot_samples(snap)["headroom_ratio"]]
    assert scenarios == ["current", "instant"]
    # two replicas: a number on the page
    two = pool(caps=(100_000.0,) * 2)
    two.capacity = pool_capacity(two, LEARNED, CapacitySettings())
    assert "N-1: -200%" in render(Snapshot(timestamp=1796289000.0, pools=[two]), Trends())
