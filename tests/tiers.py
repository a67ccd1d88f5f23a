"""The test tiers, held by what each test does rather than by hand-kept lists (a pytest plugin).

    unit    needs nothing outside the Python process: no subprocess, no TCP/UDP socket, no binary
    live    starts or talks to something: real Prometheus, promtool, Alertmanager, VictoriaMetrics,
            Chromium, LiteLLM, a daemon or simulated fleet on loopback (`pytest.mark.live`)
    vllm    needs the real vLLM CPU engine (`pytest.mark.vllm`; runs in its own pytest session)
    image   runs the container image with podman (`pytest.mark.image` beside `live`; its own tier after
            `make image`, left out of the live tier)

How a test gets its mark: a fixture declared with `@starts_servers` marks every test that uses it
(directly or through another fixture) `live`; the engine fixtures in conftest mark theirs `vllm`; a
file or test that starts things inline carries `pytest.mark.live` itself.

How the marks are kept honest: while the suite runs, every subprocess or multiprocessing worker
started, every INET socket connected or bound, is recorded against the test (or the fixture being
set up) that did it.
- With HEADROOM_TEST_TIER=unit (make test-unit) those calls raise, and a test without a `live` or
  `vllm` mark that made one fails with what it used: mark it, or make it pure.
- With HEADROOM_TEST_TIER=live (make test-live) a file whose `live` tests all passed while none of
  them, nor their fixtures, started a process or opened a socket fails the run: it belongs in the
  unit tier. (A file is the unit: a mostly-live file may keep a few pure tests under its mark.)
With HEADROOM_NO_SKIP=1 (make test, CI) a skipped test is a failure with the skip's reason, so the
whole suite never passes with something silently left out.

With HEADROOM_DURATIONS_DIR set (tests/run_tiers.py sets it), each pytest process writes the time
its tests took per file (set-up, call and teardown as pytest reports them; a module or session fixture
counts in the file of the first test that used it) to DIR/<pid>.json.

A bare `pytest` (no test paths, no -m) is the unit tier, guard included: the loop to run while working.
Naming files or a -m expression runs what was named; tests/run_tiers.py and the make targets run the tiers.
"""
from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
import threading
from typing import Callable, Optional

import pytest

TIER = os.environ.get("HEADROOM_TEST_TIER", "")
UNIT_MARKS = "not live and not vllm"  # the unit tier's -m expression (tests/run_tiers.py)
NO_SKIP = os.environ.get("HEADROOM_NO_SKIP", "") not in ("", "0")

_SERVER_FIXTURES: set[str] = set()   # declared with @starts_servers
_ENGINE_FIXTURES = {"vllm_python", "vllm_engine_factory", "vllm_small_engine", "litellm_gateway"}


def starts_servers(fn: Callable) -> Callable:
    """Declare a fixture function as one that starts a binary or a server: its tests are `live`.
    Put it under `@pytest.fixture`."""
    _SERVER_FIXTURES.add(fn.__name__)
    return fn


class ExternalUse(RuntimeError):
    """Raised in the unit tier where a test reaches outside the process."""


class _Recorder:
    """What reached outside the process, per test node id and per fixture name."""

    def __init__(self) -> None:
        self.context: Optional[tuple[str, str]] = None  # ("test", nodeid) or ("fixture", name)
        self.by_test: dict[str, set[str]] = {}
        self.by_fixture: dict[str, set[str]] = {}
        self.lock = threading.Lock()

    def record(self, what: str) -> None:
        ctx = self.context
        if ctx is None:
            return
        with self.lock:
            book = self.by_test if ctx[0] == "test" else self.by_fixture
            book.setdefault(ctx[1], set()).add(what)
        if TIER == "unit" and ctx[0] == "test" and not _RECORDER_ALLOWED.get(ctx[1], False):
            raise ExternalUse(f"test-unit: {what} (mark the test `live`, or keep it inside the process)")


REC = _Recorder()
_FAILED: set[str] = set()  # node ids whose call failed (no second report at teardown)
_LIVE_FILES: dict[str, list[int]] = {}  # file -> [live tests passed, of which reached outside]
_RECORDER_ALLOWED: dict[str, bool] = {}  # nodeid -> marked live/vllm (the unit guard lets those pass)
_ORIG = {}
_DURATIONS: dict[str, list] = {}  # file -> [seconds, tests]


def _inet(sock: socket.socket) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6)


def _install() -> None:
    if _ORIG:
        return
    _ORIG["connect"] = socket.socket.connect
    _ORIG["connect_ex"] = socket.socket.connect_ex
    _ORIG["bind"] = socket.socket.bind
    _ORIG["popen"] = subprocess.Popen.__init__
    _ORIG["mp_start"] = multiprocessing.process.BaseProcess.start

    def connect(self, address, *a, **kw):
        if _inet(self):
            REC.record(f"connect {address!r}")
        return _ORIG["connect"](self, address, *a, **kw)

    def connect_ex(self, address, *a, **kw):
        if _inet(self):
            REC.record(f"connect {address!r}")
        return _ORIG["connect_ex"](self, address, *a, **kw)

    def bind(self, address, *a, **kw):
        if _inet(self):
            REC.record(f"bind {address!r}")
        return _ORIG["bind"](self, address, *a, **kw)

    def popen(self, args, *a, **kw):
        first = args if isinstance(args, (str, bytes)) else (list(args)[:1] or ["?"])[0]
        REC.record(f"subprocess {os.path.basename(str(first))}")
        return _ORIG["popen"](self, args, *a, **kw)

    def mp_start(self):  # a multiprocessing worker (fork, spawn or the fork server's) is a process too
        REC.record(f"process {self.name}")
        return _ORIG["mp_start"](self)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.socket.bind = bind
    subprocess.Popen.__init__ = popen
    multiprocessing.process.BaseProcess.start = mp_start


def pytest_configure(config) -> None:
    _install()
    global TIER
    bare = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr
    if bare:  # `pytest` alone: the unit tier, as `make test-unit` runs it
        config.option.markexpr = UNIT_MARKS
        TIER = TIER or "unit"


def pytest_report_header(config) -> str:
    return (f"tier: {TIER or 'none'} (-m {config.option.markexpr!r}); a bare `pytest` runs the unit tier, "
            "tests/run_tiers.py and `make test` every tier")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _ENGINE_FIXTURES and not item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.vllm)
        if names & _SERVER_FIXTURES and not item.get_closest_marker("live"):
            item.add_marker(pytest.mark.live)
        _RECORDER_ALLOWED[item.nodeid] = bool(item.get_closest_marker("live") or item.get_closest_marker("vllm"))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    previous = REC.context
    REC.context = ("fixture", fixturedef.argname)
    try:
        yield
    finally:
        REC.context = previous


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    REC.context = ("test", item.nodeid)
    try:
        yield
    finally:
        REC.context = None


def _external(item) -> set[str]:
    used = set(REC.by_test.get(item.nodeid, ()))
    for name in getattr(item, "fixturenames", ()):
        used |= REC.by_fixture.get(name, set())
    return used


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if NO_SKIP and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under HEADROOM_NO_SKIP (make test runs every test): {reason}"
        return
    if call.when == "call" and report.failed:
        _FAILED.add(item.nodeid)
    if call.when != "teardown" or not report.passed or item.nodeid in _FAILED:
        return
    marked = _RECORDER_ALLOWED.get(item.nodeid, False)
    used = _external(item)
    if TIER == "unit" and used and not marked:
        report.outcome = "failed"
        report.longrepr = ("test-unit: this test reaches outside the process; mark it `live` "
                           "(pytest.mark.live, or a @starts_servers fixture) or make it pure. Used: "
                           + "; ".join(sorted(used)[:5]))
    elif TIER == "live" and item.get_closest_marker("live"):
        row = _LIVE_FILES.setdefault(item.nodeid.split("::")[0], [0, 0])
        row[0] += 1
        row[1] += bool(used)


def _pure_live_files() -> list[str]:
    return sorted(f for f, (n, external) in _LIVE_FILES.items() if n and not external)


def pytest_sessionfinish(session, exitstatus) -> None:
    if TIER == "live" and _pure_live_files() and exitstatus == 0:
        session.exitstatus = 1


def pytest_runtest_logreport(report) -> None:
    row = _DURATIONS.setdefault(report.nodeid.split("::")[0], [0.0, 0])
    row[0] += report.duration
    row[1] += report.when == "setup"


def _write_durations(directory: str) -> None:
    import json
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
        json.dump({name: {"seconds": round(s, 3), "tests": n} for name, (s, n) in _DURATIONS.items()}, f, indent=1)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if os.environ.get("HEADROOM_DURATIONS_DIR"):
        _write_durations(os.environ["HEADROOM_DURATIONS_DIR"])
    for f in _pure_live_files() if TIER == "live" else ():
        terminalreporter.write_line(f"test-live: {f} is marked `live` but none of its tests started a "
                                    "process or opened a socket: it belongs in the unit tier", red=True)
    path = os.environ.get("HEADROOM_TIER_REPORT")
    if not path:
        return
    import json
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"tests": {k: sorted(v) for k, v in REC.by_test.items()},
                   "fixtures": {k: sorted(v) for k, v in REC.by_fixture.items()}}, f, indent=1)
