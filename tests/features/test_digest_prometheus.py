"""A fresh install's 20 minutes, as the store and as a real Prometheus 2.42 (backfilled with promtool)
hold them: the daemon writes every 10 s cycle to its store, Prometheus scrapes headroom every 15 s.
The digests from both give the same peaks (values held for at least a scrape), and the knee headroom
learned half-way through, read back from its exported series.

Why "peak sessions 28 vs 7": Prometheus history was sampled once a minute within each step, which
sees one 15-s scrape in four and misses peaks the store has; the digest now samples every 15 s.
"""
from __future__ import annotations

import math
import shutil
import time

import pytest

from headroom_lab.sim.fleet import load_config
from headroom_lab.sim.history import generate_history, schema_history
from monitor.capacity.settings import PoolSettings
from monitor.digest.content import build_digest
from monitor.digest.settings import from_dict
from monitor.digest.sources import RESOLUTION, from_prometheus, from_store
from monitor.history.query_range import PrometheusHistory
from monitor.history.store import HistoryStore
from monitor.sources.prometheus import PrometheusClient

pytestmark = [pytest.mark.live, pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                                   reason="needs the prometheus and promtool binaries")]

CYCLE, SCRAPE, HOLD, SPAN = 10, 15, 20, 1200  # seconds: daemon cycle, scrape interval, value held, history
METRICS = {"active_requests": "headroom_active_requests", "queued_requests": "headroom_queued_requests",
           "kv_tokens": "headroom_kv_tokens", "sessions": "headroom_sessions"}
PEAKS = ("load", "active_requests", "queued_requests", "kv_tokens", "sessions")


def _openmetrics(truth, start: int, end: int, replicas: dict[str, int], learned_from: int) -> str:
    """headroom's exported series as Prometheus scraped them every SCRAPE seconds: each scrape shows
    the newest cycle's values; the knee is the prior (8 per replica) until `learned_from`, then 7."""
    values = {(r.pool, r.series, int(r.timestamp)): float(r.value) for r in truth.itertuples(index=False)}
    scrapes = range(start, end, SCRAPE)
    held = {t: (t // CYCLE * CYCLE) // HOLD * HOLD for t in scrapes}  # the newest cycle's value
    out = []
    for series, metric in METRICS.items():
        out.append(f"# TYPE {metric} gauge\n")
        for pool in sorted(replicas):
            out += [f'{metric}{{pool="{pool}"}} {values[(pool, series, held[t])]!r} {t}\n' for t in scrapes]
    out.append("# TYPE headroom_replicas gauge\n")
    for pool, n in sorted(replicas.items()):
        out += [f'headroom_replicas{{pool="{pool}"}} {n} {t}\n' for t in scrapes]
    out.append("# TYPE headroom_knee_requests gauge\n")
    for pool, n in sorted(replicas.items()):
        out += [f'headroom_knee_requests{{pool="{pool}"}} {(7 if t >= learned_from else 8) * n} {t}\n' for t in scrapes]
    out.append("# TYPE headroom_knee_info gauge\n")
    for pool in sorted(replicas):
        for source, signal, when in (("prior", "limits", lambda t: t < learned_from),
                                     ("learned", "queue", lambda t: t >= learned_from)):
            out += [f'headroom_knee_info{{pool="{pool}",signal="{signal}",source="{source}"}} 1 {t}\n'
                    for t in scrapes if when(t)]
    out.append("# EOF\n")
    return "".join(out)


@pytest.fixture(scope="module")
def day_one(tmp_path_factory, prometheus_on_history):
    d = tmp_path_factory.mktemp("digest-prom")
    end = math.floor(time.time() / 3600) * 3600 - 3600  # a recent top of the hour: the digest's week end
    start = end - SPAN
    cfg = load_config(None)
    truth = schema_history(generate_history(cfg, days=SPAN / 86400, step_s=HOLD, end=end - HOLD, seed=5,
                                            level=0.8, replica_series=False), cfg)
    replicas = {p.model_name: p.replicas for p in cfg.pools}
    prom = prometheus_on_history(_openmetrics(truth, start, end, replicas, start + SPAN // 2))
    store = HistoryStore(str(d / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None)
    rows = truth[truth["series"].isin(("load",) + tuple(METRICS))]
    held = {(r.pool, r.series, int(r.timestamp)): float(r.value) for r in rows.itertuples(index=False)}
    store.append((pool, series, float(t + c), v) for (pool, series, t), v in held.items()  # every cycle
                 for c in range(0, HOLD, CYCLE))
    settings = from_dict({"forecast": {"models": ["snaive_day"]}}, "<t>",
                         pools={p: PoolSettings(replicas=n, max_num_seqs=8) for p, n in replicas.items()})
    try:
        yield {"url": prom.url, "store": store, "end": float(end), "settings": settings, "pools": sorted(replicas)}
    finally:
        store.close()


def test_store_and_prometheus_give_the_same_peaks(day_one):
    s, end = day_one["settings"], day_one["end"]
    d_store = build_digest(from_store(day_one["store"], end, s), s)
    d_prom = build_digest(from_prometheus(PrometheusClient(day_one["url"]), end, s), s)
    assert [p["name"] for p in d_store["pools"]] == [p["name"] for p in d_prom["pools"]] == day_one["pools"]
    for ps, pp in zip(d_store["pools"], d_prom["pools"]):
        for k in PEAKS:
            assert pp["peaks"][k]["value"] == pytest.approx(ps["peaks"][k]["value"], rel=1e-9), (ps["name"], k)
            assert pp["peaks"][k]["timestamp"] == ps["peaks"][k]["timestamp"]
        assert ps["coverage"]["hours"] == pp["coverage"]["hours"] == pytest.approx(SPAN / 3600)


def test_sampling_once_a_minute_missed_peaks(day_one):
    """The cause of the issue's mismatch: at the old 60-s resolution Prometheus' peaks fall short."""
    end, step = day_one["end"], day_one["settings"].history_step
    client = PrometheusClient(day_one["url"])
    fine = PrometheusHistory(client, resolution=RESOLUTION).load(None, end - SPAN, end, step)
    coarse = PrometheusHistory(client, resolution=60.0).load(None, end - SPAN, end, step)
    short = [(pool, k, b) for pool in fine for k in ("sessions", "kv_tokens")
             for b, v in fine[pool][k].items() if coarse[pool][k][b] < v - 1e-9]
    assert short and all(coarse[p][k][b] <= fine[p][k][b] + 1e-9 for p in fine for k in ("sessions", "kv_tokens")
                         for b in fine[p][k].index)


def test_the_knee_learned_half_way_is_the_digests(day_one):
    s, end = day_one["settings"], day_one["end"]
    d = build_digest(from_prometheus(PrometheusClient(day_one["url"]), end, s), s)
    for p in d["pools"]:
        assert (p["knee"]["source"], p["knee"]["requests_per_replica"]) == ("learned", 7.0)
        assert p["knee"]["requests"] == 7.0 * p["replicas"]
    # the store holds no knee: without the daemon's snapshot the digest says it is a prior
    d_store = build_digest(from_store(day_one["store"], end, s), s)
    assert all(p["knee"]["source"] == "prior" and p["knee"]["requests_per_replica"] == 8.0 for p in d_store["pools"])
