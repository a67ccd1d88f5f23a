"""Serve a simulated fleet over HTTP in real time.

``start_fleet(config, scenario)`` starts one small threaded HTTP server per replica (its vLLM
``/metrics``), one for the gateway (Envoy AI Gateway ``gen_ai_*``), one for the application
metrics (``agent_*``) and one for DCGM (``DCGM_FI_DEV_*``), each on its own free port of ``host``.
A background thread advances the simulated clock to wall time (x ``speed``); every scrape first
brings the simulation up to the current time, so values are never stale. Wall time is read from
``clock`` (``time.time`` unless a test injects its own): simulated time = the simulated time when
serving began + (``clock()`` - the clock when serving began) x ``speed``. When the scenario removes
a replica, its server is shut down and its port stops answering (connection refused).

Every server also answers ``GET /health`` (200 ``OK``); replicas also answer ``/v1/models``
(with ``max_model_len``) and ``/load`` (``{"server_load": running + waiting}``) like vLLM. Pages are Prometheus text 0.0.4 whatever
the ``Accept`` header says (as vLLM's instrumentator route does).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional, Union

from .exposition import CONTENT_TYPE, render_app, render_dcgm, render_gateway, render_vllm
from .fleet import Fleet, FleetConfig, load_config

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _handler(render: Callable[[], str], extra: Optional[dict] = None):
    extra = extra or {}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # http.server API
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body = render().encode("utf-8")
                except Exception as exc:  # pragma: no cover - reported, not hidden
                    log.exception("render failed")
                    self._send(500, f"render failed: {exc}\n".encode(), "text/plain")
                    return
                self._send(200, body, CONTENT_TYPE)
            elif path == "/health":
                self._send(200, b"OK\n", "text/plain")
            elif path in extra:
                self._send(200, extra[path]().encode("utf-8"), "application/json")
            else:
                self._send(404, b"not found: try /metrics\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # keep test output quiet
            log.debug("%s " + fmt, self.address_string(), *args)

    return H


class FleetHandle:
    """A running simulated fleet. URLs are full scrape URLs (``http://host:port/metrics``)."""

    def __init__(self, fleet: Fleet, host: str, speed: float, naming: str, colon: bool,
                 tick: float = 0.05, clock: Callable[[], float] = time.time):
        self.fleet = fleet
        self.clock = clock
        self.host = host
        self.speed = speed
        self.naming = naming
        self.colon = colon
        self.tick = tick
        self.lock = threading.RLock()
        self.wall0 = clock()
        self.sim0 = fleet.t
        self._servers: dict[str, _Server] = {}
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self.replica_urls: dict[str, list[str]] = {}
        self.replica_by_url: dict[str, str] = {}
        self.url_by_replica: dict[str, str] = {}
        self.gateway_url = ""
        self.app_url = ""
        self.dcgm_url = ""
        self.error: Optional[BaseException] = None

    # ------------------------------------------------------------------ time
    def sim_now(self) -> float:
        return self.sim0 + (self.clock() - self.wall0) * self.speed

    def sync(self) -> float:
        """Advance the simulation to now (under the lock) and return the simulated time."""
        with self.lock:
            now = max(self.sim_now(), self.fleet.t)
            self.fleet.advance_to(now)
            self._reap()
            return now

    def _reap(self) -> None:
        for r in self.fleet.lost_replicas:
            srv = self._servers.pop(r.name, None)
            if srv is not None:
                log.info("replica %s went away; closing %s", r.name, self.url_by_replica[r.name])
                threading.Thread(target=_close, args=(srv,), daemon=True).start()

    def _drive(self) -> None:
        while not self._stopped.wait(self.tick):
            try:
                self.sync()
            except BaseException as exc:  # pragma: no cover - surfaced through .error
                log.exception("simulation failed")
                self.error = exc
                return

    # ------------------------------------------------------------------ serving
    def _serve(self, key: str, render: Callable[[float], str], port: int,
               extra: Optional[dict] = None) -> str:
        def page() -> str:
            with self.lock:
                now = self.sync()
                return render(now)

        srv = _Server((self.host, port), _handler(page, extra))
        self._servers[key] = srv
        th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                              name=f"sim-http-{key}", daemon=True)
        th.start()
        self._threads.append(th)
        return f"http://{self.host}:{srv.server_address[1]}/metrics"

    def start(self, base_port: int = 0) -> "FleetHandle":
        def port(i: int) -> int:
            return base_port + i if base_port else 0

        i = 0
        for pool, reps in self.fleet.pools.items():
            urls = []
            for r in reps:
                url = self._serve(r.name, (lambda now, r=r: render_vllm(r, now, self.naming,
                                                                        self.colon)), port(i),
                                  self._replica_routes(r))
                i += 1
                urls.append(url)
                self.replica_by_url[url] = r.name
                self.url_by_replica[r.name] = url
            self.replica_urls[pool] = urls
        self.gateway_url = self._serve("gateway", lambda now: render_gateway(self.fleet, now), port(i))
        self.app_url = self._serve("app", lambda now: render_app(self.fleet, now), port(i + 1))
        self.dcgm_url = self._serve("dcgm", lambda now: render_dcgm(self.fleet, now), port(i + 2))
        self.wall0 = self.clock()
        self.sim0 = self.fleet.t
        th = threading.Thread(target=self._drive, name="sim-clock", daemon=True)
        th.start()
        self._threads.append(th)
        return self

    def prometheus_targets(self) -> dict[str, list[str]]:
        """``host:port`` scrape targets per job (vllm, gateway, app, dcgm), for static_configs."""
        hp = lambda url: url.split("//", 1)[1].split("/", 1)[0]  # noqa: E731
        return {"vllm": [hp(u) for urls in self.replica_urls.values() for u in urls],
                "gateway": [hp(self.gateway_url)], "app": [hp(self.app_url)],
                "dcgm": [hp(self.dcgm_url)]}

    def _replica_routes(self, r) -> dict:
        """vLLM's /v1/models (with max_model_len) and /load (in-flight requests)."""
        def models() -> str:
            return json.dumps({"object": "list", "data": [{
                "id": r.p.model_name, "object": "model", "created": int(r.started),
                "owned_by": "vllm", "root": r.p.model_name, "parent": None,
                "max_model_len": r.p.max_model_len}]})

        def load() -> str:
            with self.lock:
                self.sync()
                return json.dumps({"server_load": r.num_running + r.num_waiting})

        return {"/v1/models": models, "/load": load}

    @property
    def all_urls(self) -> list[str]:
        out = [u for urls in self.replica_urls.values() for u in urls]
        return out + [self.gateway_url, self.app_url, self.dcgm_url]

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        servers = list(self._servers.values())
        self._servers.clear()
        for srv in servers:
            _close(srv)
        for th in self._threads:
            th.join(timeout=2.0)

    def __enter__(self) -> "FleetHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _close(srv: _Server) -> None:
    srv.shutdown()
    srv.server_close()


def start_fleet(config: Union[FleetConfig, str, None] = None, scenario: str = "steady",
                host: str = "127.0.0.1", base_port: int = 0, *, seed: Optional[int] = None,
                speed: float = 1.0, legacy_names: bool = False, underscore_names: bool = False,
                scenario_overrides: Optional[dict] = None,
                record_truth: bool = True, warmup_s: float = 30.0,
                scenario_from_serving: bool = False,
                clock: Callable[[], float] = time.time) -> FleetHandle:
    """Start the simulated fleet and its HTTP endpoints; returns a :class:`FleetHandle`.

    ``config`` is a FleetConfig, a YAML path, or None for the default fleet. ``base_port`` 0
    picks free ports; otherwise ports base_port, base_port+1, ... are used (replicas first, then
    gateway, app, DCGM). ``speed`` is simulated seconds per wall second. ``warmup_s`` > 0
    fast-forwards that much simulated time before serving (the fleet starts busy, not empty).
    Scenario times such as ``at_s`` count from the start of the warm-up, or from the moment
    serving starts when ``scenario_from_serving`` is true (what `headroom sim` does). ``legacy_names`` serves
    the V0-style vLLM naming, ``underscore_names`` spells ``vllm_`` instead of ``vllm:``. ``clock``
    is the wall clock the simulation follows (seconds, like ``time.time``; tests inject their own)."""
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    if not isinstance(config, FleetConfig):
        config = load_config(config)
    if scenario == "diurnal":
        # live fleets must look busy whatever the hour: unless told otherwise, the night and
        # the weekend run at least at 40 % of the weekday peak (fast-forward keeps the full shape)
        scenario_overrides = {"min_level": 0.4, **(scenario_overrides or {})}
    if warmup_s < 0:
        raise ValueError(f"warmup_s must be >= 0, got {warmup_s}")
    now = clock()
    fleet = Fleet(config, scenario, seed=seed, start_time=now - warmup_s,
                  record_truth=record_truth, scenario_overrides=scenario_overrides,
                  scenario_origin=now if scenario_from_serving else None)
    if warmup_s:
        fleet.advance_to(now)
    handle = FleetHandle(fleet, host, speed, "v0" if legacy_names else "v1",
                         not underscore_names, clock=clock)
    try:
        return handle.start(base_port)
    except BaseException:
        handle.stop()
        raise
