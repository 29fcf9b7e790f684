"""Kubernetes time stamps as text: metav1.Time (whole seconds) and MicroTime, both UTC with a Z."""

from __future__ import annotations

import calendar
import time
from datetime import datetime, timezone

_SECONDS = "%Y-%m-%dT%H:%M:%SZ"


def format_time(seconds: float) -> str:
    """metav1.Time: `2026-01-01T00:00:00Z` (fractions are dropped, as the API does)."""
    return time.strftime(_SECONDS, time.gmtime(int(seconds)))


def format_micro_time(seconds: float) -> str:
    """metav1.MicroTime: `2026-01-01T00:00:00.000000Z` (Lease renewTime, the config.seen annotation)."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    """Seconds since the epoch of a metav1.Time; ValueError when it is not one."""
    return float(calendar.timegm(time.strptime(text, _SECONDS)))
