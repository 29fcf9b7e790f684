"""What a pod worker does for one pod: sync it, kill it, and clean up after it (the kubelet's SyncPod family).

Each call is handed the pod's record (`edgelet.pod.workers.PodSyncStatus`), waits for a runtime status from the
pod cache newer than the pod's last action (the kubelet's GetNewerThan), lets the runtime manager act, and hands
the resulting status to the status manager. What a sync keeps for the next one it keeps in the record: the
syncer itself holds nothing per pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgelet.api import podutil
from edgelet.api.kubetime import format_time, parse_time
from edgelet.api.podutil import Pod
from edgelet.container.cache import InspectionError
from edgelet.container.runtime import ContainerState, PodRuntimeStatus
from edgelet.events import NO_EVENTS, NORMAL, WARNING, Recorder, pod_ref
from edgelet.eviction import evicted_status
from edgelet.metrics import registry as metrics
from edgelet.pod.workers import TERMINAL_PHASES, PodSyncStatus, SyncOutcome
from edgelet.status.extras import add_newer_fields
from edgelet.status.generate import generate_pod_status
from edgelet.util.errors import EdgeletError

if TYPE_CHECKING:  # the collaborators, for their types only
    from edgelet.kuberuntime.manager import RuntimeManager
    from edgelet.pleg.generic import GenericPLEG
    from edgelet.pod.manager import PodManager
    from edgelet.prober import ProbeManager
    from edgelet.status.manager import StatusManager
    from edgelet.volumes import VolumeManager

log = logging.getLogger(__name__)

# The kubelet's active deadline handler: a pod past spec.activeDeadlineSeconds fails with this reason.
DEADLINE_REASON = "DeadlineExceeded"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def active_deadline_left(pod: Pod, start_time: str | None, now: float) -> float | None:
    """Seconds until the pod passes its activeDeadlineSeconds, counted from its status startTime (<= 0: past
    it); None when it has no deadline or has not started."""
    deadline = podutil.spec(pod).get("activeDeadlineSeconds")
    if not isinstance(deadline, int) or isinstance(deadline, bool) or not start_time:
        return None
    try:
        started = parse_time(start_time)
    except ValueError:
        return None
    return started + deadline - now


# The kubelet's word for a pod on the pod network that must wait for it, and how soon it looks again (its pod
# workers' back-off after a failed sync).
NETWORK_NOT_READY_REASON = "NetworkNotReady"
NETWORK_NOT_READY_MESSAGE = "network is not ready"
NETWORK_RETRY = 10.0


def network_wait(pod: Pod, network: tuple[bool, str]) -> str | None:
    """Why the pod must wait for the pod network, or None: host-network pods never wait (the CNI DaemonSet that
    brings the network up is one)."""
    ready, why = network
    if ready or podutil.host_network(pod):
        return None
    return f"{NETWORK_NOT_READY_MESSAGE}: {why}"


def log_reason_changes(pod: Pod, before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]]) -> None:
    """Each container's failure reason (pull errors included), logged once per change of reason."""
    for name, (reason, message) in after.items():
        if before.get(name, ("",))[0] != reason:
            log.warning("pod %s container %s: %s: %s", podutil.full_name(pod), name, reason, message)


class PodSyncer:
    def __init__(
        self,
        *,
        pod_manager: PodManager,
        pleg: GenericPLEG,
        runtime_manager: RuntimeManager,
        prober: ProbeManager,
        status: StatusManager,
        volumes: VolumeManager,
        node_ip: str,
        recorder: Recorder = NO_EVENTS,
        release_resources: Callable[[str], None] = lambda uid: None,
        network: Callable[[], tuple[bool, str]] = lambda: (True, ""),
    ):
        """`release_resources(uid)` frees what the pod held (its CPUs) once it stopped; `network()` is the
        runtime's NetworkReady (`RuntimeState.network`)."""
        self._pods = pod_manager
        self._pleg = pleg
        self._runtime_manager = runtime_manager
        self._prober = prober
        self._status = status
        self._volumes = volumes
        self._node_ip = node_ip
        self._recorder = recorder
        self._release_resources = release_resources
        self._network = network
        self._removed_listeners: list[Callable[[Pod], None]] = []

    def when_removed(self, listener: Callable[[Pod], None]) -> None:
        """Calls `listener(pod)` each time a pod is gone from the node (the API is told, the status line updated)."""
        self._removed_listeners.append(listener)

    async def sync_pod(self, record: PodSyncStatus) -> SyncOutcome:
        """One sync; the outcome says when to look again and whether the pod reached a terminal phase (the
        worker then stops it for good). A failed inspection of the pod fails the sync (it is retried)."""
        pod = record.pod
        uid = podutil.uid(pod)
        if record.ask_runtime_first:
            runtime_status = await self._pleg.inspect_now(uid)
            record.ask_runtime_first = False
        else:
            runtime_status = await self._fresh_status(record)
        old_status = self._status.get_status(uid) or {}
        deadline_left = active_deadline_left(pod, old_status.get("startTime"), time.time())
        if deadline_left is not None and deadline_left <= 0:  # the kubelet's activeDeadlineHandler
            return self._deadline_exceeded(pod, record, runtime_status)
        if (waiting := network_wait(pod, self._network())) is not None:  # the status is published, nothing done
            self._recorder.event(pod_ref(pod), WARNING, NETWORK_NOT_READY_REASON, waiting)
            self.publish_status(pod, record, runtime_status)
            return SyncOutcome(requeue_after=NETWORK_RETRY)
        try:
            result = await self._runtime_manager.sync_pod(
                pod, runtime_status,
                liveness_failed=self._prober.liveness_failed(uid),
                startup_failed=self._prober.startup_failed(uid),
                startup_succeeded=self._prober.startup_succeeded(uid),
            )
        except BaseException:  # a sync that failed half-way may have acted too
            record.ask_runtime_first = True
            raise
        finally:
            record.acted_at = time.monotonic()
        if result.reinspect:
            record.ask_runtime_first = True
        if (result.started or result.stopped or result.waiting_reasons != record.waiting
                or not runtime_status.sandboxes):
            # What this sync just started or stopped is in no relist yet: one inspection now publishes the pod
            # as it is (the kubelet's cache refresh after SyncPod) instead of a status one relist period late,
            # and stores it in the cache, where it also satisfies the next sync's wait. Without it that wait
            # could be answered by the PLEG's vouching before the runtime's events for these very actions
            # arrived (they travel apart from the calls' replies), and a sync would act on the pod as it was:
            # sidecars stopped with their pod, seen exited in a sandbox not yet seen stopped, were started
            # again. A sync that changed nothing (a running pod adopted after a restart) publishes the cached
            # status as it is.
            runtime_status = await self._pleg.inspect_now(uid)
        log_reason_changes(pod, record.waiting, result.waiting_reasons)
        record.waiting = result.waiting_reasons
        status = self.publish_status(pod, record, runtime_status)
        requeue = result.requeue_after
        deadline_left = active_deadline_left(pod, status.get("startTime"), time.time())
        if deadline_left is not None:  # look again when the deadline passes
            requeue = deadline_left if requeue is None else min(requeue, deadline_left)
        return SyncOutcome(requeue_after=requeue, terminal=status.get("phase") in TERMINAL_PHASES)

    def _deadline_exceeded(self, pod: Pod, record: PodSyncStatus, runtime_status: PodRuntimeStatus) -> SyncOutcome:
        """Phase Failed, reason DeadlineExceeded, an event; the worker then kills the containers."""
        if record.eviction is None:
            log.warning("pod %s: %s", podutil.full_name(pod), DEADLINE_MESSAGE)
            record.eviction = (DEADLINE_REASON, DEADLINE_MESSAGE)
            self._recorder.event(pod_ref(pod), NORMAL, DEADLINE_REASON, DEADLINE_MESSAGE)
        self.publish_status(pod, record, runtime_status)
        return SyncOutcome(terminal=True)

    async def _fresh_status(self, record: PodSyncStatus) -> PodRuntimeStatus:
        """The pod's runtime status, observed after the worker's last action on it."""
        return await self._pleg.cache.get_newer_than(podutil.uid(record.pod), record.acted_at)

    def publish_status(self, pod: Pod, record: PodSyncStatus, runtime_status: PodRuntimeStatus) -> dict[str, Any]:
        """The status of `pod` (the copy the caller acted on) from `runtime_status` and its record's failure
        reasons and eviction, to the status manager."""
        uid = podutil.uid(pod)
        eviction = record.eviction  # evicted, stopped at node shutdown, past its deadline: (reason, message)
        # Past its deadline the pod fails as the kubelet's ShouldEvict has it: no DisruptionTarget.
        deadline = eviction if eviction is not None and eviction[0] == DEADLINE_REASON else None
        status = generate_pod_status(
            pod, runtime_status,
            old_status=self._status.get_status(uid),
            now=time.time(),
            waiting_reasons=record.waiting,
            readiness=self._prober.readiness(pod),
            started=self._prober.started(pod),
            host_ip=self._node_ip,
            pod_failure=deadline,
        )
        add_newer_fields(status, pod, runtime_status, self._runtime_manager.resize_view(pod))
        if eviction is not None and deadline is None:
            status = evicted_status(status, eviction[1], format_time(time.time()), reason=eviction[0])
        self._status.set_pod_status(pod, status)
        self._observe_start(record, runtime_status)
        return status

    def republish(self, record: PodSyncStatus) -> None:
        """The pod's status again from the runtime status as last seen, with the newest probe results: a pod
        being stopped shows its readiness change before its containers are gone."""
        uid = podutil.uid(record.pod)
        pod = self._pods.get(uid)
        if pod is not None:
            self.publish_status(pod, record, self._pleg.get_status(uid))

    def _observe_start(self, record: PodSyncStatus, runtime_status: PodRuntimeStatus) -> None:
        first_seen = record.first_seen
        if first_seen is None:
            return
        pod = self._pods.get(podutil.uid(record.pod))
        wanted = {c["name"] for c in podutil.containers(pod)} if pod else set()
        running = {c.name for c in runtime_status.containers if c.state == ContainerState.RUNNING}
        if wanted and wanted <= running:
            metrics.pod_start_sli_duration_seconds.observe(time.monotonic() - first_seen)
            record.first_seen = None

    async def terminate_pod(self, record: PodSyncStatus, grace: int | None) -> None:
        pod = record.pod
        uid = podutil.uid(pod)
        self._prober.stop_liveness_and_startup(uid)
        try:
            runtime_status = await self._fresh_status(record)
        except InspectionError as exc:  # termination never waits for the runtime to answer about the pod
            log.warning("pod %s: killing what was last seen of it: %s", podutil.full_name(pod), exc)
            runtime_status = exc.last_known
        try:
            await self._runtime_manager.kill_pod(pod, runtime_status, grace)
        finally:
            record.acted_at = time.monotonic()
        # One inspection after stopping, as the kubelet's SyncTerminatingPod asks the runtime: the final
        # status must show the containers stopped, and on_terminated removes what it lists.
        runtime_status = await self._pleg.inspect_now(uid)
        if uid in self._pods:
            record.waiting = {}
            self.publish_status(pod, record, runtime_status)

    async def on_terminated(self, record: PodSyncStatus) -> bool:
        """After the pod's containers stopped: frees what it held, and removes it from the node unless it is
        still desired (a stopped pod kept for its status). True when it is gone (its worker forgets it and its
        record)."""
        pod = record.pod
        uid = podutil.uid(pod)
        self._release_resources(uid)
        self._status.force_update(uid)  # a terminal phase held back while containers ran may go out now
        if uid in self._pods and not podutil.deletion_requested(pod):
            return False
        # The cache holds terminate_pod's inspection after the kill, or something newer.
        try:
            runtime_status = await self._fresh_status(record)
        except InspectionError as exc:  # what is left, container GC removes
            runtime_status = exc.last_known
        await self._runtime_manager.remove_pod(runtime_status)
        try:
            await self._volumes.teardown_pod(uid)
        except EdgeletError as exc:
            # Housekeeping retries: the pod directory stays until it can go.
            log.warning("pod %s: volumes not removed yet: %s", podutil.full_name(pod), exc)
        self._pods.remove(uid)
        self._status.remove(uid)
        self._prober.remove_pod(uid)
        log.info("pod %s removed", podutil.full_name(pod))
        for listener in self._removed_listeners:
            listener(pod)
        return True
