"""Per-pod workers: one asyncio task per pod carries out its updates, and the newest pending update wins.

Like the kubelet's pod_workers.go, a pod that is being terminated stays terminating: later sync
updates for it are dropped, and once it is terminated the worker reports it and forgets the pod.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from . import metrics, podutil
from .errors import EdgeletError
from .podutil import Pod

log = logging.getLogger(__name__)

# A failed sync is retried after this delay (the kubelet uses its backOffPeriod, 10 s; a node
# agent that starts pods the moment the runtime is back needs a shorter one).
ERROR_RETRY_DELAY = 2.0


class WorkType(enum.Enum):
    SYNC = "sync"
    TERMINATE = "terminate"


@dataclass(slots=True)
class SyncOutcome:
    """What a sync asks of the worker: when to look at the pod again (None = periodic resync)."""

    requeue_after: float | None = None


@dataclass(slots=True)
class _Work:
    pod: Pod
    kind: WorkType
    grace_seconds: int | None = None


SyncFn = Callable[[Pod], Awaitable[SyncOutcome]]
TerminateFn = Callable[[Pod, int | None], Awaitable[None]]
# Called once a pod's termination finished; returns True when the pod is gone (its worker then forgets it).
TerminatedFn = Callable[[Pod], Awaitable[bool | None]]


class PodWorkers:
    def __init__(
        self,
        sync_pod: SyncFn,
        terminate_pod: TerminateFn,
        on_terminated: TerminatedFn,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._sync_pod = sync_pod
        self._terminate_pod = terminate_pod
        self._on_terminated = on_terminated
        self._clock = clock
        self._pending: dict[str, _Work] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._terminating: set[str] = set()
        self._next_sync: dict[str, float] = {}
        self._last_error: dict[str, str] = {}  # uid -> the failure last logged, so a repeat is not logged again
        self._idle = asyncio.Event()
        self._idle.set()

    def update(self, pod: Pod, kind: WorkType = WorkType.SYNC, grace_seconds: int | None = None) -> None:
        """Queue work for a pod; replaces whatever was pending for it unless it is terminating."""
        uid = podutil.uid(pod)
        if uid in self._terminating and kind is WorkType.SYNC:
            return
        if kind is WorkType.TERMINATE:
            previous = self._pending.get(uid)
            if uid in self._terminating and previous is None and uid not in self._tasks:
                return
            self._terminating.add(uid)
            if previous is not None and previous.kind is WorkType.TERMINATE:
                grace_seconds = _shorter(previous.grace_seconds, grace_seconds)
        self._pending[uid] = _Work(pod, kind, grace_seconds)
        self._next_sync.pop(uid, None)
        if uid not in self._tasks:
            self._idle.clear()
            self._tasks[uid] = asyncio.create_task(self._worker(uid), name=f"pod-worker:{uid}")

    def is_terminating(self, uid: str) -> bool:
        return uid in self._terminating

    def known(self, uid: str) -> bool:
        return uid in self._tasks or uid in self._pending or uid in self._next_sync

    def due(self) -> list[str]:
        """Pods whose requeue time has come (their sync asked to be looked at again)."""
        now = self._clock()
        ready = [uid for uid, when in self._next_sync.items() if when <= now]
        for uid in ready:
            del self._next_sync[uid]
        return ready

    def forget(self, uid: str) -> None:
        self._next_sync.pop(uid, None)
        self._last_error.pop(uid, None)
        self._terminating.discard(uid)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._pending.clear()
        self._idle.set()

    async def _worker(self, uid: str) -> None:
        try:
            while (work := self._pending.pop(uid, None)) is not None:
                await self._do(uid, work)
        finally:
            self._tasks.pop(uid, None)
            if not self._tasks:
                self._idle.set()

    async def _do(self, uid: str, work: _Work) -> None:
        started = time.perf_counter()
        name = podutil.full_name(work.pod)
        try:
            if work.kind is WorkType.SYNC:
                outcome = await self._sync_pod(work.pod)
                if outcome.requeue_after is not None and uid not in self._pending:
                    self._next_sync[uid] = self._clock() + outcome.requeue_after
            else:
                await self._terminate_pod(work.pod, work.grace_seconds)
                if uid not in self._pending:
                    if await self._on_terminated(work.pod):
                        self.forget(uid)
                    self._terminating.discard(uid)
            if self._last_error.pop(uid, None) is not None:
                log.info("pod %s (%s) synced again", name, uid)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Once per change: the same failure every 2 s would bury everything else in the log.
            message = f"{type(exc).__name__}: {exc}"
            if self._last_error.get(uid) != message:
                self._last_error[uid] = message
                log.error("error syncing pod %s (%s), retrying every %.0fs: %s",
                          name, uid, ERROR_RETRY_DELAY, exc,
                          exc_info=not isinstance(exc, EdgeletError))
            if uid not in self._pending:
                if work.kind is WorkType.TERMINATE:
                    # Termination must finish: retry it rather than leaving a half-killed pod.
                    await asyncio.sleep(ERROR_RETRY_DELAY)
                    self._pending.setdefault(uid, work)
                else:
                    self._next_sync[uid] = self._clock() + ERROR_RETRY_DELAY
        finally:
            metrics.pod_worker_duration_seconds.labels(work.kind.value).observe(time.perf_counter() - started)


def _shorter(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
