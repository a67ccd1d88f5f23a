"""What one answer may hold (the sources' HTTP client, monitor/kit/http.py): the budget shared by
the answers in flight, one answer's head and body within their caps and that budget, and the error
a request fails with. Re-exported by monitor.kit.http (its public names)."""
from __future__ import annotations

import threading
from typing import Optional

from monitor.kit.http_wire import MAX_HEAD_BYTES


class FetchError(Exception):
    """A target could not be read. `reason` is a short label (timeout, connect, http, truncated, ...)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class BodyBudget:
    """The bytes of responses (heads and bodies together) that requests sharing it may hold at once
    beyond each one's own first FREE_BYTES (so an ordinary body is never refused because others are huge). A request that
    would go past it fails `too_large` and gives its bytes back: 32 endless targets cost
    32 x FREE_BYTES + the budget, not 32 x MAX_BODY_BYTES. Thread-safe."""

    FREE_BYTES = 1024 * 1024

    def __init__(self, total: int):
        if total < 0:
            raise ValueError(f"a body budget cannot be negative, got {total}")
        self.total = total
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class Held:
    """A response as it arrives, within one request's caps and the shared budget: its head (at most
    MAX_HEAD_BYTES) and its body (at most `cap`) are counted together, and bytes past the first
    FREE_BYTES are taken from the budget as they come and given back by `release`. A Content-Length
    over the cap fails before any of the body is read."""

    def __init__(self, cap: int, budget: Optional[BodyBudget]):
        self.cap, self.budget = cap, budget
        # the first piece as it came (a Content-Length body read in one receive is never copied), the
        # rest in one growing buffer: a list of pieces would cost ~50 bytes of objects per piece, so a
        # target sending 1-byte chunks would hold 50x what the budget counts
        self.first: Optional[bytes] = None
        self.rest: Optional[bytearray] = None
        self.held = self.taken = self.head_held = 0

    def head(self, size: int) -> None:
        """The answer's head has `size` bytes so far (it only grows)."""
        if size > MAX_HEAD_BYTES:
            raise FetchError("too_large", f"response head over {MAX_HEAD_BYTES} bytes")
        if size > self.head_held:
            if size + self.held > BodyBudget.FREE_BYTES:
                self._charge(size - self.head_held, "response head")
            self.head_held = size

    def _charge(self, n: int, what: str) -> None:
        """Take from the budget what `n` more bytes hold beyond the free part (head and body together)."""
        held, free = self.held + self.head_held, BodyBudget.FREE_BYTES
        extra = max(0, held + n - free) - max(0, held - free)
        if extra and self.budget is not None:
            if not self.budget.take(extra):
                raise FetchError("too_large", f"{what} over {held + n} bytes with the head while the answers "
                                              f"in flight hold the scrape memory budget")
            self.taken += extra

    def expect(self, length: int) -> None:
        if length > self.cap:
            raise FetchError("too_large", f"body of {length} bytes (Content-Length) over the {self.cap}-byte cap")

    def __call__(self, chunk: bytes) -> None:
        held = self.held + len(chunk)
        if held + self.head_held > BodyBudget.FREE_BYTES:  # within the free part: nothing to take
            self._charge(len(chunk), "body")
        self.held = held
        if self.first is None:
            self.first = chunk
        elif self.rest is None:
            self.rest = bytearray(self.first)
            self.rest += chunk
        else:
            self.rest += chunk
        if held > self.cap:
            raise FetchError("too_large", f"body over {self.cap} bytes")

    def data(self) -> bytes:
        if self.rest is not None:
            return bytes(self.rest)
        return self.first if self.first is not None else b""

    def release(self) -> None:
        if self.taken and self.budget is not None:  # taken only from a budget
            self.budget.give(self.taken)
            self.taken = 0
        self.first = self.rest = None
