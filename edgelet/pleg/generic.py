"""The pod lifecycle event generator: relists the runtime, turns differences into events, and feeds the pod cache.

The relist itself (wire bytes -> snapshot -> events) runs in `edgelet.core`; this module does the I/O
around it: the two List calls, the inspection of pods that changed, when to relist, and the health verdict.
Where the runtime serves container events (containerd >= 1.7) they trigger the relists and the periodic one
slows to `evented_relist_period`; while the stream is down, or on a runtime without it, the PLEG relists every
`relist_period` as the kubelet's generic PLEG does.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgelet import core
from edgelet.api import podutil
from edgelet.container import labels
from edgelet.container.cache import PodCache
from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState, SandboxStatus
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from edgelet.kuberuntime.termmessage import joined_message, termination_message
from edgelet.metrics import registry as metrics
from edgelet.pleg.evented import ContainerEventStream
from edgelet.util.errors import EdgeletError
from edgelet.util.tasks import wait_set

log = logging.getLogger(__name__)

NAMESPACE_MODE_NODE = 2  # runtime.v1.NamespaceMode.NODE
# Pods inspected at once by a relist: enough to overlap the round trips of a node's worth of changed pods
# (the first relist after a restart), few enough that the runtime is not flooded. More calls in flight also
# cost less each (gRPC completes them in batches): at 110 pods, 64 took the client's CPU for the 220 status
# calls from 17 ms (16 at once) to 13.
INSPECT_PARALLELISM = 64

# The events of one action come in a burst (a sandbox created and started, its containers created and started):
# the relist waits this long after the first of them so that one relist sees the whole burst.
EVENT_BATCH_DELAY = 0.05
# While events keep coming (a burst of pod starts) a relist starts at most this long after the one before: each
# lists every sandbox and container, which costs the runtime as much CPU as the starts it reports on. A worker is
# never held by it: it inspects its own pod after acting. A lone event is still relisted after EVENT_BATCH_DELAY.
EVENT_RELIST_INTERVAL = 0.25
# A stream counts only for the events sent once the runtime has subscribed it, which it does as the call
# arrives; a relist that starts this long after the stream was asked for sees everything sent before.
SUBSCRIBE_GRACE = 1.0
# While the stream is live and quiet, how often the PLEG vouches for the whole cache (the kubelet's evented PLEG
# updates the cache's global timestamp every globalCacheUpdatePeriod, 5 s). A worker waiting for a status newer
# than its last action is answered at once instead (`_vouch_now`): the tick is for health and the metrics.
CACHE_REFRESH_PERIOD = 5.0


@dataclass(frozen=True, slots=True)
class PodLifecycleEvent:
    pod_uid: str
    type: int
    data: str  # container or sandbox id

    def is_sync_worthy(self) -> bool:
        """The kubelet does not sync a pod for the removal of a container it already saw die."""
        return self.type != core.CONTAINER_REMOVED


class PodEventQueue:
    """The PLEG's events for the sync loop, at most one pending per pod: the loop only needs "pod X changed", so a
    pod whose containers changed ten times before the loop got to it is synced once. Bounded by the pods the
    runtime holds, whatever the churn. A pod keeps its place in line; a sync-worthy event replaces one that is not.
    """

    def __init__(self) -> None:
        self._pending: dict[str, PodLifecycleEvent] = {}
        self._ready = asyncio.Event()
        self.coalesced = 0  # events folded into one already pending

    def put_nowait(self, event: PodLifecycleEvent) -> None:
        pending = self._pending.get(event.pod_uid)
        if pending is None:
            self._pending[event.pod_uid] = event
            self._ready.set()
            return
        self.coalesced += 1
        if event.is_sync_worthy() and not pending.is_sync_worthy():
            self._pending[event.pod_uid] = event

    async def get(self) -> PodLifecycleEvent:
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        return self._pending.pop(next(iter(self._pending)))

    def get_nowait(self) -> PodLifecycleEvent:
        if not self._pending:
            raise asyncio.QueueEmpty
        return self._pending.pop(next(iter(self._pending)))

    def qsize(self) -> int:
        return len(self._pending)

    def empty(self) -> bool:
        return not self._pending


def _linux_user(status: pb.ContainerStatus) -> tuple[int, int, tuple[int, ...]] | None:
    """The identity of the container's first process, where the runtime reports it (containerd 2.0+)."""
    if not status.HasField("user") or not status.user.HasField("linux"):
        return None
    linux = status.user.linux
    return linux.uid, linux.gid, tuple(linux.supplemental_groups)


def _linux_resources(status: pb.ContainerStatus) -> tuple[int, int, int, int] | None:
    """The cgroup settings the runtime reports for a container (what an in-place resize compares with)."""
    if not status.HasField("resources") or not status.resources.HasField("linux"):
        return None
    linux = status.resources.linux
    return linux.cpu_shares, linux.cpu_quota, linux.cpu_period, linux.memory_limit_in_bytes


def _exit_message(status: pb.ContainerStatus) -> str:
    """An exited container's message: the runtime's, then what the container left (the kubelet reads it from
    the file mounted at its terminationMessagePath, or its log), read once when it is first seen exited."""
    annotations = status.annotations
    left = termination_message(
        [(mount.container_path, mount.host_path) for mount in status.mounts],
        annotations.get(labels.CONTAINER_TERMINATION_MESSAGE_PATH, ""),
        annotations.get(labels.CONTAINER_TERMINATION_MESSAGE_POLICY, ""), status.exit_code, status.log_path)
    return joined_message(status.message, left)


def _int_annotation(annotations, key: str, default: int) -> int:
    try:
        return int(annotations.get(key, default))
    except ValueError:
        return default


class GenericPLEG:
    """Relists sandboxes and containers and keeps the runtime cache fresh: every `relist_period`, or, while the
    runtime's container events flow (`evented`), on each batch of them and every `evented_relist_period`."""

    def __init__(
        self,
        runtime: RuntimeClient,
        *,
        relist_period: float = 1.0,
        relist_threshold: float = 180.0,
        evented: bool = True,
        evented_relist_period: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._runtime = runtime
        self._period = relist_period
        self._threshold = relist_threshold
        self._evented_period = evented_relist_period
        self._clock = clock
        self.events = PodEventQueue()
        # Set by every container event and every change of the stream: the loop relists (or changes pace).
        self._wake = asyncio.Event()
        self._stream = ContainerEventStream(runtime, self._wake.set, self._wake.set, clock=clock) if evented else None
        self._last_relist_started: float | None = None
        self.relists = 0  # done so far
        self._last_full_relist: float | None = None
        self._snapshot: core.Snapshot | None = None
        self.cache = PodCache(vouch=self._vouch_now)
        self._reinspect: set[str] = set()
        # Inspection results reused while a container's state and creation time are unchanged.
        self._inspected: dict[str, ContainerStatus] = {}
        self._sandbox_inspected: dict[str, SandboxStatus] = {}
        self._last_relist: float | None = None
        self._started = clock()
        self._first_relist = asyncio.Event()
        self._lock = asyncio.Lock()
        self.last_error: str = ""

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        stream = asyncio.create_task(self._stream.run(), name="pleg-events") if self._stream else None
        try:
            while True:
                started = self._clock()
                self._wake.clear()  # what happens from here on is seen by this relist or wakes the next
                try:
                    await self.relist()
                    self._last_relist_started = started
                except EdgeletError as exc:
                    self._note_failure(str(exc))
                except Exception as exc:  # a bug here must not stop relisting, but must be seen
                    log.exception("relist failed")
                    self._note_failure(f"relist failed: {exc!r}")
                await self._until_next_relist(started)
        finally:
            if stream is not None:
                stream.cancel()

    @property
    def mode(self) -> str:
        """"evented" while container events drive the relists, else "generic" (the periodic relist)."""
        return "evented" if self._events_live() else "generic"

    def _events_live(self) -> bool:
        """Whether the stream is known to carry every event from some time before the last relist on: it was asked
        for at least SUBSCRIBE_GRACE before that relist started, and that relist succeeded."""
        opened = self._stream.opened_at if self._stream is not None else None
        return (opened is not None and self._last_relist_started is not None
                and self._last_relist_started >= opened + SUBSCRIBE_GRACE)

    async def _until_next_relist(self, started: float) -> None:
        metrics.pleg_evented.set(1 if self._events_live() else 0)
        if not self._events_live() or self.last_error:  # a failed relist is retried a period later, as ever
            await asyncio.sleep(max(self._period - (self._clock() - started), 0.0))
            return
        while True:
            quiet_since = self._clock()
            # A failed inspection is retried a relist period later, as in the periodic relist; otherwise the loop
            # wakes for the next full relist or to vouch for the cache, whichever comes first.
            full_relist_at = (self._last_full_relist or 0.0) + self._evented_period
            timeout = (self._period if self._reinspect
                       else max(self._period, min(CACHE_REFRESH_PERIOD, full_relist_at - quiet_since)))
            if await wait_set(self._wake, timeout):
                await asyncio.sleep(max(EVENT_BATCH_DELAY, EVENT_RELIST_INTERVAL - (self._clock() - started)))
                return
            if not self._events_live() or self._reinspect:
                return  # the stream is gone, or a failed inspection retries as it would in the periodic relist
            if self._clock() >= full_relist_at:
                return
            # A whole tick without an event: the runtime had nothing to report from its start on, so every pod's
            # cached status held then (the kubelet's evented PLEG vouches for the cache the same way).
            self.cache.update_time(quiet_since)  # a pod whose inspection failed keeps its error, newer still
            self._last_relist = self._clock()
            metrics.pleg_last_seen_seconds.set(time.time())

    def _vouch_now(self) -> float | None:
        """Now, when the cache is known to hold as of now: the stream is live, no event came since the last relist
        began, no relist is under way, and no pod waits to be inspected again (so a worker waiting for a status
        newer than its last action need not wait for the next tick); else None."""
        if (self._events_live() and not self._wake.is_set() and not self._lock.locked()
                and not self._reinspect and not self.last_error):
            return self._clock()
        return None

    def _note_failure(self, message: str) -> None:
        if message != self.last_error:
            log.warning("PLEG: %s", message)
        self.last_error = message

    async def relist(self) -> list[PodLifecycleEvent]:
        """One relist: list, diff, inspect changed pods, publish events. Returns the events."""
        async with self._lock:
            started = time.perf_counter()
            # What the lists return is at least as new as this moment: the pod cache orders by it. Monotonic:
            # after the wall clock stepped back, every observation would be "older" and never stored.
            observed_at = time.monotonic()
            sandboxes_wire = await self._runtime.list_pod_sandbox_raw()
            containers_wire = await self._runtime.list_containers_raw()
            snapshot, raw_events = core.relist(self._snapshot, sandboxes_wire, containers_wire)
            self._snapshot = snapshot

            changed = {uid for uid, _, _ in raw_events} | self._reinspect
            self._reinspect = set()
            await self._inspect_all(changed, snapshot, observed_at)
            present = snapshot.pod_uids()
            for uid in [uid for uid in self.cache.uids() if uid not in changed and uid not in present]:
                self.cache.delete(uid, observed_at)
            self._forget_gone(snapshot)
            self.cache.update_time(observed_at)

            events = [PodLifecycleEvent(uid, kind, cid) for uid, kind, cid in raw_events]
            for event in events:
                self.events.put_nowait(event)

            self._last_relist = self._last_full_relist = self._clock()
            self.relists += 1
            self.last_error = ""
            metrics.pleg_relist_duration_seconds.observe(time.perf_counter() - started)
            metrics.pleg_last_seen_seconds.set(time.time())
            self._first_relist.set()
            return events

    async def _inspect_all(self, uids: set[str], snapshot: core.Snapshot, observed_at: float) -> None:
        """Inspects the changed pods, up to INSPECT_PARALLELISM at a time: the first relist after a restart
        finds every running pod new, and one round trip after another would keep them all waiting."""
        pending = iter(uids)

        async def inspect_pending() -> None:
            for uid in pending:  # one iterator shared by the inspectors: each pod is inspected once
                await self._inspect_into_cache(uid, snapshot, observed_at)

        inspectors = min(len(uids), INSPECT_PARALLELISM)
        if inspectors <= 1:
            await inspect_pending()
            return
        async with asyncio.TaskGroup() as group:  # a bug in one inspection cancels the others
            for _ in range(inspectors):
                group.create_task(inspect_pending())

    async def _inspect_into_cache(self, uid: str, snapshot: core.Snapshot, observed_at: float) -> None:
        try:
            self.cache.set(await self._inspect(uid, snapshot, observed_at))
        except EdgeletError as exc:
            # The kubelet stores the error in the cache (the pod's sync fails and is retried, its termination
            # goes on with what was last seen) and inspects the pod again at the next relist; so do we.
            log.info("PLEG: inspecting pod %s failed, retrying next relist: %s", uid, exc)
            self.cache.set_error(uid, str(exc), observed_at)
            self._reinspect.add(uid)

    def _forget_gone(self, snapshot: core.Snapshot) -> None:
        for cid in [cid for cid in self._inspected if cid not in snapshot.containers]:
            del self._inspected[cid]
        for sid in [sid for sid in self._sandbox_inspected if sid not in snapshot.sandboxes]:
            del self._sandbox_inspected[sid]

    # -- inspection -------------------------------------------------------------------------

    async def inspect_now(self, uid: str) -> PodRuntimeStatus:
        """Fresh state of one pod, straight from the runtime (used right after a worker acted).

        Lists only this pod's objects (filtered by uid label) so it costs two small calls plus
        the status calls of what changed; the cache is updated too.
        """
        selector = {labels.POD_UID: uid}
        observed_at = time.monotonic()
        sandboxes = core.parse_sandboxes(
            await self._runtime.list_pod_sandbox_raw(pb.PodSandboxFilter(label_selector=selector)))
        containers = core.parse_containers(
            await self._runtime.list_containers_raw(pb.ContainerFilter(label_selector=selector)))
        status = await self._status_of(uid, core.newest_first(sandboxes), core.newest_first(containers), observed_at)
        # A relist that began before this inspection and ends after it must not undo it (and vice versa).
        self.cache.set(status)
        return self.cache.get(uid)

    async def _inspect(self, uid: str, snapshot: core.Snapshot, observed_at: float) -> PodRuntimeStatus:
        return await self._status_of(uid, snapshot.sandboxes_of(uid), snapshot.containers_of(uid), observed_at)

    async def _status_of(self, uid: str, sandbox_records, container_records, observed_at: float) -> PodRuntimeStatus:
        """The pod's status from its relist records (newest first), asking the runtime only about the
        sandboxes and containers whose records changed since they were last inspected."""
        status = PodRuntimeStatus(uid=uid, timestamp=observed_at)
        for sid, _uid, _name, _ns, state, created_at, _attempt in sandbox_records:
            status.sandboxes.append(await self._sandbox_status(sid, state, created_at))
        for record in container_records:
            status.containers.append(await self._container_status(record))
        self._fill_names(status)
        return status

    @staticmethod
    def _fill_names(status: PodRuntimeStatus) -> None:
        if status.sandboxes:
            status.name = status.sandboxes[0].name
            status.namespace = status.sandboxes[0].namespace

    async def _sandbox_status(self, sid: str, state: int, created_at: int) -> SandboxStatus:
        cached = self._sandbox_inspected.get(sid)
        if cached is not None and cached.state == state:
            return cached
        reply = await self._runtime.pod_sandbox_status(sid)
        st = reply.status
        host_network = st.linux.namespaces.options.network == NAMESPACE_MODE_NODE
        result = SandboxStatus(
            id=sid,
            name=st.metadata.name,
            namespace=st.metadata.namespace,
            uid=st.metadata.uid,
            attempt=st.metadata.attempt,
            state=SandboxState(st.state),
            created_at=st.created_at,
            ip=st.network.ip,
            host_network=host_network,
            # Read once here, so that the start-up clean-up asks no runtime for each pod no source lists.
            source=sys.intern(st.annotations.get(podutil.CONFIG_SOURCE_ANNOTATION, podutil.SOURCE_API)),
        )
        self._sandbox_inspected[sid] = result
        return result

    async def _container_status(self, record: tuple) -> ContainerStatus:
        """One container's status; its hash and restart count come from the relist record (read by the
        core's one parser, with the kubelet's rules), the rest from ContainerStatus when the record changed."""
        cid, _uid, sandbox_id, _name, state, created_at, _attempt, container_hash, restart_count = record
        cached = self._inspected.get(cid)
        if cached is not None and cached.state == state and cached.created_at == created_at:
            return cached
        st = await self._runtime.container_status(cid)
        annotations = st.annotations
        result = ContainerStatus(
            id=cid,
            name=st.metadata.name,
            sandbox_id=sandbox_id,
            state=ContainerState(st.state),
            created_at=st.created_at,
            started_at=st.started_at,
            finished_at=st.finished_at,
            exit_code=st.exit_code,
            reason=st.reason,
            message=_exit_message(st) if st.state == pb.CONTAINER_EXITED else st.message,
            image=sys.intern(st.image.image),  # a handful of images among all containers: one string each
            image_ref=sys.intern(st.image_ref),
            hash=container_hash,
            restart_count=restart_count,
            attempt=st.metadata.attempt,
            log_path=st.log_path,
            grace_period=_int_annotation(annotations, labels.TERMINATION_GRACE_PERIOD, -1),
            user=_linux_user(st),
            resources=_linux_resources(st),
        )
        self._inspected[cid] = result
        return result

    # -- what others read -------------------------------------------------------------------

    def get_status(self, uid: str) -> PodRuntimeStatus:
        return self.cache.get(uid)

    def runtime_pod_uids(self) -> set[str]:
        return self._snapshot.pod_uids() if self._snapshot is not None else set()

    async def wait_first_relist(self) -> None:
        await self._first_relist.wait()

    @property
    def has_relisted(self) -> bool:
        return self._first_relist.is_set()

    def healthy(self) -> tuple[bool, str]:
        """Kubelet semantics: unhealthy when no relist succeeded within the threshold."""
        reference = self._last_relist if self._last_relist is not None else self._started
        since = self._clock() - reference
        if since > self._threshold:
            detail = f"; last error: {self.last_error}" if self.last_error else ""
            return False, (
                f"PLEG is not healthy: pleg was last seen active {since:.0f}s ago; "
                f"threshold is {self._threshold:.0f}s{detail}"
            )
        return True, "ok"
