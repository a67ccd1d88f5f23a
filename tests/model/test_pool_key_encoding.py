"""A pool key is never mis-parsed, whatever its label values hold (issue 38, Build 1; monitor/model/poolkey.py).

The writer (`make_key`) keeps the raw form only when the one reader (`split`) gives back exactly what
was written, else it quotes the name; these tests hold the round trip over hostile values, and hold
ordinary keys byte for byte.
"""
from __future__ import annotations

import itertools
import random

import pytest

from monitor.derive.core import pool_of
from monitor.export.samples import Renderer
from monitor.model import PoolSnapshot, ReplicaReading, ReplicaSnapshot, Snapshot
from monitor.model.poolkey import key_of, labels_of, make_key, name_of, split
from monitor.model.shard import filter_pools, owns

# the pieces a hostile value is made of: quotes, braces, backslashes, newlines, surrogates, commas, '='
PIECES = ['"', "{", "}", "\\", "\n", "\ud800", "\udfff", ",", "=", 'replica="x"', '{replica="x"}', "\\n",
          '\\"', "a", "", "é", "\U0001F600", 'cluster=""', "}{"]


def hostile_values(n: int = 3000, seed: int = 38) -> list[str]:
    rnd = random.Random(seed)
    out = ["".join(p) for p in itertools.product(PIECES, repeat=2)]
    out += ["".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 6))) for _ in range(n)]
    return out


def test_every_single_label_key_reads_back_as_its_name_with_no_labels():
    for name in hostile_values():
        key = make_key(name)
        assert split(key) == (name, ()), (name, key)
        assert labels_of(key) == {"pool": name}


def test_every_key_with_extra_labels_reads_back_exactly():
    values = hostile_values(1500)
    rnd = random.Random(7)
    for name in values:
        extra = {"cluster": rnd.choice(values), "region": rnd.choice(values)}
        key = make_key(name, extra, ("region", "cluster"))
        assert split(key) == (name, (("region", extra["region"]), ("cluster", extra["cluster"]))), (name, extra, key)


def test_different_pools_never_share_a_key():
    values = hostile_values(500)
    keys = {}
    for name in values:
        for extra in ({}, {"cluster": "a"}, {"cluster": name}):
            identity = (name, tuple(sorted(extra.items())))
            key = make_key(name, extra)
            assert keys.setdefault(key, identity) == identity, key


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B-Instruct", "tiny", "Qwen/Qwen2.5-7B", "a{b}",
                                  "model{not a label}", "x}", "m'q'", "", "é/日本語"])
def test_ordinary_names_keep_their_keys_byte_for_byte(name):
    assert make_key(name) == name
    assert key_of({}, name, "model_name") == name
    assert make_key(name, {"cluster": "a"}) == name + '{cluster="a"}'
    assert pool_of(ReplicaReading(target="t", model=name, timestamp=0.0), "model_name") == name


def test_a_name_that_reads_as_labels_is_quoted_and_so_is_a_name_that_starts_with_a_quote():
    assert make_key('evil{replica="x"}') == '"evil{replica=\\"x\\"}"'
    assert make_key('"q') == '"\\"q"'
    assert make_key('evil{replica="x"}', {"cluster": "a"}) == 'evil{replica="x"}{cluster="a"}'
    assert name_of(make_key('evil{replica="x"}')) == 'evil{replica="x"}'
    # keys of the existing stores read as before
    assert split('m{cluster="a"}') == ("m", (("cluster", "a"),))
    assert split('"not closed') == ('"not closed', ())


def test_the_renderer_exports_a_hostile_name_as_the_pool_label_and_nothing_else():
    key = pool_of(ReplicaReading(target="t", model='evil{replica="x"}', timestamp=0.0), "model_name")
    p = PoolSnapshot(pool=key, model='evil{replica="x"}', replicas=1, active_requests=2.0, last_fresh_timestamp=1.0)
    p.replica_detail = [ReplicaSnapshot(replica="r0", pool=key, up=True)]
    renderer = Renderer()
    samples = renderer.render(Snapshot(timestamp=1.0, pools=[p]))
    assert samples["headroom_active_requests"] == [({"pool": 'evil{replica="x"}'}, 2.0)]
    assert samples["headroom_replica_up"] == [({"pool": 'evil{replica="x"}', "replica": "r0"}, 1.0)]
    assert renderer.errors == {}


def test_a_shard_owns_a_hostile_model_in_prometheus_mode_as_the_cycle_owns_its_pool():
    names = ['evil{replica="x"}', '"q', "tiny"] + [f'm{i}{{a="b"}}' for i in range(20)]
    for total in (2, 3):
        for index in range(total):
            assert filter_pools(names, (index, total)) == [n for n in names if owns(make_key(n), (index, total))]


def test_a_quoted_key_goes_through_the_store_and_back_to_its_pool_label(tmp_path):
    from monitor.history.store import HistoryStore, StoreHistory, points_from_snapshot
    key = make_key('evil{replica="x"}\n"')
    p = PoolSnapshot(pool=key, model='evil{replica="x"}\n"', replicas=1, active_requests=4.0, last_fresh_timestamp=600.0)
    points = points_from_snapshot(Snapshot(timestamp=600.0, pools=[p, pool_snapshot("tiny")]))
    with HistoryStore(str(tmp_path / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None) as st:
        st.append(points)
        got = StoreHistory(st).load(None, 600.0, 900.0, 300.0, ["active_requests"])
    assert set(got) == {key, "tiny"}
    assert labels_of(next(k for k in got if k != "tiny")) == {"pool": 'evil{replica="x"}\n"'}


def pool_snapshot(name: str) -> PoolSnapshot:
    return PoolSnapshot(pool=make_key(name), model=name, replicas=1, active_requests=1.0, last_fresh_timestamp=600.0)
