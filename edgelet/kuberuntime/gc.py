"""Container garbage collection with the kubelet's defaults: keep the newest dead container per (pod, name),
remove dead sandboxes that hold no containers, and delete the log directories of pods that are gone.

The `select_*` functions are the pure policy; `ContainerGC` reads the runtime over CRI, applies
them and removes what they chose. Only objects edgelet created (labelled `io.edgelet.managed`) are
touched.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from edgelet.container import labels
from edgelet.container.runtime import ContainerState, SandboxState
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.kuberuntime.loglinks import dead_links, dead_links_to_remove, link_name, remove_link
from edgelet.util.errors import EdgeletError
from edgelet.volumes.errors import VolumeError
from edgelet.volumes.mountutil import remove_tree

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 60.0  # the kubelet's ContainerGCPeriod


@dataclass(frozen=True, slots=True)
class GCPolicy:
    """The kubelet's container GC policy; the defaults are its defaults (-1 means no limit)."""

    min_age: float = 0.0  # seconds a dead container is kept at least
    max_per_pod_container: int = 1  # dead containers kept per (pod uid, container name)
    max_containers: int = -1  # dead containers kept in total


@dataclass(frozen=True, slots=True)
class GCContainer:
    id: str
    pod_uid: str
    name: str
    sandbox_id: str
    state: ContainerState
    created_at: int  # nanoseconds since the epoch


@dataclass(frozen=True, slots=True)
class GCSandbox:
    id: str
    pod_uid: str
    state: SandboxState
    created_at: int


def _newest_first(items: Iterable) -> list:
    return sorted(items, key=lambda item: item.created_at, reverse=True)


def select_containers_to_remove(
    containers: Sequence[GCContainer],
    active_pod_uids: set[str],
    policy: GCPolicy,
    now_ns: int,
    sources_ready: bool = True,
) -> list[GCContainer]:
    """Dead containers to remove: all of pods that are gone (once every pod source has been read),
    then the oldest beyond `max_per_pod_container` per (pod, name), then beyond `max_containers`."""
    cutoff = now_ns - int(policy.min_age * 1e9)
    units: dict[tuple[str, str], list[GCContainer]] = {}
    for container in containers:
        if container.state == ContainerState.RUNNING or container.created_at > cutoff:
            continue
        units.setdefault((container.pod_uid, container.name), []).append(container)
    for key in units:
        units[key] = _newest_first(units[key])

    chosen: list[GCContainer] = []
    if sources_ready:
        for key in [key for key in units if key[0] not in active_pod_uids]:
            chosen.extend(units.pop(key))

    def keep_newest(per_unit: int) -> None:
        for key, unit in units.items():
            if len(unit) > per_unit:
                chosen.extend(unit[per_unit:])
                units[key] = unit[:per_unit]

    if policy.max_per_pod_container >= 0:
        keep_newest(policy.max_per_pod_container)
    if policy.max_containers >= 0:
        remaining = sum(len(unit) for unit in units.values())
        if remaining > policy.max_containers:
            # An equal share per (pod, name), at least one; then the oldest overall.
            keep_newest(max(policy.max_containers // max(len(units), 1), 1))
            flattened = _newest_first(c for unit in units.values() for c in unit)
            chosen.extend(flattened[policy.max_containers :])
    return chosen


def select_sandboxes_to_remove(
    sandboxes: Sequence[GCSandbox], sandboxes_with_containers: set[str], active_pod_uids: set[str]
) -> list[GCSandbox]:
    """Inactive sandboxes (not ready, no containers) to remove: all of a pod that is gone; of a pod
    that exists, all but its newest sandbox."""
    by_pod: dict[str, list[GCSandbox]] = {}
    for sandbox in sandboxes:
        by_pod.setdefault(sandbox.pod_uid, []).append(sandbox)
    chosen: list[GCSandbox] = []
    for pod_uid, pod_sandboxes in by_pod.items():
        ordered = _newest_first(pod_sandboxes)
        evictable = ordered if pod_uid not in active_pod_uids else ordered[1:]
        chosen.extend(
            sandbox
            for sandbox in evictable
            if sandbox.state != SandboxState.READY and sandbox.id not in sandboxes_with_containers
        )
    return chosen


def pod_uid_of_log_dir(name: str) -> str:
    """`<namespace>_<name>_<uid>` -> uid (names and namespaces cannot contain '_')."""
    return name.rsplit("_", 1)[-1] if name.count("_") >= 2 else ""


def select_log_dirs_to_remove(
    dir_names: Iterable[str], active_pod_uids: set[str], pods_in_runtime: set[str]
) -> list[str]:
    """Pod log directories whose pod is gone and has nothing left in the runtime."""
    chosen = []
    for name in dir_names:
        uid = pod_uid_of_log_dir(name)
        if uid and uid not in active_pod_uids and uid not in pods_in_runtime:
            chosen.append(name)
    return chosen


@dataclass(slots=True)
class ContainerGCResult:
    containers: list[str] = field(default_factory=list)
    sandboxes: list[str] = field(default_factory=list)
    log_dirs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ContainerGC:
    """Applies the container GC policy to the runtime.

    `active_pod_uids` returns the UIDs of the pods the agent still has (their content is kept);
    `sources_ready` says whether every pod source has been read since start, until which the
    containers of unknown pods are left alone (after a restart they may belong to pods not yet seen).
    """

    def __init__(
        self,
        runtime,
        active_pod_uids: Callable[[], set[str]],
        *,
        logs_dir: str,
        container_logs_dir: str = "",
        policy: GCPolicy = GCPolicy(),
        sources_ready: Callable[[], bool] = lambda: True,
        clock_ns: Callable[[], int] = time.time_ns,
        period: float = DEFAULT_PERIOD,
    ):
        self._runtime = runtime
        self._active_pod_uids = active_pod_uids
        self.logs_dir = logs_dir
        self.container_logs_dir = container_logs_dir  # the collectors' links; "" for none
        self.policy = policy
        self._sources_ready = sources_ready
        self._clock_ns = clock_ns
        self.period = period

    async def _managed_sandboxes(self) -> list[GCSandbox]:
        return [
            GCSandbox(item.id, item.metadata.uid, SandboxState(item.state), item.created_at)
            for item in await self._runtime.list_pod_sandbox()
            if item.labels.get(labels.MANAGED_BY)
        ]

    async def _managed_containers(self, sandbox_uids: dict[str, str]) -> list[GCContainer]:
        result = []
        for item in await self._runtime.list_containers():
            if not item.labels.get(labels.MANAGED_BY):
                continue
            uid = item.labels.get(labels.POD_UID) or sandbox_uids.get(item.pod_sandbox_id, "")
            name = item.labels.get(labels.CONTAINER_NAME) or item.metadata.name
            state = ContainerState(item.state)
            result.append(GCContainer(item.id, uid, name, item.pod_sandbox_id, state, item.created_at))
        return result

    async def _remove_container(self, container: GCContainer, result: ContainerGCResult) -> None:
        try:
            status = None
            try:
                status = await self._runtime.container_status(container.id)
            except EdgeletError:
                pass  # its log files are then left to the pod log directory's removal, its link to the sweep
            if container.state == ContainerState.UNKNOWN:
                # The kubelet kills a container in an unknown state before removing it.
                await self._runtime.stop_container(container.id, 0)
            await self._runtime.remove_container(container.id)
        except EdgeletError as err:
            result.errors.append(f"container {container.id}: {err}")
            log.warning("container GC: removing container %s failed: %s", container.id[:13], err)
            return
        result.containers.append(container.id)
        if status is not None:
            # Removing the container leaves its log files and link; the kubelet deletes them with the container.
            self._remove_log(status)

    def _remove_log(self, status: pb.ContainerStatus) -> None:
        """The container's log files, rotated ones too (`<log path>*`, as the kubelet's log manager cleans them),
        and its link."""
        if status.log_path:
            for path in glob.glob(glob.escape(status.log_path) + "*"):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    log.warning("container GC: removing log %s failed: %s", path, err)
        if self.container_logs_dir:
            container_labels = status.labels
            remove_link(self.container_logs_dir, link_name(
                container_labels.get(labels.POD_NAME, ""), container_labels.get(labels.POD_NAMESPACE, ""),
                container_labels.get(labels.CONTAINER_NAME) or status.metadata.name, status.id))

    async def collect(self) -> ContainerGCResult:
        """One pass: containers, then sandboxes left empty, then log directories of vanished pods."""
        result = ContainerGCResult()
        active = set(self._active_pod_uids())
        sources_ready = self._sources_ready()
        sandboxes = await self._managed_sandboxes()
        containers = await self._managed_containers({s.id: s.pod_uid for s in sandboxes})
        doomed = select_containers_to_remove(containers, active, self.policy, self._clock_ns(), sources_ready)
        for container in doomed:
            await self._remove_container(container, result)

        removed = set(result.containers)
        remaining = [c for c in containers if c.id not in removed]
        with_containers = {c.sandbox_id for c in remaining}
        for sandbox in select_sandboxes_to_remove(sandboxes, with_containers, active):
            try:
                if sandbox.state == SandboxState.READY:
                    await self._runtime.stop_pod_sandbox(sandbox.id)
                await self._runtime.remove_pod_sandbox(sandbox.id)
            except EdgeletError as err:
                result.errors.append(f"sandbox {sandbox.id}: {err}")
                log.warning("container GC: removing sandbox %s failed: %s", sandbox.id[:13], err)
                continue
            result.sandboxes.append(sandbox.id)

        if sources_ready:
            gone = set(result.sandboxes)
            in_runtime = {s.pod_uid for s in sandboxes if s.id not in gone} | {c.pod_uid for c in remaining}
            await self._remove_log_dirs(active, in_runtime, result)
        if self.container_logs_dir:
            self._remove_dead_links({c.id: c.state == ContainerState.RUNNING for c in remaining})
        if result.containers or result.sandboxes or result.log_dirs:
            log.info(
                "container GC: removed %d containers, %d sandboxes, %d pod log directories",
                len(result.containers),
                len(result.sandboxes),
                len(result.log_dirs),
            )
        return result

    async def _remove_log_dirs(self, active: set[str], in_runtime: set[str], result: ContainerGCResult) -> None:
        try:
            names = [entry.name for entry in os.scandir(self.logs_dir) if entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return
        except OSError as err:
            result.errors.append(f"{self.logs_dir}: {err}")
            return
        for name in select_log_dirs_to_remove(names, active, in_runtime):
            path = os.path.join(self.logs_dir, name)
            try:
                await asyncio.to_thread(remove_tree, path)
            except (OSError, VolumeError) as err:
                result.errors.append(f"{path}: {err}")
                log.warning("container GC: removing %s failed: %s", path, err)
                continue
            result.log_dirs.append(name)

    def _remove_dead_links(self, known: dict[str, bool]) -> None:
        """Links whose log is gone (their pod's directory removed, a container removed by other means), but
        not a running container's: its file may be only between rename and reopen of a rotation."""
        for name in dead_links_to_remove(dead_links(self.container_logs_dir), known):
            remove_link(self.container_logs_dir, name)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.collect()
            except EdgeletError as err:
                log.warning("container GC: pass failed: %s", err)
