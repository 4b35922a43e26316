"""Bytes in and out: reading ``lms.limit``, printing sizes and shapes.

Printed sizes are SI (1 GB = 1e9 bytes; any size: :func:`brats_seg.files.format_bytes`, which
every message shares); :func:`parse_limit` reads both ``GB`` (1e9) and ``GiB`` (2**30).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["format_duration", "format_gb", "format_seconds", "format_shape", "parse_limit"]


def format_gb(nbytes: float) -> str:
    """Bytes in GB with two decimals, as plans and their errors print budgets: ``12.35 GB``."""
    return f"{nbytes / 1e9:.2f} GB"


def format_seconds(seconds: float | None) -> str:
    """A step's time: ``12.3 s`` from a second on, ``85.5 ms`` below; ``-`` for None."""
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def format_duration(seconds: float | None) -> str:
    """A run's or an epoch's time: ``850 ms``, ``12.3 s``, ``2 min 30 s``, ``3 h 05 min``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return format_seconds(seconds)
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h {rest:02d} min"


def format_shape(shape: Sequence[int]) -> str:
    """``192x224x160``."""
    return "x".join(str(s) for s in shape)


_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_LIMIT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_limit(text: str | int | float, device_bytes: int | None) -> int:
    """Parse ``lms.limit`` into bytes.

    Args:
        text: ``"16GB"`` (1e9), ``"16GiB"`` (2**30), ``"512MB"``, ``"1.5e10"`` or
            ``"12345"`` (bytes), or a fraction ``"0.8"`` (a plain number <= 1.0 is a
            fraction of ``device_bytes``).
        device_bytes: device memory (RAM on CPU); needed only for fractions.

    Returns:
        The budget in bytes (> 0).

    Raises:
        ValueError: unreadable text, an unknown unit, a non-positive budget, or a
            fraction without ``device_bytes``.
    """
    if isinstance(text, bool):
        raise ValueError(f"lms.limit must be bytes, a size like '16GB', or a fraction like '0.8', got {text!r}.")
    raw = str(text)
    match = _LIMIT_RE.match(raw)
    if not match:
        raise ValueError(
            f"lms.limit {raw!r} is not a size: use bytes ('12345', '1.5e10'), a size with a unit "
            f"({', '.join(u.upper().replace('I', 'i') for u in _UNITS if u != 'b')}, e.g. '16GB'), "
            f"or a fraction of device memory ('0.8')."
        )
    value, unit = float(match.group(1)), match.group(2).lower()
    if unit:
        if unit not in _UNITS:
            raise ValueError(
                f"lms.limit {raw!r}: unknown unit {match.group(2)!r}; use B, kB, MB, GB, TB (powers of 1000) "
                f"or KiB, MiB, GiB, TiB (powers of 1024)."
            )
        nbytes = int(value * _UNITS[unit])
    elif value <= 1.0:
        if not device_bytes or device_bytes <= 0:
            raise ValueError(
                f"lms.limit {raw!r} is a fraction of device memory, but the device size is unknown; "
                f"give the limit in bytes or with a unit (e.g. '16GB')."
            )
        nbytes = int(value * device_bytes)
    else:
        nbytes = int(value)
    if nbytes <= 0:
        raise ValueError(f"lms.limit {raw!r} gives {nbytes} bytes; the budget must be positive.")
    return nbytes
