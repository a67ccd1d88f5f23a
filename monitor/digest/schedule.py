"""Running the digest: build, render, queue in the outbox, deliver; and the daemon's schedule.

    run_digest(settings, build_fn, now, outbox)      one digest for the week ending at `now`
    drain(settings, outbox, now)                     (re)try every due delivery
    schedule_digest(scheduler, settings, build_fn)   cron job (day, hour, minute, time zone) plus a
                                                     retry job that drains the outbox

`build_fn(week_end) -> DigestInput` loads history (monitor.digest.sources or .demo); its `shard`
attribute, when set (`history_build_fn` sets it from `global.shard`), makes every
delivery's key unique per shard and week (`content.digest_edition`). A week whose payload is already
in the outbox is not rebuilt: a restart or a second run in the same week queues only destinations
that are missing, so nothing is sent twice.
"""
from __future__ import annotations

import logging
import math
import os
import time
from typing import Callable, Optional

from monitor.digest import sources
from monitor.digest.content import DigestInput, build_digest, digest_edition, digest_week
from monitor.digest.deliver import render_files, senders_for
from monitor.digest.outbox import Outbox
from monitor.digest.settings import DAYS, DigestSettings
from monitor.history.query_range import PrometheusHistory
from monitor.history.store import HistoryStore
from monitor.kit.settings.reader import ConfigError
from monitor.kit.weekly import next_weekly
from monitor.sources.prometheus import PrometheusClient

log = logging.getLogger(__name__)


def week_end_for(now: float) -> float:
    """The digest's week ends at the top of the hour it runs in."""
    return math.floor(now / 3600.0) * 3600.0


def open_outbox(settings: DigestSettings) -> Outbox:
    return Outbox(settings.outbox, settings.retry, lease_seconds=max(
        [60.0] + [2 * d.timeout + 30.0 for d in settings.destinations]))


def drain(settings: DigestSettings, outbox: Outbox, now: Optional[float] = None,
          clock: Callable[[], float] = time.time) -> dict:
    return outbox.drain(senders_for(settings.destinations), clock() if now is None else now, clock)


def run_digest(settings: DigestSettings, build_fn: Callable[[float], DigestInput], now: float,
               outbox: Outbox, clock: Callable[[], float] = time.time, deliver: bool = True) -> dict:
    """Build (unless this week's payload is queued already), queue one delivery per destination,
    then try every due delivery once. Returns {"week", "queued", "outcomes", "pending"}."""
    end = week_end_for(now)
    week = digest_edition(digest_week(end, settings.zone), getattr(build_fn, "shard", None))
    dests = [d.name or d.type for d in settings.destinations]  # check() names each (by default its type)
    kept = outbox.has_week(week)
    if kept:
        log.info("digest %s is already in the outbox: the first one is kept (not rebuilt); queueing only "
                 "missing destinations", week)
        queued = outbox.enqueue(week, {}, dests, now)
    else:
        digest = build_digest(build_fn(end), settings, generated_at=now)
        if digest["edition"] != week:
            raise ValueError(f"the digest built is {digest['edition']}, expected {week} (shard mismatch)")
        queued = outbox.enqueue(week, render_files(digest), dests, now)
    outcomes = drain(settings, outbox, now, clock) if deliver else {}
    out = {"week": week, "queued": queued, "outcomes": outcomes, "pending": outbox.pending_count()}
    if kept:
        out["note"] = f"digest {week} was built before: the first one is kept, not rebuilt"
    return out


class HistoryBuild:
    """`build_fn(week_end) -> DigestInput` with the shard whose pools it reports (None: every pool)."""

    def __init__(self, fn: Callable[[float], DigestInput], shard: Optional[tuple[int, int]] = None):
        self.fn, self.shard = fn, shard

    def __call__(self, week_end: float) -> DigestInput:
        return self.fn(week_end)


def history_build_fn(settings: DigestSettings, *, store=None, store_path: Optional[str] = None, prometheus=None,
                     pool_by: tuple[str, ...] = ("model_name",), shard: Optional[tuple[int, int]] = None,
                     file: str = "<config>", knees: Optional[Callable[[], dict]] = None) -> HistoryBuild:
    """`build_fn(week_end)` reading headroom's history: the HistoryStore (`store`, else one opened
    on `store_path` (store.path) per run) or Prometheus (`prometheus`: sources.prometheus, keyed by
    `pool_by`), as `digest.history.source` says (auto: store first). The knee: in Prometheus mode
    headroom's exported knee series; with the store, `knees()` (the daemon passes its newest
    snapshot's: `monitor.digest.knee_report.knees_from_snapshot`). Only the pools of `shard` (global.shard)
    are reported, under a key unique to the shard. A history source that is not configured is a
    ConfigError of `file`."""
    src = settings.history_source
    if src == "auto":
        src = "store" if (store is not None or store_path) else ("prometheus" if prometheus else "")
    if src == "store":
        if store is None and not store_path:
            raise ConfigError(file, "store.path", "digest.history.source is store but no store is configured")
        return HistoryBuild(_store_build(store_path, settings, store, knees, shard), shard)
    if src == "prometheus":
        if prometheus is None:
            raise ConfigError(file, "sources.prometheus",
                              "digest.history.source is prometheus but none is configured")
        return HistoryBuild(_prometheus_build(prometheus, pool_by, settings, shard), shard)
    raise ConfigError(file, "digest.history", "no history: configure store.path or sources.prometheus")


def weekly_fire_times(settings: DigestSettings) -> Callable[[float], Optional[float]]:
    """`next_fire(after)`: the first time (Unix seconds) after `after` that the digest's schedule
    (day of week, hour, minute, in its time zone, daylight saving included) names."""
    s = settings.schedule
    day = DAYS.index(s.day_of_week)
    return lambda after: next_weekly(after, day, s.hour, s.minute, s.timezone)


def _store_build(store_path: Optional[str], settings: DigestSettings, store, knees,
                 shard) -> Callable[[float], DigestInput]:
    """`store`, else one opened on `store_path` per run (one of the two is given: history_build_fn)."""
    knee_fn = (lambda start, end, step: knees() or {}) if knees is not None else None

    def build(week_end: float) -> DigestInput:
        if store is not None:
            return sources.from_store(store, week_end, settings, knees=knee_fn, shard=shard)
        assert store_path is not None
        if not os.path.isfile(store_path):
            raise ValueError(f"history store {store_path} does not exist (has the daemon run?)")
        with HistoryStore(store_path, retention_seconds=None, downsample_after_seconds=None) as st:
            return sources.from_store(st, week_end, settings, knees=knee_fn, shard=shard)
    return build


def _prometheus_build(prometheus, pool_by, settings: DigestSettings, shard) -> Callable[[float], DigestInput]:
    def build(week_end: float) -> DigestInput:
        client = PrometheusClient.from_config(prometheus)  # closed after the run: the history's own
        history = PrometheusHistory.from_config(prometheus, pool_by=pool_by, client=client,
                                                resolution=sources.resolution_for(settings.history_step))
        try:
            return sources.from_source(history, week_end, settings, shard=shard,
                                       knees=sources.prometheus_knees(history.client, history.selector,
                                                                      extra=history.extra))
        finally:
            client.close()
    return build


def schedule_digest(scheduler, settings: DigestSettings, build_fn: Callable[[float], DigestInput],
                    outbox: Optional[Outbox] = None, clock: Callable[[], float] = time.time) -> list[str]:
    """Add the weekly digest to the daemon's scheduler (monitor/kit/ticker.py): the build on the wall
    clock's schedule (a fire time missed by more than 6 h is skipped), the outbox retries on the
    monotonic one. Returns the job ids."""
    box = outbox or open_outbox(settings)

    def weekly():
        try:
            r = run_digest(settings, build_fn, clock(), box, clock)
            log.info("digest %s: queued %d, %d pending", r["week"], len(r["queued"]), r["pending"])
        except Exception as exc:  # noqa: BLE001 (a scheduler job: the failure is said, next week runs)
            log.error("digest build failed: %s: %s", type(exc).__name__, exc)

    def retry():
        try:
            drain(settings, box, None, clock)
        except Exception as exc:  # noqa: BLE001 (a scheduler job: the outbox keeps what is due)
            log.error("digest outbox drain failed: %s", type(exc).__name__)

    scheduler.on_wall_clock("headroom-digest", weekly_fire_times(settings), weekly, grace=6 * 3600.0)
    scheduler.every("headroom-digest-retry", max(10.0, min(settings.retry.initial_seconds, 300.0)), retry)
    return ["headroom-digest", "headroom-digest-retry"]
