"""Numbers as text without a negative zero: a value that rounds to zero is printed unsigned.

`-0.0` (a sum of tiny negative floats, an increase extrapolated a hair below zero, `-x` of 0) and any
value that rounds to zero at the precision shown (-0.004 at two digits) read "0.00", never "-0.00",
wherever headroom prints or exports a number (the landing page, the digest, the plan, the JSON,
/metrics: `unsigned`). Python 3.11's `z` format option does the same; headroom also runs on 3.10.
"""
from __future__ import annotations

from typing import Optional, overload


@overload
def unsigned(x: float) -> float: ...
@overload
def unsigned(x: None) -> None: ...
def unsigned(x: Optional[float]) -> Optional[float]:
    """-0.0 -> 0.0; every other value (None, NaN, infinities included) as it is."""
    return x + 0.0 if isinstance(x, float) and x == 0.0 else x


def fixed(x: float, spec: str) -> str:
    """format(x, spec) with no sign on a result that reads as zero ("-0.00" -> "0.00", "-0%" -> "0%")."""
    text = format(x, spec)
    if text.startswith("-") and len(text) > 1 and text[1].isdigit() and not any(c in "123456789" for c in text):
        return text[1:]
    return text
