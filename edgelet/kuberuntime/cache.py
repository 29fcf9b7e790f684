"""The pod cache (the kubelet's container/cache.go): each pod's runtime status with the time it was observed.

The PLEG is its only writer. A status observed earlier never replaces one observed later, whichever write
lands last, so a relist that started before a worker's inspection cannot undo what the inspection saw.
Readers may wait for a status newer than a time (`get_newer_than`), as the kubelet's pod workers do.
"""

from __future__ import annotations

import asyncio

from .types import PodRuntimeStatus


class PodCache:
    def __init__(self) -> None:
        self._pods: dict[str, PodRuntimeStatus] = {}
        # Every pod's status is at least this fresh: a relist that saw no change to a pod still proves
        # that its cached status held when the relist began.
        self._global_timestamp = 0.0
        # Pods the last relist failed to inspect: the global timestamp vouches for every pod but these.
        self._unproven: frozenset[str] = frozenset()
        self._changed = asyncio.Event()  # set and replaced on every change

    def get(self, uid: str) -> PodRuntimeStatus:
        return self._pods.get(uid) or PodRuntimeStatus(uid=uid)

    def set(self, status: PodRuntimeStatus) -> bool:
        """Stores `status` unless the cache holds one observed later; True when stored."""
        current = self._pods.get(status.uid)
        if current is not None and current.timestamp > status.timestamp:
            return False
        self._pods[status.uid] = status
        self._notify()
        return True

    def delete(self, uid: str, observed_at: float) -> None:
        """Forgets a pod the runtime no longer has, unless it was seen again after `observed_at`."""
        current = self._pods.get(uid)
        if current is not None and current.timestamp <= observed_at:
            del self._pods[uid]

    def uids(self) -> list[str]:
        return list(self._pods)

    def update_time(self, timestamp: float, *, except_uids: frozenset[str] | set[str] = frozenset()) -> None:
        """Marks every pod's status valid as of `timestamp` (called after each relist), except the pods in
        `except_uids`, whose inspection failed: their readers wait for a successful one, while one broken pod
        does not hold back the workers of all the others."""
        self._unproven = frozenset(except_uids)
        if timestamp > self._global_timestamp:
            self._global_timestamp = timestamp
            self._notify()

    def is_newer_than(self, uid: str, minimum: float) -> bool:
        current = self._pods.get(uid)
        if current is not None and current.timestamp > minimum:
            return True
        return self._global_timestamp > minimum and uid not in self._unproven

    async def get_newer_than(self, uid: str, minimum: float) -> PodRuntimeStatus:
        """The pod's status once the cache holds one observed after `minimum`."""
        while not self.is_newer_than(uid, minimum):
            await self._changed.wait()
        return self.get(uid)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
