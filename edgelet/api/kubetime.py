"""Kubernetes time stamps as text: metav1.Time (whole seconds) and MicroTime, both UTC with a Z; RFC 3339 times
with nanoseconds (CRI log lines, sinceTime) read to integer nanoseconds."""

from __future__ import annotations

import calendar
import time
from datetime import UTC, datetime

_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
# The last second formatted and its text: the stamps of one second (every condition, event and start time
# of a burst of pods) then share one string instead of each status and event cache holding its own.
_last_formatted: tuple[int, str] = (-1, "")


def format_time(seconds: float) -> str:
    """metav1.Time: `2026-01-01T00:00:00Z` (fractions are dropped, as the API does)."""
    global _last_formatted
    whole = int(seconds)
    last = _last_formatted  # one read: another thread may replace it meanwhile, never tear it
    if last[0] == whole:
        return last[1]
    text = time.strftime(_SECONDS, time.gmtime(whole))
    _last_formatted = (whole, text)
    return text


def format_micro_time(seconds: float) -> str:
    """metav1.MicroTime: `2026-01-01T00:00:00.000000Z` (Lease renewTime, the config.seen annotation)."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    """Seconds since the epoch of a metav1.Time; ValueError when it is not one."""
    return float(calendar.timegm(time.strptime(text, _SECONDS)))


def parse_rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time with up to nine fraction digits; ValueError if not one."""
    head, dot, rest = text.partition(".")
    fraction = ""
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        fraction, rest = rest[:digits], rest[digits:]
        if not fraction or len(fraction) > 9:
            raise ValueError(f"{text!r} is not an RFC 3339 time")
    moment = datetime.fromisoformat(head + (rest.replace("Z", "+00:00") if rest else ""))
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return int(moment.timestamp()) * 1_000_000_000 + int(fraction.ljust(9, "0") or 0)
