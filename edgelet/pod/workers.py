"""Per-pod workers and the one record of each pod on the node (the kubelet's pod_workers.go).

A pod moves one way only: syncing -> terminating -> terminated -> finished. Once termination was asked for
(deleted, removed, evicted, stopped for a node shutdown, terminal by its restart policy or refused at
admission) no update, resync or runtime event starts it again; only a new uid runs.

The record (`PodSyncStatus`) is created by the first update of a pod and deleted when the pod is gone from the node:
everything the node keeps about a pod's life lives in it (the pod syncer reads and writes its fields through the
record it is handed), so forgetting a pod is that one deletion. The records are kept in `PodRecords`, which the
pod workers alone write and everyone else reads; it is built before anything that asks which pods are active.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.metrics import registry as metrics
from edgelet.util.errors import EdgeletError
from edgelet.util.retry import Retrier

log = logging.getLogger(__name__)

# A failed sync or termination is retried after a per-pod delay doubling from RETRY_INITIAL up to RETRY_MAX, each
# wait between the step and twice it (client-go's jitter), so that pods failing together do not retry together.
RETRY_INITIAL = 1.0
RETRY_MAX = 10.0
# A synced pod is synced again after its resync interval stretched by up to this fraction (the kubelet's
# workerResyncIntervalJitterFactor): a node's pods spread across the period instead of all in one tick.
RESYNC_JITTER = 0.5
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class WorkType(enum.Enum):
    SYNC = "sync"
    TERMINATE = "terminate"


class PodState(enum.Enum):
    SYNCING = "syncing"  # the pod should run
    TERMINATING = "terminating"  # its containers are being stopped; nothing starts any more
    TERMINATED = "terminated"  # nothing runs; what it held is not cleaned up yet
    FINISHED = "finished"  # cleaned up; kept (never run) while its source still lists it


@dataclass(slots=True)
class SyncOutcome:
    """What a sync asks of the worker: when to look at the pod again (None: its periodic resync), and whether
    the pod reached a terminal phase (it is then terminated, never started again)."""

    requeue_after: float | None = None
    terminal: bool = False


@dataclass(slots=True, eq=False)
class PodSyncStatus:
    """One pod's record: its place in its life, the work its worker has yet to do, and what its syncs keep
    between calls (the kubelet's podSyncStatus with the worker loop's lastSyncTime)."""

    pod: Pod
    state: PodState = PodState.SYNCING
    grace_seconds: int | None = None  # of its termination: the shortest asked for (None: the pod's own)
    pending: bool = True  # the worker has work for the pod's current state
    next_attempt: float | None = None  # when the worker looks at the pod again unasked
    action: asyncio.Task | None = None  # the sync or kill under way (cancelled when termination shortens it)
    action_grace: int | None = None  # the grace period the kill under way was given
    retry: Retrier | None = None  # while its work keeps failing
    # Why the node stopped the pod for good (evicted, stopped at node shutdown, past its deadline): the
    # (reason, message) of its final status.
    eviction: tuple[str, str] | None = None
    # When the worker last acted on the pod (time.monotonic(), the pod cache's clock): the next sync waits for a
    # status observed after it, so that it never acts on a view older than its own actions.
    acted_at: float = 0.0
    # Its last sync failed half-way, or left a create or start under way in the runtime: what it did is in no
    # relist yet (nor in the container events a busy runtime sends late), so the next sync asks the runtime.
    ask_runtime_first: bool = False
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # each container's failure reason, last sync
    first_seen: float | None = None  # time.monotonic() it was first asked to run, until it ran: the pod start SLI


class PodLifecycle(Protocol):
    """What a pod worker does for its pod (edgelet.kubelet.podsync.PodSyncer), handed the pod's record."""

    async def sync_pod(self, record: PodSyncStatus) -> SyncOutcome:
        """Syncs the pod; the outcome says when to look again and whether it reached a terminal phase."""

    async def terminate_pod(self, record: PodSyncStatus, grace: int | None) -> None:
        """Stops every container of the pod within `grace` seconds (None: the pod's own)."""

    async def on_terminated(self, record: PodSyncStatus) -> bool:
        """Once the pod's containers stopped; True when the pod is gone from the node (its record goes too)."""


def shorter_grace(current: int | None, asked: int | None) -> int | None:
    """The grace period a termination keeps when asked again: the shorter one (None: the pod's own)."""
    if current is None:
        return asked
    if asked is None:
        return current
    return min(current, asked)


class PodRecords:
    """The record of every pod the node knows, by uid: written by the pod workers only, read by everyone."""

    __slots__ = ("by_uid",)

    def __init__(self) -> None:
        self.by_uid: dict[str, PodSyncStatus] = {}  # the pod workers' to change

    def get(self, uid: str) -> PodSyncStatus | None:
        """The pod's record, while the node knows the pod."""
        return self.by_uid.get(uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self.by_uid

    def state(self, uid: str) -> PodState | None:
        status = self.by_uid.get(uid)
        return status.state if status is not None else None

    def eviction(self, uid: str) -> tuple[str, str] | None:
        """Why the node stopped the pod for good, (reason, message), until it is gone; None if it did not."""
        status = self.by_uid.get(uid)
        return status.eviction if status is not None else None

    def is_active(self, uid: str) -> bool:
        """Whether a desired pod holds resources: neither evicted nor asked to terminate (the kubelet's
        GetActivePods); a pod its worker has not heard of yet does."""
        status = self.by_uid.get(uid)
        return status is None or (status.state is PodState.SYNCING and status.eviction is None)

    def is_terminating(self, uid: str) -> bool:
        """Termination was asked for (the kubelet's IsPodTerminationRequested): the pod holds no resources."""
        status = self.by_uid.get(uid)
        return status is not None and status.state is not PodState.SYNCING

    def could_have_running_containers(self, uid: str) -> bool:
        """Whether the pod's containers may still run: its worker has not seen them all stopped (the kubelet's
        CouldHaveRunningContainers). A terminal phase reaches the API only once this is False."""
        status = self.by_uid.get(uid)
        return status is not None and status.state in (PodState.SYNCING, PodState.TERMINATING)


class PodWorkers:
    def __init__(
        self,
        records: PodRecords,
        lifecycle: PodLifecycle,
        *,
        resync_interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ):
        self._lifecycle = lifecycle
        self._resync_interval = resync_interval
        self._clock = clock
        self._rng = rng or random.Random()
        self._pods = records.by_uid
        self._tasks: dict[str, asyncio.Task] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    # -- what the sync loop and the managers say ---------------------------------------------------

    def update(self, pod: Pod, kind: WorkType = WorkType.SYNC, grace_seconds: int | None = None) -> None:
        """Sync the pod, or terminate it within `grace_seconds` (None: its own). A sync of a pod whose
        termination was asked for is dropped; a shorter grace period cuts short a kill under way."""
        uid = podutil.uid(pod)
        status = self._pods.get(uid)
        if status is None:
            status = self._pods[uid] = PodSyncStatus(pod)
            if kind is WorkType.SYNC:
                status.first_seen = time.monotonic()
                if _terminal_phase(pod):
                    # Terminal in its source (an API pod that finished elsewhere or earlier): never started here.
                    kind = WorkType.TERMINATE
        if kind is WorkType.SYNC:
            if status.state is not PodState.SYNCING:
                return
            status.pod = pod
            self._wake(uid, status)
            return
        status.pod = pod  # the newest copy: a deletion's grace and timestamp show in it
        asked = _effective_grace(pod, grace_seconds)
        if status.state is PodState.SYNCING:
            status.state = PodState.TERMINATING
            status.grace_seconds = asked
            status.retry = None
            self._cancel_action(status)  # a sync under way (an image pull, say) no longer matters
        elif status.state is PodState.TERMINATING:
            status.grace_seconds = shorter_grace(status.grace_seconds, asked)
            if status.action is not None and status.grace_seconds != status.action_grace:
                # The kubelet's rule: a shorter grace period cancels the kill under way and kills within it.
                log.info("pod %s: termination cut to %ss grace", podutil.full_name(pod), status.grace_seconds)
                self._cancel_action(status)
        elif status.state is PodState.FINISHED:
            status.state = PodState.TERMINATED  # deleted or removed: clean up again, now removing it
        self._wake(uid, status)

    def evict(self, pod: Pod, reason: str, message: str, grace: int | None) -> None:
        """The node stops the pod for good (eviction, node shutdown) within `grace`: its final status says why."""
        self.update(pod, WorkType.TERMINATE, grace)
        self._pods[podutil.uid(pod)].eviction = (reason, message)

    def reject(self, pod: Pod) -> None:
        """Admission refused the pod: it never runs, and is kept (finished) while its source lists it."""
        self._pods[podutil.uid(pod)] = PodSyncStatus(pod, PodState.FINISHED, pending=False)

    def sync_due(self) -> int:
        """Wakes the pods whose next look has come (resync, requeue, retry after a failure); how many."""
        now = self._clock()
        due = [(uid, status) for uid, status in self._pods.items()
               if status.next_attempt is not None and status.next_attempt <= now]
        for uid, status in due:
            self._wake(uid, status)
        return len(due)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._idle.set()

    # -- the worker --------------------------------------------------------------------------------

    def _wake(self, uid: str, status: PodSyncStatus) -> None:
        status.pending = True
        status.next_attempt = None
        if uid not in self._tasks:
            self._idle.clear()
            self._tasks[uid] = asyncio.create_task(self._worker(uid), name=f"pod-worker:{uid}")

    @staticmethod
    def _cancel_action(status: PodSyncStatus) -> None:
        if status.action is not None:
            status.action.cancel()

    async def _worker(self, uid: str) -> None:
        try:
            while (status := self._pods.get(uid)) is not None and status.pending:
                status.pending = False
                await self._step(uid, status)
        finally:
            self._tasks.pop(uid, None)
            if not self._tasks:
                self._idle.set()

    async def _step(self, uid: str, status: PodSyncStatus) -> None:
        """One piece of work for the pod's current state; a failure is retried with the pod's backoff."""
        state = status.state
        if state is PodState.FINISHED:
            return
        started = time.perf_counter()
        try:
            if state is PodState.SYNCING:
                await self._sync(status)
            elif state is PodState.TERMINATING:
                await self._terminate(status)
            else:
                await self._clean_up(uid, status)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the worker itself is stopped
            status.pending = True  # the work was cut short by newer work (termination, a shorter grace)
        except Exception as exc:  # noqa: BLE001 - a pod's failed sync is that pod's, never the worker's end
            self._failed(status, exc)
        else:
            if status.retry is not None and status.retry.succeeded():
                status.retry = None
        finally:
            metrics.pod_worker_duration_seconds.labels(state.value).observe(time.perf_counter() - started)

    async def _run(self, status: PodSyncStatus, action: Awaitable, grace: int | None = None):
        """Runs the action as a task of its own, so that `update` can cancel it and leave the worker alive."""
        status.action = asyncio.ensure_future(action)
        status.action_grace = grace
        try:
            return await status.action
        finally:
            status.action = None

    async def _sync(self, status: PodSyncStatus) -> None:
        outcome = await self._run(status, self._lifecycle.sync_pod(status))
        if status.state is not PodState.SYNCING:
            return  # termination was asked for meanwhile: the worker goes on with it
        if outcome.terminal:
            log.info("pod %s reached a terminal phase: stopping it for good", podutil.full_name(status.pod))
            status.state = PodState.TERMINATING
            status.grace_seconds = _effective_grace(status.pod, None)
            status.pending = True
        elif not status.pending:
            delay = outcome.requeue_after
            if delay is None:
                delay = self._resync_interval * (1.0 + RESYNC_JITTER * self._rng.random())
            status.next_attempt = self._clock() + delay

    async def _terminate(self, status: PodSyncStatus) -> None:
        grace = status.grace_seconds
        await self._run(status, self._lifecycle.terminate_pod(status, grace), grace)
        status.state = PodState.TERMINATED
        status.pending = True

    async def _clean_up(self, uid: str, status: PodSyncStatus) -> None:
        if await self._lifecycle.on_terminated(status):
            del self._pods[uid]  # gone from the node: a new uid of the same name starts afresh
        elif status.state is PodState.TERMINATED:
            status.state = PodState.FINISHED

    def _failed(self, status: PodSyncStatus, exc: Exception) -> None:
        name = f"{podutil.full_name(status.pod)} ({podutil.uid(status.pod)})"
        if status.retry is None:
            status.retry = Retrier(f"error {_DOING[status.state]} pod {name}", initial=RETRY_INITIAL,
                                   maximum=RETRY_MAX, logger=log, level=logging.ERROR, spread="reflector",
                                   rng=self._rng)
        delay = status.retry.failed(exc, traceback=not isinstance(exc, EdgeletError))  # a bug: its traceback, once
        if not status.pending:
            status.next_attempt = self._clock() + delay


_DOING = {PodState.SYNCING: "syncing", PodState.TERMINATING: "terminating", PodState.TERMINATED: "cleaning up",
          PodState.FINISHED: "finishing"}


def _effective_grace(pod: Pod, asked: int | None) -> int | None:
    """The grace period asked for, else the pod's own; None only for a pod known by its metadata alone (an
    orphan: its containers then keep the grace period they were started with)."""
    if asked is not None or not pod.get("spec"):
        return asked
    return podutil.grace_period_seconds(pod)


def _terminal_phase(pod: Pod) -> bool:
    status = pod.get("status")
    return isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES
