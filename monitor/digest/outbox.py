"""The digest outbox: SQLite in WAL mode (synchronous=FULL), so a restart neither loses nor repeats.

Rows:
  payloads    (week, name) -> bytes        the rendered digest (md, html, json, slack.json, PNGs)
  deliveries  key = "<edition>:<destination>"  state pending | done | failed, attempts,
              next_attempt, last_error, lease_until, delivered
The `week` column holds the digest's edition: its ISO week (`2025-W48`), and for a sharded daemon
its shard too (`2025-W48-shard-1-of-2`, monitor.digest.content.digest_edition).

`enqueue` writes the payload and one pending row per destination in one transaction; a key that
already exists (pending, done or failed) is left alone, so building the same week's digest twice
never sends it twice. `drain` sends every due row, marking it done only after the destination
acknowledged (the sender returned without raising); a failure schedules the next attempt with
exponential backoff. A row being sent carries a lease, so two processes never send it at the same
time; a process killed mid-send leaves a lease that expires after `lease_seconds`.
No clock is read here: callers pass `now`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from monitor.digest.settings import Retry

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS payloads (
    week TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (week, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS deliveries (
    key TEXT PRIMARY KEY, week TEXT NOT NULL, destination TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL, next_attempt REAL NOT NULL, last_error TEXT,
    lease_until REAL, delivered REAL
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_attempt);
"""


class OutboxError(ValueError):
    pass


def delivery_key(week: str, destination: str) -> str:
    return f"{week}:{destination}"


@dataclass
class Delivery:
    key: str
    week: str
    destination: str
    state: str
    attempts: int
    next_attempt: float
    last_error: Optional[str]
    delivered: Optional[float]


class Outbox:
    def __init__(self, path: str, retry: Retry = Retry(), lease_seconds: float = 120.0):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise OutboxError(f"digest outbox directory does not exist: {parent}")
        self.path, self.retry, self.lease_seconds = path, retry, lease_seconds
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise OutboxError(f"could not put {path} in WAL mode (got {mode})")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _tx(self):
        db = self._db

        class _T:
            def __enter__(s):
                db.execute("BEGIN IMMEDIATE")
                return db

            def __exit__(s, et, _ev, _tb):
                db.execute("COMMIT" if et is None else "ROLLBACK")
        return _T()

    # --- writing
    def enqueue(self, week: str, files: dict[str, bytes], destinations: Iterable[str], now: float) -> list[str]:
        """Store the week's payload (first one wins) and a pending delivery per destination.
        Returns the keys that were newly queued (already known keys are not queued again)."""
        dests = list(destinations)
        new = []
        with self._lock, self._tx() as db:
            known = {r[0] for r in db.execute("SELECT name FROM payloads WHERE week = ?", (week,))}
            if not known:
                db.executemany("INSERT INTO payloads (week, name, data) VALUES (?, ?, ?)",
                               [(week, n, sqlite3.Binary(b)) for n, b in files.items()])
            for d in dests:
                key = delivery_key(week, d)
                cur = db.execute("INSERT OR IGNORE INTO deliveries (key, week, destination, created, next_attempt) "
                                 "VALUES (?, ?, ?, ?, ?)", (key, week, d, now, now))
                if cur.rowcount:
                    new.append(key)
        return new

    def has_week(self, week: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM payloads WHERE week = ? LIMIT 1", (week,)).fetchone() is not None

    def payload(self, week: str) -> dict[str, bytes]:
        with self._lock:
            rows = self._db.execute("SELECT name, data FROM payloads WHERE week = ?", (week,)).fetchall()
        return {n: bytes(b) for n, b in rows}

    # --- reading
    def deliveries(self, state: Optional[str] = None) -> list[Delivery]:
        q = "SELECT key, week, destination, state, attempts, next_attempt, last_error, delivered FROM deliveries"
        args: tuple = ()
        if state:
            q, args = q + " WHERE state = ?", (state,)
        with self._lock:
            rows = self._db.execute(q + " ORDER BY created, key", args).fetchall()
        return [Delivery(*r) for r in rows]

    def pending_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM deliveries WHERE state = 'pending'").fetchone()[0])

    def last_success(self) -> Optional[float]:
        """When the newest week whose every delivery is done was completed (its last ack)."""
        with self._lock:
            row = self._db.execute(
                "SELECT max(d) FROM (SELECT week, max(delivered) AS d FROM deliveries GROUP BY week "
                "HAVING sum(state != 'done') = 0)").fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def next_due(self) -> Optional[float]:
        """When the next pending delivery may be tried (its backoff and any lease both over)."""
        with self._lock:
            row = self._db.execute("SELECT min(max(next_attempt, coalesce(lease_until, 0))) FROM deliveries "
                                   "WHERE state = 'pending'").fetchone()
        return float(row[0]) if row and row[0] is not None else None

    # --- sending
    def backoff(self, attempts: int) -> float:
        r = self.retry
        return min(r.max_seconds, r.initial_seconds * r.factor ** max(0, attempts - 1))

    def _claim(self, key: str, now: float) -> bool:
        with self._lock, self._tx() as db:
            cur = db.execute("UPDATE deliveries SET lease_until = ? WHERE key = ? AND state = 'pending' "
                             "AND next_attempt <= ? AND (lease_until IS NULL OR lease_until <= ?)",
                             (now + self.lease_seconds, key, now, now))
            return cur.rowcount == 1

    def drain(self, senders: dict[str, Callable[[str, str, dict], None]], now: float,
              clock: Optional[Callable[[], float]] = None, workers: int = 8) -> dict[str, str]:
        """Send every due pending delivery once, destinations at the same time (up to `workers`),
        so a slow one holds none of the others. `senders[destination](key, week, payload)` must
        return only after the destination acknowledged, raise otherwise, and end within its
        destination's timeout (monitor/digest/deliver.py), which is below the lease. Returns
        {key: outcome}."""
        clock = clock or (lambda: now)
        with self._lock:
            due = [r[0] for r in self._db.execute(
                "SELECT key FROM deliveries WHERE state = 'pending' AND next_attempt <= ? ORDER BY created, key",
                (now,)).fetchall()]
        claimed: list[tuple[str, str, str]] = []  # (key, week, destination)
        for key in due:
            if self._claim(key, now):
                with self._lock:
                    week, dest = self._db.execute("SELECT week, destination FROM deliveries WHERE key = ?",
                                                  (key,)).fetchone()
                claimed.append((key, week, dest))
        payloads = {week: self.payload(week) for _, week, _ in claimed}
        if not claimed:
            return {}

        def send(claim: tuple[str, str, str]) -> str:
            key, week, dest = claim
            return self._send_one(senders, key, week, dest, payloads[week], clock)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(claimed))),
                                thread_name_prefix="digest-send") as pool:
            outcomes = list(pool.map(send, claimed))
        return {key: outcome for (key, _, _), outcome in zip(claimed, outcomes)}

    def _send_one(self, senders: dict, key: str, week: str, dest: str, payload: dict,
                  clock: Callable[[], float]) -> str:
        sender = senders.get(dest)
        try:
            if sender is None:
                raise DeliveryError(f"destination {dest!r} is not configured")
            sender(key, week, payload)
        except Exception as exc:  # noqa: BLE001 - every failure is retried; the message carries no secret
            msg = safe_error(exc)
            with self._lock, self._tx() as db:
                attempts = db.execute("SELECT attempts FROM deliveries WHERE key = ?", (key,)).fetchone()[0] + 1
                give_up = self.retry.max_attempts and attempts >= self.retry.max_attempts
                t = clock()
                db.execute("UPDATE deliveries SET attempts = ?, last_error = ?, lease_until = NULL, "
                           "next_attempt = ?, state = ? WHERE key = ?",
                           (attempts, msg, t + self.backoff(attempts), "failed" if give_up else "pending", key))
            log.warning("digest delivery %s failed (attempt %d%s): %s", key, attempts,
                        ", giving up" if give_up else f", next in {self.backoff(attempts):.0f} s", msg)
            return "failed" if give_up else "retry"
        with self._lock, self._tx() as db:
            db.execute("UPDATE deliveries SET state = 'done', delivered = ?, attempts = attempts + 1, "
                       "lease_until = NULL, last_error = NULL WHERE key = ?", (clock(), key))
        log.info("digest delivery %s done", key)
        return "done"


class DeliveryError(RuntimeError):
    """A destination did not acknowledge; the message is safe to log (no secrets)."""


def safe_error(exc: BaseException) -> str:
    """A log-safe description: our own DeliveryError messages are built without secrets; for any
    other exception only its type is kept (requests' messages quote the URL, which for a Slack
    webhook is the secret)."""
    if isinstance(exc, DeliveryError):
        return str(exc)
    return type(exc).__name__
