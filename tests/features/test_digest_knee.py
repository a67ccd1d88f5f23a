"""Which knee the digest uses (monitor/digest/knee_report.py): the learned one where headroom has one, read
from its exported series (Prometheus) or its newest snapshot (the daemon); else configured or a prior."""
from __future__ import annotations

import pytest

from monitor.capacity.headroom import CapacitySettings, pool_capacity
from monitor.capacity.knee import Knee
from monitor.capacity.settings import PoolSettings
from monitor.digest.content import build_digest
from monitor.digest.knee_report import KneeReading, choose, knees_from_prometheus, knees_from_snapshot
from monitor.digest.settings import from_dict
from monitor.digest.sources import from_source
from monitor.model import PoolSnapshot, Snapshot

T0 = 1764547200.0


class Recorded:
    """A range client answering recorded Prometheus results by the knee source in the query."""

    def __init__(self, answers: dict[str, list]):
        self.answers, self.queries = answers, []

    def query_range(self, query, start, end, step):
        self.queries.append(query)
        if query.startswith("headroom_replicas"):
            return self.answers.get("replicas", [])
        source = "learned" if 'source="learned"' in query else "prior"
        return self.answers.get(source, [])


def test_the_newest_learned_knee_wins_over_a_newer_prior():
    client = Recorded({
        # learned, then a restart put the daemon back on its prior: the learned knee is still the one
        "learned": [({"pool": "a"}, [(T0 + 60, 7.4), (T0 + 120, 7.0)])],
        "prior": [({"pool": "a"}, [(T0 + 600, 8.0)]), ({"pool": "b"}, [(T0 + 60, 16.0), (T0 + 120, 12.0)]),
                  ({"pool": "c"}, [(T0, float("nan"))])],
        "replicas": [({"pool": "a"}, [(T0 + 60, 2.0), (T0 + 600, 3.0)]), ({"pool": "c"}, [(T0, 5.0)])],
    })
    got = knees_from_prometheus(client, T0, T0 + 900, 300.0)
    # the replicas answering at the newest reading come along (the digest's default replica count)
    assert got == {"a": KneeReading(7.0, "learned", T0 + 120, replicas=3),
                   "b": KneeReading(12.0, "prior", T0 + 120)}
    learned = client.queries[0]  # per copy: each copy's knee over its own replicas, its own source
    assert learned == ('headroom_knee_requests / (headroom_replicas > 0) '
                       'and ignoring (source, signal) headroom_knee_info{source="learned"}')


def test_copies_disagree_the_pessimistic_one_decides_with_its_own_source():
    """Two HA copies and a Prometheus-mode daemon export pool a's knee: the lowest per replica is
    the digest's, named with its copy; a copy's prior stays a prior when another copy learned."""
    ha0, ha1 = {"job": "headroom", "instance": "ha-0:9880"}, {"job": "headroom", "instance": "ha-1:9880"}
    pm = {"job": "headroom-prom", "instance": "pm:9880"}
    client = Recorded({
        "learned": [({"pool": "a", **ha0}, [(T0 + 60, 5.0)]), ({"pool": "a", **pm}, [(T0 + 60, 1.65)]),
                    ({"pool": "b", **ha0}, [(T0 + 60, 9.0)])],
        "prior": [({"pool": "a", **ha1}, [(T0 + 300, 6.5)]), ({"pool": "b", **ha1}, [(T0 + 300, 6.5)])],
        "replicas": [({"pool": "a", **ha0}, [(T0 + 60, 2.0)]), ({"pool": "a", **pm}, [(T0 + 60, 4.0)]),
                     ({"pool": "b", **ha1}, [(T0 + 300, 3.0)])],
    })
    got = knees_from_prometheus(client, T0, T0 + 900, 300.0)
    assert got["a"] == KneeReading(1.65, "learned", T0 + 60, replicas=4,
                                   copy='job="headroom-prom", instance="pm:9880"', copies=3)
    # b: the copy on its prior has the lower knee; it is reported as the prior it is, not "learned"
    assert got["b"] == KneeReading(6.5, "prior", T0 + 300, replicas=3,
                                   copy='job="headroom", instance="ha-1:9880"', copies=2)
    _, source, note = choose(None, got["b"], 8)
    assert source == "prior" and note == ("nothing learned yet: headroom's prior from the engine's limits; from "
                                          'the copy job="headroom", instance="ha-1:9880", the lowest of 2 copies '
                                          "of headroom")
    per_rep, source, note = choose(None, got["a"], 8)
    assert (per_rep, source) == (1.65, "learned") and 'from the copy job="headroom-prom", instance="pm:9880"' in note


def test_the_selector_reaches_every_series():
    client = Recorded({})
    knees_from_prometheus(client, T0, T0 + 300, 300.0, selector='job="headroom"')
    assert all(q.count('job="headroom"') == 3 for q in client.queries) and len(client.queries) == 2
    assert all('headroom_knee_info{source=' in q and 'job="headroom"' in q.split("headroom_knee_info")[1]
               for q in client.queries)


def test_a_snapshots_knee_per_replica_and_source():
    pool = PoolSnapshot(pool="p", model="m", replicas=3, stalled_replicas=1, active_requests=5.0, queued_requests=1.0)
    pool.capacity = pool_capacity(pool, Knee(7.0, None, "learned", "queue", confidence=0.9), CapacitySettings())
    assert pool.capacity.knee_requests == 14.0  # 7 x the 2 working replicas
    idle = PoolSnapshot(pool="q", model="m", replicas=2)
    idle.capacity = pool_capacity(idle, Knee(8.0, None, "prior", "limits"), CapacitySettings())
    none = PoolSnapshot(pool="r", model="m", replicas=2)
    got = knees_from_snapshot(Snapshot(timestamp=T0, pools=[pool, idle, none]))
    assert got == {"p": KneeReading(7.0, "learned", T0, "queue", replicas=3),
                   "q": KneeReading(8.0, "prior", T0, "limits", replicas=2)}
    assert knees_from_snapshot(None) == {}


@pytest.mark.parametrize("configured, reading, max_num_seqs, expected", [
    (None, KneeReading(7.0, "learned", T0, "queue"), 8, (7.0, "learned")),
    (86.0, KneeReading(7.0, "learned", T0), 8, (86.0, "configured")),
    (None, KneeReading(6.5, "prior", T0), 8, (6.5, "prior")),
    (None, None, 8, (8.0, "prior")),
    (None, None, None, (None, "prior")),
])
def test_choose(configured, reading, max_num_seqs, expected):
    per_rep, source, note = choose(configured, reading, max_num_seqs)
    assert (per_rep, source) == expected
    if source == "learned":
        assert note == f"learned by headroom from latency on queue, newest at {T0:.0f}"
    elif source == "configured":
        assert note == "configured in pools.<pool> (headroom learned 7.0 per replica)"
    else:
        assert note.startswith("nothing learned")


class OneSource:
    describe = "test history"

    def __init__(self, data):
        self.data = data

    def load(self, pools, start, end, step, series=None):
        return self.data


def test_from_source_uses_the_knees_and_the_shard():
    import pandas as pd
    s = pd.Series([3.0, 4.0], index=[T0 - 600.0, T0 - 300.0])
    data = {"chat-8b": {"load": s}, "agent-70b": {"load": s}}
    settings = from_dict({"forecast": {"models": ["snaive_day"]}}, "<t>",
                         pools={"*": PoolSettings(replicas=2, max_num_seqs=8)})
    asked = []

    def knees(start, end, step):
        asked.append((start, end, step))
        return {"chat-8b": KneeReading(7.0, "learned", T0 - 300.0)}
    inp = from_source(OneSource(data), T0, settings, knees=knees)
    assert asked == [(T0 - 21 * 86400.0, T0, 300.0)]
    got = {p.name: (p.knee_requests_per_replica, p.knee_source) for p in inp.pools}
    assert got == {"chat-8b": (7.0, "learned"), "agent-70b": (8.0, "prior")}
    d = build_digest(inp, settings)
    assert [p["knee"]["requests"] for p in d["pools"]] == [16.0, 14.0] and d["edition"] == d["iso_week"]
    one = from_source(OneSource(data), T0, settings, knees=knees, shard=(1, 2))  # agent-70b's shard
    assert [p.name for p in one.pools] == ["agent-70b"] and one.shard == (1, 2)
    assert build_digest(one, settings)["edition"] == "2025-W48-shard-1-of-2"


def test_a_copy_gone_long_ago_is_not_compared():
    """A pod replaced two weeks ago (its instance label gone since) learned a low knee then: the
    copies that report now decide, not its old series."""
    old, now_ = {"instance": "pod-old:9880"}, {"instance": "pod-new:9880"}
    client = Recorded({
        "learned": [({"pool": "a", **old}, [(T0, 1.5)]), ({"pool": "a", **now_}, [(T0 + 14 * 86400, 6.0)])],
        "prior": [], "replicas": [],
    })
    got = knees_from_prometheus(client, T0, T0 + 15 * 86400, 3600.0)
    assert got["a"].per_replica == 6.0 and got["a"].copies == 1 and got["a"].copy == ""
    # both seen lately: both are copies, the lower decides
    client = Recorded({"learned": [({"pool": "a", **old}, [(T0 + 14 * 86400 - 3600, 1.5)]),
                                   ({"pool": "a", **now_}, [(T0 + 14 * 86400, 6.0)])], "prior": [], "replicas": []})
    got = knees_from_prometheus(client, T0, T0 + 15 * 86400, 3600.0)
    assert got["a"].per_replica == 1.5 and got["a"].copies == 2
