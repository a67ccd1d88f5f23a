"""Direct mode's answers read by one thread as they arrive (issue 42).

Worker threads that each block on a socket hand Python's lock over at every receive: with 32 of
them, a third of a cycle's CPU went to the hand-overs and the kernel's wake-ups. So a cycle's
plain-HTTP GETs go from the cycle's own thread: each sent on a kept connection, or on a new one
begun without waiting when the host is an IP address (`Fetcher.begin`), their sockets watched by
one selector, each answer taken as it arrives and, once whole (framed by Content-Length or
chunked), read and parsed at once (`done`). At most `window` sent GETs are on their way at once.
What the loop does not finish goes to the worker threads (`hand_off`), which read it the blocking
way within its own deadline, as every request was read before: a host given by name (its lookup
can wait) or over TLS, an answer framed another way or larger than HOLD_BYTES, a kept connection
that ended before any byte of an answer or answered 408 (the fresh try connects), and whatever is
still on its way at the cycle's deadline. A request past its own deadline ends here, with the error
the blocking read gives (`done`: its read raises at once), as does a connection that failed.
"""
from __future__ import annotations

import selectors
import time
from collections import deque
from concurrent import futures
from concurrent.futures import Future
from typing import Callable, Optional

from monitor.kit.http import Exchange, Fetcher, FetchError
from monitor.kit.http_held import BodyBudget

from .settings import Target

HOLD_BYTES = BodyBudget.FREE_BYTES  # an answer still coming past this goes to a worker (cap and budget)
SLICE_SECONDS = 0.2  # the longest wait between looks at the requests' own deadlines and a close()

Done = Callable[[Target, Exchange, float], None]  # (target, its exchange, when it was sent)
# None: nothing sent yet; returns the worker's job reading a sent GET (counted in the window until it ends)
HandOff = Callable[[Target, Optional[Exchange], float], Optional[Future]]
_Flying = dict[int, tuple[Target, Exchange, float]]


def read_kept(fetcher: Fetcher, waiting: deque[Target], window: int, timeout: float, deadline: float,
              done: Done, hand_off: HandOff) -> None:
    """Send `waiting`'s GETs and read their answers until each is done or handed off, or until
    `deadline` (monotonic): then what is in flight is handed off and what was never sent is left in
    `waiting`. At most `window` sent GETs are on their way at once, here or handed to a worker."""
    selector = selectors.DefaultSelector()
    flying: _Flying = {}
    handed: list[Future] = []  # workers' jobs reading a sent GET, until they end
    swept = time.monotonic()
    try:
        while True:
            if len(flying) + len(handed) >= window:
                handed[:] = [job for job in handed if not job.done()]
            while waiting and len(flying) + len(handed) < window:
                _send(fetcher, waiting.popleft(), timeout, selector, flying, hand_off, handed)
            now = time.monotonic()
            if (not flying and not (waiting and handed)) or now >= deadline or fetcher.closed:
                break
            wait = min(deadline - now, SLICE_SECONDS)
            if not flying:  # the window is the workers': wait for one of their jobs to end
                futures.wait(handed, wait, futures.FIRST_COMPLETED)
                continue
            for key, _ in selector.select(wait):
                _ready(fetcher, key, selector, flying, done, hand_off, handed)
            now = time.monotonic()
            if now - swept >= SLICE_SECONDS:  # a request past its own deadline: its read raises at once
                swept = now
                for fd, (target, exchange, sent) in list(flying.items()):
                    if now >= exchange.ask.deadline:
                        _drop(selector, flying, fd)
                        done(target, exchange, sent)
        while flying:
            fd, (target, exchange, sent) = flying.popitem()
            selector.unregister(fd)
            hand_off(target, exchange, sent)
    finally:
        for _, exchange, _ in flying.values():  # only after an error of our own: nothing reads them
            fetcher.discard(exchange)
        selector.close()


def _ready(fetcher: Fetcher, key: selectors.SelectorKey, selector: selectors.BaseSelector, flying: _Flying,
           done: Done, hand_off: HandOff, handed: list[Future]) -> None:
    """One socket the selector found ready: a new connection made (its GET sent), or what has come
    of an answer taken; the answer read once whole, handed to a worker when the loop cannot."""
    target, exchange, sent = key.data
    conn = exchange.conn
    if conn.unsent:  # connecting: writable means made or failed
        if not conn.connected():
            _drop(selector, flying, key.fd)
            done(target, exchange, sent)  # the read raises the connect's error at once
        elif conn.send_ready():
            selector.modify(key.fd, selectors.EVENT_READ, key.data)
        else:
            _drop(selector, flying, key.fd)
            _hand(hand_off, handed, target, exchange, sent)
        return
    more = conn.take_ready()
    whole = conn.whole(fetcher.max_body)
    if whole or (not more and conn.received):  # whole, or ended part-way: read at once
        _drop(selector, flying, key.fd)
        done(target, exchange, sent)
    elif whole is None or not more or len(conn.buf) > HOLD_BYTES:
        _drop(selector, flying, key.fd)
        _hand(hand_off, handed, target, exchange, sent)


def _hand(hand_off: HandOff, handed: list[Future], target: Target, exchange: Optional[Exchange], sent: float) -> None:
    job = hand_off(target, exchange, sent)
    if job is not None:
        handed.append(job)


def _send(fetcher: Fetcher, target: Target, timeout: float, selector: selectors.BaseSelector,
          flying: _Flying, hand_off: HandOff, handed: list[Future]) -> None:
    sent = time.monotonic()
    try:
        exchange = fetcher.begin(target.url, timeout, connect=True)  # None for TLS: a worker reads it
    except (FetchError, ValueError):  # closed meanwhile, or a URL that does not read: the worker says which
        exchange = None
    sock = exchange.conn.sock if exchange is not None else None
    fd = sock.fileno() if sock is not None else -1
    if exchange is None or fd < 0:  # not begun, or closed under us (Fetcher.close)
        _hand(hand_off, handed, target, exchange, sent)
        return
    selector.register(fd, selectors.EVENT_WRITE if exchange.conn.unsent else selectors.EVENT_READ, (target, exchange, sent))
    flying[fd] = (target, exchange, sent)


def _drop(selector: selectors.BaseSelector, flying: _Flying, fd: int) -> None:
    del flying[fd]
    selector.unregister(fd)
