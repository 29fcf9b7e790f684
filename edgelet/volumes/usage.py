"""What a volume directory uses on disk (the kubelet's DiskUsage: `du`-like bytes and inodes on one filesystem, as the
eviction manager measures emptyDirs), taken at most once a period per directory: a walk of a large volume costs I/O,
and /stats/summary is scraped often."""

from __future__ import annotations

import time
from typing import Callable

from ..eviction.usage import directory_usage

DEFAULT_PERIOD = 60.0  # the kubelet's volumeStatsAggPeriod


class UsageCache:
    """Each directory's usage, measured again once older than `period` seconds."""

    def __init__(self, period: float = DEFAULT_PERIOD, clock: Callable[[], float] = time.monotonic,
                 measure: Callable[[str], tuple[int, int]] = directory_usage):
        self.period = period
        self._clock = clock
        self._measure = measure
        self._taken: dict[str, tuple[float, tuple[int, int]]] = {}

    def usage(self, path: str) -> tuple[int, int]:
        """Blocking (a walk when stale): call from a thread."""
        now = self._clock()
        taken = self._taken.get(path)
        if taken is None or now - taken[0] >= self.period:
            taken = self._taken[path] = (now, self._measure(path))
        return taken[1]

    def forget_except(self, paths: set[str]) -> None:
        for path in [p for p in self._taken if p not in paths]:
            del self._taken[path]
