"""Which replicas a Prometheus-mode read asks for again (monitor/sources/prometheus_since.py): only
those Prometheus scraped since their last read, the rest held; the whole fleet when that cannot be
judged. Exact, on plain data (the live read against a real Prometheus: test_prometheus_query_layer.py)."""
import pytest

from monitor.sources import prometheus_since as ps
from monitor.sources.prometheus_since import ReplicaSince, split_up, up_query


def full(since: ReplicaSince, times: dict, fresh: dict, at: float = 0.0) -> dict:
    """A full read (after a failure: nothing held), held for the next."""
    since.forget()
    assert since.plan(times, 'job="vllm"', at) is None
    return since.merge(fresh, {i: {"vllm:x": "vllm:x"} for i in fresh}, {i: 3 for i in fresh}, 'job="vllm"', at)


def test_only_the_instances_scraped_since_are_asked_for_and_the_others_are_held():
    since = ReplicaSince()
    times = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    fresh = {i: (f"scrape-{i}", {}) for i in "abcd"}
    assert full(since, times, fresh) == fresh
    assert since.plan(times, 'job="vllm"', 10.0) == ""  # nothing scraped since: nothing asked
    assert since.merge({}, {}, {}, 'job="vllm"', 10.0) == fresh and since.series() == 12
    assert since.plan({**times, "b": 2.5}, 'job="vllm"', 20.0) == 'instance=~"b"'
    got = since.merge({"b": ("scrape-b2", {})}, {"b": {}}, {"b": 2}, 'job="vllm"', 20.0)
    assert got == {**fresh, "b": ("scrape-b2", {})} and since.series() == 11
    # b down in Prometheus (its series stale): asked, none answered, none held; d gone from `up`: dropped
    assert since.plan({"a": 1.0, "b": 3.0, "c": 3.0}, 'job="vllm"', 30.0) == 'instance=~"b"'
    assert since.merge({}, {}, {}, 'job="vllm"', 30.0) == {i: fresh[i] for i in "ac"}
    assert since.present() == {"vllm:x": "vllm:x"}


def test_the_whole_fleet_is_read_when_narrowing_cannot_be_judged_or_would_not_pay():
    since = ReplicaSince()
    times = {f"10.0.0.{i}:8000": float(i) for i in range(10)}
    fresh = {i: ("s", {}) for i in times}
    full(since, times, fresh)
    assert since.plan(None, 'job="vllm"', 1.0) is None  # `up` did not answer
    full(since, times, fresh)
    assert since.plan(times, 'job="other"', 1.0) is None  # another selector (a shard's pools)
    full(since, times, fresh)
    assert since.plan(times, 'job="vllm"', ps.FULL_READ_EVERY) is None  # the periodic full read
    full(since, times, fresh)
    moved = {i: t + 1 for i, t in list(times.items())[:6]}
    assert since.plan({**times, **moved}, 'job="vllm"', 1.0) is None  # most of the fleet moved
    full(since, times, fresh)
    one = since.plan({**times, "10.0.0.1:8000": 9.0}, 'job="vllm"', 1.0)
    assert one == 'instance=~"10\\\\.0\\\\.0\\\\.1:8000"'  # a literal: dots escaped (a set Prometheus looks up)
    full(since, times, fresh)
    assert since.plan({**times, 'x"y': 9.0}, 'job="vllm"', 1.0) is None  # a value left to a full read
    # series of an instance `up` does not name: nothing is held, the next read is whole again
    assert full(since, times, {**fresh, "pushed": ("s", {})}) and since.held == {}
    assert since.plan(times, 'job="vllm"', 1.0) is None


def test_up_and_its_scrape_times_come_in_one_answer():
    assert up_query('{__name__="up",job="vllm"}') == ('{__name__="up",job="vllm"} or label_replace(timestamp('
                                                      '{__name__="up",job="vllm"}), "hr_up", "scraped_at", "", "")')
    answer = [({"__name__": "up", "instance": "a"}, 1.0), ({"instance": "a", "hr_up": "scraped_at"}, 1700000000.5),
              ({"__name__": "up", "instance": "b"}, 0.0), ({"instance": "b", "hr_up": "scraped_at"}, 1700000001.0)]
    ups, times = split_up(answer, "instance")
    assert ups == [answer[0], answer[2]] and times == {"a": 1700000000.5, "b": 1700000001.0}


def test_a_narrowed_answer_naming_an_instance_not_asked_for_loses_no_replica_and_reads_whole_next():
    since = ReplicaSince()
    times = {"a": 1.0, "b": 2.0, "c": 3.0}
    fresh = {i: (f"scrape-{i}", {}) for i in times}
    full(since, times, fresh)
    assert since.plan({**times, "a": 1.5}, 'job="vllm"', 5.0) == 'instance=~"a"'
    got = since.merge({"a": ("a2", {}), "x": ("x", {})}, {}, {}, 'job="vllm"', 5.0)
    assert got == {"a": ("a2", {}), "b": fresh["b"], "c": fresh["c"], "x": ("x", {})}
    assert since.held == {} and since.plan(times, 'job="vllm"', 6.0) is None


def test_an_instance_with_a_backslash_is_asked_for_as_a_literal():
    # regex `a\\b:1` (a literal backslash), written in a PromQL string with each backslash doubled
    assert ps._regex_escaped("a\\b:1") == "a" + "\\" * 4 + "b:1"
    assert ps._regex_escaped("10.0.0.1:8000") == "10" + "\\\\." + "0" + "\\\\." + "0" + "\\\\." + "1:8000"


def test_a_held_replica_counts_its_anomalies_once_per_cycle_not_once_more_each_cycle():
    """A held replica's series are read into readings again each cycle; the anomalies that read finds
    (a negative gauge here) are counted once per cycle, as a full read counts them."""
    from monitor.config import PrometheusSource
    from monitor.sources.prometheus_reader import PrometheusRead, PrometheusSourceReader

    reader = PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"))
    series = [({"__name__": "vllm:num_requests_running", "instance": "a", "model_name": "m"}, -3.0),
              ({"__name__": "vllm:num_requests_waiting", "instance": "a", "model_name": "m"}, 0.0)]
    counts = []
    for cycle in range(4):
        out = PrometheusRead(readings=[], statuses=[])
        asked = reader.since.plan({"a": 1.0}, reader.selector, float(cycle))
        assert asked == (None if cycle == 0 else "")  # a whole read first, then a's series held
        reader._readings([(dict(labels), v) for labels, v in series] if cycle == 0 else [], float(cycle), out)
        counts.append(out.anomalies.get("negative", 0))
    assert counts[0] >= 1 and counts == [counts[0]] * 4, counts


class _Layer:
    """A query layer's answers for one vLLM replica exporting both ITL names (the renamed one and the
    deprecated); `dropped`: the histogram bases whose buckets a relabelling dropped (`_count` kept)."""

    BASES = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds")

    def __init__(self, dropped=()):
        self.dropped, self.asked = set(dropped), []

    def query(self, query, at=None, deadline=None, warnings=None, stamps=None, max_bytes=None):
        lb = {"instance": "a", "model_name": "m"}
        if stamps is not None:
            stamps.append(1000.0)
        if query.startswith("count("):
            return [({}, 5.0)]
        if "hr_base" in query:
            base = next(b for b in self.BASES if b.partition(":")[2] in query)
            self.asked.append(base)
            if base in self.dropped:
                return []
            return [({"hr_base": base, "hr_part": "bucket", "model_name": "m", "le": le}, v)
                    for le, v in (("0.1", 1.0), ("+Inf", 4.0))]
        if '__name__="up"' in query:
            return [({"__name__": "up", **lb}, 1.0)]
        return [({"__name__": "vllm:num_requests_running", **lb}, 1.0)] + [
            ({"__name__": base + "_count", **lb}, 4.0) for base in self.BASES]

    def close(self):
        pass


@pytest.mark.parametrize("dropped, asked", [
    ((), ["vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds"]),
    (("vllm:inter_token_latency_seconds",), ["vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds",
                                            "vllm:time_per_output_token_seconds"])])
def test_the_later_itl_name_is_asked_only_when_the_earlier_one_gives_a_pool_nothing(dropped, asked):
    from monitor.config import PrometheusSource
    from monitor.sources.prometheus_reader import PrometheusSourceReader

    layer = _Layer(dropped)
    reader = PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"), client=layer, histogram_every=0.0)
    for _ in range(2):  # a whole read, then one asked at once
        layer.asked.clear()
        got = reader.read_all(now=1000.0)
        assert sorted(layer.asked) == asked
        assert got.pool_histograms["m"]["itl"].counts == (1.0, 4.0) and got.stale_seconds["histograms"] == 0.0
    reader.close()


class _SlowLayer(_Layer):
    """`_Layer` whose every answer takes `took` seconds of the steady clock `steady`; `fail`: histogram
    queries left to fail (deadline); `models`: the pools its replica series are in (one replica each)."""

    def __init__(self, steady, took, models=("m",)):
        super().__init__()
        self.steady, self.took, self.models, self.fail = steady, took, list(models), 0
        self.increases = self.totals = 0  # the increase queries asked; those of a pool SLO's cumulative buckets

    def query(self, query, at=None, deadline=None, warnings=None, stamps=None, max_bytes=None):
        from monitor.sources.prometheus import PrometheusError
        self.steady[0] += self.took
        self.increases += "increase(" in query
        self.totals += '"hr_part", "total"' in query
        got = super().query(query, at, deadline, warnings, stamps, max_bytes)
        if "hr_base" in query:
            if self.fail:
                self.fail -= 1
                raise PrometheusError("deadline", "the query layer did not answer in time")
            return [(dict(labels, model_name=m), v) for m in self.models for labels, v in got]
        return [({**labels, "instance": m, "model_name": m} if "instance" in labels else labels, v)
                for m in self.models for labels, v in got]


def test_the_pool_histograms_are_asked_again_once_a_tenth_of_the_window_has_passed(monkeypatch):
    """Between two reads of the pools' histograms (every REFRESH_SHARE of the latency window, timed
    from the starts of the reads: answers that take 1.2 s do not push it a cycle on) a read uses the
    last ones, their age in stale_seconds; a failed read of them is asked again the next read; a pool
    new since they answered has them asked at once. A pool SLO's cumulative buckets are asked every
    read, apart: the increases keep their schedule."""
    from monitor.config import PrometheusSource
    from monitor.sources import prometheus_reader as pr
    from monitor.sources.prometheus_reader import PrometheusSourceReader

    steady = [100.0]
    monkeypatch.setattr(pr.time, "monotonic", lambda: steady[0])
    layer = _SlowLayer(steady, took=0.4)
    reader = PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"), client=layer, latency_window=300.0)
    assert reader.histogram_every == 30.0

    def read(now):
        steady[0] = now - 900.0  # each read starts on its cycle's tick; its answers move the clock on
        layer.asked.clear()
        got = reader.read_all(now=now)
        return len(layer.asked), got.stale_seconds["histograms"], got.pool_histograms["m"]["itl"].counts

    seen = [read(now) for now in (1000.0, 1010.0, 1020.0, 1030.0, 1040.0, 1050.0, 1060.0)]
    assert seen == [(2, 0.0, (1.0, 4.0)), (0, 10.0, (1.0, 4.0)), (0, 20.0, (1.0, 4.0)),
                    (2, 0.0, (1.0, 4.0)), (0, 10.0, (1.0, 4.0)), (0, 20.0, (1.0, 4.0)), (2, 0.0, (1.0, 4.0))]
    layer.fail = 1  # the next refresh fails (one of its two queries): the last ones kept, asked again next read
    assert read(1090.0)[1:] == (30.0, (1.0, 4.0))
    assert read(1100.0) == (2, 0.0, (1.0, 4.0))
    layer.models.append("m2")  # a pool new since they answered: asked at once, not at the next refresh
    got = read(1110.0)
    assert got[0] == 2 and sorted(reader._hists[1]) == ["m", "m2"]
    assert read(1120.0)[0] == 0
    reader.close()
    slo = PrometheusSourceReader(PrometheusSource(url="http://127.0.0.1:9"), client=layer, total_kinds=("e2e",))
    seen = []
    for now in (1000.0, 1010.0, 1020.0, 1030.0):  # a pool SLO's cumulative buckets: every read, apart
        steady[0] = now - 900.0
        layer.asked.clear()
        layer.increases = layer.totals = 0
        got = slo.read_all(now=now)
        seen.append((layer.increases, layer.totals, got.stale_seconds["histograms"], got.stale_seconds["totals"], got.totals_at))
    assert seen == [(2, 1, 0.0, 0.0, 1000.0), (0, 1, 10.0, 0.0, 1010.0), (0, 1, 20.0, 0.0, 1020.0),
                    (2, 1, 0.0, 0.0, 1030.0)]
    slo.close()
