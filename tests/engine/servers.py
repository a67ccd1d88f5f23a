"""Launch and stop the real vLLM CPU engine and the real LiteLLM proxy for tests.

Servers bind 127.0.0.1 on a free port, run in their own process group (the vLLM API server forks an
engine-core process) and are stopped by killing that group. Readiness is polled with a bounded
timeout; a server that dies or does not get ready raises with the tail of its log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import requests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:  # tests/, for the one port helper
    sys.path.insert(0, os.path.dirname(HERE))
from servers import free_port  # noqa: E402  (tests/servers.py)

GATEWAY_CONFIG = os.path.join(REPO, "tests", "fixtures", "gateway", "litellm-config.yaml")
MASTER_KEY = "sk-local-test-key"  # the placeholder key of the committed fixture config
SERVED_MODEL = "tiny"
BLOCK_SIZE = 128  # vLLM's CPU backend block size (cache_config_info block_size)

# counted from the spawn: two engines and the proxy start side by side on 2 cores (one engine's start-up
# alone took 30 s quiet, 110-240 s with the cores loaded to 13-17), so a wait that only a broken start
# runs out, not a slow one
VLLM_START_TIMEOUT = float(os.environ.get("HEADROOM_VLLM_START_TIMEOUT", "600"))
LITELLM_START_TIMEOUT = float(os.environ.get("HEADROOM_LITELLM_START_TIMEOUT", "300"))
# nice value for vLLM's engine processes (EngineCore, Worker); its API server keeps the default. 0: leave alone
ENGINE_NICE = int(os.environ.get("HEADROOM_VLLM_ENGINE_NICE", "10"))


class ServerStartError(RuntimeError):
    pass


_LIVE: "list[ServerHandle]" = []  # started and not yet stopped: stopped at interpreter exit


def _stop_live() -> None:
    for handle in list(_LIVE):
        handle.stop(timeout=10)


def _install_cleanup() -> None:
    """Stop our servers even when the test process is ended by SIGTERM (CI timeout, kill): the
    default SIGTERM action skips fixture finalizers and atexit, leaving engines behind."""
    if getattr(_install_cleanup, "done", False):
        return
    _install_cleanup.done = True
    import atexit
    import threading

    atexit.register(_stop_live)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def vllm_python() -> Optional[str]:
    """The interpreter of the vLLM venv: $HEADROOM_VLLM_PYTHON, else <repo>/.venv-vllm, else
    $HEADROOM_VLLM_VENV/bin/python. None when none exists."""
    candidates = [os.environ.get("HEADROOM_VLLM_PYTHON")]
    if os.environ.get("HEADROOM_VLLM_VENV"):
        candidates.append(os.path.join(os.environ["HEADROOM_VLLM_VENV"], "bin", "python"))
    candidates.append(os.path.join(REPO, ".venv-vllm", "bin", "python"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def litellm_bin() -> Optional[str]:
    """The `litellm` console script: $HEADROOM_LITELLM_BIN, else $HEADROOM_LITELLM_VENV/bin/litellm,
    else <repo>/.venv-litellm/bin/litellm. None when none exists."""
    candidates = [os.environ.get("HEADROOM_LITELLM_BIN")]
    if os.environ.get("HEADROOM_LITELLM_VENV"):
        candidates.append(os.path.join(os.environ["HEADROOM_LITELLM_VENV"], "bin", "litellm"))
    candidates.append(os.path.join(REPO, ".venv-litellm", "bin", "litellm"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ServerHandle:
    """A running server: `url` (no trailing slash), `stop()`; also the process, its log, the seconds
    it took to become ready and the arguments it was started with."""

    name: str
    url: str
    port: int
    process: subprocess.Popen
    log_path: str
    ready_seconds: float = 0.0
    info: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after `timeout`. Idempotent."""
        if self in _LIVE:
            _LIVE.remove(self)
        proc = self.process
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None and proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        # the engine-core child may outlive the API server: kill whatever is left in the group
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _spawn(name: str, argv: Sequence[str], env: dict, log_dir: Optional[str], cwd: Optional[str] = None):
    _install_cleanup()
    log_dir = log_dir or tempfile.mkdtemp(prefix=f"headroom-{name}-")
    log_path = os.path.join(log_dir, f"{name}.log")
    log = open(log_path, "wb")
    try:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True,  # own process group: stop() kills it whole
        )
    finally:
        log.close()
    return proc, log_path


# log lines after which a starting vLLM server never gets ready (its API process may linger)
FATAL_MARKERS = ("initialization failed", "EngineDeadError", "Engine core initialization failed")


def _wait_ready(handle: ServerHandle, path: str, timeout: float, started: float) -> None:
    """Poll `path` until it answers 200, up to `started + timeout` (at least one poll: a server
    spawned long before it was awaited may have been ready for minutes)."""
    deadline = started + timeout
    last_error = "no answer yet"
    while True:
        if not handle.alive():
            rc = handle.process.returncode
            raise ServerStartError(
                f"{handle.name} exited with rc {rc} before getting ready; log tail:\n{handle.log_tail()}")
        tail = handle.log_tail(200)
        if any(marker in tail for marker in FATAL_MARKERS):
            handle.stop()
            raise ServerStartError(f"{handle.name} failed to start; log tail:\n{tail}")
        try:
            r = requests.get(handle.url + path, timeout=2)
            if r.status_code == 200:
                handle.ready_seconds = time.monotonic() - started
                return
            last_error = f"HTTP {r.status_code}"
        except requests.RequestException as exc:
            last_error = type(exc).__name__
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    handle.stop()
    raise ServerStartError(
        f"{handle.name} not ready on {handle.url}{path} after {timeout:.0f} s ({last_error}); "
        f"log tail:\n{handle.log_tail()}")


def build_tiny_model(out_dir: str, python: Optional[str] = None, size: str = "tiny") -> str:
    """Build the model folder with the vLLM venv's python (it has tokenizers/transformers); `size`
    is one of tiny_model.SIZES."""
    python = python or vllm_python()
    if not python:
        raise ServerStartError("no vLLM venv python (set HEADROOM_VLLM_PYTHON or run .ci/install-vllm.sh)")
    if not os.path.isfile(os.path.join(out_dir, "config.json")):
        subprocess.run(
            [python, os.path.join(HERE, "tiny_model.py"), out_dir, size],
            check=True, capture_output=True, timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
    return out_dir


def model_vocab_size(model_dir: str) -> int:
    import json
    with open(os.path.join(model_dir, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def start_vllm(
    model_dir: str,
    max_num_seqs: int = 8,
    num_gpu_blocks: int = 24,
    port: Optional[int] = None,
    extra_args: Sequence[str] = (),
    python: Optional[str] = None,
    log_dir: Optional[str] = None,
    timeout: float = VLLM_START_TIMEOUT,
    enforce_eager: Optional[bool] = None,
) -> ServerHandle:
    """Start `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 serving `model_dir` as `tiny`
    with dummy weights; returns once GET /ping answers 200 (raises ServerStartError otherwise).

    `enforce_eager` (default: on, unless HEADROOM_VLLM_EAGER=0) skips torch.compile: on 2 shared
    cores the compile alone took 60-90 s of a 175-240 s start; eager starts in ~110 s under the
    same load. Scheduling, KV accounting and metrics are the same code either way."""
    handle = spawn_vllm(model_dir, max_num_seqs, num_gpu_blocks, port, extra_args, python, log_dir, enforce_eager)
    return finish_vllm_start(handle, timeout)


def spawn_vllm(
    model_dir: str,
    max_num_seqs: int = 8,
    num_gpu_blocks: int = 24,
    port: Optional[int] = None,
    extra_args: Sequence[str] = (),
    python: Optional[str] = None,
    log_dir: Optional[str] = None,
    enforce_eager: Optional[bool] = None,
) -> ServerHandle:
    """The first half of `start_vllm`: the server process started, not waited for (its start-up
    overlaps whatever runs next); `finish_vllm_start(handle)` waits for it."""
    if enforce_eager is None:
        enforce_eager = os.environ.get("HEADROOM_VLLM_EAGER", "1") not in ("0", "false", "no")
    python = python or vllm_python()
    if not python:
        raise ServerStartError("no vLLM venv python (set HEADROOM_VLLM_PYTHON or run .ci/install-vllm.sh)")
    port = port or free_port()
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_dir,
        "--load-format", "dummy",
        "--dtype", "bfloat16",
        "--max-model-len", "1024",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--served-model-name", SERVED_MODEL,
        "--max-num-seqs", str(max_num_seqs),
        "--num-gpu-blocks-override", str(num_gpu_blocks),
        *(["--enforce-eager"] if enforce_eager else []),
        *extra_args,
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    started = time.monotonic()
    proc, log_path = _spawn(f"vllm-{port}", argv, env, log_dir)
    handle = ServerHandle(
        name="vllm", url=f"http://127.0.0.1:{port}", port=port, process=proc, log_path=log_path,
        info={"max_num_seqs": max_num_seqs, "num_gpu_blocks": num_gpu_blocks, "block_size": BLOCK_SIZE,
              "model_dir": model_dir, "served_model": SERVED_MODEL, "argv": argv,
              "vocab_size": model_vocab_size(model_dir), "spawned_at": started},
    )
    _LIVE.append(handle)
    return handle


def finish_vllm_start(handle: ServerHandle, timeout: float = VLLM_START_TIMEOUT) -> ServerHandle:
    """Wait (up to `timeout` s from its spawn) until a spawned engine answers /ping, then renice its
    engine processes; `ready_seconds` counts from the spawn."""
    _wait_ready(handle, "/ping", timeout, handle.info["spawned_at"])
    handle.info["engine_nice"] = renice_engine(handle.process.pid, ENGINE_NICE)
    if ENGINE_NICE > 0 and not handle.info["engine_nice"]:
        handle.stop()
        raise ServerStartError("found no VLLM:: engine process to renice (did vLLM rename its processes?); "
                               "HEADROOM_VLLM_ENGINE_NICE=0 leaves the priority alone")
    return handle


def renice_engine(api_pid: int, nice: int) -> dict:
    """Lower the CPU priority of every thread of vLLM's engine processes (the API server's process
    group minus the API server). On a GPU host the model's arithmetic runs on the GPU and the CPU is
    free for the HTTP frontend; here the engine's Worker and EngineCore compete for 2 cores with the
    API server and the test's own load client, and a starved frontend or client delays requests where
    no engine clock sees them (CI: the client's queue estimate 24 % over the engine's; the engine
    counting 0.4-0.6 fewer requests than the client had in flight). At nice 10 the engine yields the
    CPU whenever the frontend or the client is runnable and keeps it otherwise. Returns
    {pid: nice} for the processes changed (threads started later inherit the value)."""
    done: dict = {}
    if nice <= 0:
        return done
    try:
        group = os.getpgid(api_pid)
    except ProcessLookupError:
        return done
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == api_pid:
            continue
        pid = int(entry)
        try:
            if os.getpgid(pid) != group:
                continue
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            if not comm.startswith("VLLM::"):  # EngineCore, Worker; not the resource tracker
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            done[pid] = nice
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return done


def write_litellm_config(engine_url: str, path: str, template: str = GATEWAY_CONFIG) -> str:
    """The committed gateway config with the model's api_base pointed at `engine_url`."""
    import yaml

    with open(template) as f:
        config = yaml.safe_load(f)
    for entry in config["model_list"]:
        entry["litellm_params"]["api_base"] = engine_url.rstrip("/") + "/v1"
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def start_litellm(
    engine_url: str,
    port: Optional[int] = None,
    binary: Optional[str] = None,
    log_dir: Optional[str] = None,
    timeout: float = LITELLM_START_TIMEOUT,
) -> ServerHandle:
    """Start the LiteLLM proxy with the fixture config in front of `engine_url`; ready when
    GET /health/liveliness answers. Metrics at `handle.url + "/metrics/"` (trailing slash)."""
    return finish_litellm_start(spawn_litellm(engine_url, port, binary, log_dir), timeout)


def spawn_litellm(engine_url: str, port: Optional[int] = None, binary: Optional[str] = None,
                  log_dir: Optional[str] = None) -> ServerHandle:
    """The first half of `start_litellm`: the proxy's process started, not waited for (the engine
    behind it need not be up yet); `finish_litellm_start(handle)` waits for it."""
    binary = binary or litellm_bin()
    if not binary:
        raise ServerStartError("no litellm binary (set HEADROOM_LITELLM_BIN or run .ci/install-litellm.sh)")
    port = port or free_port()
    log_dir = log_dir or tempfile.mkdtemp(prefix="headroom-litellm-")
    config = write_litellm_config(engine_url, os.path.join(log_dir, "litellm-config.yaml"))
    argv = [binary, "--config", config, "--host", "127.0.0.1", "--port", str(port)]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LITELLM_LOG": os.environ.get("LITELLM_LOG", "ERROR"),
        "LITELLM_TELEMETRY": "False",
        # keep litellm from fetching its model price map over the network
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # single-process metrics, as in the fixture capture
    started = time.monotonic()
    proc, log_path = _spawn(f"litellm-{port}", argv, env, log_dir, cwd=log_dir)
    handle = ServerHandle(
        name="litellm", url=f"http://127.0.0.1:{port}", port=port, process=proc, log_path=log_path,
        info={"engine_url": engine_url, "config": config, "master_key": MASTER_KEY,
              "metrics_url": f"http://127.0.0.1:{port}/metrics/", "served_model": SERVED_MODEL},
    )
    handle.info["spawned_at"] = started
    _LIVE.append(handle)
    return handle


def finish_litellm_start(handle: ServerHandle, timeout: float = LITELLM_START_TIMEOUT) -> ServerHandle:
    """Wait (up to `timeout` s from its spawn) until a spawned proxy answers /health/liveliness."""
    _wait_ready(handle, "/health/liveliness", timeout, handle.info["spawned_at"])
    return handle


def fetch_metrics(url: str, path: str = "/metrics", timeout: float = 10.0) -> tuple[str, float]:
    """GET url+path once; returns (text, epoch seconds when the answer arrived). Raises on non-200."""
    r = requests.get(url.rstrip("/") + path, timeout=timeout)
    ts = time.time()
    r.raise_for_status()
    return r.text, ts


if __name__ == "__main__":  # manual smoke: python tests/engine/servers.py
    d = build_tiny_model(tempfile.mkdtemp(prefix="tiny-"))
    h = start_vllm(d)
    print("vllm ready in", round(h.ready_seconds, 1), "s at", h.url, file=sys.stderr)
    h.stop()
