"""Direct mode's answers on kept connections, read by one thread as they arrive (issue 42).

Worker threads that each block on a socket hand Python's lock over at every receive: with 32 of
them, a third of a cycle's CPU went to the hand-overs and the kernel's wake-ups. So a cycle's
GETs on kept plain-HTTP connections go from the cycle's own thread: up to `window` at once
(`Fetcher.begin` sends each), their sockets watched by one selector, each answer read as it
arrives and, once whole, read and parsed at once (`done`). What the loop does not finish goes to
the worker threads (`hand_off`), which read it the blocking way within its own deadline, as every
request was read before: a target with no kept connection (connecting can wait on a host), a TLS
target, an answer framed otherwise than by a Content-Length or larger than HOLD_BYTES, a kept
connection that ended before any byte of an answer (the fresh try connects), and whatever is still
on its way at the cycle's deadline. A request past its own deadline ends here, with the error the
blocking read gives (`done`: its read raises at once).
"""
from __future__ import annotations

import selectors
import time
from collections import deque
from typing import Callable, Optional

from monitor.kit.http import Exchange, Fetcher, FetchError
from monitor.kit.http_held import BodyBudget

from .settings import Target

HOLD_BYTES = BodyBudget.FREE_BYTES  # an answer still coming past this goes to a worker (cap and budget)
SLICE_SECONDS = 0.2  # the longest wait between looks at the requests' own deadlines and a close()

Done = Callable[[Target, Exchange, float], None]  # (target, its exchange, when it was sent)
HandOff = Callable[[Target, Optional[Exchange], float], None]  # None: nothing sent yet


def read_kept(fetcher: Fetcher, waiting: deque[Target], window: int, timeout: float, deadline: float,
              done: Done, hand_off: HandOff) -> None:
    """Send `waiting`'s GETs (at most `window` in flight) and read their answers until each is done
    or handed off, or until `deadline` (monotonic): then what is in flight is handed off and what
    was never sent is left in `waiting`."""
    selector = selectors.DefaultSelector()
    flying: dict[int, tuple[Target, Exchange, float]] = {}
    swept = time.monotonic()
    try:
        while True:
            while waiting and len(flying) < window:
                _send(fetcher, waiting.popleft(), timeout, selector, flying, hand_off)
            now = time.monotonic()
            if not flying or now >= deadline or fetcher.closed:
                break
            for key, _ in selector.select(min(deadline - now, SLICE_SECONDS)):
                target, exchange, sent = key.data
                conn = exchange.conn
                more = conn.take_ready()
                whole = conn.whole(fetcher.max_body)
                if whole or (not more and conn.received):  # whole, or ended part-way: read at once
                    _drop(selector, flying, key.fd)
                    done(target, exchange, sent)
                elif whole is None or not more or len(conn.buf) > HOLD_BYTES:
                    _drop(selector, flying, key.fd)
                    hand_off(target, exchange, sent)
            now = time.monotonic()
            if now - swept >= SLICE_SECONDS:  # a request past its own deadline: its read raises at once
                swept = now
                for fd, (target, exchange, sent) in list(flying.items()):
                    if now >= exchange.ask.deadline:
                        _drop(selector, flying, fd)
                        done(target, exchange, sent)
        for fd, (target, exchange, sent) in list(flying.items()):
            _drop(selector, flying, fd)
            hand_off(target, exchange, sent)
    finally:
        selector.close()


def _send(fetcher: Fetcher, target: Target, timeout: float, selector: selectors.BaseSelector,
          flying: dict[int, tuple[Target, Exchange, float]], hand_off: HandOff) -> None:
    sent = time.monotonic()
    try:
        exchange = fetcher.begin(target.url, timeout) if target.url.startswith("http://") else None
    except (FetchError, ValueError):  # closed meanwhile, or a URL that does not read: the worker says which
        exchange = None
    if exchange is None or exchange.conn.sock is None:
        hand_off(target, exchange, sent)
        return
    sock = exchange.conn.sock
    fd = sock.fileno()
    selector.register(fd, selectors.EVENT_READ, (target, exchange, sent))
    flying[fd] = (target, exchange, sent)


def _drop(selector: selectors.BaseSelector, flying: dict[int, tuple[Target, Exchange, float]], fd: int) -> None:
    del flying[fd]
    selector.unregister(fd)
