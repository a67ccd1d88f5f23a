"""DCGM exporter bodies -> the GPU power series headroom reads (parsing only; the join of a series
to a pool is monitor/capacity/power.py).

    read_dcgm(text, target) -> DcgmReading (monitor/model/readings.py, the pure core's input type)

Only the power families are parsed (DCGM_FI_DEV_POWER_USAGE, watts, gauge; dcgm_power_usage in
1.x-compatible exporters); a body that does not parse, or that was cut short, raises ValueError
naming the target, and the cycle leaves that exporter out.
"""
from __future__ import annotations

from typing import Optional

from monitor.kit import exposition
from monitor.model.readings import POWER_NAMES, DcgmReading

from .aux_samples import AUX_MAX_ROWS, too_large


def read_dcgm(text: str, target: str, cut: Optional[list] = None) -> DcgmReading:
    """The power samples of one exporter's body, the first AUX_MAX_ROWS of them (`cut`, a list, gets
    True appended when rows past them were left unread)."""
    if too_large(text, "DCGM"):
        raise ValueError(f"dcgm {target}: {too_large(text, 'DCGM')}")
    try:
        parsed = exposition.parse(text, wanted=POWER_NAMES, max_samples=AUX_MAX_ROWS)
    except ValueError as exc:
        raise ValueError(f"dcgm {target}: exposition does not parse: {exc}") from exc
    if parsed.cut and cut is not None:
        cut.append(True)
    return DcgmReading(target, tuple((name, labels, float(value))
                                     for name, items in parsed.samples.items() for labels, value in items))
