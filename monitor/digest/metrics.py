"""The catalogue's digest metrics as (name, labels, value) triples, what the exporter yields."""
from __future__ import annotations

from monitor.digest.outbox import Outbox


def metric_samples(outbox: Outbox) -> list[tuple[str, dict, float]]:
    """headroom_digest_pending_deliveries always; headroom_digest_last_success_timestamp_seconds
    once a week's digest reached every destination (never exported as 0 before that)."""
    out = [("headroom_digest_pending_deliveries", {}, float(outbox.pending_count()))]
    last = outbox.last_success()
    if last is not None:
        out.append(("headroom_digest_last_success_timestamp_seconds", {}, float(last)))
    return out
