"""Run a plan: session threads against the targets, headroom's pipeline on the target's metrics.

Bounded in time and count: no call starts after `duration + drain`; no more than `load.max_calls`
calls and `load.max_sessions` live sessions (arrivals beyond that are counted, not sent).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import requests

from monitor.config import Config, Target
from monitor.config.inputs import pipeline_settings
from monitor.pipeline.cycle import Pipeline

from .client import CallRecord, CallSpec, api_base, make_prompt, retryable, stream_call
from .mix import LoadMix
from .schedule import Plan, class_weights, task_plan
from .tags import Tags

log = logging.getLogger(__name__)
PROBE_SETTLE = 0.5  # seconds for the engine to publish the probe calls before the scrape that closes them


@dataclass
class TaskRecord:
    task: str
    session: int
    task_type: str
    klass: str
    start: float
    end: Optional[float] = None
    calls: int = 0  # attempts sent, retries included
    ok: bool = False
    cut: bool = False  # the run ended (drain over) before the task finished

    @property
    def duration(self) -> Optional[float]:
        return None if self.end is None else self.end - self.start


@dataclass
class ServerSample:
    timestamp: float
    running: float
    waiting: float
    kv_usage: Optional[float]
    pools: int
    up: int
    down: int


@dataclass
class RunResult:
    started: float
    load_started: float
    load_ended: float
    ended: float
    calls: list[CallRecord]
    tasks: list[TaskRecord]
    server: list[ServerSample] = field(default_factory=list)
    readings: dict = field(default_factory=dict)  # target -> [ReplicaReading] (oldest first)
    skipped_arrivals: int = 0
    call_cap_hit: bool = False
    model: str = ""
    probes_ended: Optional[float] = None  # the probe phase's end (a scrape follows it before the load starts)


class Monitor:
    """headroom's live pipeline on the target's /metrics every `interval` seconds, in a thread."""

    def __init__(self, urls: list[str], interval: float = 1.0, keep: float = 7200.0):
        self.urls = urls
        self.interval = interval
        cfg = Config(vllm_targets=[Target(u) for u in urls], scrape_timeout=min(10.0, max(5.0, interval * 5)),
                     history_keep=keep, latency_window=keep)
        self.pipeline = Pipeline(pipeline_settings(cfg))
        self.samples: list[ServerSample] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cycle_lock = threading.Lock()  # the timer thread and cycle() from the runner

    def cycle(self) -> None:
        with self._cycle_lock:
            self._cycle()

    def _cycle(self) -> None:
        # the whole scrape timeout, not the daemon's 0.9 x interval: an engine saturated by the load
        # answers /metrics slowly, and that is when the samples matter most
        snap = self.pipeline.run_cycle(wait_seconds=self.pipeline.settings.scrape_timeout + 0.5)
        if snap is None:
            return
        up = sum(1 for s in snap.sources if s.source == "vllm" and s.up)
        down = sum(1 for s in snap.sources if s.source == "vllm" and not s.up)
        fresh = [p for p in snap.pools if not p.stale]
        if not fresh:  # nothing was read this cycle: the server's numbers are unknown, never 0
            log.warning("load-test monitor: no fresh reading this cycle (%d of %d targets down)", down, up + down)
            return
        kv = [p.kv_usage_ratio for p in fresh if p.kv_usage_ratio is not None]
        self.samples.append(ServerSample(
            snap.timestamp, sum(p.active_requests for p in fresh), sum(p.queued_requests for p in fresh),
            max(kv) if kv else None, len(fresh), up, down))

    def start(self) -> "Monitor":
        self.cycle()
        self._thread = threading.Thread(target=self._loop, name="loadtest-monitor", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        nxt = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, nxt - time.monotonic())):
            nxt += self.interval
            try:
                self.cycle()
            except Exception:  # the monitor must not take the load test down
                log.exception("metrics cycle failed")

    def settle_and_cycle(self, settle: float) -> float:
        """Wait `settle` seconds for the engine to publish the last requests' metrics, then scrape;
        returns the time the wait ended (the scrape's reading is the first at or after it)."""
        time.sleep(settle)
        at = time.time()
        self.cycle()
        return at

    def stop(self, settle: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.settle_and_cycle(settle)
        self.pipeline.close()

    def readings(self) -> dict:
        out: dict = {}
        for _key, dq in self.pipeline.history.items():
            for r in dq:
                out.setdefault(r.target, []).append(r)
        return out


def detect_model(base: str, headers: dict, timeout: float = 10.0) -> str:
    try:
        r = requests.get(base + "/models", headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {base}/models to find the model ({type(exc).__name__}); "
                              "is the target up? (or give --model)") from None
    if r.status_code != 200:
        raise ConnectionError(f"{base}/models answered HTTP {r.status_code}; give --model NAME")
    data = r.json().get("data") or []
    if not data:
        raise ConnectionError(f"{base}/models lists no model; give --model NAME")
    return str(data[0]["id"])


class Runner:
    def __init__(self, mix: LoadMix, plan: Plan, targets: list[str], model: str, seed: int,
                 api_key: Optional[str] = None, metrics: Optional[list[str]] = None,
                 scrape_interval: float = 1.0, probes: int = 3,
                 progress: Optional[Callable[[dict], None]] = None, tags: Optional[Tags] = None,
                 send_priority: bool = False, batch_gate=None):
        self.mix = mix
        self.plan = plan
        self.bases = [api_base(t) for t in targets]
        self.model = model
        self.seed = seed
        self._key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.tags = tags or Tags()
        self._secrets = tuple(s for s in (api_key, *self.tags.secrets()) if s)
        self.metrics = list(metrics or [])
        self.scrape_interval = scrape_interval
        self.probes = probes
        self.progress = progress
        self.send_priority = send_priority  # put each task type's `priority` in the request body
        self.batch_gate = batch_gate  # follower.Gate: a batch call goes out only with a slot of it
        self.calls: list[CallRecord] = []
        self.tasks: list[TaskRecord] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self._batch_in_flight = 0
        self._per_target = [0] * len(self.bases)
        self._rr = 0
        self._calls_sent = 0
        self._stop = threading.Event()
        self.t0 = 0.0
        self.end_load = 0.0
        self.hard_end = 0.0
        self.skipped = 0
        self.cap_hit = False
        self.live_sessions = 0

    # ---- one call with retries ------------------------------------------------------------
    def _pick_target(self) -> int:
        """Least calls in flight; ties go round-robin (call under the lock)."""
        n = len(self.bases)
        if n == 1:
            return 0
        start = self._rr % n
        self._rr += 1
        order = [(start + i) % n for i in range(n)]
        return min(order, key=lambda i: self._per_target[i])

    def _one(self, http: requests.Session, rec: CallRecord, prompt, max_tokens: int) -> CallRecord:
        req = self.mix.request
        with self._lock:
            idx = self._pick_target()
            rec.target = idx
            self._per_target[idx] += 1
            self._in_flight += 1
            rec.in_flight = self._in_flight
            rec.batch_active = self._batch_in_flight > 0
            if rec.klass == "batch":
                self._batch_in_flight += 1
            self._calls_sent += 1
        try:
            meta, heads = self.tags.for_call(rec.task_type, rec.task, rec.session, rec.call)
            spec = CallSpec(self.bases[idx], rec.api, self.model, prompt, max_tokens, req.timeout_seconds,
                            req.ignore_eos, req.temperature, {**self.headers, **heads}, meta, rec.priority)
            stream_call(http, spec, rec, self._secrets)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._per_target[idx] -= 1
                if rec.klass == "batch":
                    self._batch_in_flight -= 1
                self.calls.append(rec)
        return rec

    def _may_send(self) -> bool:
        if self._stop.is_set() or time.time() >= self.hard_end:
            return False
        with self._lock:
            if self._calls_sent >= self.mix.load.max_calls:
                self.cap_hit = True
                return False
        return True

    def _sleep(self, seconds: float) -> bool:
        """Tool wait; False when the run must stop."""
        until = min(time.time() + seconds, self.hard_end)
        while True:
            left = until - time.time()
            if left <= 0:
                return time.time() < self.hard_end
            if self._stop.wait(min(left, 0.25)):
                return False

    # ---- a session -----------------------------------------------------------------------
    def _session(self, sp, at: float) -> None:
        http = requests.Session()
        try:
            # threads start a little early and wait here, so sessions planned for the same instant
            # (a burst, a ramp step) send their first calls together
            if self._stop.wait(max(0.0, at - time.time())):
                return
            number = 0
            while not self._stop.is_set() and time.time() < self.end_load:
                if sp.max_tasks is not None and number >= sp.max_tasks:
                    break
                self._task(http, sp.index, number, sp.klass)
                number += 1
        finally:
            http.close()
            with self._lock:
                self.live_sessions -= 1

    def _task(self, http: requests.Session, session: int, number: int, klass: Optional[str] = None) -> None:
        tp = task_plan(self.mix, class_weights(self.mix, self.plan.weights, klass), self.seed, session, number)
        tt = self.mix.task_types[tp.task_type]
        api = self.mix.api_of(tt)
        trec = TaskRecord(f"{session}-{number}", session, tp.task_type, tp.klass, time.time())
        ok = True
        for ci, cp in enumerate(tp.calls):
            prompt = make_prompt(self.mix.request.prompt_mode, cp.prompt_tokens, tp.text_seed * 31 + ci,
                                 self.mix.request.token_id_range)
            attempt = 0
            while True:
                if not self._may_send():
                    trec.cut = True
                    break
                rec = CallRecord(session, trec.task, tp.task_type, tp.klass, ci, attempt, 0, api,
                                 cp.prompt_tokens, cp.output_tokens,
                                 priority=tt.priority if self.send_priority else None)
                gated = self.batch_gate is not None and tp.klass == "batch"
                if gated and not self.batch_gate.acquire(self._stop, self.end_load):
                    trec.cut = True  # the budget kept the gate shut to the end of the load
                    break
                try:
                    self._one(http, rec, prompt, cp.output_tokens)
                finally:
                    if gated:
                        self.batch_gate.release()
                trec.calls += 1
                if rec.ok:
                    break
                if not retryable(rec) or attempt >= tt.max_retries:
                    ok = False
                    break
                attempt += 1
                if not self._sleep(tt.backoff_seconds * (2 ** (attempt - 1))):
                    trec.cut = True
                    break
            if trec.cut or not ok:
                break
            if cp.wait_after > 0 and not self._sleep(cp.wait_after):
                trec.cut = ci < len(tp.calls) - 1
                if trec.cut:
                    break
        trec.end = time.time()
        trec.ok = ok and not trec.cut
        with self._lock:
            self.tasks.append(trec)

    # ---- probes: unloaded baseline -------------------------------------------------------
    def _probe(self) -> None:
        if self.probes <= 0:
            return
        # mixed: the probes stand for the interactive calls (the unloaded TTFT sets their target)
        weights = class_weights(self.mix, self.plan.weights, "interactive" if self.plan.pattern == "mixed" else None)
        total = sum(weights.values()) or 1.0
        prompt_tokens = int(round(sum(self.mix.task_types[n].prompt.mean * w for n, w in weights.items()) / total))
        http = requests.Session()
        try:
            for i in range(self.probes):
                rec = CallRecord(-1, f"probe-{i}", "_probe", "probe", 0, 0, 0, self.mix.request.api,
                                 prompt_tokens, 2, phase="probe")
                prompt = make_prompt(self.mix.request.prompt_mode, prompt_tokens, self.seed * 1000 + i,
                                     self.mix.request.token_id_range)
                self._one(http, rec, prompt, 2)
                time.sleep(0.05)
        finally:
            http.close()

    # ---- the run -------------------------------------------------------------------------
    def run(self) -> RunResult:
        started = time.time()
        probes_ended = None
        monitor = Monitor(self.metrics, self.scrape_interval, keep=self.plan.duration + 3600) if self.metrics else None
        if monitor:
            monitor.start()
        threads: list[threading.Thread] = []
        drain = self.mix.load.drain_seconds
        drain = self.mix.request.timeout_seconds if drain is None else drain
        try:
            self.hard_end = time.time() + 600 + self.plan.duration + drain
            self._probe()
            if monitor and self.probes > 0:
                # a scrape between the probes and the load: the engine's own view of the unloaded calls
                probes_ended = monitor.settle_and_cycle(PROBE_SETTLE)
            lead = 0.5  # seconds a session thread is started before its planned start
            self.t0 = time.time() + lead
            self.end_load = self.t0 + self.plan.duration
            self.hard_end = self.end_load + drain
            prog = threading.Thread(target=self._progress_loop, daemon=True) if self.progress else None
            if prog:
                prog.start()
            for sp in self.plan.sessions:
                at = self.t0 + sp.start
                while not self._stop.is_set() and time.time() < at - lead:
                    self._stop.wait(min(0.05, max(0.0, at - lead - time.time())))
                if self._stop.is_set() or at >= self.end_load:
                    break
                with self._lock:
                    if self.live_sessions >= self.mix.load.max_sessions:
                        self.skipped += 1
                        continue
                    self.live_sessions += 1
                th = threading.Thread(target=self._session, args=(sp, at), name=f"session-{sp.index}", daemon=True)
                th.start()
                threads.append(th)
            while time.time() < self.end_load and not self._stop.is_set():
                if all(not t.is_alive() for t in threads):  # every session is done (burst)
                    break
                self._stop.wait(0.1)
            load_end = time.time()
            for th in threads:
                th.join(timeout=max(0.0, self.hard_end - time.time()) + 5)
        except KeyboardInterrupt:
            self._stop.set()
            raise
        finally:
            self._stop.set()
            if monitor:
                monitor.stop()
        ended = time.time()
        if self.progress:
            self.progress({"final": True})
        calls = sorted(self.calls, key=lambda r: r.start)
        return RunResult(started, self.t0, load_end, ended, calls,
                         sorted(self.tasks, key=lambda t: t.start),
                         monitor.samples if monitor else [], monitor.readings() if monitor else {},
                         self.skipped, self.cap_hit, self.model, probes_ended)

    def _progress_loop(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                ok = sum(1 for r in self.calls if r.ok)
                state = {"elapsed": max(0.0, time.time() - self.t0), "duration": self.plan.duration, "in_flight": self._in_flight,
                         "sessions": self.live_sessions, "calls": len(self.calls), "ok": ok,
                         "failed": len(self.calls) - ok}
            self.progress(state)


def terminal_progress(stream=sys.stderr) -> Optional[Callable[[dict], None]]:
    """A one-line progress bar on stderr, only when stderr is a terminal."""
    if not getattr(stream, "isatty", lambda: False)():
        return None

    def show(state: dict) -> None:
        if state.get("final"):
            stream.write("\n")
            stream.flush()
            return
        frac = max(0.0, min(1.0, state["elapsed"] / state["duration"]))
        bar = "#" * int(frac * 30)
        stream.write(f"\r[{bar:<30}] {state['elapsed']:5.0f}/{state['duration']:.0f} s  sessions {state['sessions']:3d}"
                     f"  in flight {state['in_flight']:3d}  calls {state['calls']:5d}  failed {state['failed']:4d} ")
        stream.flush()
    return show
