"""Only this job's alerts on the landing page, against a real Prometheus 2.42 evaluating a real rule:
two headroom jobs (a direct-mode and a Prometheus-mode daemon) export the same pool's headroom into
one Prometheus, and both copies' alert fires; the daemon with `sources.alerts.match: {job: ...}`
lists its own job's alert only."""
from __future__ import annotations

import pytest
import yaml
from bodies import vllm_body
from servers import MetricsServer, Prometheus, wait_for

from monitor.config import from_dict
from monitor.config.inputs import pipeline_settings
from monitor.export.landing import Trends, render
from monitor.pipeline.cycle import Pipeline

pytestmark = pytest.mark.live

RULE = {"groups": [{"name": "t", "interval": "1s", "rules": [{
    "alert": "HeadroomLow", "expr": 'headroom_ratio{scenario="current"} < 0.2', "for": "0s",
    "labels": {"severity": "warning"}, "annotations": {"summary": "Capacity headroom is low."}}]}]}


def test_another_jobs_alert_for_the_same_pool_is_not_listed(tmp_path):
    direct, prom_mode, engine = MetricsServer(), MetricsServer(), MetricsServer()
    for s in (direct, prom_mode):
        s.bodies["/metrics"] = ('# TYPE headroom_ratio gauge\n'
                                'headroom_ratio{pool="tiny",scenario="current"} -0.5\n')
    engine.bodies["/metrics"] = vllm_body("tiny")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(RULE))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["rules.yaml"],
              "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{s.port}"]}]}
                                 for job, s in (("headroom-direct", direct), ("headroom-prom", prom_mode))]}
    prom = Prometheus(str(tmp_path), yaml.safe_dump(config))
    try:
        prom.wait_for("ALERTS", predicate=lambda r: len(r) == 2, timeout=60)  # both jobs' copies fire
        cfg = from_dict({"sources": {"vllm": {"targets": [engine.url("/metrics")]},
                                     "alerts": {"url": prom.url, "match": {"job": "headroom-direct"}}}})
        p = Pipeline(pipeline_settings(cfg))
        try:
            snap = wait_for(p.run_cycle, lambda s: s is not None and s.alerts, timeout=30, what="the alerts")
        finally:
            p.close()
    finally:
        prom.stop()
        for s in (direct, prom_mode, engine):
            s.stop()
    assert [(a.name, a.labels.get("job")) for a in snap.alerts] == [("HeadroomLow", "headroom-direct")]
    page = render(snap, Trends(), has_alerts_source=True)
    assert "1 firing, 0 pending" in page and page.count("<b>HeadroomLow</b>") == 2  # the list and the pool's card
