"""The container runtime's health as the node sees it (the kubelet's runtime_state.go): the CRI Status verdict,
and whether the relist lost the runtime (containers that die with it did not crash)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgelet.container.runtime import RuntimeFeatures, RuntimeHandlerInfo
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

# What edgelet itself does with a handler's features: it refuses pods with hostUsers: false and
# recursiveReadOnly: Enabled mounts (admission.py), so the node reports neither whatever the runtime can do.
PASSES_USER_NAMESPACES = False
PASSES_RECURSIVE_READ_ONLY_MOUNTS = False
NETWORK_READY = "NetworkReady"


def runtime_features(reply: pb.StatusResponse) -> RuntimeFeatures:
    """The Node's runtimeHandlers and features from a CRI Status reply (empty from runtimes before them)."""
    return RuntimeFeatures(
        handlers=tuple(RuntimeHandlerInfo(
            name=handler.name,
            recursive_read_only_mounts=handler.features.recursive_read_only_mounts
            and PASSES_RECURSIVE_READ_ONLY_MOUNTS,
            user_namespaces=handler.features.user_namespaces and PASSES_USER_NAMESPACES,
        ) for handler in reply.runtime_handlers),
        supplemental_groups_policy=reply.features.supplemental_groups_policy,
    )


def network_readiness(reply: pb.StatusResponse) -> tuple[bool, str]:
    """(ready, why not) from a CRI Status reply's NetworkReady condition, in the kubelet's words (a missing
    condition is not ready, as for the kubelet)."""
    for condition in reply.status.conditions:
        if condition.type == NETWORK_READY:
            if condition.status:
                return True, ""
            break
    else:
        return False, "container runtime network not ready: <nil>"
    return False, (f"container runtime network not ready: {NETWORK_READY}=false reason:{condition.reason} "
                   f"message:{condition.message}")


class RuntimeState:
    def __init__(self, runtime: RuntimeClient, *, forget_crash_backoff: Callable[[], None]):
        self._runtime = runtime
        self._forget_crash_backoff = forget_crash_backoff
        self._listeners: list[Callable[[], None]] = []  # told when the readiness verdict flips
        self._health = (False, f"waiting for the container runtime at {runtime.endpoint}")
        self._network = (True, "")  # NetworkReady: nothing is said before the runtime answers
        self.checked = False  # whether a Status call has been answered or has failed yet
        self.lost = False  # the relist cannot reach the runtime (the sync loop watches it)
        self.features: RuntimeFeatures | None = None  # from the last Status reply

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener()` runs whenever the readiness verdict flips (the heartbeat is written at once)."""
        self._listeners.append(listener)

    def health(self) -> tuple[bool, str]:
        return self._health

    def network(self) -> tuple[bool, str]:
        """The runtime's NetworkReady as the kubelet words it: (False, "container runtime network not ready: ...")
        while the pod network is not set up (no CNI config yet); True while unknown or the runtime is down."""
        return self._network

    async def check(self) -> None:
        """The kubelet's runtime health: the CRI Status call, RuntimeReady and NetworkReady."""
        was = (self._health[0], self._network[0])
        self._health = await self._status()
        self.checked = True
        if self._network[0] != was[1]:
            if self._network[0]:
                log.info("container runtime network ready: pods on the pod network can start")
            else:
                log.warning("%s: only host-network pods start", self._network[1])
        if (self._health[0], self._network[0]) != was:
            for listener in self._listeners:
                listener()

    async def _status(self) -> tuple[bool, str]:
        try:
            reply = await self._runtime.status()
        except EdgeletError as exc:
            return False, f"container runtime is down: {exc}"
        self.features = runtime_features(reply)
        self._network = network_readiness(reply)
        failing = [f"{c.type}={c.status} ({c.reason}: {c.message})"
                   for c in reply.status.conditions if not c.status and c.type == "RuntimeReady"]
        return (False, "container runtime not ready: " + "; ".join(failing)) if failing else (True, "ok")

    async def version(self) -> str:
        try:
            reply = await self._runtime.version()
            return f"{reply.runtime_name} {reply.runtime_version}"
        except EdgeletError as exc:
            return f"unknown ({exc})"

    def note_lost(self, why: str) -> None:
        """Containers that die with the runtime did not crash: their restart back-off starts over, now and
        again once the runtime is back (attempts made while it was away must not count either)."""
        if not self.lost:
            self.lost = True
            log.warning("container runtime lost (%s): container restart back-off starts over", why)
        self._forget_crash_backoff()

    def note_back(self) -> bool:
        """The relist reaches the runtime; True when it had been lost (every pod is then synced at once)."""
        if not self.lost:
            return False
        self.lost = False
        self._forget_crash_backoff()
        log.info("container runtime reachable again: restarting pods without back-off")
        return True
