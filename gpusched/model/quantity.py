"""Kubernetes resource quantities, parsed exactly.

The model keeps CPU in millicores and memory in MiB.  Requests are rounded
*up* and capacities *down* when converted, so a rounding error can never make
a plan over-commit a node.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = ["MAX_UNITS", "QuantityError", "cpu_milli", "memory_mib", "parse_quantity"]

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_MIB = Decimal(2**20)
_MAX = Decimal(2**63 - 1)
"""The largest quantity in base units (bytes, cores, devices) that a node or pod can hold."""


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would not accept."""


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "1.5", "16Gi", "1e3") into a Decimal."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):  # null, a list, a mapping
        raise QuantityError(f"quantity must be a number or string, got {text!r}")
    if isinstance(text, int | float):
        if isinstance(text, int) and text > _MAX:
            raise _too_large(text)
        value = Decimal(str(text))
        if not value.is_finite():
            raise QuantityError(f"invalid quantity {text!r}: must be a finite number")
        if value < 0:
            raise QuantityError(f"invalid quantity {text!r}: must not be negative")
        if value > _MAX:
            raise _too_large(text)
        return value
    s = text.strip()
    match = _QUANTITY.match(s)
    if match is None:
        raise QuantityError(
            f"invalid quantity {text!r}: expected a number with an optional suffix such as 500m, 2, 16Gi or 1e3"
        )
    number, suffix = match.group(1), match.group(2) or ""
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # e.g. "1.2.3"
        raise QuantityError(f"invalid quantity {text!r}: {number!r} is not a number") from exc
    if value < 0:
        raise QuantityError(f"invalid quantity {text!r}: must not be negative")
    if value.adjusted() > 40:  # over 2**63 whatever the suffix; multiplying could overflow
        raise _too_large(text)
    value *= _SUFFIXES[suffix]
    if value > _MAX:
        raise _too_large(text)
    return value


def _too_large(text: object, limit: str = "2^63-1 in base units") -> QuantityError:
    return QuantityError(f"invalid quantity {text!r}: too large (at most {limit})")


def _round(value: Decimal, up: bool) -> int:
    return math.ceil(value) if up else math.floor(value)


MAX_UNITS = 1 << 50
"""The most millicores or MiB a quantity may come to (a million times any machine): what the
books add up per node stays far inside 64-bit integers."""


def _units(value: Decimal, text: object, up: bool) -> int:
    units = _round(value, up)
    if units > MAX_UNITS:
        raise _too_large(text, "2^50 millicores or MiB")
    return units


def cpu_milli(text: str | int | float, *, round_up: bool = True) -> int:
    """CPU quantity in millicores (requests round up, capacities round down)."""
    return _units(parse_quantity(text) * 1000, text, round_up)


def memory_mib(text: str | int | float, *, round_up: bool = True) -> int:
    """Memory quantity in MiB (requests round up, capacities round down)."""
    return _units(parse_quantity(text) / _MIB, text, round_up)
