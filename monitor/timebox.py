"""Run a function with a time box in a forked child process, so an overrunning fit can really be
abandoned (a thread cannot be stopped; a child process can be killed). The application hands
`timeboxed(seconds)` to the forecasts as their fit runner (monitor/app.py); the forecast package
itself starts no process."""
from __future__ import annotations

import multiprocessing as mp
import pickle
import traceback


class TimeBoxExceeded(TimeoutError):
    """The call did not finish within its time box and was abandoned (child killed)."""


def _child(conn, fn, args):
    try:
        result = ("ok", fn(*args))
    except BaseException as exc:  # report every failure to the parent, with its type
        result = ("err", (type(exc).__name__, str(exc), traceback.format_exc()))
    try:
        conn.send_bytes(pickle.dumps(result))
    except Exception as exc:  # an unpicklable result is reported, never lost silently
        conn.send_bytes(pickle.dumps(("err", ("PicklingError", str(exc), ""))))
    finally:
        conn.close()


class ChildError(RuntimeError):
    def __init__(self, kind: str, message: str, tb: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.tb = kind, message, tb


def call_with_timebox(fn, args: tuple, seconds: float | None):
    """fn(*args) in a forked child; raises TimeBoxExceeded after `seconds` (None: run inline)."""
    if seconds is None:
        return fn(*args)
    if seconds <= 0:
        raise ValueError(f"time box must be positive seconds, got {seconds!r}")
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(seconds):
            raise TimeBoxExceeded(f"abandoned after {seconds:g} s")
        try:
            status, payload = pickle.loads(parent.recv_bytes())
        except EOFError:
            raise ChildError("ChildDied", f"fit process exited with code {proc.exitcode}", "") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    if status == "ok":
        return payload
    raise ChildError(*payload)


def timeboxed(seconds: float):
    """A fit runner for `ForecastSettings(runner=...)`: runner(fn, args) is fn(*args) in a forked
    child, abandoned after `seconds` (TimeBoxExceeded)."""
    if not seconds > 0:
        raise ValueError(f"time box must be positive seconds, got {seconds!r}")
    return lambda fn, args: call_with_timebox(fn, args, seconds)
