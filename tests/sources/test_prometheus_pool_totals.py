"""A pool SLO's cumulative buckets in Prometheus mode (monitor/sources/prometheus_pool_totals.py), on
plain data: asked every read apart from the bucket increases (which keep their refresh), only at the
`le` values the targets need once every pool's are known, read whole again when a pool's answer
lacks one, the values relearned from each refresh of the increases (a bound added); what answered
is stamped with its read's time, and a failed read reuses the last ones with theirs. The same against a real Prometheus: tests/sources/test_prometheus_query_layer.py."""
import math
import re

import pytest

from monitor.config import PrometheusSource
from monitor.derive import histogram as histo
from monitor.sources.prometheus import PrometheusError
from monitor.sources.prometheus_queries import pool_histograms

TTFT = "vllm:time_to_first_token_seconds"
LES = {"m": ["0.1", "0.5", "1.0", "2.5", "+Inf"], "m2": ["0.25", "0.75", "5.0", "+Inf"]}


class _Fleet:
    """A query layer's answers for one vLLM replica per pool of `pools` with a TTFT histogram whose
    cumulative buckets grow by read (`grow`); its bucket queries honour an `le=~` matcher as
    Prometheus does (the regex anchored). `fail`: total queries left to fail."""

    def __init__(self, pools=("m",)):
        self.pools, self.grow, self.fail = list(pools), 1.0, 0
        self.increases, self.totals = 0, []

    def buckets(self, pool):
        les = LES[pool]
        return {le: self.grow * (i + 1) * (3 if pool == "m2" else 1) for i, le in enumerate(les)}

    def query(self, query, at=None, deadline=None, warnings=None, stamps=None, max_bytes=None):
        if stamps is not None:
            stamps.append(1_800_000_000.0)
        if query.startswith("count("):
            return [({}, 3.0 * len(self.pools))]
        if '"hr_part", "total"' in query:
            self.totals.append(query)
            if self.fail:
                self.fail -= 1
                raise PrometheusError("deadline", "the query layer did not answer in time")
            got = re.search(r'le=~"((?:[^"\\]|\\.)*)"', query)
            regex = None if got is None else got.group(1).replace('\\"', '"').replace("\\\\", "\\")
            return [({"hr_base": TTFT, "hr_part": "total", "model_name": pool, "le": le}, v)
                    for pool in self.pools for le, v in self.buckets(pool).items()
                    if regex is None or re.fullmatch(regex, le)]
        if "increase(" in query:
            self.increases += 1
            return [({"hr_base": TTFT, "hr_part": "bucket", "model_name": pool, "le": le}, v / 10)
                    for pool in self.pools for le, v in self.buckets(pool).items()]
        if '__name__="up"' in query:
            return [({"__name__": "up", "instance": pool, "model_name": pool}, 1.0) for pool in self.pools]
        return [({"__name__": name, "instance": pool, "model_name": pool}, 1.0) for pool in self.pools
                for name in ("vllm:num_requests_running", TTFT + "_count")]

    def close(self):
        pass


@pytest.fixture
def reader(monkeypatch):
    """A reader with a pool SLO on TTFT at 0.7 s (latency window 300 s: the increases every 30 s),
    its steady clock that of the reads' `now`."""
    from monitor.sources import prometheus_reader as pr
    steady = [0.0]
    monkeypatch.setattr(pr.time, "monotonic", lambda: steady[0])
    layer = _Fleet()
    got = pr.PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"), client=layer, latency_window=300.0,
                                    total_kinds=("ttft",), total_bounds={"ttft": (0.7,)})

    def read(now):
        steady[0] = now - 900.0
        layer.increases, layer.totals[:] = 0, []
        return got.read_all(now=now)

    got.layer, got.at = layer, read
    yield got
    got.close()


def _counts(h, threshold=0.7):
    return histo.total(h), histo.fraction_above(h, threshold) * histo.total(h)


def _whole(layer, pool):
    rows = [({"hr_base": TTFT, "hr_part": "total", "model_name": pool, "le": le}, v) for le, v in layer.buckets(pool).items()]
    return pool_histograms(rows, ["model_name"])[1][pool]["ttft"]


def test_with_a_pool_slo_the_totals_are_asked_every_read_and_the_increases_keep_their_refresh(reader):
    seen = []
    for i, now in enumerate((1000.0, 1010.0, 1020.0, 1030.0)):
        reader.layer.grow = 1.0 + i
        got = reader.at(now)
        [asked] = reader.layer.totals
        le = re.search(r'le=~"([^"]*)"', asked)
        seen.append((reader.layer.increases, set(le.group(1).split("|")) if le else None, got.totals_at,
                     got.stale_seconds["totals"], got.stale_seconds["histograms"]))
        # only the buckets around 0.7 s and +Inf: the same total and count over the target as every bucket
        assert _counts(got.pool_totals["m"]["ttft"]) == _counts(_whole(reader.layer, "m"))
    around = {"0\\\\.5", "1\\\\.0", "\\\\+Inf"}  # each a literal in the PromQL string
    assert seen == [(1, None, 1000.0, 0.0, 0.0), (0, around, 1010.0, 0.0, 10.0), (0, around, 1020.0, 0.0, 20.0),
                    (1, around, 1030.0, 0.0, 0.0)]
    assert len(reader.at(1040.0).pool_totals["m"]["ttft"].bounds) == 3


def test_a_pool_whose_buckets_are_not_known_has_every_bucket_read_in_the_same_read(reader):
    reader.at(1000.0)
    reader.layer.pools.append("m2")  # another vLLM's buckets: none of m's values but +Inf
    got = reader.at(1010.0)
    assert len(reader.layer.totals) == 2 and "le=~" in reader.layer.totals[0] and "le=~" not in reader.layer.totals[1]
    for pool in ("m", "m2"):
        assert _counts(got.pool_totals[pool]["ttft"]) == _counts(_whole(reader.layer, pool)), pool
    got = reader.at(1020.0)  # both pools' buckets known: one read, the values each needs
    [asked] = reader.layer.totals
    assert re.search(r'le=~"([^"]*)"', asked).group(1).count("|") == 4  # 0.5 1.0 (m), 0.25 0.75 (m2), +Inf
    for pool in ("m", "m2"):
        assert _counts(got.pool_totals[pool]["ttft"]) == _counts(_whole(reader.layer, pool)), pool


def test_a_failed_read_of_the_totals_reuses_the_last_ones_with_their_own_time(reader):
    first = reader.at(1000.0)
    reader.layer.fail, reader.layer.grow = 1, 5.0
    failed = reader.at(1010.0)
    assert failed.pool_totals == first.pool_totals and failed.totals_at == 1000.0
    assert failed.stale_seconds["totals"] == 10.0 and failed.stale_seconds["replicas"] == 0.0
    back = reader.at(1020.0)
    assert back.totals_at == 1020.0 and _counts(back.pool_totals["m"]["ttft"]) == _counts(_whole(reader.layer, "m"))
    reader.shift_time(-60.0)  # the wall clock stepped: the time they were read moves with it
    reader.layer.fail = 1
    assert reader.at(970.0).totals_at == 960.0


def test_without_a_pool_slo_nothing_cumulative_is_asked(monkeypatch):
    from monitor.sources import prometheus_reader as pr
    layer = _Fleet()
    got = pr.PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"), client=layer)
    try:
        out = got.read_all(now=1000.0)
    finally:
        got.close()
    assert layer.totals == [] and out.pool_totals == {} and out.totals_at is None and "totals" not in out.stale_seconds
    assert math.isfinite(out.stale_seconds["histograms"])


class _RuledFleet(_Fleet):
    """`_Fleet` with the bundled recording rules loaded: the pools' TTFT bucket rates (the vLLM
    increase queries then left out)."""

    def query(self, query, at=None, deadline=None, warnings=None, stamps=None, max_bytes=None):
        if "pool_le:vllm_" in query:
            self.increases += 1
            name = "pool_le:vllm_time_to_first_token_seconds_bucket:rate5m"
            return [({"__name__": name, "model_name": pool, "le": le}, v / 300) for pool in self.pools
                    for le, v in self.buckets(pool).items()]
        return super().query(query, at, deadline, warnings, stamps, max_bytes)


@pytest.mark.parametrize("rules", [False, True], ids=["increases", "rules"])
def test_a_bound_added_between_those_around_a_target_is_read_from_the_next_refresh_of_the_increases(
        reader, monkeypatch, rules):
    if rules:
        reader.layer.__class__ = _RuledFleet
    reader.at(1000.0)  # every bucket read: m's 0.5 and 1.0 around the 0.7 s target
    monkeypatch.setitem(LES, "m", ["0.1", "0.5", "0.6", "1.0", "2.5", "+Inf"])  # an engine upgrade adds 0.6
    for now in (1010.0, 1020.0):  # the increases not asked again yet: the buckets learned still answer
        got = reader.at(now)
        assert reader.layer.increases == 0 and "0\\\\.6" not in reader.layer.totals[-1]
    assert _counts(got.pool_totals["m"]["ttft"]) != _counts(_whole(reader.layer, "m"))  # coarser: what is fixed
    got = reader.at(1030.0)  # the increases' refresh carries every bucket: 0.6 and 1.0 read, no read of every bucket
    # (the totals started with the increases at the old values, asked again at the new ones)
    les = [set(re.search(r'le=~"([^"]*)"', asked).group(1).split("|")) for asked in reader.layer.totals]
    assert reader.layer.increases == 1 and reader._rules is rules  # the rules asked, not the increase queries
    assert les == [{"0\\\\.5", "1\\\\.0", "\\\\+Inf"}, {"0\\\\.6", "1\\\\.0", "\\\\+Inf"}]
    assert _counts(got.pool_totals["m"]["ttft"]) == _counts(_whole(reader.layer, "m"))
    got = reader.at(1040.0)
    assert _counts(got.pool_totals["m"]["ttft"]) == _counts(_whole(reader.layer, "m"))


def test_a_spare_candidate_is_asked_only_for_a_pool_whose_slo_reads_the_kind_it_lacks():
    from monitor.model.poolkey import make_key
    from monitor.sources.prometheus_pool_totals import lacking_kinds
    h = _whole(_Fleet(), "m")
    spare = {"vllm:time_per_output_token_seconds": "vllm:time_per_output_token_seconds"}  # an itl candidate
    sg = make_key("s", {"cluster": "a"})  # an engine with no itl histogram, its pool keyed with a cluster
    totals = {"m": {"ttft": h, "itl": h}, sg: {"ttft": h}}
    assert lacking_kinds(totals, spare, None)  # not told which pools have an SLO: every pool counts
    assert not lacking_kinds(totals, spare, {"m": ("itl", "ttft"), "s": ("ttft",)})  # s's SLO reads no itl
    assert not lacking_kinds(totals, spare, {"m": ("itl",)})  # s has no SLO
    assert lacking_kinds(totals, spare, {"s": ("itl",)})  # s's SLO reads itl, by the pool's name
    assert lacking_kinds(totals, spare, {sg: ("itl",)})  # or by its key


def test_the_pools_with_a_slo_and_their_signals_from_the_configuration(tmp_path):
    from monitor.config import load
    from monitor.config.inputs import pool_slo_pools
    path = tmp_path / "headroom.yml"
    path.write_text("sources:\n  prometheus: {url: 'http://127.0.0.1:9'}\n"
                    "slos:\n  pools:\n    a: {ttft_p95_seconds: 0.5, e2e_p99_seconds: 30}\n"
                    "pools:\n  b:\n    slo: {itl_p99_seconds: 0.05}\n  c: {}\n")
    assert pool_slo_pools(load(str(path))) == {"a": ("e2e", "ttft"), "b": ("itl",)}


def test_a_pools_own_slo_replaces_the_slos_sections_in_what_is_read(tmp_path):
    """pools.<name>.slo replaces the `slos:` section's targets of that pool for the judge
    (capacity_inputs), so the seconds and signals read each cycle are those of the targets judged."""
    from monitor.config import load
    from monitor.config.inputs import capacity_inputs, pool_slo_pools, pool_slo_seconds, pool_slo_signals
    path = tmp_path / "headroom.yml"
    path.write_text("sources:\n  prometheus: {url: 'http://127.0.0.1:9'}\n"
                    "slos:\n  pools:\n    a: {ttft_p95_seconds: 0.5, e2e_p99_seconds: 30}\n"
                    "    b: {ttft_p95_seconds: 2}\n"
                    "pools:\n  a:\n    slo: {ttft_p95_seconds: 1}\n")
    cfg = load(str(path))
    judged = capacity_inputs(cfg).slos.pool_targets
    assert {p: sorted((t.signal, t.seconds) for t in ts) for p, ts in judged.items()} == {
        "a": [("ttft", 1.0)], "b": [("ttft", 2.0)]}
    assert pool_slo_pools(cfg) == {"a": ("ttft",), "b": ("ttft",)}
    assert pool_slo_seconds(cfg) == {"ttft": (1.0, 2.0)}  # not a's replaced 0.5 s, nor its e2e
    assert pool_slo_signals(cfg) == ("ttft",)
