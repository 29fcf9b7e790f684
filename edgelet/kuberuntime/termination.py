"""The order in which a pod's containers stop: sidecars outlive the app containers and stop in reverse order.

The kubelet's terminationOrdering: each running sidecar waits until every running app container and every
sidecar after it in the spec has stopped, but never past its grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection

from edgelet.api import podutil


def termination_dependencies(pod: podutil.Pod, running: Collection[str]) -> dict[str, set[str]]:
    """For each running sidecar, the running containers that must stop before it does (pure)."""
    apps = {spec.get("name", "") for spec in podutil.containers(pod)} & set(running)
    dependencies: dict[str, set[str]] = {}
    later_sidecars: set[str] = set()
    for spec in reversed(podutil.init_containers(pod)):
        name = spec.get("name", "")
        if not podutil.is_sidecar(spec) or name not in running:
            continue
        dependencies[name] = apps | later_sidecars
        later_sidecars = later_sidecars | {name}
    return dependencies


class TerminationOrdering:
    """Lets each container of a pod being killed wait for its turn; `stopped(name)` records each end."""

    def __init__(self, pod: podutil.Pod, running: Collection[str], clock: Callable[[], float] = time.monotonic):
        self._dependencies = termination_dependencies(pod, running)
        self._stopped = {name: asyncio.Event() for name in running}
        self._clock = clock

    async def wait_for_turn(self, name: str, timeout: float) -> float:
        """Waits until the containers `name` depends on have stopped or `timeout` passed; the seconds waited."""
        events = [self._stopped[d].wait() for d in self._dependencies.get(name, ()) if d in self._stopped]
        if not events:
            return 0.0
        began = self._clock()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*events)
        return self._clock() - began

    def stopped(self, name: str) -> None:
        event = self._stopped.get(name)
        if event is not None:
            event.set()
