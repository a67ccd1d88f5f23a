"""DCGM exporter bodies -> the GPU power series headroom reads (parsing only; the join of a series
to a pool is monitor/capacity/power.py).

    read_dcgm(text, target) -> DcgmReading (monitor/readings.py, the pure core's input type)

Only the power families are parsed (DCGM_FI_DEV_POWER_USAGE, watts, gauge; dcgm_power_usage in
1.x-compatible exporters); a body that does not parse, or that was cut short, raises ValueError
naming the target, and the cycle leaves that exporter out.
"""
from __future__ import annotations

from monitor.readings import POWER_NAMES, DcgmReading

from monitor.kit import exposition
from .aux_samples import too_large


def read_dcgm(text: str, target: str) -> DcgmReading:
    if too_large(text, "DCGM"):
        raise ValueError(f"dcgm {target}: {too_large(text, 'DCGM')}")
    try:
        parsed = exposition.parse(text, wanted=POWER_NAMES)
    except ValueError as exc:
        raise ValueError(f"dcgm {target}: exposition does not parse: {exc}") from exc
    return DcgmReading(target, tuple((name, labels, float(value))
                                     for name, items in parsed.samples.items() for labels, value in items))
