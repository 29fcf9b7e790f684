"""Kubernetes resource quantities ("100m", "1.5", "64Mi", "1e3") parsed exactly, as the API server does.

A quantity is held as a whole number of nano-units (billionths of a core, of a byte): Kubernetes keeps every
quantity to the nano, rounding a finer one up (away from zero), so integers carry it exactly.
"""

from __future__ import annotations

import math
import re

# Nano-units in one unit.
NANO = 10**9

# Binary suffixes multiply by a power of two; decimal suffixes are a power of ten ("" is the plain number). "K" is
# deliberately absent: Kubernetes spells kilo "k" and kibi "Ki", and rejects "1K".
_BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<whole>[0-9]+)(?:\.(?P<fraction>[0-9]*))?|\.(?P<bare_fraction>[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)

# Kubernetes stores quantities in an int64 of the smallest unit; beyond that nothing can use them.
_LIMIT = 2**63 * NANO
_MAX_EXPONENT = 30  # 1e30 already exceeds the limit; bounding it keeps the powers of ten small


def parse_quantity(value: str | int | float) -> int:
    """Parse a quantity into nano-units (of cores for CPU, of bytes for memory); ValueError if malformed.

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
    fraction = match["fraction"] or match["bare_fraction"] or ""
    digits = int((match["whole"] or "") + fraction)
    suffix = match["suffix"] or ""
    if suffix in _DECIMAL_SUFFIX:
        exponent = _DECIMAL_SUFFIX[suffix]
    elif suffix in _BINARY_SUFFIX:
        exponent, digits = 0, digits * _BINARY_SUFFIX[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"quantity {text!r} is out of range")
    # digits x 10**(exponent - len(fraction)) units, in nano-units: a negative power of ten is a division, whose
    # remainder rounds the magnitude up.
    power = exponent - len(fraction) + 9
    magnitude = digits * 10**power if power >= 0 else -(-digits // 10**-power)
    if magnitude >= _LIMIT:
        raise ValueError(f"quantity {text!r} is out of range")
    return -magnitude if match["sign"] == "-" else magnitude


def to_int_ceil(nanos: int) -> int:
    """The whole-unit value, rounded up as Kubernetes' Quantity.Value() does ("1.5" bytes -> 2)."""
    return -(-nanos // NANO)


def to_millis_ceil(nanos: int) -> int:
    """Thousandths, rounded up as Quantity.MilliValue() does ("100m" CPU -> 100, "0.0001" -> 1)."""
    return -(-nanos // (NANO // 1000))


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
        unit = _BINARY_SUFFIX[suffix]
        if count % unit == 0:
            return f"{count // unit}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        unit = 10 ** _DECIMAL_SUFFIX[suffix]
        if count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def cpu_quantity(millis: int) -> str:
    """CPU millis as a Kubernetes quantity, whole cores without a suffix ("2", "1500m")."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
