"""The history store is optional at run time (it only feeds the forecasts): a corrupt file (damaged
header, cut short) is moved aside, never overwritten, and a fresh store started; one that cannot be
written is read only; one that cannot be read is not used. Each is one log line and
headroom_store_errors_total{operation="open"} 1; never an exit or a traceback. The read-only mount and
the daemon's answers are in tests/history/test_store_open_live.py."""
import logging
import os
import sqlite3

from monitor.app import Store
from monitor.config import from_dict
from monitor.config.inputs import pipeline_settings
from monitor.history.store import HistoryStore, open_store, store_problem
from monitor.pipeline.cycle import Pipeline

NOW = 1796289000.0  # 2026-12-03T09:10:00Z
POINTS = [("p", "load", 1000.0 + 15 * k, float(k % 7)) for k in range(20_000)]


def _real_store(path):
    with HistoryStore(str(path)) as st:
        st.append(POINTS)
    return path.read_bytes()


def _damage_header(path):
    data = bytearray(path.read_bytes())
    data[:16] = b"not a database!!"
    path.write_bytes(bytes(data))
    return bytes(data)


def _cut_in_half(path):
    data = path.read_bytes()[: os.path.getsize(path) // 2]
    path.write_bytes(data)
    return data


def test_a_corrupt_store_is_moved_aside_and_a_fresh_one_started(tmp_path):
    for damage in (_damage_header, _cut_in_half):
        path = tmp_path / f"{damage.__name__}.sqlite"
        _real_store(path)
        damaged = damage(path)
        opened = open_store(str(path), writable=True, now=NOW)
        assert opened.writable and opened.problem.startswith("corrupt (")
        assert opened.moved_to == f"{path}.corrupt-20261203T091000Z"
        assert open(opened.moved_to, "rb").read() == damaged  # kept byte for byte, never overwritten
        assert opened.store.count() == 0
        assert opened.store.append([("p", "load", NOW, 1.0)]) == 1
        opened.store.close()


def test_an_intact_store_is_opened_as_it_is(tmp_path):
    path = tmp_path / "h.sqlite"
    _real_store(path)
    opened = open_store(str(path), writable=True, now=NOW)
    assert opened.problem is None and opened.moved_to is None and opened.store.count() == len(POINTS)
    opened.store.close()
    assert sorted(os.listdir(tmp_path)) == ["h.sqlite"]


def test_once_reads_a_store_read_only_and_leaves_a_corrupt_one_alone(tmp_path):
    path = tmp_path / "h.sqlite"
    _real_store(path)
    opened = open_store(str(path), writable=False, now=NOW)
    assert opened.problem is None and not opened.writable and opened.store.count() == len(POINTS)
    opened.store.close()
    damaged = _damage_header(path)
    opened = open_store(str(path), writable=False, now=NOW)
    assert opened.store is None and "cannot be read" in opened.problem
    assert path.read_bytes() == damaged and not [f for f in os.listdir(tmp_path) if "corrupt" in f]


def test_store_problem_names_what_cannot_be_written(tmp_path):
    assert store_problem(str(tmp_path / "h.sqlite")) is None
    assert store_problem(str(tmp_path / "missing" / "h.sqlite")) == f"directory {tmp_path / 'missing'} does not exist"
    (tmp_path / "d.sqlite").mkdir()
    assert store_problem(str(tmp_path / "d.sqlite")) == f"{tmp_path / 'd.sqlite'} is not a file"


def test_the_daemon_store_component_reports_a_corrupt_file_once(tmp_path, caplog):
    path = tmp_path / "h.sqlite"
    _real_store(path)
    _cut_in_half(path)
    cfg = from_dict({"sources": {"vllm": {"targets": ["http://a:8000/metrics"]}}, "store": {"path": str(path)}}, "f")
    pipeline = Pipeline(pipeline_settings(cfg), clock=lambda: NOW)
    with caplog.at_level(logging.INFO):
        store = Store(cfg, pipeline, writable=True)
    assert store.errors == {"open": 1.0, "append": 0.0, "maintain": 0.0, "restore": 0.0} and store.writable
    assert len(caplog.records) == 1 and not caplog.records[0].exc_info
    line = caplog.records[0].getMessage()
    assert line.startswith(f"history store {path}: corrupt (") and "a fresh store was started" in line
    assert f"{path}.corrupt-20261203T091000Z" in line
    store.stop()
    pipeline.close()
    assert sqlite3.connect(str(path)).execute("PRAGMA quick_check").fetchone()[0] == "ok"
