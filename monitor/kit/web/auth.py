"""Basic auth that a password flood cannot turn into a denial of service (issue 38).

A bcrypt check costs a worker a quarter of a second at cost 12; a client sending wrong passwords as
fast as it can used to fill the one /metrics worker and its queue, and the authorised scrapes got
503. Three parts keep them apart:

- `BasicAuth.known(header)`: credentials that passed a bcrypt check are remembered (a SHA-256 of the
  header, never the password) while they keep being used: an entry unused for `CACHE_SECONDS` is
  forgotten, at most `CACHE_ENTRIES` are kept. The check is a dictionary look-up, cheap enough for the
  selector thread; the web server sends only such requests to the /metrics lane, so bcrypt never runs
  there (as prometheus/exporter-toolkit caches successful checks).
- `CheckThrottle`: every bcrypt check a client address asks for takes a token from that address's
  bucket (`BURST`, refilled at `PER_SECOND`); a successful check gives it back. An address with no
  token left is refused at once (429) on the selector thread, without a check.
- The checks that do run are on the general workers, never on the /metrics lane.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Callable, Optional

CACHE_SECONDS = 300.0  # a credential unused this long needs a bcrypt check again (covers a 5-minute scrape interval)
CACHE_ENTRIES = 1000
BURST = 5             # bcrypt checks an address may ask for at once
PER_SECOND = 0.5      # and then one every 2 s (a successful check gives its token back)
MAX_CLIENTS = 4096    # addresses tracked; past it the fullest buckets (nothing owed) are forgotten first


def _digest(header: str) -> bytes:
    return hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()


class BasicAuth:
    """authorize(header) -> bool: bcrypt-checked basic auth over `hashes` (user -> bcrypt hash);
    an unknown user is checked against `dummy` (same cost), so the answer takes as long as for a
    known one. `known(header)`: the header passed a check recently (cheap; refreshes the entry)."""

    def __init__(self, hashes: dict[str, bytes], dummy: bytes, cache_seconds: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.hashes, self.dummy = hashes, dummy
        self.cache_seconds, self.clock = cache_seconds, clock
        self._verified: OrderedDict[bytes, float] = OrderedDict()  # sha256(header) -> last used (monotonic)
        self._lock = threading.Lock()

    def known(self, header: Optional[str]) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        digest, now = _digest(header), self.clock()
        with self._lock:
            used = self._verified.get(digest)
            if used is None:
                return False
            if now - used > self.cache_seconds:
                del self._verified[digest]
                return False
            self._verified[digest] = now
            self._verified.move_to_end(digest)
            return True

    def __call__(self, header: Optional[str]) -> bool:
        import bcrypt  # noqa: PLC0415
        if not header or not header.startswith("Basic "):
            return False
        if self.known(header):
            return True
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
        # bcrypt reads at most 72 bytes of a password (htpasswd hashes those); the library refuses more
        hashed = self.hashes.get(user)
        ok = bcrypt.checkpw(password.encode()[:72], hashed if hashed is not None else self.dummy)
        ok = ok and hashed is not None and bool(sep)
        if ok:
            with self._lock:
                self._verified[_digest(header)] = self.clock()
                while len(self._verified) > CACHE_ENTRIES:
                    self._verified.popitem(last=False)  # the longest unused
        return ok


class CheckThrottle:
    """Per client address, how many bcrypt checks it may still ask for (a token bucket)."""

    def __init__(self, burst: float = BURST, per_second: float = PER_SECOND, max_clients: int = MAX_CLIENTS,
                 clock: Callable[[], float] = time.monotonic):
        self.burst, self.per_second, self.max_clients, self.clock = float(burst), per_second, max_clients, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when counted)
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, when = self._buckets.get(client, (self.burst, now))
        return min(self.burst, tokens + (now - when) * self.per_second)

    def take(self, client: str) -> bool:
        """One check for `client`; False (refuse without checking) when it has none left."""
        now = self.clock()
        with self._lock:
            tokens = self._tokens(client, now)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                return False
            self._buckets[client] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_clients:
                self._forget(now)
            return True

    def give_back(self, client: str) -> None:
        """The check passed: its token is returned."""
        now = self.clock()
        with self._lock:
            if client in self._buckets:
                self._buckets[client] = (min(self.burst, self._tokens(client, now) + 1.0), now)

    def _forget(self, now: float) -> None:
        full = [c for c in self._buckets if self._tokens(c, now) >= self.burst]
        for c in full:
            del self._buckets[c]
        if len(self._buckets) > self.max_clients:  # all owe: the oldest counted go (a bounded table)
            for c in sorted(self._buckets, key=lambda c: self._buckets[c][1])[:len(self._buckets) - self.max_clients]:
                del self._buckets[c]
