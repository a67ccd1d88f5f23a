"""Opening the history store as the daemon does: never stopped by the store (it only feeds the
forecasts). `open_store` gives the store read-write, a corrupt file moved aside for a fresh one,
read-only when it cannot be written, or none; `store_problem` says why a path cannot be written
(`headroom run` and `headroom check-config` both ask it); `store_damage` why a file is not read as
SQLite (a damaged header or first page: `open_store` moves it aside as it does a truncated one)."""
from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from typing import Optional

from monitor.history.sqlite_store import HistoryStore, StoreError


def store_problem(path: str) -> Optional[str]:
    """Why the daemon could not write the store at `path` (None: it can). `headroom run` and
    `headroom check-config` both ask this."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    if os.path.exists(path) and not os.path.isfile(path):
        return f"{path} is not a file"
    for what in ([path] if os.path.exists(path) else []) + [parent]:
        if not os.access(what, os.W_OK):  # a read-only mount too (EROFS)
            return f"{what} is read-only" + (" (SQLite writes its -wal and -shm files beside the store)"
                                             if what == parent else "")
    return None


def store_damage(path: str) -> Optional[str]:
    """Why the store at `path` cannot be read as SQLite (its header or first page damaged), or None
    (no file, or it reads). `headroom run` moves such a file aside (kept) and starts a fresh store;
    `headroom check-config` says so. Reads the header and the schema page only: quick on any size."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    try:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return "not a SQLite database (its header is damaged)"
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        db = sqlite3.connect(uri, uri=True, timeout=5.0)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        finally:
            db.close()
    except sqlite3.OperationalError:
        return None  # locked or unreadable here: not known to be damaged (store_problem says the rest)
    except (sqlite3.DatabaseError, OSError) as exc:
        return f"not a SQLite database ({exc})"
    return None


@dataclass
class Opened:
    """What `open_store` made of the configured store: `store` None when it is not used at all;
    `problem` (one line) when it is not read-write as configured; `moved_to` the corrupt file's new name."""
    store: Optional[HistoryStore]
    problem: Optional[str] = None
    moved_to: Optional[str] = None

    @property
    def writable(self) -> bool:
        return self.store is not None and not self.store.read_only


def _move_aside(path: str, stamp: str) -> str:
    """Rename a corrupt store (and its -wal / -shm, which belong to it) to PATH.corrupt-STAMP."""
    target = f"{path}.corrupt-{stamp}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, target + suffix)
    return target


def open_store(path: str, *, writable: bool, now: float, **settings) -> Opened:
    """The store at `path` as far as it can be used, never an exception for a broken one: read-write
    if `writable` and it can be written; a corrupt file moved aside (never overwritten) and a fresh
    store started; read-only when it cannot be written (or `writable` is False); else none."""
    problem = store_problem(path) if writable else None
    if writable and problem is None:
        try:
            return Opened(HistoryStore(path, **settings))
        except StoreError as exc:  # a schema of a newer headroom: kept as it is
            problem = str(exc)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):  # unable to open, locked, read-only: not corrupt
                problem = f"cannot be written: {exc}"
            else:
                stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
                try:
                    moved = _move_aside(path, stamp)
                    return Opened(HistoryStore(path, **settings), f"corrupt ({exc}): moved aside", moved)
                except (OSError, sqlite3.Error) as again:
                    return Opened(None, f"corrupt ({exc}) and could not be replaced: {again}")
    if not os.path.isfile(path):
        return Opened(None, problem)
    try:
        store = HistoryStore(path, read_only=True, **settings)
    except (sqlite3.Error, StoreError, OSError) as exc:
        return Opened(None, f"{problem + '; ' if problem else ''}cannot be read: {exc}")
    return Opened(store, problem)
