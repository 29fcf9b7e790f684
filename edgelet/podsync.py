"""What a pod worker does for one pod: sync it, kill it, and clean up after it (the kubelet's SyncPod family).

Each call reads the runtime state from the PLEG cache, lets the runtime manager act, inspects the pod
again when something changed, and hands the resulting status to the status manager.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from . import metrics, podutil
from .errors import EdgeletError
from .kuberuntime.types import ContainerState, PodRuntimeStatus
from .podutil import Pod
from .podworkers import SyncOutcome
from .eviction import evicted_status
from .kubetime import format_time
from .status.generate import generate_pod_status

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger(__name__)


def log_reason_changes(pod: Pod, before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]]) -> None:
    """Each container's failure reason (pull errors included), logged once per change of reason."""
    for name, (reason, message) in after.items():
        if before.get(name, ("",))[0] != reason:
            log.warning("pod %s container %s: %s: %s", podutil.full_name(pod), name, reason, message)


class PodSyncer:
    def __init__(self, agent: Agent):
        self._agent = agent
        self.waiting: dict[str, dict[str, tuple[str, str]]] = {}
        self.first_seen: dict[str, float] = {}  # for the pod start SLI

    def seen(self, uid: str) -> None:
        self.first_seen.setdefault(uid, time.monotonic())

    async def sync_pod(self, pod: Pod) -> SyncOutcome:
        uid = podutil.uid(pod)
        runtime_status = self._agent.pleg.get_status(uid)
        result = await self._agent.runtime_manager.sync_pod(
            pod, runtime_status,
            liveness_failed=self._agent.prober.liveness_failed(uid),
            startup_failed=self._agent.prober.startup_failed(uid),
        )
        if result.started or result.waiting_reasons != self.waiting.get(uid) or not runtime_status.sandboxes:
            runtime_status = await self._agent.pleg.inspect_now(uid)
        log_reason_changes(pod, self.waiting.get(uid) or {}, result.waiting_reasons)
        self.waiting[uid] = result.waiting_reasons
        self.publish_status(pod, runtime_status, result.waiting_reasons)
        return SyncOutcome(requeue_after=result.requeue_after)

    def publish_status(self, pod: Pod, runtime_status: PodRuntimeStatus,
                        waiting: dict[str, tuple[str, str]]) -> dict[str, Any]:
        uid = podutil.uid(pod)
        status = generate_pod_status(
            pod, runtime_status,
            old_status=self._agent.status.get_status(uid),
            now=time.time(),
            waiting_reasons=waiting,
            readiness=self._agent.prober.readiness(uid),
            started=self._agent.prober.started(uid),
            host_ip=self._agent.node_ip,
        )
        stopped = self._agent.evicted.get(uid)
        if stopped is not None:
            status = evicted_status(status, stopped[1], format_time(time.time()), reason=stopped[0])
        self._agent.status.set_pod_status(pod, status)
        self._observe_start(uid, runtime_status)
        return status

    def _observe_start(self, uid: str, runtime_status: PodRuntimeStatus) -> None:
        first_seen = self.first_seen.get(uid)
        if first_seen is None:
            return
        pod = self._agent.pods.get(uid)
        wanted = {c["name"] for c in podutil.containers(pod)} if pod else set()
        running = {c.name for c in runtime_status.containers if c.state == ContainerState.RUNNING}
        if wanted and wanted <= running:
            metrics.pod_start_sli_duration_seconds.observe(time.monotonic() - first_seen)
            del self.first_seen[uid]

    async def terminate_pod(self, pod: Pod, grace: int | None) -> None:
        uid = podutil.uid(pod)
        self._agent.prober.stop_liveness_and_startup(uid)
        runtime_status = await self._agent.pleg.inspect_now(uid)
        await self._agent.runtime_manager.kill_pod(pod, runtime_status, grace)
        if uid in self._agent.pods:
            runtime_status = await self._agent.pleg.inspect_now(uid)
            self.publish_status(pod, runtime_status, {})

    async def on_terminated(self, pod: Pod) -> None:
        uid = podutil.uid(pod)
        self._agent.cpu_manager.remove(uid)
        if uid in self._agent.pods and not podutil.deletion_requested(pod):
            return
        runtime_status = await self._agent.pleg.inspect_now(uid)
        await self._agent.runtime_manager.remove_pod(runtime_status)
        try:
            await self._agent.volumes.teardown_pod(uid)
        except EdgeletError as exc:
            # Housekeeping retries: the pod directory stays until it can go.
            log.warning("pod %s: volumes not removed yet: %s", podutil.full_name(pod), exc)
        self._agent.pods.pop(uid, None)
        self._agent.status.remove(uid)
        self._agent.evicted.pop(uid, None)
        if self._agent.cluster is not None:
            self._agent.cluster.pod_terminated(pod)
        self._agent.prober.remove_pod(uid)
        self._agent.workers.forget(uid)
        self.waiting.pop(uid, None)
        self.first_seen.pop(uid, None)
        log.info("pod %s removed", podutil.full_name(pod))
        self._agent.update_status_line()
