"""The hollow node's runtime: pods "start" the moment they are added, and their state goes through the
agent's own status pipeline (generate_pod_status -> StatusManager -> StatusSyncer), as podsync.py does.

The runtime state of a started pod (`started`) is a pure function apart from the loop applying updates.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState, SandboxStatus
from edgelet.events import NO_EVENTS, NORMAL, Recorder, pod_ref
from edgelet.podconfig.config import Op, PodConfig, PodUpdate
from edgelet.status.generate import generate_pod_status
from edgelet.status.manager import StatusManager

_NANOS = 1_000_000_000


def started(pod: Pod, now: float) -> PodRuntimeStatus:
    """A ready sandbox with every container of `pod` running since `now` (its spec's containers, in order)."""
    uid = podutil.uid(pod)
    stamp = int(now * _NANOS)
    sandbox_id = f"hollow-{uid}"
    sandbox = SandboxStatus(id=sandbox_id, name=podutil.name(pod), namespace=podutil.namespace(pod), uid=uid,
                            attempt=0, state=SandboxState.READY, created_at=stamp)
    containers = [
        ContainerStatus(id=f"{sandbox_id}-{spec['name']}", name=spec["name"], sandbox_id=sandbox_id,
                        state=ContainerState.RUNNING, created_at=stamp, started_at=stamp,
                        image=spec.get("image", ""), image_ref=spec.get("image", ""))
        for spec in podutil.containers(pod)
    ]
    return PodRuntimeStatus(uid=uid, name=sandbox.name, namespace=sandbox.namespace, sandboxes=[sandbox],
                            containers=containers, timestamp=now)


class HollowRuntime:
    """Applies one node's pod updates at once and publishes each pod's status, like a pod worker would."""

    def __init__(self, pod_config: PodConfig, status: StatusManager, *, on_terminated: Callable[[Pod], None],
                 recorder: Recorder = NO_EVENTS, clock: Callable[[], float] = time.time):
        self._pod_config = pod_config
        self._status = status
        self._on_terminated = on_terminated
        self._recorder = recorder
        self._clock = clock
        self.pods: dict[str, PodRuntimeStatus] = {}
        self.starts = 0

    async def run(self) -> None:
        while True:
            self.apply(await self._pod_config.updates.get())

    def apply(self, update: PodUpdate) -> None:
        for pod in update.pods:
            uid = podutil.uid(pod)
            if update.op is Op.REMOVE:
                self.pods.pop(uid, None)
                self._status.remove(uid)
            elif update.op is Op.DELETE or podutil.deletion_requested(pod):
                self._terminate(pod)
            else:  # ADD, UPDATE, RECONCILE: (re)assert the running state
                if uid not in self.pods:
                    self.pods[uid] = started(pod, self._clock())
                    self.starts += 1
                    self._started_events(pod)
                self._publish(pod)

    def _terminate(self, pod: Pod) -> None:
        """Containers stop at once; then, as podsync's on_terminated, the status goes and the final delete follows."""
        uid = podutil.uid(pod)
        self.pods.pop(uid, None)
        self._status.remove(uid)
        self._on_terminated(pod)

    def _started_events(self, pod: Pod) -> None:
        """What the kubelet tells of a container whose image is present: Pulled, Created, Started."""
        for spec in podutil.containers(pod):
            name, ref = spec["name"], pod_ref(pod, spec["name"])
            self._recorder.event(ref, NORMAL, "Pulled",
                                 f'Container image "{spec.get("image", "")}" already present on machine')
            self._recorder.event(ref, NORMAL, "Created", f"Created container {name}")
            self._recorder.event(ref, NORMAL, "Started", f"Started container {name}")

    def _publish(self, pod: Pod) -> None:
        uid = podutil.uid(pod)
        status = generate_pod_status(pod, self.pods[uid], old_status=self._status.get_status(uid), now=self._clock())
        self._status.set_pod_status(pod, status)
