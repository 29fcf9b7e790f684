"""Hands the C heap's free pages back to the system (glibc's malloc_trim) from the housekeeping pass.

grpc's threads and a burst of pod syncs leave freed memory inside glibc's heaps that malloc keeps resident;
trimming now and then returns it (about 0.8 MiB at 110 pods, docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Callable

from edgelet import libc

TRIM_INTERVAL = 30.0  # seconds between trims: each walks the heaps' free lists, well under a millisecond


def trim_due(now: float, next_trim: float) -> bool:
    """Whether a housekeeping pass at `now` trims (the first pass does: the start-up's peak is behind it)."""
    return now >= next_trim


def libc_malloc_trim() -> Callable[[], bool] | None:
    """glibc's malloc_trim(0) as a function saying whether memory went back; None where the C library has
    none (musl)."""
    return libc.malloc_trim if libc.HAVE_MALLOC_TRIM else None


class HeapTrimmer:
    """Trims at most once every `interval` seconds, when the housekeeping pass asks."""

    def __init__(self, trim: Callable[[], bool] | None, interval: float = TRIM_INTERVAL):
        self._trim = trim
        self._interval = interval
        self._next_trim = float("-inf")

    def maybe_trim(self, now: float) -> bool:
        """Trims if one is due; True when it ran."""
        if self._trim is None or not trim_due(now, self._next_trim):
            return False
        self._next_trim = now + self._interval
        self._trim()
        return True
