"""headroom's embedded history store (direct mode): SQLite in WAL mode. How the daemon opens it (a
corrupt file moved aside, an unwritable one read only) is monitor/history/store_open.py; callers
import both through monitor/history/store.py.

One table keyed by (pool, series, resolution, ts): appending the same point twice keeps one row
(the later value wins), so a writer that restarts after a crash can re-append its last batch
safely. A batch is one transaction: after `append` returns, its points survive a kill -9 of the
process (WAL + synchronous=FULL by default). Old raw points are downsampled into rollup rows
(max, sum, count per bucket) so `query(..., agg="max"|"mean")` stays exact across resolutions;
retention deletes rows older than a cut-off. Timestamps are stored in integer milliseconds.
No clock is read here: callers pass `now`.

A second table, `slo_counts`, holds the SLO tracker's cumulative counts per key (its columns are
in monitor/model/schema.py; monitor/history/slo_history.py writes and reads it): `slo_apply` adds and
drops points in one transaction, `slo_rows` reads them all back.
"""
from __future__ import annotations

import math
import os
import sqlite3
import threading
import urllib.parse
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:  # pandas is imported when querying only: writers start fast
    import pandas as pd

SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    pool TEXT NOT NULL,
    series TEXT NOT NULL,
    res INTEGER NOT NULL,       -- 0 for raw points, else the rollup bucket in seconds
    ts INTEGER NOT NULL,        -- milliseconds since the epoch (bucket start for rollups)
    vmax REAL NOT NULL,
    vsum REAL NOT NULL,
    cnt INTEGER NOT NULL,
    PRIMARY KEY (pool, series, res, ts)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS points_ts ON points (ts);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS slo_counts (
    key TEXT NOT NULL,          -- the tracker's key (JSON)
    ts INTEGER NOT NULL,        -- milliseconds since the epoch
    total REAL NOT NULL,        -- cumulative observations, rebased over counter resets
    bad REAL NOT NULL,          -- cumulative observations over the target, rebased
    raw_total REAL NOT NULL,    -- the counters as read (a reset shows as a drop)
    raw_bad REAL NOT NULL,
    PRIMARY KEY (key, ts)
) WITHOUT ROWID;
"""
SCHEMA_VERSION = "2"
# Schema 1 stored active + queued as `active_requests`; 2 stores the history schema's names
# (monitor/model/schema.py): active and queued apart, their sum as `load`. One transaction turns a
# schema-1 store into a schema-2 one: raw points exactly; the older rollups of active alone cannot be
# recovered (the peak of a difference is not the difference of peaks), so they are dropped and their
# `load` copies kept.
_MIGRATE_1_TO_2 = (
    "INSERT INTO points (pool, series, res, ts, vmax, vsum, cnt) SELECT pool, 'load', res, ts, vmax, vsum, cnt "
    "FROM points WHERE series = 'active_requests' ON CONFLICT (pool, series, res, ts) DO NOTHING",
    "UPDATE points SET "
    "vmax = MAX(0.0, vmax - COALESCE((SELECT q.vmax FROM points q WHERE q.pool = points.pool "
    "AND q.series = 'queued_requests' AND q.res = 0 AND q.ts = points.ts), 0.0)), "
    "vsum = MAX(0.0, vsum - COALESCE((SELECT q.vsum FROM points q WHERE q.pool = points.pool "
    "AND q.series = 'queued_requests' AND q.res = 0 AND q.ts = points.ts), 0.0)) "
    "WHERE series = 'active_requests' AND res = 0",
    "DELETE FROM points WHERE series = 'active_requests' AND res > 0",
    "UPDATE meta SET value = '2' WHERE key = 'schema_version'",
)


class StoreError(ValueError):
    """Bad input to the store; the message names the field."""


class StoreBusy(sqlite3.OperationalError):
    """A write that found the store locked (another process's write lock, or this process's
    maintenance) for longer than the store's `write_timeout`: nothing was written."""


def _ms(ts: float) -> int:
    return int(round(ts * 1000.0))


class HistoryStore:
    def __init__(self, path: str, *, retention_seconds: Optional[float] = 35 * 86400.0,
                 downsample_after_seconds: Optional[float] = 7 * 86400.0,
                 downsample_step_seconds: int = 3600, synchronous: str = "FULL", read_only: bool = False,
                 write_timeout: Optional[float] = None):
        if retention_seconds is not None and retention_seconds <= 0:
            raise StoreError(f"retention_seconds must be positive, got {retention_seconds!r}")
        if downsample_after_seconds is not None and downsample_after_seconds <= 0:
            raise StoreError("downsample_after_seconds must be positive")
        if int(downsample_step_seconds) <= 0:
            raise StoreError("downsample_step_seconds must be a positive whole number of seconds")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise StoreError("synchronous must be FULL, NORMAL or EXTRA")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise StoreError(f"history store directory does not exist: {parent}")
        self.path = path
        self.retention_seconds = retention_seconds
        self.downsample_after_seconds = downsample_after_seconds
        self.downsample_step = int(downsample_step_seconds)
        self.read_only = read_only
        # how long a write waits for a lock held elsewhere before it gives up (StoreBusy); None: 30 s
        self.write_timeout = write_timeout
        self._lock = threading.RLock()
        self._closed = True
        if read_only:
            self._db = _connect_read_only(path)
        else:
            self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._closed = False
        try:
            self._prepare(synchronous)
        except BaseException:
            self.close()
            raise

    def _prepare(self, synchronous: str) -> None:
        """WAL mode, the schema, an upgrade; then a check of every page (sqlite3.DatabaseError: corrupt)."""
        if self.read_only:
            self._check_version(self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone())
        else:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"could not put {self.path} in WAL mode (got {mode})")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.executescript(SCHEMA)
            self._upgrade()
        problem = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem != "ok":  # a file cut short reads its first pages well, then fails here
            raise sqlite3.DatabaseError(f"database disk image is malformed ({problem})")
        if self.write_timeout is not None:  # opened with SQLite's longer wait; each write waits this long
            self._db.execute(f"PRAGMA busy_timeout = {max(0, int(self.write_timeout * 1000))}")

    def _upgrade(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        elif row[0] == "1":
            with self._lock, self._transaction():
                for statement in _MIGRATE_1_TO_2:
                    self._db.execute(statement)
        else:
            self._check_version(row)

    def _check_version(self, row) -> None:
        if row is None or row[0] in ("1",):
            raise StoreError(f"{self.path}: history store schema {row[0] if row else 'none'!r} is older than "
                             f"{SCHEMA_VERSION} and this store is read-only: it cannot be upgraded")
        if row[0] != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: history store schema {row[0]!r} is newer than this headroom "
                             f"({SCHEMA_VERSION}); upgrade headroom or point store.path elsewhere")

    @contextmanager
    def _writing(self):
        """This store's lock for a write, waited for `write_timeout` at most; SQLite's own lock
        (another process) waited for as long (the connection's busy timeout). Either: StoreBusy."""
        timeout = -1 if self.write_timeout is None else self.write_timeout
        if not self._lock.acquire(timeout=timeout):
            raise StoreBusy(f"history store {self.path} is busy (maintenance in this process) for over "
                            f"{self.write_timeout:g} s")
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreBusy(f"history store {self.path} is locked by another writer for over "
                                f"{self.write_timeout if self.write_timeout is not None else 30:g} s ({exc})") from exc
            raise
        finally:
            self._lock.release()

    @contextmanager
    def _transaction(self):
        """BEGIN IMMEDIATE .. COMMIT; on any failure a ROLLBACK if SQLite has not rolled back itself.
        The failure raised is the first one (a full disk), never the rollback's ("cannot rollback")."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the first failure below says what went wrong
            raise

    # --- lifecycle
    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._db.close()
                self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self, write: bool = False):
        if self._closed:
            raise StoreError("history store is closed")
        if write and self.read_only:
            raise StoreError(f"history store {self.path} is open read-only")

    # --- writing
    def append(self, points: Iterable[tuple[str, str, float, float]]) -> int:
        """Insert raw points (pool, series, ts seconds, value) in one transaction; idempotent.
        Returns the number of points written. Non-finite values are rejected with StoreError."""
        rows = []
        for i, p in enumerate(points):
            try:
                pool, series, ts, value = p
            except (TypeError, ValueError):
                raise StoreError(f"point {i}: expected (pool, series, ts, value), got {p!r}") from None
            if not isinstance(pool, str) or not pool:
                raise StoreError(f"point {i}: pool must be a non-empty string, got {pool!r}")
            if not isinstance(series, str) or not series:
                raise StoreError(f"point {i}: series must be a non-empty string, got {series!r}")
            try:
                ts, value = float(ts), float(value)
            except (TypeError, ValueError):
                raise StoreError(f"point {i}: ts and value must be numbers, got {ts!r}, {value!r}") from None
            if not math.isfinite(ts):
                raise StoreError(f"point {i}: timestamp is not finite: {ts!r}")
            if not math.isfinite(value):
                raise StoreError(f"point {i}: value is not finite: {value!r}")
            rows.append((pool, series, _ms(ts), value, value))
        if not rows:
            return 0
        with self._writing():
            self._check_open(write=True)
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO points (pool, series, res, ts, vmax, vsum, cnt) VALUES (?, ?, 0, ?, ?, ?, 1) "
                    "ON CONFLICT (pool, series, res, ts) DO UPDATE SET vmax = excluded.vmax, "
                    "vsum = excluded.vsum, cnt = 1", rows)
        return len(rows)

    # --- reading
    def query(self, pool: str, series: str, start: float, end: float, step: Optional[float] = None,
              agg: str = "max") -> "pd.Series":
        """Points in [start, end] as a Series indexed by Unix seconds. With `step`, one value per
        bucket floor(ts / step) * step: the max or the (count-weighted) mean of what fell in it."""
        import pandas as pd  # noqa: PLC0415
        if agg not in ("max", "mean"):
            raise StoreError(f"agg must be 'max' or 'mean', got {agg!r}")
        if end < start:
            raise StoreError(f"end ({end}) is before start ({start})")
        if step is not None and not step > 0:
            raise StoreError(f"step must be positive seconds, got {step!r}")
        with self._lock:
            self._check_open()
            rows = self._db.execute(
                "SELECT ts, vmax, vsum, cnt FROM points WHERE pool = ? AND series = ? AND ts >= ? "
                "AND ts <= ? ORDER BY ts", (pool, series, _ms(start), _ms(end))).fetchall()
        if not rows:
            return pd.Series([], dtype=float, index=pd.Index([], dtype=float))
        df = pd.DataFrame(rows, columns=["ts", "vmax", "vsum", "cnt"])
        secs = df["ts"] / 1000.0
        if step is None:
            key = secs
        else:
            key = (secs // step) * step
        g = df.groupby(key.to_numpy())
        if agg == "max":
            out = g["vmax"].max()
        else:
            out = g["vsum"].sum() / g["cnt"].sum()
        out.index = out.index.astype(float)
        return out.astype(float)

    def count(self, pool: Optional[str] = None, series: Optional[str] = None) -> int:
        """Rows held (raw points plus rollup buckets) for the pool / series (all when None)."""
        sql, args = "SELECT COUNT(*) FROM points WHERE 1=1", list[str]()
        if pool is not None:
            sql, args = sql + " AND pool = ?", args + [pool]
        if series is not None:
            sql, args = sql + " AND series = ?", args + [series]
        with self._lock:
            self._check_open()
            return int(self._db.execute(sql, args).fetchone()[0])

    def series_keys(self) -> list[tuple[str, str]]:
        with self._lock:
            self._check_open()
            return [tuple(r) for r in self._db.execute(
                "SELECT DISTINCT pool, series FROM points ORDER BY pool, series")]

    # --- the SLO tracker's counts
    def slo_apply(self, added: Iterable[tuple], dropped: Iterable[tuple[str, float]] = (),
                  expire_before: Optional[float] = None) -> int:
        """Delete (key, ts) points, then insert (key, ts, total, bad, raw_total, raw_bad) ones, in one
        transaction; with `expire_before`, also every key whose newest point is older (a target
        no longer configured). Returns the points written."""
        rows = []
        for i, p in enumerate(added):
            try:
                key, ts, *values = p
                values = [float(v) for v in values]
                ts = float(ts)
            except (TypeError, ValueError):
                raise StoreError(f"SLO point {i}: expected (key, ts, total, bad, raw_total, raw_bad), "
                                 f"got {p!r}") from None
            if not isinstance(key, str) or not key or len(values) != 4:
                raise StoreError(f"SLO point {i}: expected (key, ts, total, bad, raw_total, raw_bad), got {p!r}")
            if not all(math.isfinite(v) for v in (ts, *values)):
                raise StoreError(f"SLO point {i}: values must be finite, got {p!r}")
            rows.append((key, _ms(ts), *values))
        gone = [(k, _ms(ts)) for k, ts in dropped]
        with self._writing():
            self._check_open()
            with self._transaction():
                self._db.executemany("DELETE FROM slo_counts WHERE key = ? AND ts = ?", gone)
                self._db.executemany(
                    "INSERT INTO slo_counts (key, ts, total, bad, raw_total, raw_bad) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (key, ts) DO UPDATE SET total = excluded.total, bad = excluded.bad, "
                    "raw_total = excluded.raw_total, raw_bad = excluded.raw_bad", rows)
                if expire_before is not None:
                    self._db.execute("DELETE FROM slo_counts WHERE key IN (SELECT key FROM slo_counts "
                                     "GROUP BY key HAVING MAX(ts) < ?)", (_ms(expire_before),))
        return len(rows)

    def slo_rows(self) -> list[tuple[str, float, float, float, float, float]]:
        """Every saved SLO point: (key, ts seconds, total, bad, raw_total, raw_bad), by key and time."""
        with self._lock:
            self._check_open()
            rows = self._db.execute("SELECT key, ts, total, bad, raw_total, raw_bad FROM slo_counts "
                                    "ORDER BY key, ts").fetchall()
        return [(k, ts / 1000.0, t, b, rt, rb) for k, ts, t, b, rt, rb in rows]

    # --- maintenance
    def downsample(self, now: float) -> int:
        """Fold raw points older than now - downsample_after into rollup buckets; returns how
        many raw points were folded. One transaction: a crash leaves either all or nothing."""
        if self.downsample_after_seconds is None:
            return 0
        cutoff = _ms(now - self.downsample_after_seconds)
        b = self.downsample_step * 1000
        with self._lock:
            self._check_open(write=True)
            with self._transaction():
                n = self._db.execute("SELECT COUNT(*) FROM points WHERE res = 0 AND ts < ?",
                                     (cutoff,)).fetchone()[0]
                self._db.execute(
                    "INSERT INTO points (pool, series, res, ts, vmax, vsum, cnt) "
                    "SELECT pool, series, ?, (ts / ?) * ?, MAX(vmax), SUM(vsum), SUM(cnt) FROM points "
                    "WHERE res = 0 AND ts < ? GROUP BY pool, series, (ts / ?) * ? "
                    "ON CONFLICT (pool, series, res, ts) DO UPDATE SET "
                    "vmax = MAX(vmax, excluded.vmax), vsum = vsum + excluded.vsum, cnt = cnt + excluded.cnt",
                    (self.downsample_step, b, b, cutoff, b, b))
                self._db.execute("DELETE FROM points WHERE res = 0 AND ts < ?", (cutoff,))
        return int(n)

    def drop_after(self, ts: float) -> int:
        """Delete every row stamped after `ts` (points written before the wall clock stepped back:
        no future stamp is kept); returns rows deleted."""
        with self._lock:
            self._check_open()
            cur = self._db.execute("DELETE FROM points WHERE ts > ?", (_ms(ts),))
            return int(cur.rowcount)

    def apply_retention(self, now: float) -> int:
        """Delete every row older than now - retention; returns rows deleted."""
        if self.retention_seconds is None:
            return 0
        with self._lock:
            self._check_open(write=True)
            cur = self._db.execute("DELETE FROM points WHERE ts < ?",
                                   (_ms(now - self.retention_seconds),))
            return int(cur.rowcount)

    def maintain(self, now: float) -> dict:
        return {"downsampled": self.downsample(now), "expired": self.apply_retention(now)}


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection. On a read-only mount SQLite cannot create the -shm file a WAL store
    needs to share; then the file is read as immutable (nothing else can be writing it there)."""
    if not os.path.isfile(path):
        raise StoreError(f"history store {path} does not exist")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path))
    db = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=30.0, isolation_level=None, check_same_thread=False)
    try:
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        db.close()
    return sqlite3.connect(uri + "?immutable=1", uri=True, isolation_level=None, check_same_thread=False)
