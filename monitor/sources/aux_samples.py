"""The samples of a gateway, router or DCGM body, read once per cycle (monitor/cycle.py `collect`).

    too_large(text, what) -> why a body is not parsed (over AUX_MAX_BODY_BYTES), or None
    iter_samples(text, names) -> (sample name, labels, value) of every wanted sample

The one module below the gateway reader (gateway.py), the queue reader (gateway_queue.py) and the
DCGM reader (dcgm.py): each takes its samples from here, none imports another.
"""
from __future__ import annotations

from typing import Iterator, Optional

from monitor.kit import exposition

# The largest gateway or DCGM body read (bytes). A body is parsed in the cycle, before it publishes:
# 8 MiB parses in about a second on one core (a LiteLLM scrape of 30 sessions is 1.9 MB), a 28 MB
# router body took 15-20 s. A larger body is refused `too_large` (fetched with this cap: the source
# is down, counted in headroom_source_errors_total{reason="too_large"}; a body over it that reaches a
# reader anyway is not parsed, its scrape's error says so, counted as the anomaly gateway_too_large).
AUX_MAX_BODY_BYTES = 8 * 1024 * 1024


def too_large(text: str, what: str) -> Optional[str]:
    """Why a body is not parsed (over AUX_MAX_BODY_BYTES), or None. Measured in characters: a
    UTF-8 body has at least as many bytes."""
    if len(text) > AUX_MAX_BODY_BYTES:
        return f"too_large: {what} body of {len(text)} characters over the {AUX_MAX_BODY_BYTES}-byte cap"
    return None


def iter_samples(text: str, sample_names: Optional[set[str]] = None) -> Iterator[tuple[str, dict, float]]:
    """(sample name, labels, value) for every wanted sample of the text (the project's parser,
    monitor/kit/exposition.py). A body that does not parse raises ValueError saying so."""
    try:
        parsed = exposition.parse(text, wanted=sample_names)
    except ValueError as exc:
        raise ValueError(f"gateway exposition does not parse: {exc}") from exc
    for name, items in parsed.samples.items():
        for labels, value in items:
            yield name, labels, float(value)
