"""What the runtime manager remembers of its container creates and starts between syncs: those still under way in
the runtime (InFlight, awaited by compute_pod_actions) and those the runtime refused (held back for a while)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from edgelet.container.runtime import PodRuntimeStatus

from .actions import InFlight, in_flight_ended

# How long a create or start under way may show nothing before it is tried again. Trying again is safe, the
# runtime refuses a second create of a reserved name and a second start of a starting container; the wait spares
# it the calls.
IN_FLIGHT_PATIENCE_SECONDS = 10.0

# A container the runtime refused to create is tried again after the kubelet's pod worker back-off period (10 s,
# stretched by up to half of it), whatever else syncs the pod meanwhile; its sandbox stays.
CREATE_RETRY_SECONDS = 10.0
CREATE_RETRY_JITTER = 0.5


class StartLog:
    """Per pod uid and container name; the clock and the jitter's random source are injectable."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None):
        self._clock = clock
        self._rng = rng or random.Random()
        self._in_flight: dict[str, dict[str, InFlight]] = {}  # uid -> name -> its create or start under way
        self._refused: dict[tuple[str, str], tuple[float, str]] = {}  # (uid, name) -> (retry not before, why)

    def under_way(self, uid: str, name: str, attempt: int, container_id: str = "") -> None:
        """A create (no `container_id`) or start whose end the agent did not see."""
        self._in_flight.setdefault(uid, {})[name] = InFlight(name, attempt, container_id, self._clock())

    def pending(self, status: PodRuntimeStatus) -> list[InFlight]:
        """The pod's creates and starts still under way; those the runtime's state shows ended are forgotten, and
        those that showed nothing for IN_FLIGHT_PATIENCE_SECONDS are tried again."""
        under_way = self._in_flight.get(status.uid)
        if not under_way:
            return []
        now = self._clock()
        for name, op in list(under_way.items()):
            if in_flight_ended(op, status, now, IN_FLIGHT_PATIENCE_SECONDS):
                del under_way[name]
        if not under_way:
            del self._in_flight[status.uid]
        return list(under_way.values())

    def refused(self, uid: str, name: str, message: str) -> float:
        """The runtime refused to create the container; returns the seconds until it may be tried again."""
        delay = CREATE_RETRY_SECONDS * (1.0 + CREATE_RETRY_JITTER * self._rng.random())
        self._refused[(uid, name)] = (self._clock() + delay, message)
        return delay

    def created(self, uid: str, name: str) -> None:
        self._refused.pop((uid, name), None)

    def held_back(self, uid: str, name: str) -> tuple[float, str] | None:
        """(seconds left, the runtime's words) while the container's last refused create is too recent to retry."""
        refused = self._refused.get((uid, name))
        if refused is None:
            return None
        remaining = refused[0] - self._clock()
        return (remaining, refused[1]) if remaining > 0 else None

    def new_sandbox(self, uid: str) -> None:
        """What was under way belongs to the sandbox given up."""
        self._in_flight.pop(uid, None)

    def forget(self, uid: str) -> None:
        self._in_flight.pop(uid, None)
        for key in [key for key in self._refused if key[0] == uid]:
            del self._refused[key]
