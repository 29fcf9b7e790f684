"""What each pod uses, for ranking pods to evict: memory working set and task count read from the
containers' cgroups, and disk bytes and inodes of the pod's logs and local volumes.

Our CRI subset has no ContainerStats, and reading cgroups directly costs one small file read per
container: each container's cgroup is found by its id under the controller's hierarchy (cgroupfs
`<parent>/<id>` or systemd `cri-containerd-<id>.scope`), so no layout is assumed. Writable layers are
not measured (that needs ContainerStats); logs and emptyDir volumes are what pods usually fill.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.container.runtime import PodRuntimeStatus
from edgelet.eviction.signals import parse_flat_keyed
from edgelet.kuberuntime.sandbox import pod_log_dir

_CONTAINER_DIR = re.compile(r"(?:^|[-:])([0-9a-f]{64})(?:\.scope)?$")
_SCAN_DEPTH = 5


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    memory: int | None = None  # working set, bytes
    disk: int | None = None  # log bytes
    inodes: int | None = None
    processes: int | None = None


def _total(values: Iterable[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


@dataclass(frozen=True, slots=True)
class PodUsage:
    containers: Mapping[str, ContainerUsage] = field(default_factory=dict)
    volume_bytes: int = 0
    volume_inodes: int = 0

    # A pod with nothing running uses nothing; None means a running container could not be measured.
    @property
    def memory(self) -> int | None:
        return _total(c.memory for c in self.containers.values()) if self.containers else 0

    @property
    def disk(self) -> int:
        return (_total(c.disk for c in self.containers.values()) or 0) + self.volume_bytes

    @property
    def inodes(self) -> int:
        return (_total(c.inodes for c in self.containers.values()) or 0) + self.volume_inodes

    @property
    def processes(self) -> int | None:
        return _total(c.processes for c in self.containers.values()) if self.containers else 0


def working_set(usage: int, stat: Mapping[str, int]) -> int:
    """cAdvisor's working set: usage minus inactive file pages (v1 "total_inactive_file", v2 "inactive_file")."""
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return max(usage - inactive, 0)


def directory_usage(path: str) -> tuple[int, int]:
    """(bytes, inodes) below `path`, without following links or entering other filesystems (tmpfs volumes)."""
    try:
        root = os.lstat(path)
    except OSError:
        return 0, 0
    total, inodes = 0, 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = os.scandir(current)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    stats = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stats.st_dev != root.st_dev:
                    continue
                inodes += 1
                total += stats.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total, inodes


class CgroupFinder:
    """Finds a container's cgroup directory by id; rescans the hierarchy at most once per `new_pass()`."""

    def __init__(self, root: str = "/sys/fs/cgroup"):
        self.root = root
        self.unified = os.path.exists(os.path.join(root, "cgroup.controllers"))
        self._index: dict[str, dict[str, str]] = {}
        self._scanned: set[str] = set()

    def new_pass(self) -> None:
        self._scanned.clear()

    def controller_root(self, controller: str) -> str:
        return self.root if self.unified else os.path.join(self.root, controller)

    def find(self, controller: str, container_id: str) -> str | None:
        index = self._index.get(controller, {})
        path = index.get(container_id)
        if path is not None and os.path.isdir(path):
            return path
        if controller in self._scanned:
            return None
        self._scanned.add(controller)
        self._index[controller] = index = self._scan(self.controller_root(controller))
        return index.get(container_id)

    @staticmethod
    def _scan(top: str) -> dict[str, str]:
        found: dict[str, str] = {}
        stack = [(top, 0)]
        while stack:
            current, depth = stack.pop()
            try:
                entries = list(os.scandir(current))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                match = _CONTAINER_DIR.search(entry.name)
                if match:
                    found[match.group(1)] = entry.path
                elif depth < _SCAN_DEPTH:
                    stack.append((entry.path, depth + 1))
        return found

    def memory_working_set(self, container_id: str) -> int | None:
        path = self.find("memory", container_id)
        if path is None:
            return None
        usage_file = "memory.current" if self.unified else "memory.usage_in_bytes"
        try:
            with open(os.path.join(path, usage_file)) as file:
                usage = int(file.read().strip())
            with open(os.path.join(path, "memory.stat")) as file:
                stat = parse_flat_keyed(file.read())
        except (OSError, ValueError):
            return None
        return working_set(usage, stat)

    def processes(self, container_id: str) -> int | None:
        path = self.find("pids", container_id)
        if path is None:
            return None
        try:
            with open(os.path.join(path, "pids.current")) as file:
                return int(file.read().strip())
        except (OSError, ValueError):
            return None


class PodUsageReader:
    """Usage of pods' running containers (`runtime_status(uid)`, the PLEG cache) and of their directories."""

    def __init__(self, *, runtime_status: Callable[[str], PodRuntimeStatus], pods_dir: str, logs_dir: str,
                 cgroup_root: str = "/sys/fs/cgroup"):
        self._runtime_status = runtime_status
        self._pods_dir = pods_dir
        self._logs_dir = logs_dir
        self._cgroups = CgroupFinder(cgroup_root)

    async def usage(self, pods: Sequence[Pod]) -> dict[str, PodUsage]:
        # Read from the runtime cache here, on the loop; the file reads go to a thread.
        running = {}
        for pod in pods:
            uid = podutil.uid(pod)
            running[uid] = [(c.name, c.id) for c in self._runtime_status(uid).running_containers()]
        return await asyncio.to_thread(self._read, list(pods), running)

    def _read(self, pods: list[Pod], running: dict[str, list[tuple[str, str]]]) -> dict[str, PodUsage]:
        self._cgroups.new_pass()
        result = {}
        for pod in pods:
            uid = podutil.uid(pod)
            log_dir = pod_log_dir(self._logs_dir, pod)
            containers = {}
            for name, container_id in running.get(uid, []):
                disk, inodes = directory_usage(os.path.join(log_dir, name))
                containers[name] = ContainerUsage(
                    memory=self._cgroups.memory_working_set(container_id), disk=disk, inodes=inodes,
                    processes=self._cgroups.processes(container_id))
            volume_bytes, volume_inodes = directory_usage(os.path.join(self._pods_dir, uid, "volumes"))
            result[uid] = PodUsage(containers, volume_bytes, volume_inodes)
        return result
