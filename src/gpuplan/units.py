"""Units: parsing and formatting of durations, bytes and money.

Core code works in base units (bytes, seconds, FLOP, currency units); only this
module and the report layer convert. GiB is 2**30 bytes, GB is 10**9 bytes;
parameter counts use powers of 1000.
"""

from __future__ import annotations

import math
import re

GIB = 2**30
MIB = 2**20
GB = 10**9

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d|w)?\s*$")
_DURATION_UNITS_S = {
    "ms": 0.001,
    "s": 1.0,
    None: 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}


def parse_duration_s(value: str | int | float, *, field: str = "duration") -> float:
    """Parse a duration such as ``90s``, ``10m``, ``24h`` or ``7d`` into seconds.

    A bare number is seconds. Raises ``ValueError`` naming ``field`` otherwise.

    >>> parse_duration_s("10m")
    600.0
    >>> parse_duration_s(90)
    90.0
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a duration like 90s, 10m, 24h or 7d, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value))
        if not match:
            raise ValueError(
                f"{field}: expected a duration like 90s, 10m, 24h or 7d, got {value!r}"
            )
        seconds = float(match.group(1)) * _DURATION_UNITS_S[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{field}: duration must be a finite number >= 0, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Format seconds for people: ``45s``, ``12.5m``, ``3.2h``, ``4.1d``.

    >>> format_duration(5400)
    '1.5h'
    """
    if seconds < 120:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.2g}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def format_bytes(n: float) -> str:
    """Format a byte count in binary units.

    >>> format_bytes(80 * 2**30)
    '80.0 GiB'
    """
    if n < MIB:
        return f"{n / 1024:.1f} KiB"
    if n < GIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / GIB:.1f} GiB"


def format_count(n: float) -> str:
    """Format a parameter or token count with decimal suffixes.

    >>> format_count(8_030_261_248)
    '8.03B'
    """
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}"
