"""Hostile configurations and environments (issue #20): each is refused by `check-config` and by `run`
with the same one line, `headroom: file: key: problem`, exit code 2, and no secret in it.

`run` and `check-config` are called in-process through `monitor.commands.cli.main` (what `headroom` runs); two
cases also go through real subprocesses, as a user would start them.
"""
import subprocess
import sys

import pytest

import monitor.commands.run as run_command
from monitor.commands.cli import build_parser, main
from monitor.config import ConfigError, HttpAuth

TARGET = "sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n"
PROM = "sources:\n  prometheus:\n    url: http://127.0.0.1:1\n"
SECRET = "s3cr3t-9f8e7d"  # written into token files and variables; must never be printed


def _files(tmp):
    (tmp / "newline-token").write_text(f"abc\n{SECRET}\n")
    (tmp / "empty-token").write_text("\n")
    (tmp / "notes.txt").write_text("not a database\n")
    (tmp / "web.yml").write_text("colour: blue\n")


# id -> (configuration, environment, expected "key: problem" start); {tmp} is the test's directory
CASES = {
    "listen address": (TARGET + "web: {listen_address: nonsense}\n", {},
                       "web.listen_address: expected HOST:PORT or :PORT with a port from 0 to 65535, got 'nonsense'"),
    "store in a missing directory": (TARGET + "store: {path: '{tmp}/missing/h.sqlite'}\n", {},
                                     "store.path: directory does not exist: {tmp}/missing"),
    "store is another file": (TARGET + "store: {path: '{tmp}/notes.txt'}\n", {},
                              "store.path: not a SQLite database: {tmp}/notes.txt"),
    "unset password_env": (PROM + "    basic_auth: {username: u, password_env: HEADROOM_TEST_UNSET_PW}\n", {},
                           "sources.prometheus.basic_auth.password_env: environment variable HEADROOM_TEST_UNSET_PW "
                           "(named for a secret) is not set"),
    "interval overflows": (TARGET + "global: {interval: 99999999w}\n", {}, "global.interval: must be <= 1d, got "),
    "scrape_timeout 0s": (TARGET + "global: {scrape_timeout: 0s}\n", {},
                          "global.scrape_timeout: must be > 0s, got 0s"),
    "port out of range": ("sources:\n  vllm:\n    targets: ['http://127.0.0.1:99999/metrics']\n", {},
                          "sources.vllm.targets[0]: the port must be a number from 1 to 65535: "
                          "'http://127.0.0.1:99999/metrics'"),
    "port not a number": ("sources:\n  vllm:\n    targets: ['http://127.0.0.1:abc/metrics']\n", {},
                          "sources.vllm.targets[0]: the port must be a number from 1 to 65535"),
    "credentials in a bad URL": (f"sources:\n  vllm:\n    targets: ['http://admin:{SECRET}@127.0.0.1:abc/m']\n", {},
                                 "sources.vllm.targets[0]: the port must be a number from 1 to 65535: "
                                 "'http://127.0.0.1:abc/m'"),
    "token file with a newline": (PROM + "    bearer_token_file: '{tmp}/newline-token'\n", {},
                                  "sources.prometheus.bearer_token_file: file {tmp}/newline-token holds a control "
                                  "character (a line break inside the secret?); the value is not shown"),
    "token variable with a control character": (
        PROM + "    bearer_token_env: HEADROOM_TEST_TOKEN\n", {"HEADROOM_TEST_TOKEN": f"tok\x1b{SECRET}"},
        "sources.prometheus.bearer_token_env: environment variable HEADROOM_TEST_TOKEN holds a control character"),
    "secret pasted as a variable name": (PROM + f"    basic_auth: {{username: u, password_env: '{SECRET}'}}\n", {},
                                         "sources.prometheus.basic_auth.password_env: expected a variable name "
                                         "like HEADROOM_TOKEN (the value is not shown"),
    "secret pasted as a file name": (PROM + f"    bearer_token_file: '{SECRET}'\n", {},
                                     "sources.prometheus.bearer_token_file: no such file (the value is not shown"),
    "empty token file": (PROM + "    bearer_token_file: '{tmp}/empty-token'\n", {},
                         "sources.prometheus.bearer_token_file: file {tmp}/empty-token is empty"),
    "forecast key misspelt": (TARGET + "forecast: {refit_minute: 5}\n", {},
                              "forecast.refit_minute: unknown key (did you mean refit_minutes?"),
    "knee_margin": (TARGET + "pools: {gold: {knee_margin: 0.1}}\n", {}, "pools.gold.knee_margin: removed"),
    "capacity out of bounds": (TARGET + "capacity: {min_confidence: 2}\n", {},
                               "capacity.min_confidence: must be <= 1, got 2"),
    "CA bundle that is not one": (TARGET + "    tls: {ca_file: '{tmp}/notes.txt'}\n", {},
                                  "sources.vllm.tls.ca_file: not a CA bundle"),
    "digest outbox in a missing directory": (
        TARGET + "store: {path: '{tmp}/h.sqlite'}\ndigest: {outbox: '{tmp}/nowhere/o.sqlite'}\n", {},
        "digest.outbox: directory does not exist: {tmp}/nowhere"),
    "digest history without a store": (TARGET + "digest: {history: {source: store}}\n", {},
                                       "store.path: digest.history.source is store but no store is configured"),
    "digest webhook URL is a secret": (
        TARGET + "store: {path: '{tmp}/h.sqlite'}\n"
        f"digest: {{destinations: [{{type: webhook, url: 'ftp://hooks/{SECRET}'}}]}}\n", {},
        "digest.destinations[0].url: not an http(s) URL"),
}


@pytest.fixture
def cli(capsys, monkeypatch):
    """main(argv) -> (exit code, stderr lines); a daemon that wrongly starts stops at once."""
    monkeypatch.setattr(run_command, "exit_if_stuck", lambda *a, **k: None)
    monkeypatch.delenv("HEADROOM_TEST_UNSET_PW", raising=False)

    def call(argv):
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse refusing a flag
            code = exc.code
        return code, capsys.readouterr().err.strip().splitlines()
    return call


def _write(tmp_path, case):
    text, env, expect = CASES[case]
    _files(tmp_path)
    path = tmp_path / "headroom.yml"
    path.write_text(text.replace("{tmp}", str(tmp_path)))
    return str(path), env, f"headroom: {path}: " + expect.replace("{tmp}", str(tmp_path))


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_config_and_run_refuse_alike(case, tmp_path, cli, monkeypatch):
    path, env, expect = _write(tmp_path, case)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    checked = cli(["check-config", path])
    ran = cli(["run", "--config.file", path, "--web.listen-address", "127.0.0.1:0", "--duration", "1"])
    assert checked == ran, "check-config and run disagree"
    code, lines = checked
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(expect), lines[0]
    assert SECRET not in lines[0]


def test_web_config_is_checked_by_both(tmp_path, cli):
    _files(tmp_path)
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(TARGET)
    web = str(tmp_path / "web.yml")
    checked = cli(["check-config", str(cfg), "--web.config.file", web])
    ran = cli(["run", "--config.file", str(cfg), "--web.config.file", web, "--web.listen-address", "127.0.0.1:0"])
    assert checked == ran
    assert checked[0] == 2 and checked[1][0].startswith(f"headroom: {web}: colour: unknown key")
    cfg.write_text(TARGET + f"web: {{config_file: '{web}'}}\n")  # the same file named in the configuration
    assert cli(["check-config", str(cfg)]) == checked


@pytest.mark.parametrize("argv, env, expect", [
    (["run", "--config.file", "{cfg}"], {"HEADROOM_DURATION": "-5"},
     "headroom: HEADROOM_DURATION: duration must not be negative, got -5.0 (read as --duration)"),
    (["run", "--config.file", "{cfg}"], {"HEADROOM_DURATION": "abc"},
     "headroom: HEADROOM_DURATION: expected a duration like 15s, 5m or 1h, got 'abc' (read as --duration)"),
    (["loadtest", "--target", "http://127.0.0.1:1", "--mix", "{cfg}"], {"HEADROOM_DURATION": "soon"},  # required flag
     "headroom: HEADROOM_DURATION: expected a duration like 15s, 5m or 1h, got 'soon' (read as --duration)"),
    (["check-config", "{cfg}"], {"HEADROOM_LOG_LEVEL": "verbose"},
     "headroom: HEADROOM_LOG_LEVEL: expected one of debug, info, warning, error (as --log.level), got 'verbose'"),
    (["once", "--config.file", "{cfg}"], {"HEADROOM_INTERVAL": "abc"},
     "headroom: HEADROOM_INTERVAL: invalid float value 'abc' (read as --interval)"),
    (["once", "--config.file", "{cfg}"], {"HEADROOM_JSON": "maybe"},
     "headroom: HEADROOM_JSON: expected true or false (1/0, yes/no, on/off) for --json, got 'maybe'"),
    # a port past 65535 was wrapped by getaddrinfo into another port and bound
    (["run", "--config.file", "{cfg}"], {"HEADROOM_WEB_LISTEN_ADDRESS": ":70000"},
     "headroom: HEADROOM_WEB_LISTEN_ADDRESS: listen address port must be 0 to 65535, got ':70000' "
     "(read as --web.listen-address)"),
    (["run", "--config.file", "{cfg}"], {"HEADROOM_WEB_LISTEN_ADDRESS": ":-1"},
     "headroom: HEADROOM_WEB_LISTEN_ADDRESS: listen address must be HOST:PORT or :PORT, got ':-1' "
     "(read as --web.listen-address)"),
])
def test_environment_is_checked_like_the_flags(argv, env, expect, tmp_path, cli, monkeypatch):
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(TARGET)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli([a.replace("{cfg}", str(cfg)) for a in argv]) == (2, [expect])


@pytest.mark.parametrize("address, problem", [(":70000", "port must be 0 to 65535"),
                                              ("127.0.0.1:-1", "must be HOST:PORT or :PORT"),
                                              (":99999999", "must be HOST:PORT or :PORT")])
def test_a_listen_port_out_of_range_is_refused_naming_the_flag(address, problem, tmp_path, cli):
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(TARGET)
    for command in ("run", "demo"):
        argv = [command, "--web.listen-address", address] + (["--config.file", str(cfg)] if command == "run" else [])
        code, lines = cli(argv)
        assert code == 2 and f"argument --web.listen-address: listen address {problem}" in lines[-1], lines
    cfg.write_text(TARGET + f"web: {{listen_address: '{address}'}}\n")  # the file's key is refused too
    code, lines = cli(["run", "--config.file", str(cfg)])
    assert code == 2 and "web.listen_address: expected HOST:PORT or :PORT with a port from 0 to 65535" in lines[0]


def test_flags_and_other_commands_variables(tmp_path, cli, monkeypatch):
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(TARGET)
    code, lines = cli(["run", "--config.file", str(cfg), "--duration", "-5"])
    assert code == 2 and "argument --duration: duration must not be negative" in lines[-1]
    monkeypatch.setenv("HEADROOM_SEED", "abc")  # a flag of loadtest, digest and demo: not check-config's
    code, _ = cli(["check-config", str(cfg)])
    assert code == 0
    monkeypatch.setenv("HEADROOM_DURATION", "90s")
    monkeypatch.setenv("HEADROOM_LOG_LEVEL", "debug")
    parser, _ = build_parser()
    args = parser.parse_args(["run", "--config.file", str(cfg)])
    assert (args.duration, args.log_level) == (90.0, "debug")


def test_a_secret_rotated_into_a_bad_one_is_refused_when_used(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    auth = HttpAuth(bearer_token_file=str(token))
    assert auth.bearer_token() == SECRET  # read on every use: a rotated token is picked up
    token.write_text(f"Bearer\n{SECRET}\n")
    with pytest.raises(ConfigError) as info:
        auth.bearer_token()
    assert str(token) in str(info.value) and "control character" in str(info.value)
    assert SECRET not in str(info.value)
    monkeypatch.setenv("HEADROOM_TEST_PW", f"{SECRET}\rx")
    with pytest.raises(ConfigError) as info:
        HttpAuth(username="u", password_env="HEADROOM_TEST_PW").password()
    assert "HEADROOM_TEST_PW" in str(info.value) and SECRET not in str(info.value)


@pytest.mark.live
@pytest.mark.parametrize("case", ["port out of range", "token file with a newline"])
def test_subprocesses_refuse_alike(case, tmp_path):
    path, _, expect = _write(tmp_path, case)
    out = []
    for argv in (["check-config", path], ["run", "--config.file", path, "--duration", "1"]):
        r = subprocess.run([sys.executable, "-m", "monitor", *argv], capture_output=True, text=True, timeout=120)
        out.append((r.returncode, r.stderr.strip()))
    assert out[0] == out[1]
    assert out[0][0] == 2 and out[0][1].startswith(expect) and "\n" not in out[0][1]
    assert SECRET not in out[0][1]


# A flag that stands for a key (`run --shard`, `once --interval`, `once --vllm/--target`) is read by the
# same reader as the file (monitor/config `load(path, overrides)`): the same kinds, bounds and
# Config.check, the same error naming the key, with the flag added.
@pytest.mark.parametrize("in_file, argv", [
    ("global: {shard: 3/2}\n", ["run", "--shard", "3/2"]),
    ("global: {shard: two}\n", ["run", "--shard", "two"]),
    ("global: {latency_window: 100000}\n", ["once", "--interval", "50000"]),  # twice the interval, over 1d
    ("global: {latency_window: .inf}\n", ["once", "--interval", "inf"]),
])
def test_a_bad_override_is_refused_like_the_same_value_in_the_file(in_file, argv, tmp_path, cli):
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(TARGET)
    bad.write_text(in_file + TARGET)
    code, in_the_file = cli(["check-config", str(bad)])
    assert code == 2 and len(in_the_file) == 1 and f"{bad}: global." in in_the_file[0]
    command, *flags = argv
    code, on_the_line = cli([command, "--config.file", str(good), *flags])
    assert code == 2
    assert on_the_line == [in_the_file[0].replace(str(bad), str(good)) + f" (given as {' '.join(flags)})"]


def test_targets_on_the_command_line_are_read_like_the_files(tmp_path, cli):
    """`once --vllm URL` once took a URL without the metrics path that the file refuses."""
    bad = tmp_path / "bad.yml"
    for flag, target in (("--target", "'http://127.0.0.1:1'"), ("--vllm", "{url: 'http://127.0.0.1:1', kind: vllm}")):
        bad.write_text(f"sources:\n  vllm:\n    targets: [{target}]\n")
        code, in_the_file = cli(["check-config", str(bad)])
        assert code == 2 and ": the URL has no path: a scrape target is the metrics page itself" in in_the_file[0]
        assert cli(["once", flag, "http://127.0.0.1:1"]) == (
            2, [in_the_file[0].replace(str(bad), "<command line>") + f" (given as {flag})"])
    code, lines = cli(["once", "--vllm", "http://127.0.0.1:1/metrics", "--target", "not-a-url"])
    assert code == 2 and lines == ["headroom: <command line>: sources.vllm.targets[1]: not an http(s) URL: "
                                   "'not-a-url' (given as --vllm/--target)"]


def test_an_override_under_a_key_that_is_no_mapping_leaves_the_files_own_error(tmp_path, cli):
    bad = tmp_path / "bad.yml"
    bad.write_text("global: 5\n" + TARGET)
    _, in_the_file = cli(["check-config", str(bad)])
    assert cli(["run", "--config.file", str(bad), "--shard", "1/2"]) == (2, in_the_file)
    assert "(given as" not in in_the_file[0]


def _once(argv):
    from monitor.commands import once
    return once.config_from_args(build_parser()[0].parse_args(["once", *argv]))


def test_valid_overrides_are_what_once_runs_with(tmp_path):
    cfg = tmp_path / "h.yml"
    cfg.write_text("global: {latency_window: 10m}\n" + TARGET)
    c = _once(["--config.file", str(cfg), "--interval", "5"])
    assert (c.latency_window, c.capacity.task_window, c.history_keep) == (600.0, 5.0, 3600.0)  # the file's window
    c = _once(["--config.file", str(cfg), "--interval", "0"])
    assert (c.latency_window, c.capacity.task_window) == (600.0, None)  # one reading: nothing over an interval
    c = _once(["--config.file", str(cfg), "--interval", "1000"])
    # twice the interval; Config.check keeps twice the window in memory (a dataclasses.replace left 3600)
    assert (c.latency_window, c.capacity.task_window, c.history_keep) == (2000.0, 1000.0, 4000.0)
    c = _once(["--vllm", "http://a:8000/metrics", "--target", "http://b:30000/metrics", "--interval", "5"])
    assert [(t.url, t.kind) for t in c.vllm_targets] == [("http://a:8000/metrics", "vllm"),
                                                         ("http://b:30000/metrics", "auto")]
    assert (c.file, c.latency_window, c.capacity.task_window) == ("<command line>", 300.0, 5.0)


def test_valid_shard_is_what_run_builds_with(tmp_path, cli, monkeypatch):
    import monitor.app
    built = []

    def build(cfg, *args, **kwargs):
        built.append(cfg)
        raise ConfigError(cfg.file, "", "stopped by the test")
    monkeypatch.setattr(monitor.app, "build", build)
    cfg = tmp_path / "h.yml"
    cfg.write_text("global: {shard: 0/2}\n" + TARGET)
    assert cli(["run", "--config.file", str(cfg), "--shard", "1/3"])[0] == 2
    assert cli(["run", "--config.file", str(cfg)])[0] == 2
    assert [c.shard for c in built] == [(1, 3), (0, 2)]  # the flag wins over the file


def test_overrides_leave_the_mapping_read_as_it_was():
    from monitor.config import Override, from_dict
    data = {"global": {"interval": "5s"}, "sources": {"vllm": {"targets": ["http://a:1/metrics"]}}}
    before = repr(data)
    c = from_dict(data, "<test>", [Override("global.shard", "1/2", "--shard 1/2"),
                                   Override("capacity.task_window", 7, "--interval 7")])
    assert (c.shard, c.capacity.task_window, c.interval) == ((1, 2), 7.0, 5.0)
    assert repr(data) == before
    with pytest.raises(ConfigError, match=r"^<test>: sources: no source: "):
        from_dict(None, "<test>", [Override("global.shard", "1/2", "--shard 1/2")])  # an empty file
