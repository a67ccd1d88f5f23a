"""Real servers for tests: a misbehaving-on-demand metrics server, and real Prometheus on loopback."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

import requests

from monitor.kit.process import stop_process

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A loopback port for a server the caller starts next: the one port helper of the tests and the
    benchmarks (tests/engine/servers.py and benchmarks/ import it).

    Binding port 0 and closing at once (what each copy used to do) leaves the port to the next port-0
    bind of any process on the machine, another test's server included. Here the port is bound,
    connected to and accepted, and the accepted side closes first: the port waits in TIME_WAIT, which
    the kernel skips when it hands out ports for port 0, while a server that sets SO_REUSEADDR (Python's
    socketserver with allow_reuse_address, Go's net.Listen: Prometheus, Alertmanager, VictoriaMetrics;
    uvicorn: vLLM, LiteLLM; headroom's own listener) binds it at once. A port is handed out once per process."""
    while True:
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            port = listener.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                accepted, _ = listener.accept()
                accepted.close()
        with _HANDED_OUT_LOCK:
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def self_signed_cert(directory) -> tuple[str, str]:
    """(cert.pem, key.pem) in `directory`: a self-signed certificate for 127.0.0.1 and localhost, made
    by openssl (the test is skipped when openssl is not installed)."""
    import pytest
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def wait_for(fetch, cond=bool, timeout: float = 30.0, what: str = "the condition", every: float = 0.05,
             tolerate=(requests.RequestException, ValueError, OSError)):
    """Call fetch() until cond(value) holds and return that value: the one poll of the test suite.
    A fetch that raises one of `tolerate` (a server not up yet) counts as no value; after `timeout`
    seconds an AssertionError names what did not happen and the last value seen."""
    end = time.monotonic() + timeout
    value = None
    while True:
        try:
            value = fetch()
        except tolerate as exc:
            value = exc
        else:
            if value is not None and cond(value):
                return value
        if time.monotonic() >= end:
            raise AssertionError(f"not within {timeout}s: {what} (last: {str(value)[:400]})")
        time.sleep(every)


def wait_http(url: str, timeout: float = 30.0, ok=(200,)) -> None:
    wait_for(lambda: requests.get(url, timeout=1), lambda r: r.status_code in ok, timeout, f"{url} ready")


class MetricsServer:
    """Serves bodies per path; `mode[path]` makes a path misbehave: 'down' (503), 'slow', 'truncated',
    'garbage'. Bodies may be callables (called per request)."""

    def __init__(self, content_type: str = "text/plain; version=0.0.4; charset=utf-8"):
        self.bodies: dict[str, Callable[[], str] | str] = {}
        self.mode: dict[str, str] = {}
        self.slow_seconds = 3.0
        self.hits: dict[str, int] = {}
        self.accept_headers: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                outer.hits[path] = outer.hits.get(path, 0) + 1
                outer.accept_headers.append(self.headers.get("Accept", ""))
                body = outer.bodies.get(path)
                mode = outer.mode.get(path, "ok")
                if body is None or mode == "down":
                    self.send_response(404 if body is None else 503)
                    self.end_headers()
                    return
                text = body() if callable(body) else body
                data = text.encode()
                if mode == "slow":
                    time.sleep(outer.slow_seconds)
                if mode == "garbage":
                    data = b"vllm:num_requests_running{engine=\"0\",model_name=\"x\" oops\n"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if mode == "truncated":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

        class QuietServer(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # the misbehaving modes break connections on purpose

        self.server = QuietServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-server", daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class ManagedProcess:
    """A server process started by a test (`self.proc`, `self.log`): terminate, then kill."""

    def launch(self, argv: list, log_path, cwd, ready_url: str, timeout: float = 30.0) -> None:
        """Start `argv` with its output in `log_path`, then wait until `ready_url` answers 200; a
        server that does not get ready is stopped before the error goes up."""
        self.log_path = str(log_path)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            wait_http(ready_url, timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def scrape_config(jobs: dict, interval: str = "1s") -> str:
    """A Prometheus configuration scraping every `interval`: `jobs` maps a job name to its targets,
    each a (host:port, target labels or None) pair."""
    import yaml
    return yaml.safe_dump({"global": {"scrape_interval": interval}, "scrape_configs": [
        {"job_name": job, "static_configs": [{"targets": [t], **({"labels": dict(labels)} if labels else {})}
                                             for t, labels in targets]}
        for job, targets in jobs.items()]}, sort_keys=False)


class Prometheus(ManagedProcess):
    """A real Prometheus (Debian 2.42) on loopback, started in a temp dir, readiness polled."""

    def __init__(self, workdir: str, config_text: str, extra_args: tuple[str, ...] = (), data_dir: Optional[str] = None,
                 ready_timeout: float = 30.0):
        self.binary = shutil.which("prometheus")
        if not self.binary:
            raise FileNotFoundError("prometheus binary not on PATH")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = os.path.join(workdir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(config_text)
        self.launch([self.binary, f"--config.file={cfg}",
                     f"--storage.tsdb.path={data_dir or os.path.join(workdir, 'data')}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                     "--storage.tsdb.retention.time=60d", *extra_args],
                    os.path.join(workdir, "prometheus.log"), workdir, self.url + "/-/ready", ready_timeout)

    def query(self, q: str):
        r = requests.get(self.url + "/api/v1/query", params={"query": q}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def wait_for(self, q: str, timeout: float = 60.0, predicate=lambda result: bool(result)):
        return wait_for(lambda: self.query(q), predicate, timeout, f"query {q!r} satisfies the condition", 0.25)


def same_as_direct(servers, url: str):
    """One cycle of a direct scrape of `servers` and one in Prometheus mode on the query API at `url`
    (selector job="vllm"); asserts the prometheus source up and the pool's replicas, requests and KV
    tokens equal to the direct ones: (the direct pool, the Prometheus-mode pool)."""
    import pytest

    from monitor.config import Config, PrometheusSource, Target
    from monitor.config.inputs import pipeline_settings
    from monitor.pipeline.cycle import Pipeline
    direct = Pipeline(pipeline_settings(Config(vllm_targets=[Target(s.url("/metrics")) for s in servers])))
    via = Pipeline(pipeline_settings(Config(prometheus=PrometheusSource(url=url, selector='job="vllm"'))))
    try:
        d = direct.run_cycle().pools[0]
        snap = via.run_cycle()
    finally:
        direct.close()
        via.close()
    p = snap.pools[0]
    assert [s.up for s in snap.sources if s.source == "prometheus"] == [True]
    for field in ("replicas", "active_requests", "queued_requests", "kv_tokens_live", "kv_tokens_capacity"):
        assert getattr(p, field) == pytest.approx(getattr(d, field)), field
    return d, p


def stop_all(stoppers: list) -> None:
    """A fixture's teardown: call each stop function, the last started first, going on past one that fails."""
    for stop in reversed(stoppers):
        try:
            stop()
        except Exception:
            pass


def headroom_run(workdir, config_text: str, duration: int, stdout=subprocess.DEVNULL) -> tuple[subprocess.Popen, str]:
    """`headroom run` on `config_text` (written to workdir/h.yml) for up to `duration` seconds, in a
    child process serving on a free loopback port (HEADROOM_WEB_LISTEN_ADDRESS), its stderr piped for
    a failure's message: (process, base URL). Stop it with stop_process."""
    cfg = os.path.join(str(workdir), "h.yml")
    with open(cfg, "w", encoding="utf-8") as f:
        f.write(config_text)
    port = free_port()
    env = dict(os.environ, HEADROOM_WEB_LISTEN_ADDRESS=f"127.0.0.1:{port}")
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", cfg, "--duration", str(duration)],
                            env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


def metric(text: str, name: str, **labels) -> Optional[float]:
    """The value of the first sample of `name` whose labels include `labels` (None: no such sample)."""
    import re
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.split("}")[0]))
            if all(have.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None


def samples(text: str, name: str) -> dict[tuple, float]:
    """The samples of `name` in an exposition body: {sorted label pairs: value}."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


NO_SCRAPES = "global:\n  scrape_interval: 1h\nscrape_configs: []\n"  # a Prometheus that only answers queries


def backfill(openmetrics, workdir: str, max_block_duration: Optional[str] = None) -> str:
    """Blocks made by `promtool tsdb create-blocks-from openmetrics` in workdir/data from `openmetrics`
    (the text, or the pathlib.Path of a file holding it); the data folder. A promtool failure is a test
    error with promtool's own words."""
    if isinstance(openmetrics, str):
        path = os.path.join(workdir, "history.om")
        with open(path, "w", encoding="utf-8") as f:
            f.write(openmetrics)
    else:
        path = str(openmetrics)
    data = os.path.join(workdir, "data")
    os.makedirs(data, exist_ok=True)
    block = [f"--max-block-duration={max_block_duration}"] if max_block_duration else []
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", *block, path, data],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"promtool could not backfill {path}: {(r.stderr or r.stdout)[-2000:]}")
    if isinstance(openmetrics, str):
        os.remove(path)  # the blocks hold it now; the text of two weeks is tens of MB
    return data
