"""Process lifecycle the same way everywhere: stopping a child (terminate, wait, kill) and making
sure this process itself exits soon after it has decided to stop."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout` seconds, then SIGKILL and reap. A finished process is left as is."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def exit_if_stuck(seconds: float, code: int = 1, what: str = "headroom") -> threading.Thread:
    """Backstop for a clean stop: if the process is still alive `seconds` from now (a thread that will
    not finish holds the interpreter's exit), say so on stderr and end it with `code`.

    Runs in a daemon thread, which keeps running while the interpreter waits for its other threads
    at exit and dies with the process when the exit is clean.
    """
    end = time.monotonic() + seconds
    never = threading.Event()  # waited on, not time.sleep: a clock_nanosleep some libc shims refuse

    def watch() -> None:
        while (left := end - time.monotonic()) > 0:
            never.wait(left)
        busy = sorted(t.name for t in threading.enumerate() if t.is_alive() and not t.daemon
                      and t is not threading.main_thread())
        msg = f"{what}: exit forced after {seconds:g}s; threads still running: {', '.join(busy) or 'none'}\n"
        try:
            os.write(2, msg.encode())  # not sys.stderr: a stuck thread may hold its lock
        finally:
            os._exit(code)
    thread = threading.Thread(target=watch, name="exit-watchdog", daemon=True)
    thread.start()
    return thread
