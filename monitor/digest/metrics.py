"""The catalogue's digest metrics as (name, labels, value) triples, what the exporter yields."""
from __future__ import annotations

import sqlite3

from monitor.digest.outbox import Outbox


def metric_samples(outbox: Outbox) -> list[tuple[str, dict, float]]:
    """headroom_digest_pending_deliveries always; headroom_digest_last_success_timestamp_seconds
    once a week's digest reached every destination (never exported as 0 before that)."""
    try:
        pending, last = outbox.pending_count(), outbox.last_success()
    except sqlite3.ProgrammingError:  # closed while the daemon stops: export nothing
        return []
    out = [("headroom_digest_pending_deliveries", {}, float(pending))]
    if last is not None:
        out.append(("headroom_digest_last_success_timestamp_seconds", {}, float(last)))
    return out
