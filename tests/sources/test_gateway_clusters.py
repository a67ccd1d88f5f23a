"""Gateways that know their cluster: two clusters serve the same model, each behind its own gateway.

With `global.pool_by: [cluster, model_name]` the model is two pools. A gateway entry with
`labels: {cluster: a}` feeds only cluster a's pools (monitor/derive/gateway_scope.py); one without
labels feeds a model's pool only when one pool serves that model, else nothing (counted as
gateway_unattributed / gateway_queue_unmapped, logged once), never both. The gateway bodies are the
real LiteLLM capture (its counts checked against the run's client-side truth) and the llm-d router
body; the engines are the real vLLM CPU capture. The gateway bodies go through the cycle's own
reader (monitor/sources/auxiliary.py `AuxSources.read_gateway`), then the pure step; the last test
runs the whole cycle in Prometheus mode against a real Prometheus 2.42 that scrapes the engines and
both proxies with a `cluster` target label.
"""
from __future__ import annotations

import csv
import logging
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from bodies import app_task_body, vllm_body
from servers import MetricsServer, Prometheus, scrape_config, wait_for
from tiers import starts_servers

from monitor.capacity.enrich import CapacityState
from monitor.capacity.slo_settings import read_slos
from monitor.config import Capacity, Config, GatewaySource, PrometheusSource, Target, from_dict
from monitor.config.inputs import capacity_inputs, pipeline_settings, step_settings
from monitor.derive.gateway_scope import Scope
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.kit.http import BodyBudget
from monitor.kit.settings.reader import ConfigError
from monitor.pipeline.cycle import Pipeline
from monitor.sources.auxiliary import AuxSources, pool_models
from monitor.sources.gateway_queue import read_gateway_queues
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs, CycleState
from monitor.step.cycle_step import step

FIX = Path(__file__).parents[1] / "fixtures" / "gateway"
LITELLM = (FIX / "litellm-1.108.7-agent-tasks.prom").read_text()
ROUTER = (FIX / "llm-d-router-flow-control.prom").read_text()
T0, WINDOW = 1_790_000_000.0, 10.0
POOL_BY = ("cluster", "model_name")
SAMPLE = re.compile(r"^([a-zA-Z_:][^ ]*(?:\{.*\})?) ([-+0-9.eE]+|NaN|[+-]Inf)$")


def truth_calls() -> Counter:
    calls: Counter = Counter()
    with (FIX / "litellm-1.108.7-agent-tasks.truth.csv").open() as f:
        for row in csv.DictReader(f):
            calls[row["task_type"]] += int(row["model_calls"])
    return calls


def scaled(body: str, k: float) -> str:
    """Every sample value times `k`: the same gateway k times as far along (counters, buckets)."""
    out = []
    for line in body.splitlines():
        m = SAMPLE.match(line)
        if m and not m.group(1).split("{")[0].endswith("_created"):
            line = f"{m.group(1)} {float(m.group(2)) * k!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def engines(clusters: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(url, cluster, model) of one replica per cluster and model."""
    return [(f"http://{c}-{i}:8000/metrics", c, m) for c, models in clusters.items() for i, m in enumerate(models)]


def config(replicas, gateways: list[GatewaySource], task_pools=None) -> Config:
    return Config(vllm_targets=[Target(u, labels={"cluster": c}) for u, c, _ in replicas], gateways=gateways,
                  pool_by=POOL_BY, capacity=Capacity(task_window=WINDOW, task_pools=task_pools or {}))


class Fleet:
    """The pure step of a two-cluster fleet, fed gateway bodies through the cycle's reader."""

    def __init__(self, cfg: Config, replicas):
        self.cfg, self.replicas = cfg, replicas
        capacity = CapacityState(capacity_inputs(cfg))
        self.state = CycleState(step_settings(cfg), capacity)
        self.aux = AuxSources(gateways=cfg.gateways, dcgm_targets=cfg.dcgm_targets, alerts=cfg.alerts,
                              scrape_timeout=cfg.scrape_timeout, interval=cfg.interval, pool_by=cfg.pool_by,
                              budget=BodyBudget(1 << 20), gateway_configs=[
                                  capacity.gateway_config(g.kind, g.task_label, g.session_label) for g in cfg.gateways])

    def cycle(self, t: float, bodies: list[str]):
        readings = [r for url, c, m in self.replicas for r in readings_from_text(vllm_body(m), url, t, {"cluster": c})]
        models = pool_models(readings, self.state.history, POOL_BY)
        scrapes = [self.aux.read_gateway(i, body, t, models) for i, body in enumerate(bodies)]
        self.state, snap = step(self.state, CycleInputs(readings, [], gateways=scrapes), t)
        return snap


def calls_by_pool(snap) -> dict[str, dict[str, float]]:
    return {p.pool: {tt: s.calls for tt, s in p.tasks.by_type.items()} for p in snap.pools if p.tasks.by_type}


def test_each_clusters_pool_gets_only_its_gateways_tasks():
    replicas = engines({"a": ["tiny"], "b": ["tiny"]})
    gateways = [GatewaySource(kind="litellm", url=f"http://gw-{c}:4000/metrics", labels={"cluster": c}) for c in "ab"]
    fleet = Fleet(config(replicas, gateways), replicas)
    fleet.cycle(T0, [LITELLM, LITELLM])
    # over the window cluster a's proxy served the captured run once more, cluster b's twice more
    snap = fleet.cycle(T0 + WINDOW, [scaled(LITELLM, 2), scaled(LITELLM, 3)])
    truth = truth_calls()
    assert calls_by_pool(snap) == {'tiny{cluster="a"}': dict(truth),
                                   'tiny{cluster="b"}': {tt: 2 * n for tt, n in truth.items()}}
    assert "gateway_unattributed" not in snap.anomalies


def test_a_gateway_without_labels_never_counts_a_model_twice(caplog):
    replicas = engines({"a": ["tiny"], "b": ["tiny"]})
    fleet = Fleet(config(replicas, [GatewaySource(kind="litellm", url="http://gw:4000/metrics")]), replicas)
    with caplog.at_level(logging.WARNING, logger="monitor.capacity.gateway_plan"):
        for k in range(3):
            snap = fleet.cycle(T0 + k * WINDOW, [scaled(LITELLM, k + 1)])
    assert len({p.pool for p in snap.pools}) == 2
    assert calls_by_pool(snap) == {}  # neither cluster's pool: the proxy's calls cannot be split between them
    assert snap.anomalies["gateway_unattributed"] == 3.0  # one a cycle
    assert snapshot_to_dict(snap)["gateway_unattributed_total"] == 3.0  # also in /api/v1/snapshot
    warned = [r.getMessage() for r in caplog.records if "not attributed" in r.getMessage()]
    assert len(warned) == 1 and "http://gw:4000/metrics" in warned[0] and "model tiny" in warned[0]


def test_a_gateway_without_labels_feeds_a_model_only_one_cluster_serves():
    replicas = engines({"a": ["tiny"], "b": ["other"]})
    fleet = Fleet(config(replicas, [GatewaySource(kind="litellm", url="http://gw:4000/metrics")]), replicas)
    fleet.cycle(T0, [LITELLM])
    snap = fleet.cycle(T0 + WINDOW, [scaled(LITELLM, 2)])
    assert calls_by_pool(snap) == {'tiny{cluster="a"}': dict(truth_calls())}
    assert "gateway_unattributed" not in snap.anomalies


def test_task_pools_and_pool_resolve_inside_the_gateways_cluster():
    replicas = engines({"a": ["tiny", "big"], "b": ["tiny", "big"]})
    gateways = [GatewaySource(kind="litellm", url="http://gw-b:4000/metrics", labels={"cluster": "b"}, pool="big")]
    fleet = Fleet(config(replicas, gateways, task_pools={"policy_question": "tiny"}), replicas)
    fleet.cycle(T0, [LITELLM])
    snap = fleet.cycle(T0 + WINDOW, [scaled(LITELLM, 2)])
    truth = truth_calls()
    assert calls_by_pool(snap) == {
        'tiny{cluster="b"}': {"policy_question": truth["policy_question"]},
        'big{cluster="b"}': {tt: n for tt, n in truth.items() if tt != "policy_question"}}
    # the same names from a gateway without labels: two pools answer to each, so neither is fed
    unplaced = [GatewaySource(kind="litellm", url="http://gw:4000/metrics", pool="big")]
    fleet = Fleet(config(replicas, unplaced, task_pools={"policy_question": "tiny"}), replicas)
    fleet.cycle(T0, [LITELLM])
    snap = fleet.cycle(T0 + WINDOW, [scaled(LITELLM, 2)])
    assert calls_by_pool(snap) == {} and snap.anomalies["gateway_unattributed"] == 2.0


def test_each_clusters_pool_gets_only_its_routers_queue():
    models = ["llama-3.1-8b", "qwen2.5-7b"]
    replicas = engines({"a": models, "b": models})
    gateways = [GatewaySource(kind="llm-d", url=f"http://epp-{c}:9090/metrics", labels={"cluster": c}) for c in "ab"]
    bodies = [ROUTER, scaled(ROUTER, 3)]
    snap = Fleet(config(replicas, gateways), replicas).cycle(T0, bodies)
    queued = {p.pool: dict(p.gateway_queued) for p in snap.pools}
    for (c, url), body in zip((("a", "http://epp-a:9090/metrics"), ("b", "http://epp-b:9090/metrics")), bodies):
        by_model = read_gateway_queues(body, "llm-d").queued_by_model()
        for m in models:
            assert queued[f'{m}{{cluster="{c}"}}'] == {url: by_model[m]}
    assert queued['qwen2.5-7b{cluster="b"}']["http://epp-b:9090/metrics"] == \
        3 * queued['qwen2.5-7b{cluster="a"}']["http://epp-a:9090/metrics"] > 0
    # without labels the router's queue of a model both clusters serve is on no pool, and counted
    snap = Fleet(config(replicas, [GatewaySource(kind="llm-d", url="http://epp:9090/metrics")]), replicas
                 ).cycle(T0, [ROUTER])
    assert all(not p.gateway_queued for p in snap.pools)
    assert snap.anomalies["gateway_queue_unmapped"] >= 2
    assert snapshot_to_dict(snap)["gateway_queue_unmapped_total"] == snap.anomalies["gateway_queue_unmapped"]


def test_gateway_labels_must_be_extra_pool_by_labels():
    def load(pool_by, labels):
        return from_dict({"global": {"pool_by": pool_by}, "sources": {
            "vllm": {"targets": ["http://a:8000/metrics"]},
            "gateways": [{"kind": "litellm", "url": "http://gw:4000/metrics"},
                         {"kind": "litellm", "url": "http://gw-2:4000/metrics", "labels": labels}]}})

    assert load(["cluster", "model_name"], {"cluster": "a"}).gateways[1].labels == {"cluster": "a"}
    two = ["cluster", "model_name"]
    for pool_by, labels in ((two, {"zone": "x"}), (two, {"model_name": "m"}), ("model_name", {"cluster": "a"})):
        with pytest.raises(ConfigError) as err:
            load(pool_by, labels)
        label = next(iter(labels))
        text = str(err.value)
        assert f"sources.gateways[1].labels.{label}" in text and "http://gw-2:4000/metrics" in text
        assert "not an extra global.pool_by label" in text
    # credentials in a gateway's URL never reach the error
    with pytest.raises(ConfigError) as err:
        from_dict({"global": {"pool_by": two}, "sources": {
            "vllm": {"targets": ["http://a:8000/metrics"]},
            "gateways": [{"kind": "litellm", "url": "http://ops:hunter2@gw:4000/metrics", "labels": {"zone": "x"}}]}})
    assert "hunter2" not in str(err.value) and "gw:4000" in str(err.value)


def test_scope_names_and_models():
    pools = [('tiny{cluster="a"}', "tiny"), ('tiny{cluster="b"}', "tiny"), ('big{cluster="a"}', "big")]
    a, anywhere = Scope(pools, {"cluster": "a"}), Scope(pools)
    assert sorted(a.pools) == ['big{cluster="a"}', 'tiny{cluster="a"}'] and len(anywhere) == 3
    assert a.named("tiny") == ('tiny{cluster="a"}', False) and anywhere.named("tiny") == (None, True)
    assert anywhere.named('tiny{cluster="b"}') == ('tiny{cluster="b"}', False)
    assert a.named('tiny{cluster="b"}') == (None, False)  # out of its scope
    assert anywhere.serving("big") == ('big{cluster="a"}', False) and anywhere.serving("tiny") == (None, True)
    assert Scope(pools, {"cluster": "c"}).only() is None and Scope(pools[1:2], {}).only() == 'tiny{cluster="b"}'
    assert anywhere.routes({"x": "tiny", "y": "big", "z": "gone"}) == (
        {"x": None, "y": 'big{cluster="a"}', "z": None}, ["x"])
    plain = Scope([("chat", "m1"), ("code", "m2")])  # one pool_by label: every key a plain name, nothing changes
    assert plain.named("chat") == ("chat", False) and plain.serving("m2") == ("code", False)


def test_prometheus_windows_keep_each_clusters_series_apart():
    """The window query keeps the extra pool_by labels: a series' own cluster decides whose windows it is."""
    from monitor.history.slo_history import PrometheusWindows, window_query

    q = window_query("litellm_request_total_latency_metric", "metadata_task_type", 300.0, 15.0, ("cluster",))
    assert q.startswith("sum by (metadata_task_type, cluster, le) (increase(")
    assert "count by (metadata_task_type, cluster) (" in q

    class Rows:  # what Prometheus answers that query with: buckets and coverage rows per task type and cluster
        def query(self, query, at=None, deadline=None, warnings=None):
            assert query == q
            return [({"metadata_task_type": "chat", "cluster": c, "le": le}, v) for c, k in (("a", 1.0), ("b", 3.0))
                    for le, v in (("1.0", 4 * k), ("+Inf", 5 * k), ("covered", 1.0))]

    got = PrometheusWindows(Rows(), {"5m": 300.0}, {"call"}, [("litellm", None)], tolerance=15.0,
                            extra=("cluster",)).read(T0)
    assert sorted(got) == [("call", "chat", (("cluster", "a"),)), ("call", "chat", (("cluster", "b"),))]
    assert [got[("call", "chat", (("cluster", c),))]["5m"].count for c in "ab"] == [5.0, 15.0]



def test_each_clusters_pool_takes_its_clusters_burn_windows_from_prometheus():
    """Prometheus mode: the windows read per cluster (PrometheusWindows with the extra labels) go to
    the pool of that cluster; a task type in one pool per cluster is no longer left to the tracker."""
    from monitor.capacity.slo import Target as SloTarget
    from monitor.capacity.slo import bad_count, window_burn
    from monitor.model import Histogram

    replicas = engines({"a": ["tiny"], "b": ["tiny"]})
    cfg = Config(vllm_targets=[Target(u, labels={"cluster": c}) for u, c, _ in replicas], pool_by=POOL_BY,
                 gateways=[GatewaySource(kind="app", url=f"http://app-{c}:9000/metrics", labels={"cluster": c})
                           for c in "ab"], capacity=Capacity(task_window=WINDOW),
                 slos=read_slos({"task_types": {"summarise": {"p95_seconds": 30}}, "windows": ["5m"]}))
    # the window of each cluster: a 10 % of 100 tasks over 30 s, b 40 %
    windows = {("task", "summarise", (("cluster", c),)): {"5m": Histogram((30.0, float("inf")), (100 - bad, 100.0),
                                                                          0.0, 100.0)}
               for c, bad in (("a", 10.0), ("b", 40.0))}
    fleet = Fleet(cfg, replicas)
    for k in range(2):
        t = T0 + k * WINDOW
        readings = [r for url, c, m in replicas for r in readings_from_text(vllm_body(m), url, t, {"cluster": c})]
        scrapes = [fleet.aux.read_gateway(i, app_task_body(100.0 * (k + 1), 10.0 * (k + 1)), t) for i in range(2)]
        fleet.state, snap = step(fleet.state, CycleInputs(readings, [], gateways=scrapes, slo_windows=windows), t)
    target = SloTarget(30.0, 0.95)
    got = {p.extra_labels["cluster"]: p.tasks.by_type["summarise"] for p in snap.pools}
    assert {c: t.slo_source for c, t in got.items()} == {"a": "prometheus", "b": "prometheus"}
    for c in "ab":
        h = windows[("task", "summarise", (("cluster", c),))]["5m"]
        assert got[c].slo_burn_rate == {"5m": window_burn(bad_count(h, target), target)}
    assert got["b"].slo_burn_rate["5m"] == pytest.approx(4 * got["a"].slo_burn_rate["5m"])



@pytest.mark.parametrize("gateway_clusters, source", [("a", "prometheus"), ("ab", "tracker")])
def test_windows_of_series_without_the_cluster_label_go_to_the_one_pool_fed(gateway_clusters, source):
    """Gateway series without the cluster label (one gateway, or the label only added at remote
    write) come back keyed cluster="": one pool fed by the task type in the whole fleet takes them, as
    before clusters; two pools leave it to the tracker, never both."""
    from monitor.model import Histogram

    replicas = engines({"a": ["tiny"], "b": ["tiny"]})
    cfg = Config(vllm_targets=[Target(u, labels={"cluster": c}) for u, c, _ in replicas], pool_by=POOL_BY,
                 gateways=[GatewaySource(kind="app", url=f"http://app-{c}:9000/metrics", labels={"cluster": c})
                           for c in gateway_clusters], capacity=Capacity(task_window=WINDOW),
                 slos=read_slos({"task_types": {"summarise": {"p95_seconds": 30}}, "windows": ["5m"]}))
    windows = {("task", "summarise", (("cluster", ""),)): {"5m": Histogram((30.0, float("inf")), (90.0, 100.0),
                                                                         0.0, 100.0)}}
    fleet = Fleet(cfg, replicas)
    for k in range(2):
        t = T0 + k * WINDOW
        readings = [r for url, c, m in replicas for r in readings_from_text(vllm_body(m), url, t, {"cluster": c})]
        scrapes = [fleet.aux.read_gateway(i, app_task_body(100.0 * (k + 1), 10.0 * (k + 1)), t)
                   for i in range(len(gateway_clusters))]
        fleet.state, snap = step(fleet.state, CycleInputs(readings, [], gateways=scrapes, slo_windows=windows), t)
    got = {p.extra_labels["cluster"]: p.tasks.by_type.get("summarise") for p in snap.pools}
    assert {c: got[c].slo_source for c in gateway_clusters} == {c: source for c in gateway_clusters}


CALLS = "litellm_proxy_total_requests_metric_total"


@pytest.fixture
@starts_servers
def two_clusters():
    """One engine and one LiteLLM proxy per cluster (the real captures), on loopback."""
    servers = {c: (MetricsServer(), MetricsServer()) for c in "ab"}
    for engine, proxy in servers.values():
        engine.bodies["/metrics"] = vllm_body("tiny")
        proxy.bodies["/metrics"] = LITELLM
    yield servers
    for pair in servers.values():
        for server in pair:
            server.stop()


def test_prometheus_mode_gives_each_clusters_pool_its_own_gateway_numbers(two_clusters, tmp_path):
    jobs = {job: [(f"127.0.0.1:{pair[i].port}", {"cluster": c}) for c, pair in two_clusters.items()]
            for i, job in enumerate(("vllm", "litellm"))}
    prom = Prometheus(str(tmp_path), scrape_config(jobs))
    by_cluster = f"sum by (cluster) ({CALLS}{{job=\"litellm\"}})"
    try:
        prom.wait_for('count(vllm:num_requests_running{job="vllm"}) == 2', timeout=60)
        before = prom.wait_for(by_cluster, timeout=30, predicate=lambda result: len(result) == 2)
        cfg = Config(prometheus=PrometheusSource(url=prom.url, selector='job="vllm"'), pool_by=POOL_BY, interval=1.0,
                     gateways=[GatewaySource(kind="litellm", url=pair[1].url("/metrics"), labels={"cluster": c})
                               for c, pair in two_clusters.items()], capacity=Capacity(task_window=2.0))
        pipeline = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
        try:
            first = pipeline.run_cycle()
            # over the window cluster a's proxy serves the captured run once more, cluster b's twice more
            for c, k in (("a", 2), ("b", 3)):
                two_clusters[c][1].bodies["/metrics"] = scaled(LITELLM, k)
            after = prom.wait_for(by_cluster, timeout=30, predicate=lambda result: len(result) == 2 and all(
                float(r["value"][1]) > float(b["value"][1]) for r in result for b in before
                if b["metric"] == r["metric"]))
            wait_for(time.time, lambda t: t >= first.timestamp + cfg.capacity.task_window, timeout=30,
                     what="a task window since the first cycle")
            snap = pipeline.run_cycle()
        finally:
            pipeline.close()
    finally:
        prom.stop()
    assert [s.up for s in snap.sources if s.source in ("prometheus", "gateway")] == [True, True, True]
    pools = {p.extra_labels["cluster"]: p for p in snap.pools}
    assert {c: (p.name, p.replicas) for c, p in pools.items()} == {"a": ("tiny", 1), "b": ("tiny", 1)}
    truth = truth_calls()
    assert {c: {tt: s.calls for tt, s in p.tasks.by_type.items()} for c, p in pools.items()} == {
        "a": dict(truth), "b": {tt: 2 * n for tt, n in truth.items()}}
    # each pool's calls are what Prometheus saw of that cluster's proxy alone over the same bodies
    seen = {r["metric"]["cluster"]: float(r["value"][1]) for r in after}
    seen = {c: v - next(float(b["value"][1]) for b in before if b["metric"]["cluster"] == c) for c, v in seen.items()}
    assert {c: sum(s.calls for s in p.tasks.by_type.values()) for c, p in pools.items()} == seen
    assert "gateway_unattributed" not in snap.anomalies


def test_a_shard_owning_one_clusters_pool_still_sees_the_reading_is_ambiguous():
    """Two shards, each owning one cluster's pool of the model: a gateway without labels goes to
    neither (each shard judges over the whole fleet), one with labels to its cluster's owner only."""
    from dataclasses import replace as with_

    from monitor.model.shard import owner

    replicas = engines({"a": ["tiny"], "c": ["tiny"]})
    keys = {c: f'tiny{{cluster="{c}"}}' for c in "ac"}
    assert sorted(owner(k, 2) for k in keys.values()) == [0, 1]  # one pool a shard
    got: dict = {}
    for labels in ({}, {"cluster": "c"}):
        for shard in (0, 1):
            cfg = with_(config(replicas, [GatewaySource(kind="litellm", url="http://gw:4000/metrics", labels=labels)]),
                        shard=(shard, 2))
            fleet = Fleet(cfg, replicas)
            fleet.cycle(T0, [LITELLM])
            snap = fleet.cycle(T0 + WINDOW, [scaled(LITELLM, 2)])
            assert [p.pool for p in snap.pools] == [k for k in keys.values() if owner(k, 2) == shard]
            got.setdefault(bool(labels), {}).update(calls_by_pool(snap))
    assert got == {False: {}, True: {keys["c"]: dict(truth_calls())}}


def test_slo_windows_from_a_partial_answer_are_refused_and_promql_notes_are_not():
    """Issue 38: the burn windows of a partial answer (a store did not answer) would be a part of the
    fleet's; the read raises `partial` and the cycle falls back to the tracker's windows."""
    import pytest

    from monitor.history.slo_history import PrometheusWindows
    from monitor.sources.prometheus import PrometheusError

    class Partial:
        def __init__(self, warning):
            self.warning = warning

        def query(self, query, at=None, deadline=None, warnings=None):
            warnings.append(self.warning)
            return [({"metadata_task_type": "chat", "le": le}, v) for le, v in (("+Inf", 5.0), ("covered", 1.0))]

    def read(warning):
        return PrometheusWindows(Partial(warning), {"5m": 300.0}, {"call"}, [("litellm", None)], tolerance=15.0).read(T0)
    with pytest.raises(PrometheusError) as err:
        read("store gateway 2 did not answer")
    assert err.value.reason == "partial" and "store gateway 2" in err.value.detail
    assert read("PromQL info: metric might not be a counter")[("call", "chat")]["5m"].count == 5.0
