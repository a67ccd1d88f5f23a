"""The embedded history store as a part of the daemon (monitor/app `build`): opened, written after
each cycle's snapshot is published (after /metrics is rendered), maintained hourly."""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Optional

from ..config import Config
from ..pipeline.cycle import Pipeline
from .component import Component

if TYPE_CHECKING:
    from ..history.store import HistoryStore

log = logging.getLogger(__name__)

STORE_MAINTENANCE_HOURS = 1
# seconds a cycle's store write waits for a lock held elsewhere before it is skipped (its points kept)
STORE_WRITE_WAIT = 0.5
STORE_BACKLOG_POINTS = 200_000  # points of skipped appends kept for the next one (oldest dropped past it)


class Store(Component):
    """The embedded history store: each snapshot's pool series appended (unless read-only), expired
    and downsampled hourly. Optional at run time (it only feeds the forecasts): a corrupt file is moved
    aside and a fresh store started, one that cannot be written is read only, one that cannot be read
    is not used; each said in one log line and as headroom_store_errors_total{operation="open"}.
    Never on the live path: the cycle publishes first (the web server renders before the store is
    written), and a write waits STORE_WRITE_WAIT for a lock held elsewhere (another process, this
    one's maintenance), then is skipped and counted; its points are written with the next append that
    gets the lock (at most STORE_BACKLOG_POINTS kept, the oldest dropped past it)."""
    name = "store"

    def __init__(self, cfg: Config, pipeline: Pipeline, writable: bool):
        from ..history.store import open_store  # noqa: PLC0415
        assert cfg.store_path is not None  # built only when store.path is set (monitor/app build)
        self.clock = pipeline.clock
        opened = open_store(cfg.store_path, writable=writable, now=self.clock(), retention_seconds=cfg.store_retention,
                            write_timeout=STORE_WRITE_WAIT)
        self.store = opened.store
        self.writable = opened.writable
        # failures by operation (headroom_store_errors_total): the first is logged with its traceback,
        # the rest as one line each, so a full disk does not fill the log with tracebacks
        self.errors = {"open": 0.0, "append": 0.0, "maintain": 0.0, "restore": 0.0} if writable else {}
        self._lock = threading.Lock()  # a persist or maintenance in flight finishes before stop() closes
        self._closed = False
        self._backlog: list = []  # points of appends skipped because the store was locked
        self._busy = False  # the store was locked at the last write (said when it starts and ends)
        if opened.problem:
            self.errors["open"] = 1.0
            log.warning("history store %s: %s; %s", cfg.store_path, opened.problem, _store_fallback(opened))
        if self.writable:
            pipeline.on_snapshot(self.persist)
            pipeline.on_clock_step(self.clock_stepped)

    def guarded(self, operation: str, fn, wait: Optional[float] = None) -> bool:
        """Run the store operation `fn`, counted and logged when it fails; `wait`: seconds to wait for
        a store operation in flight (an append: STORE_WRITE_WAIT). True when `fn` ran and succeeded."""
        from ..history.sqlite_store import StoreBusy  # noqa: PLC0415
        if wait is None and operation == "append":
            wait = STORE_WRITE_WAIT
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            self._failed(operation, StoreBusy(f"history store busy with another operation for over {wait:g} s"))
            return False
        try:
            if self._closed:  # a cycle that ends after stop(): its points are not written
                return False
            fn()
        except Exception as exc:  # noqa: BLE001 (a failed store operation is said and counted; the cycle goes on)
            self._failed(operation, exc)
            return False
        finally:
            self._lock.release()
        if self._busy and operation == "append":
            self._busy = False
            log.info("history store writable again: the skipped cycles' points are written")
        return True

    def _failed(self, operation: str, exc: Exception) -> None:
        from ..history.sqlite_store import StoreBusy  # noqa: PLC0415
        first = not any(v for k, v in self.errors.items() if k not in ("open", "restore"))
        self.errors[operation] = self.errors.get(operation, 0.0) + 1
        if isinstance(exc, StoreBusy):  # not the store's fault: said once while it lasts, no traceback
            if not self._busy:
                log.warning("history store %s skipped: %s; the cycles go on, their points are kept for the next "
                            "append (headroom_store_errors_total counts the skipped ones)", operation, exc)
            self._busy = True
        elif first:
            log.exception("history store %s failed (headroom_store_errors_total counts them)", operation,
                          exc_info=exc)
        else:
            log.warning("history store %s failed: %s: %s", operation, type(exc).__name__, exc)

    def count_skipped(self, operation: str, n: int) -> None:
        """`n` items an operation left out (badly typed rows at restore): counted, never fatal."""
        self.errors[operation] = self.errors.get(operation, 0.0) + n

    def persist(self, snapshot) -> None:
        from ..history.store import points_from_snapshot  # noqa: PLC0415
        points = self._backlog + points_from_snapshot(snapshot)
        self._backlog = points[-STORE_BACKLOG_POINTS:]  # until written: a locked store loses no point
        if self.guarded("append", lambda: self._written().append(points)) or not self._busy:
            self._backlog = []  # written, or failed for another reason (a full disk: history has a gap)

    def clock_stepped(self, seconds: float, now: float) -> None:
        """After a step back, points stamped after the new now are dropped: no future stamp is kept."""
        if seconds < 0:
            self.guarded("maintain", lambda: log.warning(
                "history store: %d points stamped after the stepped-back clock dropped",
                self._written().drop_after(now)))

    def _written(self) -> HistoryStore:
        """The store the writes go to: they are set up only when it opened writable (so it opened)."""
        assert self.store is not None
        return self.store

    def start(self, scheduler) -> None:
        if self.writable:
            hours = STORE_MAINTENANCE_HOURS * 3600.0
            scheduler.every("store-maintenance", hours, lambda: self.guarded(
                "maintain", lambda: self._written().maintain(self.clock())), first_delay=hours)

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            if self.store is not None:
                self.store.close()

    def seed_trends(self, trends) -> None:
        """The landing chart starts with the stored hours (active and queued apart)."""
        if self.store is None:
            return
        now = self.clock()
        since = now - trends.keep
        for pool, series in self.store.series_keys():
            if series == "active_requests":
                active = self.store.query(pool, "active_requests", since, now, step=300, agg="mean")
                queued = self.store.query(pool, "queued_requests", since, now, step=300, agg="mean")
                trends.seed(pool, [(float(t), float(v), float(queued.get(t, 0.0)), 0.0) for t, v in active.items()])


def _store_fallback(opened) -> str:
    """What the daemon does instead of writing the configured store."""
    if opened.moved_to:
        return f"a fresh store was started (the old file is kept as {opened.moved_to})"
    if opened.store is not None:
        return "it is used read-only: the forecasts read it, no new history is written"
    return "it is not used: live numbers only, no forecasts from the store"
