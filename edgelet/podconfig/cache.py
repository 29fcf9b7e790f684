"""The pod checkpoints behind offline autonomy: every pod accepted from the API, persisted crash-safely (not the
runtime status cache, which is kuberuntime.cache.PodCache).

At start the cached pods are handed to the pod config before the API server has answered, so a device
that reboots with no network brings its pods back; once the API answers, its list replaces the cached
set and the usual ADD/UPDATE/REMOVE diff reconciles what changed while offline. Entries are checkpoints
(temp file + fsync + rename + fsync of the directory, versioned header, SHA-256), one per pod uid; a
damaged entry is set aside and reported, never trusted and never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.util.checkpoint import SUFFIX, CheckpointStore

from .. import core
from .apiserver import pod_problem
from .config import SourceHandle

log = logging.getLogger(__name__)

POD_KIND = "pod"
STATE_KIND = "pod-cache-state"
_STATE_KEY = "state"
# Parts of a pod that change on every status write and mean nothing to a restarted agent.
_VOLATILE_METADATA = frozenset({"resourceVersion", "managedFields"})


def content_version(pod: Pod) -> int:
    """What decides whether a cached entry must be rewritten: metadata and spec, not the status.

    A status write bumps the pod's resourceVersion; keying on it would rewrite (and fsync) the entry on
    every status change, wearing flash for nothing: the agent keeps its own statuses elsewhere.
    """
    meta = {k: v for k, v in podutil.meta(pod).items() if k not in _VOLATILE_METADATA}
    return core.status_hash({"metadata": meta, "spec": podutil.spec(pod)})


class PodCheckpoints:
    """The saved pods of one node, one checkpoint per uid in `directory` (blocking I/O)."""

    def __init__(self, directory: str, node_name: str):
        # Pods may carry secrets in env values: root-only like every other checkpoint.
        self._store = CheckpointStore(directory, kind=POD_KIND, mode=0o600)
        self._state = CheckpointStore(os.path.join(directory, "state"), kind=STATE_KIND, mode=0o600)
        self.node_name = node_name
        self._versions: dict[str, int | None] = {}  # uid -> content version on disk (None: must go)
        self._listed = False
        self.writes = 0

    def load(self) -> tuple[list[Pod], bool]:
        """(the cached pods, whether they are the complete list the API server last gave this node).

        Entries the store finds damaged are set aside by it; entries that decode but do not hold a pod of
        this node under its own uid are set aside here; either makes the list incomplete. Mirror pods are
        never cached, nor restored.
        """
        pods = []
        files = sum(1 for name in os.listdir(self._store.directory) if name.endswith(SUFFIX))
        entries = self._store.load_all()
        # A damaged entry may have been one of our pods: the list is then no longer complete, and
        # trusting it would remove that pod's containers as orphans while offline.
        damaged = len(entries) < files
        for key, payload in entries.items():
            try:
                pod = orjson.loads(payload)
            except orjson.JSONDecodeError as e:
                self._store.set_aside(key, f"not JSON: {e}")
                damaged = True
                continue
            problem = pod_problem(pod, self.node_name)
            if problem is None and podutil.uid(pod) != key:
                problem = f"holds pod uid {podutil.uid(pod)!r}, not {key!r}"
            if problem is None and podutil.is_mirror(pod):
                problem = "is a mirror pod"
            if problem is not None:
                spec = pod.get("spec") if isinstance(pod, dict) else None
                if isinstance(spec, dict) and spec.get("nodeName") not in (None, self.node_name):
                    log.info("pod cache entry %s belongs to another node name; dropped", key)
                    self._versions[key] = None  # deleted at the next sync
                else:
                    self._store.set_aside(key, problem)
                    damaged = True
                continue
            self._versions[key] = content_version(pod)
            pods.append(pod)
        state = self._read_state()
        complete = state is not None and state.get("node") == self.node_name and not damaged
        if state is not None and state.get("node") != self.node_name:
            log.info("pod cache was written for node %r, not %r: its pods are not trusted as complete",
                     state.get("node"), self.node_name)
        elif damaged:
            log.warning("pod cache had damaged entries: pods it does not know are kept until the API server answers")
        return pods, complete

    def _read_state(self) -> dict[str, Any] | None:
        payload = self._state.read(_STATE_KEY)
        if payload is None:
            return None
        try:
            state = orjson.loads(payload)
        except orjson.JSONDecodeError:
            state = None
        if not isinstance(state, dict) or not isinstance(state.get("node"), str):
            self._state.set_aside(_STATE_KEY, "content is not the pod cache's state")
            return None
        return state

    def changes(self, pods: Iterable[Pod]) -> tuple[dict[str, Pod], list[str]]:
        """(entries to write, uids to delete) for the cache to hold exactly `pods`; no I/O."""
        wanted = {podutil.uid(pod): pod for pod in pods if podutil.uid(pod)}
        writes = {uid: pod for uid, pod in wanted.items() if self._versions.get(uid) != content_version(pod)}
        deletes = [uid for uid in self._versions if uid not in wanted]
        return writes, deletes

    def sync(self, pods: Iterable[Pod]) -> None:
        """Makes the cache hold exactly these pods (a complete list), writing only entries that changed."""
        writes, deletes = self.changes(pods)
        # One fsync of the directory for the whole set (a node's first list writes every pod at once).
        self._store.write_many({**dict.fromkeys(deletes), **{uid: orjson.dumps(pod) for uid, pod in writes.items()}})
        for uid in deletes:
            del self._versions[uid]
        for uid, pod in writes.items():
            self._versions[uid] = content_version(pod)
        self.writes += len(writes)
        if not self._listed:
            # Only now may a restart trust the cache as this node's complete pod list.
            self._state.write(_STATE_KEY, orjson.dumps({"node": self.node_name, "listed": time.time()}))
            self._listed = True


class CachingHandle:
    """A SourceHandle in front of another: each full set is persisted, then applied.

    `set` returns at once; a single writer task persists (in a thread, so fsync never stalls the loop) and
    applies the newest set, in order. `before_apply` (e.g. fetching the ConfigMaps the pods need) runs
    first. `mark_ready` takes effect only after the sets before it were applied.
    """

    def __init__(self, handle: SourceHandle, cache: PodCheckpoints, *,
                 before_apply: Callable[[list[Pod]], Awaitable[None]] | None = None):
        self._handle = handle
        self._cache = cache
        self._before_apply = before_apply
        self._pending: list[Pod] | None = None
        self._ready_requested = False
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def restore(self) -> list[Pod]:
        """Applies the cached pods (call once at start, before the source connects) and returns them.

        The source is marked ready only when the cache holds a complete list from an earlier API sync:
        then pods that left the API while the agent was down are cleaned up offline too. An empty or
        never-completed cache leaves readiness to the API server, so nothing is removed on no evidence.
        """
        started = time.monotonic()
        pods, complete = self._cache.load()
        self._handle.set(pods)
        if complete:
            self._handle.mark_ready()
        if pods or complete:
            log.info("restored %d pods from the offline cache in %.0f ms%s", len(pods),
                     (time.monotonic() - started) * 1000, "" if complete else " (incomplete: waiting for the API)")
        return pods

    def set(self, pods: Iterable[Pod]) -> None:
        self._pending = list(pods)
        self._kick()

    def mark_ready(self) -> None:
        self._ready_requested = True
        self._kick()

    @property
    def ready(self) -> bool:
        return self._handle.ready

    async def drain(self) -> None:
        """Waits until every set so far has been persisted and applied."""
        await self._idle.wait()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None

    def _kick(self) -> None:
        self._idle.clear()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="pod-cache-writer")

    async def _write_loop(self) -> None:
        try:
            while self._pending is not None or self._ready_requested:
                pods, self._pending = self._pending, None
                if pods is not None:
                    await self._apply(pods)
                elif self._ready_requested:
                    self._ready_requested = False
                    self._handle.mark_ready()
        finally:
            if self._pending is None and not self._ready_requested:
                self._idle.set()

    async def _apply(self, pods: list[Pod]) -> None:
        if self._before_apply is not None:
            try:
                await self._before_apply(pods)
            except Exception:  # a failing helper must not keep pods from the agent
                log.exception("preparing %d API pods failed; applying them anyway", len(pods))
        try:
            await asyncio.to_thread(self._cache.sync, pods)
        except OSError as e:  # disk full, read-only: pods still run, but an offline restart may miss them
            log.warning("cannot persist the pod cache for offline restarts: %s", e)
        self._handle.set(pods)
