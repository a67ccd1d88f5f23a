"""`headroom check-config` accepts exactly what `headroom run` accepts (issue #16), on generated files.

Each example edits a valid configuration at one to three keys taken from the declarations (every key
of docs/configuration.md, plus misspellings of them) with values from a bag of good and hostile
ones, then runs both commands in-process through `monitor.commands.cli.main`. When check-config refuses the
file, run must refuse it with the same line and exit code 2; when check-config says valid, run must
start, serve and stop cleanly (exit 0). HEADROOM_AGREEMENT_EXAMPLES sets the number of examples.
"""
import contextlib
import dataclasses
import io
import os
import re
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import monitor.commands.run as run_command
from monitor.commands.cli import main
from monitor.config import Config, from_dict
from monitor.kit.settings.reader import ConfigError, default_of, join, specs

pytestmark = pytest.mark.live  # a file run accepts starts the daemon on loopback
N = int(os.environ.get("HEADROOM_AGREEMENT_EXAMPLES", "40"))


GOOD_BY_KIND = {"integer": 2, "number": 0.5, "duration": "30s", "string": "x", "boolean": False,
                "URL": "http://127.0.0.1:1/metrics", "HOST:PORT": "127.0.0.1:0", "file path": "{tmp}/token",
                "variable name": "HEADROOM_AGREE_SET", "time zone": "UTC", "I/N": "0/2"}


def _keys(cls, prefix=""):
    """(key path, a value the declaration accepts or None) of every declared key, placeholders filled."""
    for name, spec, path in specs(cls):
        full = join(prefix, path)
        if spec.merge:
            yield from _keys(spec.kind.cls, full)
            continue
        default = default_of(cls, name)
        options = getattr(spec.kind, "options", None)
        if default is None or dataclasses.is_dataclass(default):
            good = options[0] if options else GOOD_BY_KIND.get(spec.kind.name)
        else:
            good = list(default) if isinstance(default, tuple) else default
        yield full.replace("<pool>", "p").replace("<task type>", "t").replace("[]", "[0]"), good
        for child_prefix, child, _ in spec.kind.children(full):
            yield from _keys(child, child_prefix)


KEYS = dict(_keys(Config))
PATHS = sorted(KEYS) + [re.sub(r"([a-z])([a-z])(?=[^.\[]*$)", r"\2\1", k, count=1) for k in sorted(KEYS)[::7]]


VALUES = [None, True, 0, 1, -1, 3, 65536, 10 ** 20, 0.5, float("nan"), float("inf"), "", "nonsense", "15s", "0s",
          "99999999w", "5m", "0/2", ":0", "127.0.0.1:0", "http://127.0.0.1:1/metrics", "http://127.0.0.1:99999/m",
          "http://127.0.0.1:abc/m", "ftp://x", "queue", "envoy", "mon", "UTC", "Mars/Olympus", "{tmp}/token",
          "{tmp}/newline-token", "{tmp}/missing/x", "{tmp}", "HEADROOM_AGREE_SET", "HEADROOM_AGREE_UNSET", [],
          ["http://127.0.0.1:1/metrics"], [1], {}, {"a": "b"}, {"url": "http://127.0.0.1:1"},
          {"type": "directory", "path": "{tmp}/out"}, {"refit_minutes": 5}, {"ttft_p95_seconds": 0.5},
          {"task_types": {"a": {"p95_seconds": 30}}}, {"outbox": "{tmp}/o.sqlite"}]


def _put(data: dict, path: str, value) -> None:
    """Set `path` ("a.b[0].c") in nested data, making the mappings and lists on the way."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node = data
    for part, nxt in zip(parts, parts[1:] + [None]):
        fresh = [] if nxt and nxt.startswith("[") else {}
        if part.startswith("["):
            if not node:
                node.append(fresh)
            if nxt is None:
                node[0] = value
            elif not isinstance(node[0], type(fresh)):
                node[0] = fresh
            node = node[0]
        elif nxt is None:
            node[part] = value
        else:
            if not isinstance(node.get(part), type(fresh)):
                node[part] = fresh
            node = node[part]


DESTINATIONS = {"path": {"type": "directory", "path": "{tmp}/out"}, "formats": {"type": "directory", "path": "{tmp}/out"},
                "url": {"type": "webhook", "url": "http://127.0.0.1:1/hook"}}


def _base(paths: list[str]) -> dict:
    """A valid file, with what the edited keys need beside them (a url next to a source's other keys)."""
    data = {"sources": {"vllm": {"targets": ["http://127.0.0.1:1/metrics"]}}, "store": {"path": "{tmp}/h.sqlite"}}
    for path in paths:
        if path.startswith("sources.prometheus"):
            data["sources"] = {"prometheus": {"url": "http://127.0.0.1:1"}}
        elif path.startswith("sources.gateways[0]"):
            data["sources"]["gateways"] = [{"kind": "envoy", "url": "http://127.0.0.1:1/metrics"}]
        elif path.startswith("sources.alerts."):
            data["sources"]["alerts"] = {"url": "http://127.0.0.1:1"}
        elif path.startswith("sources.vllm.targets[0].") or path.startswith("sources.dcgm.targets[0]."):
            section = "vllm" if path.startswith("sources.vllm") else "dcgm"
            data["sources"].setdefault(section, {})["targets"] = [{"url": "http://127.0.0.1:1/metrics"}]
        elif path.startswith("digest.destinations[0]."):
            name = path.rsplit(".", 1)[1]
            dest = DESTINATIONS.get(name.split("_")[0] if name.startswith(("url", "bearer")) else name,
                                    {"type": "smtp", "host": "127.0.0.1", "from": "a@b.c", "to": ["d@e.f"]})
            data["digest"] = {"destinations": [dict(dest)]}
    return data


def _fill(value, tmp: str):
    if isinstance(value, str):
        return value.replace("{tmp}", tmp)
    if isinstance(value, list):
        return [_fill(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, tmp) for k, v in value.items()}
    return value


def _cli(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, [line for line in err.getvalue().splitlines() if line.startswith("headroom: ")]


EDIT = st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), st.one_of(
    st.just(KEYS.get(p)), st.sampled_from(VALUES))))


@settings(max_examples=N, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(EDIT, min_size=1, max_size=3))
def test_check_config_and_run_give_the_same_verdict(monkeypatch, edits):
    monkeypatch.setattr(run_command, "exit_if_stuck", lambda *a, **k: None)  # the pytest process stays
    monkeypatch.setenv("HEADROOM_AGREE_SET", "tok-1")
    monkeypatch.delenv("HEADROOM_AGREE_UNSET", raising=False)
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):  # relative paths land in tmp
        with open(f"{tmp}/token", "w") as f:
            f.write("tok-2\n")
        with open(f"{tmp}/newline-token", "w") as f:
            f.write("tok\n3\n")
        data = _fill(_base([path for path, _ in edits]), tmp)
        for path, value in edits:
            _put(data, path, _fill(value, tmp))
        with open(f"{tmp}/headroom.yml", "w") as f:
            yaml.safe_dump(data, f)
        checked = _cli(["check-config", f"{tmp}/headroom.yml"])
        ran = _cli(["run", "--config.file", f"{tmp}/headroom.yml", "--web.listen-address", "127.0.0.1:0",
                    "--duration", "0.2"])
    if checked[0] in (0, 1):  # 1: valid, but store.path cannot be written (run serves without writing it)
        assert ran[0] == 0, f"check-config said valid, run refused: {ran} ({data})"
    else:
        assert checked[0] == 2 and len(checked[1]) == 1, checked
        assert ran == checked, f"check-config and run disagree on {data}"


def test_the_generator_reaches_both_verdicts_and_every_section(tmp_path, monkeypatch):
    """A test of the test: the edits cover every section, and both verdicts are common."""
    tops = {re.split(r"[.\[]", p)[0] for p in PATHS}
    assert {"global", "sources", "pools", "web", "store", "capacity", "forecast", "digest", "slos"} <= tops
    assert "digest.destinations[0].host" in KEYS and len(PATHS) > 150
    data: dict = {"sources": {"vllm": {"targets": ["x"]}}}
    _put(data, "sources.vllm.targets[0].url", "http://a:1/m")
    _put(data, "digest.destinations[0]", {"type": "directory"})
    assert data == {"sources": {"vllm": {"targets": [{"url": "http://a:1/m"}]}},
                    "digest": {"destinations": [{"type": "directory"}]}}
    monkeypatch.setenv("HEADROOM_AGREE_SET", "tok-1")
    (tmp_path / "token").write_text("tok-2\n")
    verdicts = {True: 0, False: 0}
    for path, good in KEYS.items():
        data = _fill(_base([path]), str(tmp_path))
        _put(data, path, _fill(good, str(tmp_path)))
        try:
            from_dict(data, "g.yml")
            verdicts[True] += 1
        except ConfigError:
            verdicts[False] += 1
    assert verdicts[True] > 3 * verdicts[False], verdicts  # a good value alone mostly makes a valid file
