"""Configuration: valid files load; every bad file gives one message naming file, key and problem."""
import subprocess
import sys

import pytest

from monitor.config import ConfigError, from_dict, load, parse_duration

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


@pytest.mark.parametrize("data,key,problem", [
    ({"sourcez": {}}, "sourcez", "unknown key"),
    ({"sources": {"vllm": {"targets": ["ftp://x/metrics"]}}}, "sources.vllm.targets[0]", "not an http(s) URL"),
    ({"sources": {"vllm": {"targets": "http://x"}}}, "sources.vllm.targets", "expected a list"),
    ({**GOOD, "global": {"interval": "ten"}}, "global.interval", "expected a duration"),
    ({**GOOD, "global": {"scrape_concurrency": 0}}, "global.scrape_concurrency", "at least 1"),
    ({**GOOD, "pools": {"p": {"max_num_seqs": "8"}}}, "pools.p.max_num_seqs", "expected an integer"),
    ({**GOOD, "pools": {"p": {"knee_margin": 2}}}, "pools.p.knee_margin", "within 0 and 1"),
    ({"sources": {}}, "sources", "no source"),
    ({"sources": {"prometheus": {"url": "http://p:9090"}, "vllm": {"targets": ["http://a/metrics"]}}},
     "sources", "not both"),
    ({"sources": {"prometheus": {"url": "http://p:9090", "bearer_token_file": "/nonexistent/token"}}},
     "sources.prometheus.bearer_token_file", "file not found"),
    ({"sources": {"vllm": {"targets": ["http://a/metrics"]}, "gateways": [{"kind": "nginx", "url": "http://g"}]}},
     "sources.gateways[0].kind", "must be one of"),
])
def test_bad_config_names_key_and_problem(data, key, problem):
    with pytest.raises(ConfigError) as info:
        from_dict(data, "bad.yml")
    assert info.value.key == key
    assert problem in info.value.problem
    assert str(info.value).startswith("bad.yml: ")


def test_durations():
    assert parse_duration("1.5h") == 5400 and parse_duration(30) == 30 and parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        parse_duration("5 minutes")


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("sources:\n  vllm: [\n")
    with pytest.raises(ConfigError, match="not valid YAML: line"):
        load(str(p))


@pytest.mark.live  # runs a subprocess (tests/tiers.py)
def test_check_config_cli_exit_codes(tmp_path):
    good = tmp_path / "good.yml"
    good.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n")
    bad = tmp_path / "bad.yml"
    bad.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\nglobal:\n  interval: soon\n")
    ok = subprocess.run([sys.executable, "-m", "monitor.cli", "check-config", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "valid" in ok.stdout
    ko = subprocess.run([sys.executable, "-m", "monitor.cli", "check-config", str(bad)], capture_output=True, text=True)
    assert ko.returncode == 2
    assert ko.stderr.strip().count("\n") == 0  # one message
    assert "bad.yml: global.interval: expected a duration" in ko.stderr


@pytest.mark.live  # runs a subprocess (tests/tiers.py)
def test_daemon_refuses_bad_config(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\nweb:\n  listen_adress: ':1'\n")
    r = subprocess.run([sys.executable, "-m", "monitor.cli", "run", "--config.file", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "web.listen_adress: unknown key" in r.stderr
