"""The sync loop: one loop selecting over pod config updates, PLEG events, the sync tick and housekeeping.

Like the kubelet's syncLoop, it decides nothing about containers itself: it keeps the set of desired
pods, admits new ones, and hands each pod's work to its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgelet.api import podutil
from edgelet.api.kubetime import format_time
from edgelet.api.podutil import Pod
from edgelet.events import WARNING, pod_ref
from edgelet.lifecycle.admission import admit, rejected_status
from edgelet.metrics import registry as metrics
from edgelet.pod.workers import PodState, WorkType
from edgelet.podconfig.config import Op, PodUpdate
from edgelet.status.generate import readiness_needs_reconcile
from edgelet.util.errors import EdgeletError, cut_long_values
from edgelet.util.heaptrim import HeapTrimmer, libc_malloc_trim
from edgelet.util.tasks import wait_set

if TYPE_CHECKING:  # the collaborators, for their types only
    from edgelet.config import SyncConfig
    from edgelet.events import EventRecorder
    from edgelet.kubelet.podsync import PodSyncer
    from edgelet.kubelet.runtimestate import RuntimeState
    from edgelet.lifecycle.admission import Check
    from edgelet.logs.rotation import LogRotator
    from edgelet.pleg.generic import GenericPLEG, PodLifecycleEvent
    from edgelet.pod.manager import PodManager
    from edgelet.pod.workers import PodRecords, PodWorkers
    from edgelet.podconfig.config import PodConfig
    from edgelet.prober import ProbeManager
    from edgelet.status.manager import StatusManager
    from edgelet.volumes import VolumeManager

log = logging.getLogger(__name__)

SYNC_TICK = 1.0
LOG_ROTATION_INTERVAL = 10.0
RUNTIME_CHECK_INTERVAL = 5.0  # the kubelet asks the runtime's Status every 5 s
# While the runtime's container events flow and it last said it was ready, a runtime that goes away breaks their
# stream, which turns the PLEG generic and brings the 5 s check back at once; the Status call then only watches the
# conditions a ready runtime reports (RuntimeReady, NetworkReady), and every call wakes gRPC's thread pool for
# seconds: it is made less often. A runtime not ready yet (its CNI still loading, say) is asked every 5 s.
EVENTED_RUNTIME_CHECK_INTERVAL = 30.0
# How long the start-up clean-up waits for the first full view of the sources its candidates came from.
STARTUP_SOURCES_WAIT = 10.0


@dataclass(frozen=True, slots=True)
class Collaborators:
    """What the sync loop reads and tells: the pods' sources and owners, their workers, and the node's managers."""

    pod_config: PodConfig
    pod_manager: PodManager
    pleg: GenericPLEG
    records: PodRecords  # where each pod is in its life (read only)
    workers: PodWorkers
    syncer: PodSyncer
    prober: ProbeManager
    probe_results: asyncio.Queue[str]  # the uids of pods whose probe results changed (the kubelet's channel)
    status: StatusManager
    runtime_state: RuntimeState
    volumes: VolumeManager
    log_rotator: LogRotator
    recorder: EventRecorder


class SyncLoop:
    def __init__(
        self,
        settings: SyncConfig,
        collaborators: Collaborators,
        *,
        max_pods: int,
        admit_checks: Sequence[Check] = (),
        on_runtime_ready: Callable[[], Awaitable[None]],
        on_pods_changed: Callable[[], None] = lambda: None,
        heap_trimmer: HeapTrimmer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`on_runtime_ready` runs once, after the first relist and before the first pod sync (the managers that
        need the runtime start there); `on_pods_changed` after each config update; `heap_trimmer` gives freed C
        heap back from the housekeeping pass (glibc's malloc_trim by default)."""
        self._settings = settings
        self._max_pods = max_pods
        # Each collaborator in an attribute of its own: the loop's paths read them without one more lookup.
        self._pods = collaborators.pod_manager
        self._pod_config = collaborators.pod_config
        self._pleg = collaborators.pleg
        self._records = collaborators.records
        self._workers = collaborators.workers
        self._syncer = collaborators.syncer
        self._prober = collaborators.prober
        self._probe_results = collaborators.probe_results
        self._status = collaborators.status
        self._runtime_state = collaborators.runtime_state
        self._volumes = collaborators.volumes
        self._log_rotator = collaborators.log_rotator
        self._recorder = collaborators.recorder
        self._admit_checks = tuple(admit_checks)
        self._on_runtime_ready = on_runtime_ready
        self._on_pods_changed = on_pods_changed
        self._heap_trimmer = heap_trimmer if heap_trimmer is not None else HeapTrimmer(libc_malloc_trim())
        self.alive_at = time.monotonic()  # the watchdog and /healthz read it: a hung loop stops it
        self._next_log_rotation = 0.0
        self._metrics_seen: tuple[int, int] | None = None  # (relists, cache writes) the gauges were counted at
        self._clock = clock  # housekeeping's schedules; alive_at stays on time.monotonic, which its readers use
        self._runtime_checked_at: float | None = None
        self._housekeeping_problem = ""

    async def run(self) -> None:
        await self._wait_for_runtime()
        await self._stop_unwanted_pods()
        config_get: asyncio.Task | None = None
        pleg_get: asyncio.Task | None = None
        probe_get: asyncio.Task | None = None
        next_housekeeping = self._clock() + self._settings.housekeeping_interval
        try:
            while True:
                config_get = config_get or asyncio.create_task(self._pod_config.updates.get())
                pleg_get = pleg_get or asyncio.create_task(self._pleg.events.get())
                probe_get = probe_get or asyncio.create_task(self._probe_results.get())
                done, _ = await asyncio.wait({config_get, pleg_get, probe_get}, timeout=SYNC_TICK,
                                             return_when=asyncio.FIRST_COMPLETED)
                self.alive_at = time.monotonic()
                self._watch_runtime()
                if config_get in done:
                    self._handle_config(config_get.result())
                    config_get = None
                if pleg_get in done:
                    self._handle_pleg(pleg_get.result())
                    pleg_get = None
                if probe_get in done:
                    self.probe_result_changed(probe_get.result())
                    probe_get = None
                # Requeues, retries after failures and the periodic resync, each pod at its own time.
                self._workers.sync_due()
                now = self._clock()
                if now >= next_housekeeping:
                    next_housekeeping = now + self._settings.housekeeping_interval
                    await self._guarded_housekeeping()
        finally:
            for task in (config_get, pleg_get, probe_get):
                if task is not None:
                    task.cancel()

    def _watch_runtime(self) -> None:
        """A relist that cannot reach the runtime means it is gone; once it answers again every pod is synced
        at once, with the restart back-off the loss reset (RuntimeState.note_lost)."""
        if self._pleg.last_error:
            self._runtime_state.note_lost(self._pleg.last_error)
        elif self._runtime_state.lost and self._runtime_state.note_back():
            for uid in self._pods.uids():
                self.sync_if_known(uid)

    async def _wait_for_runtime(self) -> None:
        """No sync before the first relist: adopting running containers needs to see them first."""
        while not self._pleg.has_relisted:
            self.alive_at = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_TICK):
                    await self._pleg.wait_first_relist()
        _, version = await asyncio.gather(self._runtime_state.check(), self._runtime_state.version())
        log.info("container runtime ready: %s", version)
        adopted = sum(1 for uid in self._pleg.runtime_pod_uids()
                      if self._pleg.get_status(uid).running_containers())
        log.info("adopted %d pod%s with running containers from the runtime", adopted, "" if adopted == 1 else "s")
        await self._on_runtime_ready()
        self._on_pods_changed()

    async def _stop_unwanted_pods(self) -> None:
        """Before any pod is synced: stop the runtime pods no source wants (removed or edited while the agent
        was down, old versions of edited pods), and wait until they are gone. An agent that dies young, again
        and again, so never leaves more than one version of a pod behind.

        A pod counts as unwanted once its own source (its sandbox's config.source annotation) has given its
        first full view (waiting at most STARTUP_SOURCES_WAIT for it), or when that source is not configured
        any more; pods of a source still silent are left to housekeeping.
        """
        pod_config = self._pod_config
        candidates = self._pleg.runtime_pod_uids() - {podutil.uid(pod) for pod in pod_config.get_pods()}
        if not candidates:
            return
        sources = {uid: self._runtime_pod_source(uid) for uid in sorted(candidates)}

        def ready(source: str | None) -> bool:
            return source is not None and (source not in pod_config.sources() or pod_config.source(source).ready)

        deadline = time.monotonic() + STARTUP_SOURCES_WAIT
        while True:
            became_ready = pod_config.source_became_ready  # taken before the check: no readiness slips past
            remaining = deadline - time.monotonic()
            if all(ready(source) for source in sources.values() if source is not None) or remaining <= 0:
                break
            self.alive_at = time.monotonic()
            await wait_set(became_ready, min(remaining, SYNC_TICK))
        wanted = {podutil.uid(pod) for pod in pod_config.get_pods()}
        unwanted = [uid for uid, source in sources.items() if uid not in wanted and ready(source)]
        if not unwanted:
            return
        log.info("stopping %d pods that no source wants any more before syncing any other", len(unwanted))
        for uid in unwanted:
            self._terminate_orphan(uid, "no source wants it any more")
        await self._turning(self._workers.wait_idle())

    def _runtime_pod_source(self, uid: str) -> str | None:
        """The source (file, http, api) a runtime pod came from, as its newest sandbox records it."""
        sandboxes = self._pleg.get_status(uid).sandboxes
        return (sandboxes[0].source or None) if sandboxes else None

    async def _turning(self, awaitable) -> None:
        """Awaits while telling /healthz and the watchdog that the loop is alive (start-up can take a while)."""
        task = asyncio.ensure_future(awaitable)
        try:
            while not task.done():
                self.alive_at = time.monotonic()
                await asyncio.wait({task}, timeout=SYNC_TICK)
            task.result()
        finally:
            task.cancel()

    def _terminate_orphan(self, uid: str, why: str) -> None:
        status = self._pleg.get_status(uid)
        orphan = {"metadata": {"uid": uid, "name": status.name, "namespace": status.namespace}}
        log.info("removing pod %s_%s (%s): %s", status.name, status.namespace, uid, why)
        self._workers.update(orphan, WorkType.TERMINATE)

    def _handle_config(self, update: PodUpdate) -> None:
        for pod in update.pods:
            try:
                self._handle_pod(update.op, pod)
            except Exception:  # a pod no check foresaw costs that pod, never the loop every pod depends on
                log.exception("pod %s: %s update skipped", cut_long_values(podutil.full_name(pod)), update.op.value)
        self._on_pods_changed()

    def _handle_pod(self, op: Op, pod: Pod) -> None:
        """Where each pod is in its life is the pod workers' to decide: a sync of a pod whose termination was
        asked for (evicted, refused, terminal, stopped) is dropped there, whatever op brought it."""
        uid = podutil.uid(pod)
        if op in (Op.ADD, Op.UPDATE) and podutil.deletion_requested(pod):
            # Deleted before the agent knew it (say, while it was down): terminate it, as the
            # kubelet's pod workers do for any pod that carries a deletionTimestamp.
            self._pods.set(pod)
            self._workers.update(pod, WorkType.TERMINATE, podutil.grace_period_seconds(pod))
            self._prober.update_pod(pod)
        elif op in (Op.ADD, Op.UPDATE):
            # Admission decides every pod the workers do not know yet, whichever op brings it first.
            if uid not in self._records and not self._admit(pod):
                return
            if self._records.is_terminating(uid):
                self._pods.set(pod)  # the newest copy, for its status; it never runs again
                return
            self._pods.set(pod)
            self._workers.update(pod)
            self._prober.update_pod(pod)
        elif op is Op.DELETE:
            self._pods.set(pod)
            self._status.mark_deleted(uid, at=podutil.meta(pod).get("deletionTimestamp") or
                                            format_time(time.time()), grace=podutil.grace_period_seconds(pod))
            self._workers.update(pod, WorkType.TERMINATE, podutil.grace_period_seconds(pod))
            self._prober.update_pod(pod)
        elif op is Op.REMOVE:
            self._pods.remove(uid)
            self._workers.update(pod, WorkType.TERMINATE)
            self._status.mark_deleted(uid, at=format_time(time.time()), grace=podutil.grace_period_seconds(pod))
        elif op is Op.RECONCILE:
            self._pods.update_if_known(pod)
            if readiness_needs_reconcile(pod):
                self.sync_if_known(uid)  # a readiness gate's condition changed: Ready is worked out again

    def _admit(self, pod: Pod) -> bool:
        """The kubelet's admission: a rejected pod gets phase Failed with the reason and never runs."""
        active = sum(1 for uid in self._pods if not self._records.is_terminating(uid))
        verdict = admit(pod, active_pods=active, max_pods=self._max_pods, extra=self._admit_checks)
        if verdict.admit:
            return True
        # Kept as desired and finished: later copies from the source are never admitted again, nor reported.
        log.warning("pod %s rejected: %s: %s", podutil.full_name(pod), verdict.reason, verdict.message)
        self._pods.set(pod)
        self._workers.reject(pod)
        self._status.set_pod_status(pod, rejected_status(verdict))
        self._recorder.event(pod_ref(pod), WARNING, verdict.reason, verdict.message)
        return False

    def _handle_pleg(self, event: PodLifecycleEvent) -> None:
        if not event.is_sync_worthy():
            return
        self.sync_if_known(event.pod_uid)

    def probe_result_changed(self, uid: str) -> None:
        """A probe result changed: a pod that runs is synced (a failed liveness probe restarts a container); a
        pod being stopped only has its status published again, so that its readiness shows while it stops
        (the kubelet's prober sets container readiness in the status manager, whatever the pod worker does)."""
        record = self._records.get(uid)
        if record is not None and record.state is PodState.TERMINATING:
            self._syncer.republish(record)
        else:
            self.sync_if_known(uid)

    def sync_if_known(self, uid: str) -> None:
        """A sync of a desired pod (the pod workers drop it for a pod whose termination was asked for)."""
        pod = self._pods.get(uid)
        if pod is not None:
            self._workers.update(pod)

    # -- housekeeping -------------------------------------------------------------------------------

    async def _guarded_housekeeping(self) -> None:
        """Housekeeping that fails (say, a damaged directory under root_dir) is reported once per problem and
        tried again next time; the loop every pod depends on goes on."""
        try:
            await self._housekeeping()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._housekeeping_problem:
                log.exception("housekeeping failed (retried every %gs)", self._settings.housekeeping_interval)
            self._housekeeping_problem = problem
        else:
            self._housekeeping_problem = ""

    async def _housekeeping(self) -> None:
        """Trims the C heap now and then; kills runtime pods that no source knows, once every source has
        reported at least once."""
        now = self._clock()
        watched = self._pleg.mode == "evented" and self._runtime_state.health()[0]
        interval = EVENTED_RUNTIME_CHECK_INTERVAL if watched else RUNTIME_CHECK_INTERVAL
        if self._runtime_checked_at is None or now - self._runtime_checked_at >= interval:
            self._runtime_checked_at = now
            await self._runtime_state.check()
        self._heap_trimmer.maybe_trim(now)
        if not self._pod_config.all_sources_ready():
            return
        for uid in self._pleg.runtime_pod_uids() - set(self._pods):
            if self._records.is_terminating(uid) or uid in self._records:
                continue
            self._terminate_orphan(uid, "housekeeping: no source knows it")
        await self._remove_orphaned_volumes()
        await self._rotate_logs()
        self._update_metrics()

    async def _rotate_logs(self) -> None:
        """The kubelet's container log manager: every 10 s, rotate live logs past the size limit."""
        now = self._clock()
        if now < self._next_log_rotation:
            return
        self._next_log_rotation = now + LOG_ROTATION_INTERVAL
        running = [(c.id, c.log_path) for uid in self._pleg.runtime_pod_uids()
                   for c in self._pleg.get_status(uid).running_containers() if c.log_path]
        try:
            await self._log_rotator.rotate(running)
        except OSError as exc:
            log.warning("log rotation failed: %s", exc)

    async def _remove_orphaned_volumes(self) -> None:
        """Volume directories of pods that are gone (say, removed while the agent was down)."""
        active = set(self._pods) | self._pleg.runtime_pod_uids()
        for uid in self._volumes.pods_on_disk():
            if uid in active or uid in self._records:
                continue
            try:
                await self._volumes.teardown_pod(uid)
            except EdgeletError as exc:
                log.warning("housekeeping: volumes of pod %s not removed yet: %s", uid, exc)

    def _update_metrics(self) -> None:
        """The running pod and container gauges, recounted only when a relist or the pod cache moved: idle, a
        housekeeping pass every 2 s must not walk every pod."""
        seen = (self._pleg.relists, self._pleg.cache.writes)
        if seen == self._metrics_seen:
            return
        self._metrics_seen = seen
        running_pods = 0
        running = 0
        for uid in self._pleg.runtime_pod_uids():
            status = self._pleg.get_status(uid)
            if status.sandboxes and status.sandboxes[0].state == 0:
                running_pods += 1
            running += len(status.running_containers())
        metrics.running_pods.set(running_pods)
        metrics.running_containers.labels("running").set(running)
