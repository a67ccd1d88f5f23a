"""Run a function with a time box in a worker process, so an overrunning fit can really be abandoned
(a thread cannot be stopped; a process can be killed). The application hands a `FitPool` to the
forecasts as their fit runner (monitor/pipeline/forecaster.py); the forecast package itself starts no process.

The workers are never forked from the caller: the daemon has threads (the web server, the
scheduler, the cycle's requests), and a fork copies whatever lock another thread held at that
moment. They come from multiprocessing's fork server, a single-threaded process started once
(fork + exec) with the modules given as `preload` imported, so each worker starts with pandas and
statsmodels already loaded; a worker is reused for fit after fit (`max_fits` bounds its memory).
A call over its time box has its worker killed (TimeBoxExceeded); the next call starts a new one.

Why not pebble's ProcessPool (benchmarks/fitpool_bench.py, fitpool_results.json): on the same refits,
fork server and preload it took as long (warm 1.20x, cold 0.96x: within the noise of a loaded
machine), a time box ended the same, a trivial call cost 0.41 ms against 0.08 ms; it adds three
threads to the daemon, a fixed number of workers (a second refit at once would queue, not get its
own), and a dependency, for some 130 lines saved here.
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import threading
import traceback
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from typing import Any, Callable, Iterable

START_TIMEOUT = 120.0  # seconds a new worker may take to come up (the fork server's first start imports statsmodels)


class TimeBoxExceeded(TimeoutError):
    """The call did not finish within its time box and was abandoned (its worker killed)."""


class ChildError(RuntimeError):
    """The call failed in the worker (`kind` is the exception's type name), or the worker died."""

    def __init__(self, kind: str, message: str, tb: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.tb = kind, message, tb


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """fn(*args) as a pickled ("ok", result) or ("err", (type, message, traceback))."""
    try:
        result = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - report every failure to the caller, with its type
        result = ("err", (type(exc).__name__, str(exc), traceback.format_exc()))
    try:
        return pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is reported, never lost silently
        return pickle.dumps(("err", ("PicklingError", str(exc), "")))


def _serve(conn: Connection) -> None:
    """A worker: say it is ready, then run each (fn, args) it is sent until its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the daemon's to handle; it stops us
    conn.send_bytes(b"ready")
    while True:
        try:
            job = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not job:
            return
        try:
            fn, args = pickle.loads(job)
        except Exception as exc:  # noqa: BLE001 - an unreadable job is answered with its error; the worker goes on
            conn.send_bytes(pickle.dumps(("err", (type(exc).__name__, str(exc), traceback.format_exc()))))
            continue
        conn.send_bytes(_outcome(fn, args))


class _Worker:
    def __init__(self, ctx: ForkServerContext, start_timeout: float):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(child,), name="headroom-fit", daemon=True)
        self.proc.start()
        child.close()
        self.fits = 0
        if not self.conn.poll(start_timeout) or self.conn.recv_bytes() != b"ready":
            self.kill()
            raise ChildError("WorkerStart", f"fit worker did not start within {start_timeout:g} s", "")

    def call(self, job: bytes, seconds: float) -> Any:
        self.conn.send_bytes(job)
        if not self.conn.poll(seconds):
            raise TimeBoxExceeded(f"abandoned after {seconds:g} s")
        self.fits += 1
        return pickle.loads(self.conn.recv_bytes())

    def stop(self) -> None:
        """Ask it to exit (its pipe closed), then make sure."""
        try:
            self.conn.send_bytes(b"")
        except OSError:
            pass
        self.proc.join(2.0)
        self.kill()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5.0)
        self.conn.close()


class FitPool:
    """A fit runner: `pool(fn, args)` is fn(*args) in a worker process, abandoned after `seconds`
    (TimeBoxExceeded: the worker is killed). fn and args must pickle (fn by name, a module-level
    function). A failure in fn is a ChildError naming its type; so is a worker that died.
    Thread-safe: concurrent callers get a worker each; `max_idle` of them are kept for reuse."""

    def __init__(self, seconds: float, preload: Iterable[str] = (), max_fits: int = 500, max_idle: int = 1,
                 start_timeout: float = START_TIMEOUT):
        if not seconds > 0:
            raise ValueError(f"time box must be positive seconds, got {seconds!r}")
        if max_fits < 1 or max_idle < 0:
            raise ValueError("max_fits must be >= 1 and max_idle >= 0")
        self.seconds, self.max_fits, self.max_idle = float(seconds), max_fits, max_idle
        self.start_timeout = start_timeout
        self._ctx = mp.get_context("forkserver")
        self._preload = list(preload)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def _worker(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise ChildError("Closed", "the fit pool is closed", "")
            if self._idle:
                return self._idle.pop()
            if self._preload:  # takes effect when the fork server starts (once per process)
                self._ctx.set_forkserver_preload(self._preload)
        return _Worker(self._ctx, self.start_timeout)

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            keep = not self._closed and worker.fits < self.max_fits and len(self._idle) < self.max_idle
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.stop()

    def __call__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        job = pickle.dumps((fn, args))  # fn or args that do not pickle fail here, before any worker
        worker = self._worker()
        try:
            status, payload = worker.call(job, self.seconds)
        except TimeBoxExceeded:  # a TimeoutError, so an OSError: before the clause below
            worker.kill()
            raise
        except (EOFError, OSError):
            worker.kill()
            raise ChildError("ChildDied", f"fit process exited with code {worker.proc.exitcode}", "") from None
        except BaseException:  # over its time box (or interrupted): the worker's answer is never read
            worker.kill()
            raise
        self._release(worker)
        if status == "ok":
            return payload
        raise ChildError(*payload)

    def close(self) -> None:
        """Stop the idle workers; a call in flight finishes, and its worker is stopped then."""
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for worker in idle:
            worker.stop()
