"""Configuration: valid files load; every bad file gives one message naming file, key and problem;
the reference (docs/configuration.md) is generated from the same declarations the reader uses."""
import dataclasses
import inspect
import os
import re
import subprocess
import sys

import pytest
import yaml

from monitor.config import Config, ConfigError, from_dict, load, parse_duration
from monitor.config.docs import render, rows
from monitor.config.headroom_yml import Capacity
from monitor.kit.settings.reader import default_of, specs
from monitor.kit.settings.shapes import Sub

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = {"sources": {"vllm": {"targets": ["http://127.0.0.1:8000/metrics",
                                         {"url": "http://127.0.0.1:8001/metrics", "labels": {"pool": "a"}}]}},
        "global": {"interval": "10s", "latency_window": "2m"},
        "pools": {"tiny": {"max_num_seqs": 8, "watts_per_replica": 300}}}


def test_good_config():
    cfg = from_dict(GOOD, "f.yml")
    assert cfg.interval == 10 and cfg.latency_window == 120
    assert [t.url for t in cfg.vllm_targets][1] == "http://127.0.0.1:8001/metrics"
    assert cfg.vllm_targets[1].labels == {"pool": "a"}
    assert cfg.pool_settings("tiny").max_num_seqs == 8
    assert cfg.history_keep == 3600  # the default, already more than twice latency_window
    assert from_dict({**GOOD, "global": {"latency_window": "1h"}}, "f.yml").history_keep == 7200


@pytest.mark.parametrize("data,key,problem", [
    ({"sourcez": {}}, "sourcez", "unknown key"),
    ({"sources": {"vllm": {"targets": ["ftp://x/metrics"]}}}, "sources.vllm.targets[0]", "not an http(s) URL"),
    ({"sources": {"vllm": {"targets": "http://x"}}}, "sources.vllm.targets", "expected a list"),
    ({**GOOD, "global": {"interval": "ten"}}, "global.interval", "expected a duration"),
    ({**GOOD, "global": {"scrape_concurrency": 0}}, "global.scrape_concurrency", "must be >= 1, got 0"),
    ({**GOOD, "pools": {"p": {"max_num_seqs": "8"}}}, "pools.p.max_num_seqs", "expected an integer"),
    ({**GOOD, "pools": {"p": {"knee_margin": 0.1}}}, "pools.p.knee_margin", "removed: it was read but never used"),
    ({"sources": {}}, "sources", "no source"),
    ({"sources": {"prometheus": {"url": "http://p:9090"}, "vllm": {"targets": ["http://a/metrics"]}}},
     "sources", "not both"),
    ({"sources": {"prometheus": {"url": "http://p:9090", "bearer_token_file": "/nonexistent/token"}}},
     "sources.prometheus.bearer_token_file", "file not found"),
    ({"sources": {"vllm": {"targets": ["http://a/metrics"]}, "gateways": [{"kind": "nginx", "url": "http://g"}]}},
     "sources.gateways[0].kind", "expected one of litellm, envoy, llm-d, dynamo, app"),
    ({**GOOD, "forecast": {"refit_minute": 5}}, "forecast.refit_minute", "did you mean refit_minutes?"),
    ({**GOOD, "forecast": {"refit_minutes": 0}}, "forecast.refit_minutes", "must be > 0"),
    ({**GOOD, "capacity": {"knee_signl": "ttft"}}, "capacity.knee_signl", "did you mean knee_signal?"),
    ({**GOOD, "capacity": {"min_confidence": 2}}, "capacity.min_confidence", "must be <= 1, got 2"),
    ({**GOOD, "capacity": {"task_classes": {"t": "urgent"}}}, "capacity.task_classes.t", "expected one of"),
    ({**GOOD, "slos": {"windows": ["1h", "5 minutes"]}}, "slos.windows[1]", "expected a duration"),
    ({**GOOD, "slos": {"task_types": ["a"]}}, "slos.task_types", "expected a mapping, got list"),
    ({**GOOD, "slos": {"default": {"p95": 3}}}, "slos.default.p95", "not like p95_seconds"),
    ({**GOOD, "pools": {"gold": {"slo": {"ttft_p95": 0.5}}}}, "pools.gold.slo.ttft_p95", "not like ttft_p95_seconds"),
    ({**GOOD, "capacity": {"knee_signal": "latency"}}, "capacity.knee_signal", "expected one of queue"),
    ({**GOOD, "digest": {"history": {"source": "store"}}}, "store.path", "no store is configured"),
    ({**GOOD, "digest": {"colour": "blue"}}, "digest.colour", "unknown key"),
    ({**GOOD, "global": []}, "global", "expected a mapping, got list"),
])
def test_bad_config_names_key_and_problem(data, key, problem):
    with pytest.raises(ConfigError) as info:
        from_dict(data, "bad.yml")
    assert info.value.key == key
    assert problem in info.value.problem
    assert str(info.value) == f"bad.yml: {key}: {info.value.problem}"


def test_durations():
    assert parse_duration("1.5h") == 5400 and parse_duration(30) == 30 and parse_duration("250ms") == 0.25
    for bad in ("5 minutes", float("inf"), float("nan"), -1, True, "1" + "0" * 400 + "s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("sources:\n  vllm: [\n")
    with pytest.raises(ConfigError, match="not valid YAML: line"):
        load(str(p))
    p.write_text("global:\n  interval: 2024-13-01\n")  # shaped like a YAML date, but none: the key says so
    with pytest.raises(ConfigError, match=r"c\.yml: global\.interval: .*'2024-13-01'"):
        load(str(p))
    with pytest.raises(ConfigError, match="file not found"):
        load(str(tmp_path / "absent.yml"))


def test_forecast_is_a_typed_section():
    assert from_dict(GOOD, "f").forecast.refit_minutes == 15.0
    cfg = from_dict({**GOOD, "forecast": {"refit_minutes": 5, "fit_timeout_seconds": 12}}, "f")
    assert (cfg.forecast.refit_minutes, cfg.forecast.fit_timeout_seconds) == (5.0, 12.0)


def test_capacity_is_typed_and_its_defaults_are_the_knee_estimators():
    cfg = from_dict({**GOOD, "capacity": {"knee_signal": "ttft", "confirmations": 2}}, "f")
    assert (cfg.capacity.knee_signal, cfg.capacity.confirmations) == ("ttft", 2)
    assert cfg.capacity.min_confidence == default_of(Capacity, "min_confidence")
    from monitor.capacity.enrich import SIGNAL_HIST, CapacityState
    from monitor.capacity.knee import KneeEstimator
    from monitor.config.inputs import capacity_inputs
    assert set(_choice_options(Capacity, "knee_signal")) == set(SIGNAL_HIST)
    knee = inspect.signature(KneeEstimator).parameters
    for name in ("min_confidence", "min_change", "confirmations", "min_observations"):
        assert default_of(Capacity, name) == knee[name].default, name
    state = CapacityState(capacity_inputs(cfg))
    assert (state.signal, state.knee_opts["confirmations"]) == ("ttft", 2)
    assert state.min_span == default_of(Capacity, "knee_min_span_seconds")


def _choice_options(cls, name):
    return next(spec.kind.options for field, spec, _ in specs(cls) if field == name)


def test_store_path_directory_and_foreign_file(tmp_path):
    cfg = from_dict({**GOOD, "store": {"path": str(tmp_path)}}, "f")
    assert cfg.store_path == str(tmp_path / "history.sqlite")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match=r"store.path: not a SQLite database"):
        from_dict({**GOOD, "store": {"path": str(tmp_path / "notes.txt")}}, "f")


def test_readme_example_loads(tmp_path):
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    block = re.search(r"A configuration \(YAML.*?```yaml\n(.*?)```", text, re.S).group(1)
    assert "store:" in block and "interval: 15s" in block
    cfg = from_dict(yaml.safe_load(block.replace("/var/lib/headroom/", f"{tmp_path}/")), "README.md")
    assert cfg.interval == 15 and cfg.max_series == 100_000 and cfg.listen_address == ":9880"
    assert [t.url for t in cfg.vllm_targets] == ["http://vllm-0:8000/metrics", "http://vllm-1:8000/metrics"]
    assert cfg.gateways[0].kind == "envoy" and cfg.store_path == f"{tmp_path}/history.sqlite"
    assert cfg.pool_settings("meta-llama/Llama-3.1-8B-Instruct").watts_per_replica == 700


def test_the_reference_is_generated_from_the_declarations():
    with open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8") as f:
        assert f.read() == render(), "docs/configuration.md is stale: make docs"


def test_the_load_test_mix_reference_is_generated_from_its_declarations():
    from headroom_lab.loadtest.docs import render as render_mix
    with open(os.path.join(REPO, "docs", "loadtest-mix.md"), encoding="utf-8") as f:
        text = f.read()
    assert text == render_mix(), "docs/loadtest-mix.md is stale: make docs"
    assert "| `slo.quantile` |" in text  # a load-test key, not only the plan's


def _sections(cls, seen):
    if cls in seen:
        return
    seen.add(cls)
    for _, spec, _ in specs(cls):
        for _, child, _ in spec.kind.children(""):
            _sections(child, seen)
        if isinstance(spec.kind, Sub):
            _sections(spec.kind.cls, seen)


def test_every_setting_is_declared_once_with_help():
    from headroom_lab.loadtest.mix import LoadMix
    seen: set = set()
    for top in (Config, LoadMix):
        _sections(top, seen)
    assert len(seen) > 20
    for cls in seen:
        paths = [path for _, spec, path in specs(cls) if not spec.merge]
        assert len(paths) == len(set(paths)), f"{cls.__name__}: two settings read the same key"
        for name, spec, _path in specs(cls):
            assert spec.help.strip() or spec.merge, f"{cls.__name__}.{name} has no help"
    documented = {r.key for r in rows(Config)}
    assert {"global.interval", "sources.prometheus.basic_auth.password_env", "pools.<pool>.knee_margin",
            "digest.destinations[].password", "forecast.refit_minutes"} <= documented
    fields = {f.name for f in dataclasses.fields(Config)} - {"file"}
    assert fields == {name for name, _, _ in specs(Config)}  # nothing on Config escapes the reader


@pytest.mark.live  # runs a subprocess (tests/tiers.py)
def test_check_config_cli_exit_codes(tmp_path):
    good = tmp_path / "good.yml"
    good.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n")
    bad = tmp_path / "bad.yml"
    bad.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\nglobal:\n  interval: soon\n")
    ok = subprocess.run([sys.executable, "-m", "monitor", "check-config", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "valid" in ok.stdout
    ko = subprocess.run([sys.executable, "-m", "monitor", "check-config", str(bad)], capture_output=True, text=True)
    assert ko.returncode == 2
    assert ko.stderr.strip().count("\n") == 0  # one message
    assert "bad.yml: global.interval: expected a duration" in ko.stderr


@pytest.mark.live  # runs a subprocess (tests/tiers.py)
def test_daemon_refuses_bad_config(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\nweb:\n  listen_adress: ':1'\n")
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--config.file", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "web.listen_adress: unknown key (did you mean listen_address?" in r.stderr


def test_a_prometheus_reader_built_alone_forgets_as_the_config_default():
    from monitor.config import Config
    from monitor.sources.prometheus_reader import FORGET_AFTER
    assert Config().forget_after == FORGET_AFTER


def test_a_store_with_a_damaged_header_is_valid_another_file_is_not(tmp_path):
    """A file sized in whole SQLite pages whose header is damaged is a damaged store (run moves it aside,
    kept); a file of another size is another file named by mistake (refused, as before)."""
    damaged = tmp_path / "history.sqlite"
    damaged.write_bytes(b"\x00" * 16 + b"\xff" * 4080)
    assert from_dict({**GOOD, "store": {"path": str(damaged)}}, "f").store_path == str(damaged)
    (tmp_path / "notes.txt").write_bytes(b"x" * 4095)
    with pytest.raises(ConfigError, match=r"store.path: not a SQLite database"):
        from_dict({**GOOD, "store": {"path": str(tmp_path / "notes.txt")}}, "f")
