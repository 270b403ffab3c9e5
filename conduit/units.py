"""Physical quantities: bytes, bandwidth and time, parsed from numbers or unit strings.

Topology files and workload presets state hardware numbers the way datasheets do (``"400 Gb/s"``,
``"80 GiB"``, ``"2 us"``). Internally Conduit uses base units only: bytes, bytes per second and
seconds, as floats. The rules that bite in practice:

* capital ``B`` is a byte, lower-case ``b`` a bit (``400 Gb/s`` is 50e9 B/s, ``25 GB/s`` is 25e9 B/s);
* ``k/M/G/T`` are powers of 1000, ``Ki/Mi/Gi/Ti`` powers of 1024;
* ``ns``, ``us`` (or ``µs``), ``ms`` and ``s`` are times.

A bare number is already in base units. A string whose unit is of another kind than the field
expects (``"80 GiB"`` for a bandwidth) is an error, not a guess.
"""

from __future__ import annotations

import math
import re
from enum import Enum

from conduit.errors import UnitError, shown


class Kind(str, Enum):
    """What a quantity measures; decides which units are accepted."""

    BYTES = "bytes"
    BANDWIDTH = "bandwidth"
    TIME = "time"


_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}


def _unit_table() -> dict[str, tuple[Kind, float]]:
    table: dict[str, tuple[Kind, float]] = {}
    for prefix, scale in {**_DECIMAL, **_BINARY}.items():
        table[f"{prefix}B"] = (Kind.BYTES, scale)
        table[f"{prefix}B/s"] = (Kind.BANDWIDTH, scale)
        table[f"{prefix}b/s"] = (Kind.BANDWIDTH, scale / 8.0)
        table[f"{prefix}bit/s"] = (Kind.BANDWIDTH, scale / 8.0)
        if prefix in _DECIMAL:
            table[f"{prefix}Bps"] = (Kind.BANDWIDTH, scale)
            table[f"{prefix}bps"] = (Kind.BANDWIDTH, scale / 8.0)
    table["Kbps"] = (Kind.BANDWIDTH, 1e3 / 8.0)
    for unit, scale in _TIME.items():
        table[unit] = (Kind.TIME, scale)
    return table


UNITS: dict[str, tuple[Kind, float]] = _unit_table()

_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµμ/]+)?\s*$")


def parse_quantity(value: object, kind: Kind | str) -> float:
    """Return ``value`` in base units of ``kind`` (bytes, bytes/s or seconds).

    ``value`` is a number (taken as base units) or a string with a number and a unit. Raises
    :class:`UnitError` for anything else: non-numeric text, an unknown unit, a unit of another
    kind, NaN or infinity. Sign checks are the caller's: a latency of 0 is fine, a bandwidth of 0
    is not, and only the caller knows which it holds.
    """
    kind = Kind(kind)
    if isinstance(value, bool):
        raise UnitError(f"expected a {kind.value} quantity, got a boolean {shown(value)}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        # no quantity is longer; the bound keeps the regular expression's backtracking short
        match = _QUANTITY.match(value) if len(value) <= 100 else None
        if not match:
            raise UnitError(f"cannot parse {shown(value)} as a {kind.value} quantity")
        number, unit = float(match.group(1)), match.group(2)
        if unit is not None:
            if unit not in UNITS:
                raise UnitError(f"unknown unit {shown(unit)} in {shown(value)}")
            unit_kind, scale = UNITS[unit]
            if unit_kind is not kind:
                raise UnitError(
                    f"{shown(value)} is a {unit_kind.value} quantity, expected {kind.value}"
                )
            number *= scale
    else:
        raise UnitError(f"expected a {kind.value} quantity, got {type(value).__name__} {shown(value)}")
    if not math.isfinite(number):
        raise UnitError(f"{shown(value)} is not a finite {kind.value} quantity")
    return number


def kind_of_field(name: str) -> Kind | None:
    """The quantity kind a field holds, from its name (see docs/topology-format.md)."""
    if name.endswith("bandwidth"):
        return Kind.BANDWIDTH
    if name == "latency" or name.endswith(("_latency", "overhead", "_time")):
        return Kind.TIME
    if name in ("capacity", "memory") or name.endswith(("_capacity", "_bytes", "_memory")):
        return Kind.BYTES
    return None


def format_quantity(value: float, kind: Kind | str) -> str:
    """A short human form: ``GB/s`` for bandwidth, ``GiB`` for sizes, ``us``/``ms`` for time."""
    kind = Kind(kind)
    if kind is Kind.TIME:
        for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {unit}"
        return f"{value / 1e-9:.3g} ns"
    if kind is Kind.BANDWIDTH:
        for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
            if abs(value) >= scale:
                return f"{value / scale:.4g} {unit}"
        return f"{value:.4g} B/s"
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} B"
