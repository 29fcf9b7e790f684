"""The pod cache (the kubelet's container/cache.go): each pod's runtime status, or the error inspecting it, with
the time it was observed.

The PLEG is its only writer. A status observed earlier never replaces one observed later, whichever write
lands last, so a relist that started before a worker's inspection cannot undo what the inspection saw.
Readers may wait for an observation newer than a time (`get_newer_than`), as the kubelet's pod workers do: a
failed inspection is such an observation too, and the reader gets its error instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from edgelet.container.runtime import PodRuntimeStatus
from edgelet.util.errors import EdgeletError


class InspectionError(EdgeletError):
    """The runtime could not be asked about the pod; `last_known` is its status as last observed."""

    def __init__(self, uid: str, message: str, last_known: PodRuntimeStatus):
        super().__init__(f"inspecting pod {uid} failed: {message}")
        self.last_known = last_known


class PodCache:
    def __init__(self, *, vouch: Callable[[], float | None] | None = None) -> None:
        """`vouch()` returns a time as of which every cached status holds, when its writer knows one without
        looking again (an event-driven PLEG whose stream is live and quiet), else None: a reader waiting for a newer
        observation asks it before it waits."""
        self._vouch = vouch
        self._pods: dict[str, PodRuntimeStatus] = {}
        self._errors: dict[str, tuple[str, float]] = {}  # uid -> (why its last inspection failed, when)
        # Every pod's status is at least this fresh: a relist that saw no change to a pod still proves
        # that its cached status held when the relist began.
        self._global_timestamp = 0.0
        self._changed = asyncio.Event()  # set and replaced on every change
        self.writes = 0  # statuses stored or pods forgotten so far: what was derived from the cache is stale

    def get(self, uid: str) -> PodRuntimeStatus:
        return self._pods.get(uid) or PodRuntimeStatus(uid=uid)

    def error(self, uid: str) -> str | None:
        """Why the pod's newest inspection failed; None when it succeeded."""
        failure = self._errors.get(uid)
        return failure[0] if failure is not None else None

    def _observed_at(self, uid: str) -> float | None:
        current = self._pods.get(uid)
        failure = self._errors.get(uid)
        times = [t for t in (current.timestamp if current is not None else None,
                             failure[1] if failure is not None else None) if t is not None]
        return max(times) if times else None

    def set(self, status: PodRuntimeStatus) -> bool:
        """Stores `status` unless the cache holds an observation made later; True when stored."""
        observed = self._observed_at(status.uid)
        if observed is not None and observed > status.timestamp:
            return False
        self._pods[status.uid] = status
        self._errors.pop(status.uid, None)
        self.writes += 1
        self._notify()
        return True

    def set_error(self, uid: str, message: str, observed_at: float) -> bool:
        """Stores a failed inspection of the pod unless the cache holds an observation made later."""
        observed = self._observed_at(uid)
        if observed is not None and observed > observed_at:
            return False
        self._errors[uid] = (message, observed_at)
        self._notify()
        return True

    def delete(self, uid: str, observed_at: float) -> None:
        """Forgets a pod the runtime no longer has, unless it was seen again after `observed_at`."""
        observed = self._observed_at(uid)
        if observed is not None and observed <= observed_at:
            self._pods.pop(uid, None)
            self._errors.pop(uid, None)
            self.writes += 1

    def uids(self) -> list[str]:
        return list(self._pods.keys() | self._errors.keys())

    def update_time(self, timestamp: float) -> None:
        """Marks every pod's observation valid as of `timestamp` (called after each relist)."""
        if timestamp > self._global_timestamp:
            self._global_timestamp = timestamp
            self._notify()

    def is_newer_than(self, uid: str, minimum: float) -> bool:
        observed = self._observed_at(uid)
        if observed is not None and observed > minimum:
            return True
        return self._global_timestamp > minimum

    async def get_newer_than(self, uid: str, minimum: float) -> PodRuntimeStatus:
        """The pod's status once the cache holds an observation made after `minimum`; InspectionError when that
        observation is a failed inspection."""
        while not self.is_newer_than(uid, minimum):
            vouched = self._vouch() if self._vouch is not None else None
            if vouched is not None and vouched > minimum:
                self.update_time(vouched)
                continue
            await self._changed.wait()
        failure = self._errors.get(uid)
        if failure is not None:
            raise InspectionError(uid, failure[0], self.get(uid))
        return self.get(uid)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
