"""The digest's outbox as the exporter reads it: a `DigestStatus` (monitor/export/samples.py renders
the catalogue's digest metrics from it)."""
from __future__ import annotations

import sqlite3
from typing import Optional

from monitor.digest.outbox import Outbox
from monitor.export.samples import DigestStatus, digest_samples


def digest_status(outbox: Optional[Outbox]) -> Optional[DigestStatus]:
    """Deliveries pending, and when a week's digest last reached every destination (None before
    that: never exported as 0). None without an outbox, or once it is closed (the daemon stops)."""
    if outbox is None:
        return None
    try:
        pending, last = outbox.pending_count(), outbox.last_success()
    except sqlite3.ProgrammingError:  # closed while the daemon stops: export nothing
        return None
    return DigestStatus(float(pending), float(last) if last is not None else None)


def metric_samples(outbox: Outbox) -> list[tuple[str, dict, float]]:
    """headroom_digest_pending_deliveries always; headroom_digest_last_success_timestamp_seconds
    once a week's digest reached every destination, as the exporter renders them."""
    return digest_samples(digest_status(outbox))
