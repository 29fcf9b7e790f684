"""The status manager: the last status of every pod, versioned, written to disk only when its hash changes.

`edgelet pods` reads the same files, so it answers whether or not the agent is running. Writes
happen behind the event loop (`run()` flushes changed statuses in a thread, coalescing bursts), so
an fsync never stalls pod starts. When a cluster is configured, a syncer registered with
`add_listener` pushes changed statuses to the API.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from edgelet.api import podutil
from edgelet.api.limits import document_problem
from edgelet.api.podutil import Pod
from edgelet.util.checkpoint import CheckpointStore

from .. import core

log = logging.getLogger(__name__)

STATUS_KIND = "pod-status"
# A failed write (disk full, read-only) is tried again this often until it succeeds.
WRITE_RETRY_DELAY = 5.0


def status_dir(config) -> str:
    """Where the statuses live under the agent's state directory."""
    return os.path.join(config.state_dir, "pods")


@dataclass(slots=True)
class PodStatusEntry:
    pod: Pod  # metadata + spec as last accepted, with `status` set to the latest status
    status_hash: int
    version: int


Listener = Callable[[Pod, int], None]


def same_metadata(stored: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether two copies of a pod's metadata agree, but for `config.seen`: that is when this run of the agent
    first saw the pod, new at every start, and rewriting every checkpoint for it would wear the flash."""
    if stored == new:
        return True
    before, after = stored.get("annotations") or {}, new.get("annotations") or {}
    if before.get(podutil.CONFIG_SEEN_ANNOTATION) == after.get(podutil.CONFIG_SEEN_ANNOTATION):
        return False
    return ({**stored, "annotations": _without_seen(before)} == {**new, "annotations": _without_seen(after)})


def _without_seen(annotations: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in annotations.items() if key != podutil.CONFIG_SEEN_ANNOTATION}


def _stored_pod(pod: Pod, status: dict[str, Any]) -> Pod:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod.get("metadata") or {},
        "spec": pod.get("spec") or {},
        "status": status,
    }


def _share_spec(entry: PodStatusEntry, pod: Pod) -> None:
    """A status read back at start holds a copy of the pod's spec of its own; once the live pod's spec is seen
    to be the same, the entry keeps that one instead (1.9 KiB less per one-container pod after a restart, more
    for larger specs). Memory only: the checkpoint's bytes are the same either way."""
    spec, stored = pod.get("spec"), entry.pod.get("spec")
    if stored is not spec and spec is not None and stored == spec:
        entry.pod = {**entry.pod, "spec": spec}


class StatusManager:
    def __init__(self, directory: str):
        self._store = CheckpointStore(directory, kind=STATUS_KIND, mode=0o600)
        self._entries: dict[str, PodStatusEntry] = {}
        self._listeners: list[Listener] = []
        self._unwritten: dict[str, bytes | None] = {}  # uid -> payload to write, None to delete
        self._wake = asyncio.Event()
        self._write_failing = False
        self.disk_writes = 0

    def load(self) -> None:
        """Takes the statuses the previous run left, so transition and start times carry over."""
        for key, payload in self._store.load_all().items():
            pod, problem = decode_stored_pod(payload)
            if pod is None:
                self._store.set_aside(key, problem)
                continue
            self._entries[podutil.uid(pod)] = PodStatusEntry(pod, core.status_hash(pod["status"]), 0)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def get_status(self, uid: str) -> dict[str, Any] | None:
        entry = self._entries.get(uid)
        return entry.pod.get("status") if entry is not None else None

    def get_entry(self, uid: str) -> PodStatusEntry | None:
        return self._entries.get(uid)

    def set_pod_status(self, pod: Pod, status: dict[str, Any]) -> bool:
        """Records a status; returns whether it differed from the last one (and so was written)."""
        uid = podutil.uid(pod)
        digest = core.status_hash(status)
        entry = self._entries.get(uid)
        same_pod = entry is not None and same_metadata(entry.pod.get("metadata") or {}, pod.get("metadata") or {})
        if entry is not None and entry.status_hash == digest and same_pod:
            _share_spec(entry, pod)
            return False
        version = entry.version + 1 if entry is not None else 1
        stored = _stored_pod(pod, status)
        try:
            payload = orjson.dumps(stored)
        except TypeError as exc:
            # Sources bound every number and depth before a pod gets here; should one slip through, it costs
            # this pod's status, never the sync loop that called us.
            log.error("pod %s: status not recorded: %s", podutil.full_name(pod), exc)
            return False
        self._entries[uid] = PodStatusEntry(stored, digest, version)
        self._unwritten[uid] = payload
        self._wake.set()
        for listener in self._listeners:
            listener(stored, version)
        return True

    def force_update(self, uid: str) -> None:
        """Tells the listeners about the pod's status again, changed or not: what held part of it back (its
        containers still running) is over (the kubelet's forced status update after termination)."""
        entry = self._entries.get(uid)
        if entry is not None:
            for listener in self._listeners:
                listener(entry.pod, entry.version)

    def mark_deleted(self, uid: str, *, at: str, grace: int | None) -> None:
        """The pod is being deleted: until it is gone its stored copy carries the deletionTimestamp (Terminating)."""
        entry = self._entries.get(uid)
        if entry is None:
            return
        metadata = entry.pod.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            return  # the first deletion stands, as the API server keeps the first deletionTimestamp
        entry.pod = {**entry.pod, "metadata": {**metadata, "deletionTimestamp": at,
                                               "deletionGracePeriodSeconds": grace}}
        self._unwritten[uid] = orjson.dumps(entry.pod)
        self._wake.set()

    def remove(self, uid: str) -> None:
        if self._entries.pop(uid, None) is not None:
            self._unwritten[uid] = None
            self._wake.set()

    async def run(self) -> None:
        """Writes changed statuses to disk as they come, a batch at a time, off the event loop."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                batch, self._unwritten = self._unwritten, {}
                try:
                    await asyncio.to_thread(self._write, batch)
                except OSError as exc:  # disk full or read-only: keep serving, try again a little later
                    if not self._write_failing:
                        log.warning("writing pod statuses under %s failed: %s; retrying every %.0fs",
                                    self._store.directory, exc, WRITE_RETRY_DELAY)
                    self._write_failing = True
                    for uid, payload in batch.items():
                        self._unwritten.setdefault(uid, payload)
                    asyncio.get_running_loop().call_later(WRITE_RETRY_DELAY, self._wake.set)
                else:
                    if self._write_failing:
                        log.info("pod statuses under %s are written again", self._store.directory)
                    self._write_failing = False
        finally:
            self.flush()

    def flush(self) -> None:
        """Writes whatever is still pending (at shutdown)."""
        batch, self._unwritten = self._unwritten, {}
        try:
            self._write(batch)
        except OSError as exc:
            log.warning("writing pod statuses under %s failed: %s", self._store.directory, exc)

    def _write(self, batch: dict[str, bytes | None]) -> None:
        # One fsync of the directory for the batch: a burst of pod starts writes a hundred statuses at once.
        self._store.write_many(batch)
        self.disk_writes += sum(payload is not None for payload in batch.values())

    def known_uids(self) -> set[str]:
        return set(self._entries)

    def pods(self) -> list[Pod]:
        return [entry.pod for entry in self._entries.values()]

    def pod_list_json(self) -> bytes:
        return orjson.dumps(pod_list(self.pods()))


def decode_stored_pod(payload: bytes) -> tuple[Pod | None, str]:
    """(the pod a status checkpoint holds, "") or (None, what is wrong with it): checked like any input."""
    try:
        pod = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(pod, dict):
        return None, f"holds a JSON {type(pod).__name__}, not a pod"
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("uid"), str) or not meta["uid"]:
        return None, "holds no metadata.uid"
    for field in ("spec", "status"):
        if not isinstance(pod.get(field), dict):
            return None, f"holds no {field} object"
    if problem := document_problem(pod):
        return None, f"{problem[0]}: {problem[1]}"
    return pod, ""


def pod_list(pods: list[Pod]) -> dict[str, Any]:
    ordered = sorted(pods, key=lambda p: (podutil.namespace(p), podutil.name(p)))
    return {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": ordered}


def read_pod(directory: str, uid: str) -> Pod | None:
    """One pod as the agent last wrote it, or None when it has no status (any more)."""
    payload = CheckpointStore(directory, kind=STATUS_KIND, mode=0o600, reader=True).read(uid)
    try:
        return orjson.loads(payload) if payload is not None else None
    except orjson.JSONDecodeError:
        return None


def read_pod_list(directory: str) -> dict[str, Any]:
    """The PodList as the agent last wrote it, read straight from disk (the agent may be down)."""
    store = CheckpointStore(directory, kind=STATUS_KIND, mode=0o600, reader=True)
    pods = []
    for payload in store.load_all().values():
        pod, _ = decode_stored_pod(payload)
        if pod is not None:
            pods.append(pod)
    return pod_list(pods)
