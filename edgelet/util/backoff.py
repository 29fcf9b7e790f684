"""Retry delays: per-key exponential backoff like the kubelet's flowcontrol.Backoff, and jittered reconnect
schedules."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    delay: float
    last_update: float


class Backoff:
    """Per-key doubling delays (initial, 2x, 4x ... capped at `maximum`).

    A key idle for more than 2 x `maximum` since its last failure starts over at `initial`, as in the kubelet
    (CrashLoopBackOff: 10 s doubling to 5 min, forgotten after 10 min of good behaviour). Pure apart from the
    injectable clock; not thread-safe (use it from the event loop).
    """

    def __init__(self, initial: float, maximum: float, *, clock: Callable[[], float] = time.monotonic):
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got initial={initial} maximum={maximum}")
        self.initial = initial
        self.maximum = maximum
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.last_update > 2 * self.maximum

    def next(self, key: Hashable, *, now: float | None = None) -> float:
        """Record a failure of `key` and return the delay to wait before its next attempt."""
        now = self._clock() if now is None else now
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, now):
            entry = self._entries[key] = _Entry(self.initial, now)
        else:
            entry.delay = min(entry.delay * 2, self.maximum)
            entry.last_update = now
        return entry.delay

    def delay(self, key: Hashable) -> float:
        """The current delay of `key` (0 when it has none)."""
        entry = self._entries.get(key)
        return entry.delay if entry is not None else 0.0

    def in_backoff(self, key: Hashable, *, since: float | None = None) -> bool:
        """Whether `key` must still wait. `since` is when the event happened (default: now); the kubelet passes
        the container's finish time so that a slow sync does not extend the wait."""
        return self.remaining(key, since=since) > 0

    def remaining(self, key: Hashable, *, since: float | None = None) -> float:
        """Seconds until `key` may be retried; 0 when it is not backing off."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        now = self._clock() if since is None else since
        if self._expired(entry, now):
            return 0.0
        return max(0.0, entry.last_update + entry.delay - now)

    def reset(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget every key (say, the failures were not the keys' own doing)."""
        self._entries.clear()

    def gc(self) -> None:
        """Forget every key that has been quiet long enough to start over anyway."""
        now = self._clock()
        for key in [key for key, entry in self._entries.items() if self._expired(entry, now)]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


class JitteredBackoff:
    """Reconnect delays that double from `initial` to `maximum`, jittered so that a fleet that lost its API server
    together does not return together. Two spreads, per loop:

    - "full" (the default): the n-th failure of a streak waits uniform in [0, min(maximum, initial * 2**n)].
      For loops that must be back within their own period (the Lease, the node status).
    - "reflector": uniform in [d, 2d] with d that doubling step, as client-go's reflector waits (jitter factor
      1.0) before it lists and watches again. At the cap a node retries every 45 s on average instead of 15, so
      an API server that comes back after an outage meets a third of the requests (the watches of the pod
      source and of ConfigMaps and Secrets).
    """

    SPREADS = ("full", "reflector")

    def __init__(self, initial: float = 0.8, maximum: float = 30.0, *, rng: random.Random | None = None,
                 spread: str = "full"):
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got initial={initial} maximum={maximum}")
        if spread not in self.SPREADS:
            raise ValueError(f"spread must be one of {self.SPREADS}, got {spread!r}")
        self.initial = initial
        self.maximum = maximum
        self.ceiling = 0.0  # the doubling step of the last delay; 0 before the first failure of a streak
        self._uniform = (rng or random.Random()).uniform
        self._from = 1.0 if spread == "reflector" else 0.0  # the low end of a delay, in steps

    def next(self, *, at_least: float = 0.0) -> float:
        """The delay after one more failure; `at_least` lifts the step (never beyond `maximum`)."""
        ceiling = self.ceiling * 2 if self.ceiling else self.initial
        self.ceiling = min(max(ceiling, at_least), self.maximum)
        return self._uniform(self._from * self.ceiling, (1.0 + self._from) * self.ceiling)

    def reset(self) -> None:
        """A success: the next failure starts again at `initial`."""
        self.ceiling = 0.0

