"""Kubernetes resource quantities ("100m", "1.5", "64Mi", "1e3") parsed exactly, as the API server does."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

# Exact multipliers of each suffix; "" is the plain number. "K" is deliberately absent: Kubernetes
# spells kilo "k" and kibi "Ki", and rejects "1K".
_SUFFIX_MULTIPLIER: dict[str, Decimal] = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)

# Kubernetes stores quantities in an int64 of the smallest unit; beyond that nothing can use them.
_LIMIT = Decimal(2) ** 63
_MAX_EXPONENT = 30  # 1e30 already exceeds the limit; bounding it keeps Decimal arithmetic cheap


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity into an exact Decimal (cores for CPU, bytes for memory); ValueError if malformed.

    YAML gives bare numbers (`cpu: 2`, `cpu: 0.5`) as int/float; those are accepted like the API server's
    JSON decoding does. Booleans are not quantities.
    """
    if isinstance(value, bool):
        raise ValueError(f"quantity must be a string or a number, not {value!r}")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"quantity {value!r} is not a finite number")
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"quantity must be a string or a number, not {type(value).__name__}")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(
            f"quantity {text!r} does not match a number with an optional suffix "
            "(n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent like e3)"
        )
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"quantity {text!r} is out of range")
        multiplier = Decimal(10) ** exponent
    else:
        multiplier = _SUFFIX_MULTIPLIER[suffix]
    try:
        result = Decimal(match["number"]) * multiplier
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid numbers
        raise ValueError(f"quantity {text!r} is not a number") from exc
    if abs(result) >= _LIMIT:
        raise ValueError(f"quantity {text!r} is out of range")
    return result


def to_int_ceil(quantity: Decimal) -> int:
    """The whole-unit value, rounded up as Kubernetes' Quantity.Value() does ("1.5" bytes -> 2)."""
    return math.ceil(quantity)


def to_millis_ceil(quantity: Decimal) -> int:
    """Thousandths, rounded up as Quantity.MilliValue() does ("100m" CPU -> 100, "0.0001" -> 1)."""
    return math.ceil(quantity * 1000)


def parse_quantity_bytes(text: str) -> int:
    """A non-negative whole number of bytes from "10Mi", "1Gi", "100M" or "4096"; ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError(f'expected a size string like "10Mi", got {text!r}')
    quantity = parse_quantity(text)
    if quantity < 0:
        raise ValueError(f"size {text!r} must not be negative")
    return to_int_ceil(quantity)


def format_bytes(count: int) -> str:
    """The shortest exact spelling of a byte count: binary suffix if it divides, then decimal, else plain."""
    if count == 0:
        return "0"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIX_MULTIPLIER[suffix])
        if count % unit == 0:
            return f"{count // unit}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        unit = int(_SUFFIX_MULTIPLIER[suffix])
        if count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def cpu_quantity(millis: int) -> str:
    """CPU millis as a Kubernetes quantity, whole cores without a suffix ("2", "1500m")."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
