"""The samples of a gateway, router or DCGM body, read once per cycle (monitor/pipeline/cycle.py `collect`).

    too_large(text, what) -> why a body is not parsed (over AUX_MAX_BODY_BYTES), or None
    read_samples(text, names) -> BodySamples: the wanted samples, at most AUX_MAX_ROWS (`cut` past it)
    iter_samples(text, names) -> (sample name, labels, value) of those samples

The one module below the gateway reader (gateway.py), the queue reader (gateway_queue.py) and the
DCGM reader (dcgm.py): each takes its samples from here, none imports another.
"""
from __future__ import annotations

from dataclasses import dataclass
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


# The most sample rows read from one gateway, router or DCGM body (its wanted samples; and items of an
# alerts answer, monitor/sources/alerts.py). Each row costs the parser tens of microseconds on a busy
# core (65,113 llm-d queue rows: 2.9 s), so a body of small rows under the byte cap could still hold
# the cycle; the rows past it are not read (the body is cut there, counted as the input anomaly
# aux_rows_cut). A LiteLLM body of 30 agent sessions has 1,291 such rows.
AUX_MAX_ROWS = 20_000

Sample = tuple[str, dict, float]


@dataclass(frozen=True)
class BodySamples:
    """The wanted samples of one body, at most `AUX_MAX_ROWS` of them; `cut`: rows past it left unread."""
    rows: tuple[Sample, ...]
    cut: bool = False

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.rows)


def read_samples(text: str, sample_names: Optional[set[str]] = None, max_rows: int = AUX_MAX_ROWS) -> BodySamples:
    """The wanted samples of the text (the project's parser, monitor/kit/exposition.py), the first
    `max_rows` of them. A body that does not parse raises ValueError saying so."""
    try:
        parsed = exposition.parse(text, wanted=sample_names, max_samples=max_rows)
    except ValueError as exc:
        raise ValueError(f"gateway exposition does not parse: {exc}") from exc
    rows = tuple((name, labels, float(value)) for name, items in parsed.samples.items() for labels, value in items)
    return BodySamples(rows, bool(parsed.cut))


def iter_samples(text: str, sample_names: Optional[set[str]] = None) -> Iterator[Sample]:
    """(sample name, labels, value) for the wanted samples of the text (`read_samples`: the first
    AUX_MAX_ROWS). A body that does not parse raises ValueError saying so."""
    return iter(read_samples(text, sample_names).rows)
