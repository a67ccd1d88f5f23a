"""The agent application and the slow gateway of the overload journey (benchmarks/overload_journey.py,
tests/engine/test_journey_vllm.py).

`AgentApp` runs closed-loop agent sessions against an OpenAI-compatible gateway: a session runs tasks
one after another; a task makes `calls` chat calls with a tool wait between two calls. Some sessions
give up on a call that has not answered its first byte within `give_up_seconds` (the client closes
the connection) and abandon the task. The application exposes the documented task convention on its
own /metrics (docs/capacity.md): `agent_sessions_active`, `agent_tasks_started_total`,
`agent_task_duration_seconds` (completed tasks only), `agent_task_model_calls_total` and
`agent_calls_abandoned_total`, all by `task_type`; and it keeps the client's truth: every call's
start, first byte and end, every task's duration and outcome, calls in flight sampled every second.

`SlowGateway` is a front end that holds requests: at most `concurrency` are forwarded at a time, the
others wait in it (a starved or rate-limited gateway), with `delay` seconds added to each. It exposes
nothing of its queue: only the callers' task latency shows it.
"""
from __future__ import annotations

import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import requests
import urllib3
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from engine.load import text_prompt

TASK_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 45, 60, 90, 120)


@dataclass
class CallRecord:
    task_type: str
    start: float
    first_byte: Optional[float] = None
    end: Optional[float] = None
    abandoned: bool = False
    error: Optional[str] = None


@dataclass
class TaskRecord:
    task_type: str
    start: float
    end: Optional[float] = None
    completed: bool = False
    calls: list = field(default_factory=list)


class AgentApp:
    """Closed-loop agent sessions with give-ups; `set_sessions(n, give_up=k)` changes the load."""

    def __init__(self, gateway_url: str, model: str, api_key: str, task_type: str = "chat",
                 calls: int = 3, max_tokens: tuple[int, int] = (40, 90), tool_wait: tuple[float, float] = (0.5, 2.0),
                 give_up_seconds: float = 4.0, stream: bool = True, seed: int = 1,
                 prompt_words: Optional[tuple[int, int]] = None) -> None:
        self.url = gateway_url.rstrip("/") + "/v1/chat/completions"
        self.model, self.key, self.task_type = model, api_key, task_type
        self.calls, self.max_tokens, self.tool_wait = calls, max_tokens, tool_wait
        self.give_up_seconds, self.stream, self.seed = give_up_seconds, stream, seed
        # a long prompt per call (random words of engine.load.WORDS, about 2.9 tokens a word on the
        # test models' tokenizer), so a call holds KV blocks for its prompt as well; None: one short line
        self.prompt_words = prompt_words
        self.registry = CollectorRegistry()
        lab = ["task_type"]
        self.m_sessions = Gauge("agent_sessions_active", "Agent sessions open.", lab, registry=self.registry)
        self.m_started = Counter("agent_tasks_started", "Tasks started.", lab, registry=self.registry)
        self.m_calls = Counter("agent_task_model_calls", "Model calls made by tasks.", lab, registry=self.registry)
        self.m_abandoned = Counter("agent_calls_abandoned", "Model calls the agent gave up on.", lab,
                                   registry=self.registry)
        self.m_duration = Histogram("agent_task_duration_seconds", "Duration of completed tasks.", lab,
                                    buckets=TASK_BUCKETS, registry=self.registry)
        self.m_sessions.labels(task_type).set(0)
        self.lock = threading.Lock()
        self.tasks: list[TaskRecord] = []
        self.calls_log: list[CallRecord] = []
        self.in_flight_samples: list[tuple[float, int]] = []
        self.sessions: list[tuple[threading.Event, threading.Thread]] = []
        self.retired: list[threading.Thread] = []  # stopped sessions, maybe still finishing a call
        self.stop_all = threading.Event()
        self.server = None

    def serve(self) -> int:
        """Start /metrics on a free loopback port; returns the port."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server, _ = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        threading.Thread(target=self._sample_in_flight, name="app-in-flight", daemon=True).start()
        return port

    def set_sessions(self, n: int, give_up: int = 0) -> None:
        """Run `n` sessions, the first `give_up` of them giving up after give_up_seconds."""
        while len(self.sessions) > n:
            stop, thread = self.sessions.pop()
            stop.set()
            self.retired.append(thread)
        while len(self.sessions) < n:
            i = len(self.sessions)
            stop = threading.Event()
            thread = threading.Thread(target=self._session, args=(i, stop), name=f"agent-{i}", daemon=True)
            self.sessions.append((stop, thread))
            thread.start()
        self.give_up_sessions = give_up
        self.m_sessions.labels(self.task_type).set(n)

    def set_calls(self, max_tokens: tuple[int, int], prompt_words: Optional[tuple[int, int]] = None) -> None:
        """The shape of the calls made from now on (the sessions read it at each call)."""
        self.max_tokens, self.prompt_words = max_tokens, prompt_words

    def stop(self, timeout: float = 120.0) -> None:
        """Every session stopped and joined (a call in flight ends first), /metrics shut."""
        self.set_sessions(0)
        threads = self.retired
        self.stop_all.set()
        end = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def _sample_in_flight(self) -> None:
        while not self.stop_all.wait(1.0):
            now = time.time()
            with self.lock:
                n = sum(1 for c in self.calls_log[-400:] if c.end is None)
                self.in_flight_samples.append((now, n))

    def _session(self, i: int, stop: threading.Event) -> None:
        rng = random.Random(self.seed * 1000 + i)
        http = requests.Session()
        stop.wait(rng.uniform(0, 2.0))  # staggered starts
        while not stop.is_set():
            task = TaskRecord(self.task_type, time.time())
            self.m_started.labels(self.task_type).inc()
            with self.lock:
                self.tasks.append(task)
            for n in range(self.calls):
                if stop.is_set():
                    break
                gives_up = i < getattr(self, "give_up_sessions", 0)
                call = self._call(http, rng, gives_up)
                task.calls.append(call)
                if call.abandoned or call.error:
                    break
                if n < self.calls - 1:
                    stop.wait(rng.uniform(*self.tool_wait))
            else:
                task.end = time.time()
                task.completed = True
                self.m_duration.labels(self.task_type).observe(task.end - task.start)
                stop.wait(rng.uniform(*self.tool_wait))
                continue
            task.end = time.time()
            stop.wait(rng.uniform(*self.tool_wait))
        http.close()

    def _content(self, rng: random.Random) -> str:
        line = f"step of a {self.task_type} task {rng.random():.6f}"
        if self.prompt_words is None:
            return line
        return line + " " + text_prompt(rng, rng.randint(*self.prompt_words))

    def _call(self, http: requests.Session, rng: random.Random, gives_up: bool) -> CallRecord:
        call = CallRecord(self.task_type, time.time())
        with self.lock:
            self.calls_log.append(call)
        self.m_calls.labels(self.task_type).inc()
        body = {"model": self.model, "max_tokens": rng.randint(*self.max_tokens), "temperature": 0.0,
                "stream": self.stream, "ignore_eos": True,
                "messages": [{"role": "user", "content": self._content(rng)}],
                "metadata": {"task_type": self.task_type}}
        read_timeout = self.give_up_seconds if gives_up else 300.0
        try:
            with http.post(self.url, json=body, headers={"Authorization": f"Bearer {self.key}"},
                           stream=self.stream, timeout=(5.0, read_timeout)) as resp:
                if resp.status_code != 200:
                    call.error = f"HTTP {resp.status_code}"
                else:
                    for raw in resp.iter_lines(chunk_size=None):
                        if raw and call.first_byte is None:
                            call.first_byte = time.time()
                        if raw.strip() == b"data: [DONE]":
                            break
                    if not self.stream:
                        json.loads(resp.content or b"{}")
        except (requests.RequestException, ValueError) as exc:
            if _read_timed_out(exc):
                call.abandoned = gives_up
                call.error = None if gives_up else "read timeout"
                if gives_up:
                    self.m_abandoned.labels(self.task_type).inc()
            else:
                call.error = type(exc).__name__
        call.end = time.time()
        if call.first_byte is None and not call.abandoned and not call.error:
            call.first_byte = call.end
        return call


def _read_timed_out(exc: Exception) -> bool:
    """Whether a call ended on its read timeout: requests says ReadTimeout before the answer starts,
    and a ConnectionError around urllib3's ReadTimeoutError once a streamed answer has begun."""
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)


class SlowGateway:
    """A front end that forwards at most `concurrency` requests at a time (the rest wait in it) and
    adds `delay` seconds to each; a plain byte-for-byte relay of the answer."""

    def __init__(self, upstream: str, concurrency: int = 4, delay: float = 0.3) -> None:
        self.upstream = upstream.rstrip("/")
        self.gate = threading.Semaphore(concurrency)
        self.delay = delay
        outer = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer.gate:
                    time.sleep(outer.delay)
                    try:
                        with requests.post(outer.upstream + self.path, data=body, stream=True, timeout=300,
                                           headers={k: v for k, v in self.headers.items()
                                                    if k.lower() in ("authorization", "content-type")}) as r:
                            self.send_response(r.status_code)
                            self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                            self.send_header("Transfer-Encoding", "chunked")
                            self.end_headers()
                            for chunk in r.iter_content(chunk_size=None):
                                if chunk:
                                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                                    self.wfile.flush()
                            self.wfile.write(b"0\r\n\r\n")
                    except (requests.RequestException, OSError):
                        self.close_connection = True

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

            def handle_error(self, request, client_address):
                pass  # callers that gave up close their connections

        self.server = Server(("127.0.0.1", 0), Relay)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="slow-gateway", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
