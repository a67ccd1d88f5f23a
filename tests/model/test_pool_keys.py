"""Clusters as a dimension: `global.pool_by: [cluster, model_name]` keys pools by every label.

The last label names the pool (`pool=`), the others are exported beside it (`cluster=`) on every
pool and replica series, in the JSON, the store's keys, the Prometheus history's grouping and the
shard owner; with one label nothing changes.
"""
from __future__ import annotations

import io
import json

import pytest

from monitor.capacity.fit import fleet_fit, unknown, where_fits
from monitor.commands.once import print_fit
from monitor.config import ConfigError
from monitor.config.headroom_yml import Config
from monitor.derive.core import derive_pools, pool_of
from monitor.export.landing import Trends, render
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.history.query_range import PrometheusHistory, default_queries, pool_matcher
from monitor.history.store import HistoryStore, StoreHistory, points_from_snapshot
from monitor.model import Capacity, PoolSnapshot, ReplicaReading, ReplicaSnapshot, Scenarios, Snapshot
from monitor.model.poolkey import PoolBySetting, key_of, labels_of, make_key, name_of, split
from monitor.model.shard import owns
from monitor.sources.prometheus_queries import pool_key

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BY = ("cluster", "model_name")


def reading(target: str, cluster: str, running: float, model: str = MODEL) -> ReplicaReading:
    return ReplicaReading(target=target, model=model, timestamp=100.0, labels={"cluster": cluster},
                          running=running, waiting=0.0, kv_usage=0.5, kv_capacity_tokens=1000.0,
                          kv_live_tokens=500.0)


def test_one_label_keys_are_the_plain_name_byte_for_byte():
    r = reading("a0", "a", 1)
    assert pool_of(r, "model_name") == pool_of(r, ("model_name",)) == MODEL
    assert key_of({"cluster": "a"}, MODEL, ["model_name"]) == MODEL
    assert split(MODEL) == (MODEL, ())


def test_a_cluster_and_model_make_one_key_and_two_clusters_two():
    a, b = pool_of(reading("a0", "a", 1), BY), pool_of(reading("b0", "b", 1), BY)
    assert a == MODEL + '{cluster="a"}' and b == MODEL + '{cluster="b"}'
    assert labels_of(a) == {"pool": MODEL, "cluster": "a"}
    assert name_of(b) == MODEL
    # the last label names the pool, whatever it is; a missing label is empty, as in Prometheus
    r = ReplicaReading(target="t", model="m", timestamp=0.0, labels={"team": "gold"})
    assert labels_of(pool_of(r, ("cluster", "team"))) == {"pool": "gold", "cluster": ""}


def test_keys_round_trip_awkward_values():
    for name, extra in ((MODEL, {"cluster": 'eu "west", 1\\2'}), ("a{b}", {"cluster": "x"}),
                        ('x{cluster="a"', {"cluster": "}"}), ("m", {"cluster": "a", "region": "r\n1"})):
        key = make_key(name, extra, ("region", "cluster"))
        assert labels_of(key) == {"pool": name, **extra}, key
    # a plain name that merely looks odd stays a plain name
    assert split("model{not a label}") == ("model{not a label}", ())


@pytest.mark.parametrize("value, problem", [
    ([], "non-empty list"), ("bad label", "not a label name"), (["cluster", "cluster"], "listed twice"),
    (["pool", "model_name"], "cannot be carried"), (["model_name", "cluster"], "cannot be carried"),
    ([3], "not a label name"),
])
def test_pool_by_setting_names_the_problem(value, problem):
    with pytest.raises(ValueError, match=problem):
        PoolBySetting().parse(value)


def test_pool_by_is_read_from_headroom_yml_as_a_list_or_one_label(tmp_path):
    from monitor.config import load
    f = tmp_path / "h.yml"
    f.write_text("global:\n  pool_by: [cluster, model_name]\nsources:\n  vllm:\n    targets: [http://a:1/metrics]\n")
    assert load(str(f)).pool_by == BY
    f.write_text("global:\n  pool_by: team\nsources:\n  vllm:\n    targets: [http://a:1/metrics]\n")
    assert load(str(f)).pool_by == ("team",)
    f.write_text("global:\n  pool_by: [cluster, cluster]\nsources:\n  vllm:\n    targets: [http://a:1/metrics]\n")
    with pytest.raises(ConfigError, match=r"h\.yml.*global\.pool_by.*listed twice"):
        load(str(f))
    assert Config().pool_by == ("model_name",)


def test_pool_settings_are_found_by_the_pool_name():
    from monitor.capacity.settings import PoolSettings
    cfg = Config(pools={MODEL: PoolSettings(max_num_seqs=7)})
    assert cfg.pool_settings(MODEL + '{cluster="a"}').max_num_seqs == 7


def two_cluster_pools() -> list[PoolSnapshot]:
    hist = {"a0": [reading("a0", "a", 3)], "a1": [reading("a1", "a", 4)], "b0": [reading("b0", "b", 1)]}
    return derive_pools(hist, now=100.0, window_seconds=60, pool_by=BY)


def test_the_same_model_in_two_clusters_is_two_pools():
    pools = {p.pool: p for p in two_cluster_pools()}
    a, b = pools[MODEL + '{cluster="a"}'], pools[MODEL + '{cluster="b"}']
    assert (a.replicas, a.active_requests, b.replicas, b.active_requests) == (2, 7, 1, 1)
    assert (a.name, a.extra_labels, b.extra_labels) == (MODEL, {"cluster": "a"}, {"cluster": "b"})
    assert a.model == b.model == MODEL


def with_capacity(p: PoolSnapshot, headroom: float, n1, per_session: float = 2.0) -> PoolSnapshot:
    p.capacity = Capacity(headroom_requests=Scenarios(headroom, n1), active_requests_per_session=per_session)
    return p


def test_every_pool_and_replica_series_carries_the_cluster():
    p = PoolSnapshot(pool=MODEL + '{cluster="a"}', model=MODEL, replicas=1, replicas_configured=1,
                     active_requests=3.0, last_fresh_timestamp=1.0)
    p.replica_detail = [ReplicaSnapshot(replica="a0", pool=p.pool, up=True, active_requests=3.0)]
    with_capacity(p, 10.0, 4.0)
    samples = Renderer().render(Snapshot(timestamp=1.0, pools=[p]))
    pool_rows = [(name, labels) for name, rows in samples.items() for labels, _ in rows if "pool" in labels]
    assert pool_rows and all(labels["pool"] == MODEL and labels["cluster"] == "a" for _, labels in pool_rows)
    assert samples["headroom_active_requests"] == [({"pool": MODEL, "cluster": "a"}, 3.0)]
    assert ({"pool": MODEL, "cluster": "a", "replica": "a0"}, 1.0) in samples["headroom_replica_up"]


def test_one_label_renders_exactly_the_pool_label():
    p = PoolSnapshot(pool=MODEL, model=MODEL, replicas=1, active_requests=3.0, last_fresh_timestamp=1.0)
    samples = Renderer().render(Snapshot(timestamp=1.0, pools=[p]))
    assert samples["headroom_active_requests"] == [({"pool": MODEL}, 3.0)]
    assert all(set(labels) <= {"pool", "replica", "version", "limit", "scenario", "where"}
               for rows in samples.values() for labels, _ in rows if "pool" in labels)


def test_a_key_label_clashing_with_a_metric_label_is_dropped_and_counted_and_the_rest_served(caplog):
    # (before issue 38 the whole render raised UnknownMetric, whose message showed the same labels
    # twice, "takes labels ('pool', 'replica'), got ('pool', 'replica')": one clash froze /metrics)
    p = PoolSnapshot(pool=make_key("m", {"replica": "x"}), model="m", replicas=1, last_fresh_timestamp=1.0)
    p.replica_detail = [ReplicaSnapshot(replica="a0", pool=p.pool, up=True)]
    renderer = Renderer()
    samples = renderer.render(Snapshot(timestamp=1.0, pools=[p], cycles=3))
    assert "headroom_replica_up" not in samples
    assert renderer.errors["headroom_replica_up"] == 1.0
    assert samples["headroom_cycles"] == [({}, 3.0)]
    assert samples["headroom_replicas"] == [({"pool": "m", "replica": "x"}, 1.0)]
    live = renderer.live(None)
    assert ({"family": "headroom_replica_up"}, 1.0) in live["headroom_render_errors"]
    assert "headroom_replica_up its pool key carries ['replica'], labels of its own" in caplog.text


def test_the_json_names_the_cluster_and_where_sessions_fit():
    pools = {p.extra_labels["cluster"]: p for p in two_cluster_pools()}
    with_capacity(pools["a"], 9.0, 1.0)
    with_capacity(pools["b"], 30.0, None)
    doc = json.loads(json.dumps(snapshot_to_dict(Snapshot(timestamp=100.0, pools=list(pools.values())))))
    by_cluster = {d["cluster"]: d for d in doc["pools"]}
    assert by_cluster["a"]["pool"] == by_cluster["b"]["pool"] == MODEL
    assert by_cluster["a"]["key"] == MODEL + '{cluster="a"}'
    assert doc["fit"] == [
        {"cluster": "b", "pool": MODEL, "spare_sessions": 15.0, "spare_sessions_n_minus_1": None},
        {"cluster": "a", "pool": MODEL, "spare_sessions": 4.0, "spare_sessions_n_minus_1": 0.0}]


def test_the_json_of_one_label_has_no_cluster_or_key():
    p = PoolSnapshot(pool=MODEL, model=MODEL, replicas=1)
    [d] = snapshot_to_dict(Snapshot(timestamp=1.0, pools=[p]))["pools"]
    assert d["pool"] == MODEL and "cluster" not in d and "key" not in d


def test_fit_leaves_out_stale_and_unknown_pools_and_rounds_down():
    fresh = with_capacity(PoolSnapshot(pool="x", model="x", replicas=1), 10.0, 3.0, per_session=3.0)
    stale = with_capacity(PoolSnapshot(pool="s", model="s", replicas=0, stale=True), 50.0, 1.0)
    unknown_pool = PoolSnapshot(pool="u", model="u", replicas=1, capacity=Capacity())
    full = with_capacity(PoolSnapshot(pool="f", model="f", replicas=1), -4.0, -8.0)
    fits = fleet_fit([stale, unknown_pool, full, fresh])
    # whole sessions, rounded down (10 / 3 = 3.33 -> 3): the docs' promise
    assert [(f.pool, f.spare_sessions, f.spare_sessions_n_minus_1) for f in fits] == [("x", 3.0, 1.0), ("f", -2.0, -4.0)]
    assert [f.pool for f in where_fits(fits, 3)] == ["x"]
    assert where_fits(fits, 4) == []
    assert unknown([stale, unknown_pool, full, fresh]) == [("s", (), "stale (its sources did not answer)"),
                                                           ("u", (), "no session size (no agent sessions measured, none configured)")]


def test_once_fit_prints_where_n_sessions_fit():
    pools = {p.extra_labels["cluster"]: p for p in two_cluster_pools()}
    with_capacity(pools["a"], 9.0, 1.0)
    with_capacity(pools["b"], 30.0, None)
    snap = Snapshot(timestamp=100.0, pools=list(pools.values()))
    out = io.StringIO()
    assert print_fit(snap, 10, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "10 more sessions fit in 1 of 2 pools:"
    assert lines[1].split() == ["fits", "cluster=b", f"pool={MODEL}", "spare_sessions=15", "with_one_replica_lost=unknown"]
    assert lines[2].split() == ["cluster=a", f"pool={MODEL}", "spare_sessions=4", "with_one_replica_lost=0"]
    out = io.StringIO()
    assert print_fit(snap, 16, out) == 3
    assert out.getvalue().startswith("16 more sessions fit in no pool")


def test_once_fit_at_idle_says_unknown_not_none():
    """An idle fleet: no agent sessions measured, so no session size: the answer is unknown (exit 4),
    never "fits in no pool" (exit 3); a pool that does take them still answers 0."""
    idle = PoolSnapshot(pool="i", model="i", replicas=2, capacity=Capacity())
    out = io.StringIO()
    assert print_fit(Snapshot(timestamp=1.0, pools=[idle]), 5, out) == 4
    assert out.getvalue().splitlines() == [
        "5 more sessions: unknown (1 of 1 pools without a known headroom or session size; none of the other 0 "
        "takes them)",
        "  ?     pool=i  unknown: no session size (no agent sessions measured, none configured)"]
    full = with_capacity(PoolSnapshot(pool="f", model="f", replicas=1), -4.0, -8.0)
    assert print_fit(Snapshot(timestamp=1.0, pools=[idle, full]), 5, io.StringIO()) == 4
    assert print_fit(Snapshot(timestamp=1.0, pools=[full]), 5, io.StringIO()) == 3
    roomy = with_capacity(PoolSnapshot(pool="r", model="r", replicas=1), 40.0, 20.0)
    assert print_fit(Snapshot(timestamp=1.0, pools=[idle, roomy]), 5, io.StringIO()) == 0


def test_the_landing_page_groups_pools_by_cluster():
    pools = two_cluster_pools()
    for p in pools:
        with_capacity(p, 9.0, 1.0)
    page = render(Snapshot(timestamp=100.0, pools=pools[::-1]), Trends())
    a, b = page.index('<h3 class="group">cluster=a</h3>'), page.index('<h3 class="group">cluster=b</h3>')
    assert a < b
    assert page.count(f"<h2>{MODEL}") == 2
    assert "Where more sessions fit" in page


def test_store_keys_keep_two_clusters_apart(tmp_path):
    pools = two_cluster_pools()
    points = points_from_snapshot(Snapshot(timestamp=600.0, pools=pools))
    assert {pool for pool, *_ in points} == {MODEL + '{cluster="a"}', MODEL + '{cluster="b"}'}
    with HistoryStore(str(tmp_path / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None) as st:
        st.append(points)
        h = StoreHistory(st).load(None, 600.0, 900.0, 300.0, ["active_requests"])
        assert {k: list(v["active_requests"]) for k, v in h.items()} == {
            MODEL + '{cluster="a"}': [7.0], MODEL + '{cluster="b"}': [1.0]}


def test_shards_own_keys_so_one_model_in_two_clusters_can_live_on_two_shards():
    keys = [f'm{{cluster="c{i}"}}' for i in range(40)]
    owners = [[k for k in keys if owns(k, (i, 2))] for i in range(2)]
    assert sorted(owners[0] + owners[1]) == sorted(keys) and owners[0] and owners[1]


def test_prometheus_mode_keys_series_by_every_pool_label():
    labels = {"model_name": MODEL, "cluster": "a", "le": "1"}
    assert pool_key(labels, ["cluster", "model_name"]) == MODEL + '{cluster="a"}'
    assert pool_key(labels, ["model_name"]) == MODEL


def test_prometheus_history_groups_by_pool_and_cluster():
    queries = default_queries(pools=[MODEL + '{cluster="a"}'], extra=("cluster",))
    own, raw = queries["active_requests"]
    assert "max by (pool, cluster) (headroom_active_requests" in own.expr
    assert "sum by (cluster, model_name) (vllm:num_requests_running" in raw.expr
    assert pool_matcher("pool", [MODEL + '{cluster="a"}', MODEL + '{cluster="b"}']) == \
        'pool=~"meta-llama/Llama-3\\\\.1-8B-Instruct"'
    assert own.key({"pool": MODEL, "cluster": "b"}) == MODEL + '{cluster="b"}'
    assert raw.key({"model_name": MODEL, "cluster": "a"}) == MODEL + '{cluster="a"}'
    assert own.key({"cluster": "b"}) is None


class Range:
    def __init__(self, answers):
        self.answers, self.queries = answers, []

    def query_range(self, query, start, end, step):
        self.queries.append(query)
        return self.answers(query, start, end, step)


def test_prometheus_history_reads_each_cluster_into_its_own_key():
    def answers(query, start, end, step):
        if "headroom_active_requests" not in query or "vllm:" in query or "headroom_queued" in query:
            return []
        return [({"pool": MODEL, "cluster": c}, [(start, v)]) for c, v in (("a", 5.0), ("b", 2.0))]

    class Src:
        selector = ""
    client = Range(answers)
    h = PrometheusHistory.from_config(Src(), pool_by=["cluster", "model_name"], client=client, vllm=False)
    got = h.load(None, 600.0, 900.0, 300.0, ["active_requests"])
    assert {k: list(v["active_requests"]) for k, v in got.items()} == {
        MODEL + '{cluster="a"}': [5.0], MODEL + '{cluster="b"}': [2.0]}
    assert any("max by (pool, cluster)" in q for q in client.queries)


def test_metrics_body_has_one_series_per_cluster_and_one_label_bodies_unchanged():
    from monitor.export.collector import Exposition
    pools = two_cluster_pools()
    exp = Exposition()
    exp.update(Snapshot(timestamp=100.0, pools=pools))
    body = exp.body().decode()
    assert f'headroom_active_requests{{cluster="a",pool="{MODEL}"}} 7.0' in body
    assert f'headroom_active_requests{{cluster="b",pool="{MODEL}"}} 1.0' in body
    assert f'headroom_replica_up{{cluster="a",pool="{MODEL}",replica="a0"}} 1.0' in body
    plain = Exposition()
    plain.update(Snapshot(timestamp=100.0, pools=derive_pools({"a0": [reading("a0", "a", 3)]}, now=100.0,
                                                              window_seconds=60)))
    assert f'headroom_active_requests{{pool="{MODEL}"}} 3.0' in plain.body().decode()
    assert "cluster=" not in plain.body().decode()


def test_the_digest_reads_each_clusters_knee_into_its_own_key():
    from monitor.digest.knee_report import KneeReading, knees_from_prometheus

    def answers(query, start, end, step):
        if query.startswith("headroom_replicas"):
            return [({"pool": "m", "cluster": "a"}, [(start, 2.0)]), ({"pool": "m", "cluster": "b"}, [(start, 4.0)])]
        if 'source="prior"' in query:
            return [({"pool": "m", "cluster": "a"}, [(start, 8.0)]), ({"pool": "m", "cluster": "b"}, [(start, 16.0)])]
        return []
    client = Range(answers)
    got = knees_from_prometheus(client, 600.0, 600.0, 300.0, extra=("cluster",))
    assert got == {'m{cluster="a"}': KneeReading(8.0, "prior", 600.0, replicas=2),
                   'm{cluster="b"}': KneeReading(16.0, "prior", 600.0, replicas=4)}
    # the cluster is the pool's label, not a copy's: two clusters are two pools, one copy each
    assert all(k.copies == 1 and k.copy == "" for k in got.values())


def test_a_firing_alert_shows_on_its_own_clusters_card_only():
    from monitor.model import Alert
    pools = two_cluster_pools()
    alert = Alert(name="HeadroomLow", state="firing", pool=MODEL, labels={"pool": MODEL, "cluster": "b"})
    page = render(Snapshot(timestamp=100.0, pools=pools, alerts=[alert]), Trends())
    a, b = page.index('<h3 class="group">cluster=a</h3>'), page.index('<h3 class="group">cluster=b</h3>')
    assert "alert firing" not in page[a:b] and page[b:].count("alert firing") == 1
