"""One meaning per unit, for every part that reads a rate, a size or a duration: the emulated cluster,
the simulator, the grid and the settings.

Why one module: the emulator and the simulator used to disagree ("mbps" was bytes in one and bits in the
other, a bare "100" was bit/s in one and byte/s in the other, a bare "3" was ms in one and s in the
other) while the grid handed both the same string.

* **Rates.** ``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit`` and ``bps``, ``kbps``, ``mbps``, ``gbps``,
  ``tbps`` are **bits** per second (networking's Mbps; note that tc itself reads ``mbps`` as megabytes,
  which is why pushpull always hands tc a number of bits). Bytes per second are written with a slash
  only: ``B/s``, ``KB/s``, ``MB/s``, ``GB/s``. A number with no unit in a string is refused (bits or
  bytes?); a number passed from code (int or float) is bytes per second.
* **Sizes.** Bytes: a bare number, or ``k``/``kb``, ``m``/``mb``, ``g``/``gb`` (decimal) and ``kib``,
  ``mib``, ``gib`` (binary).
* **Durations.** ``s``, ``ms``, ``us`` (``µs``), ``ns``. A number with no unit in a string is refused
  (tc would read ms, Python s); a number passed from code is seconds.

Units are case-insensitive except that nothing depends on case: ``10Gbps`` and ``10gbps`` are the same.
"""
from __future__ import annotations

import math
import re

RATE_UNITS = {  # -> bytes per second
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8, "tbps": 1e12 / 8,
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
}
SIZE_UNITS = {
    "": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3,
}
TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6, "µs": 1e-6, "ns": 1e-9}

_NUM = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"


def _parse(value, units: dict, what: str, arg: str, allow_inf: bool = False) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value)
    else:
        s = str(value).strip()
        if allow_inf and s.lower() in ("inf", "infinite", "infinity"):
            return math.inf
        m = re.fullmatch(_NUM + r"\s*([a-zA-Zµ/]*)", s)
        if not m:
            raise ValueError(f"{arg}: cannot parse {value!r} as a {what}")
        key = m.group(2).lower()
        if key not in units:
            known = ", ".join(sorted(k for k in units if k))
            if not key:
                raise ValueError(f"{arg}: {value!r} has no unit; a {what} needs one of {known}")
            raise ValueError(f"{arg}: unknown unit {m.group(2)!r} in {value!r} (expected one of {known})")
        v = float(m.group(1)) * units[key]
    if v < 0 or math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{arg}: {what} must be a finite number >= 0, got {value!r}")
    return v


def rate_bytes(value, arg: str = "rate", allow_inf: bool = False) -> float:
    """``100mbit``, ``25Gbps``, ``1.25GB/s`` -> bytes per second (> 0)."""
    v = _parse(value, RATE_UNITS, "rate", arg, allow_inf=allow_inf)
    if v == 0:
        raise ValueError(f"{arg}: a rate must be > 0, got {value!r}")
    return v


def rate_bits(value, arg: str = "rate") -> float:
    """The same, in bits per second (what tc is given)."""
    return rate_bytes(value, arg) * 8


def size_bytes(value, arg: str = "size") -> int:
    """``4MB``, ``4096000``, ``64MiB`` -> bytes."""
    return int(round(_parse(value, SIZE_UNITS, "size", arg)))


def duration_s(value, arg: str = "duration") -> float:
    """``50us``, ``1ms``, ``0.2s`` -> seconds."""
    return _parse(value, TIME_UNITS, "duration", arg)


def format_rate(bytes_per_s: float) -> str:
    """bytes/s -> ``10gbit`` style (the inverse of :func:`rate_bytes` for round numbers); ``inf``."""
    if math.isinf(bytes_per_s):
        return "inf"
    bits = bytes_per_s * 8
    for unit, f in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= f:
            return f"{bits / f:g}{unit}"
    return f"{bits:g}bit"


def format_size(n: float | None) -> str:
    """bytes -> ``4.096MB`` style (decimal, 4 significant digits); ``inf`` for None or infinity."""
    if n is None or math.isinf(n):
        return "inf"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.4g}{unit}"
    return f"{n:g}B"
