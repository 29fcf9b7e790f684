"""Eviction signals: how much memory, disk, inodes and PIDs the node has left, as (available, capacity) pairs.

memory.available follows the kubelet: capacity (MemTotal) minus the working set of the root memory
cgroup (usage minus inactive file pages; cgroup v1). Where the root cgroup has no usage file (cgroup v2,
or no memory controller) the same formula is taken from /proc/meminfo: MemTotal - MemFree - Inactive(file).
nodefs is the filesystem of the agent's root_dir, imagefs the runtime's image filesystem (CRI ImageFsInfo);
containerd keeps writable layers beside the images, so containerfs is observed as imagefs. pid.available
is min(pid_max, threads-max) minus the tasks in use.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

MEMORY_AVAILABLE = "memory.available"
ALLOCATABLE_MEMORY_AVAILABLE = "allocatableMemory.available"
NODEFS_AVAILABLE = "nodefs.available"
NODEFS_INODES_FREE = "nodefs.inodesFree"
IMAGEFS_AVAILABLE = "imagefs.available"
IMAGEFS_INODES_FREE = "imagefs.inodesFree"
CONTAINERFS_AVAILABLE = "containerfs.available"
CONTAINERFS_INODES_FREE = "containerfs.inodesFree"
PID_AVAILABLE = "pid.available"

# What edgelet observes; allocatableMemory.available needs the kubelet's pod cgroup tree, which edgelet has not.
OBSERVED_SIGNALS = (MEMORY_AVAILABLE, NODEFS_AVAILABLE, NODEFS_INODES_FREE, IMAGEFS_AVAILABLE,
                    IMAGEFS_INODES_FREE, CONTAINERFS_AVAILABLE, CONTAINERFS_INODES_FREE, PID_AVAILABLE)


@dataclass(frozen=True, slots=True)
class Observation:
    available: int
    capacity: int


Observations = Mapping[str, Observation]


# -- parsing (pure) ----------------------------------------------------------------------------------

def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes by key ("MemTotal", "Inactive(file)", ...)."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def parse_flat_keyed(text: str) -> dict[str, int]:
    """A cgroup "key value" file such as memory.stat."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    return values


def memory_observation(meminfo: Mapping[str, int], root_usage: int | None = None,
                       root_stat: Mapping[str, int] | None = None) -> Observation:
    """memory.available from MemTotal and the root cgroup's usage and memory.stat (v1), else from meminfo."""
    capacity = meminfo.get("MemTotal", 0)
    if root_usage is not None and root_stat is not None and "total_inactive_file" in root_stat:
        working_set = root_usage - root_stat["total_inactive_file"]
    else:
        working_set = capacity - meminfo.get("MemFree", 0) - meminfo.get("Inactive(file)", 0)
    return Observation(available=max(capacity - max(working_set, 0), 0), capacity=capacity)


def filesystem_observations(stats: os.statvfs_result) -> tuple[Observation, Observation | None]:
    """(bytes, inodes) of a filesystem; inodes is None where the filesystem does not count them (btrfs)."""
    space = Observation(available=stats.f_bavail * stats.f_frsize, capacity=stats.f_blocks * stats.f_frsize)
    inodes = Observation(available=stats.f_ffree, capacity=stats.f_files) if stats.f_files else None
    return space, inodes


def pid_observation(pid_max: int, threads_max: int, tasks: int) -> Observation:
    limits = [value for value in (pid_max, threads_max) if value > 0]
    capacity = min(limits) if limits else 0
    return Observation(available=max(capacity - tasks, 0), capacity=capacity)


def tasks_in_use(loadavg: str) -> int:
    """Scheduling entities in use: the total of the 4th /proc/loadavg field ("running/total")."""
    fields = loadavg.split()
    return int(fields[3].split("/")[1]) if len(fields) > 3 and "/" in fields[3] else 0


# -- gathering (I/O) ---------------------------------------------------------------------------------

def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def _read_int(path: str) -> int:
    try:
        return int(_read(path).strip())
    except (OSError, ValueError):
        return 0


def existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


class NodeSignals:
    """Reads the signals; `image_fs_mountpoint` returns the image filesystem's mountpoint (from CRI
    ImageFsInfo), and is asked again only until it has answered once."""

    def __init__(
        self,
        root_dir: str,
        *,
        image_fs_mountpoint: Callable[[], Awaitable[str]] | None = None,
        proc: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ):
        self._root_dir = root_dir
        self._image_fs_mountpoint = image_fs_mountpoint
        self._image_mountpoint: str | None = None
        self._proc = proc
        self._cgroup_root = cgroup_root
        self._statvfs = statvfs
        self.dedicated_image_fs = False

    async def observe(self) -> dict[str, Observation]:
        """Every signal that could be read this time; one that cannot is left out (and logged)."""
        if self._image_mountpoint is None and self._image_fs_mountpoint is not None:
            try:
                self._image_mountpoint = await self._image_fs_mountpoint() or None
            except Exception as exc:  # noqa: BLE001 - the runtime may be down: the image signals wait for it
                log.debug("eviction: image filesystem unknown yet: %s", exc)
        return await asyncio.to_thread(self._observe)

    def _observe(self) -> dict[str, Observation]:
        result: dict[str, Observation] = {}
        try:
            result[MEMORY_AVAILABLE] = self._memory()
        except (OSError, ValueError) as exc:
            log.warning("eviction: cannot read memory usage: %s", exc)
        try:
            nodefs_path = existing_parent(self._root_dir)
            nodefs = self._statvfs(nodefs_path)
            space, inodes = filesystem_observations(nodefs)
            result[NODEFS_AVAILABLE] = space
            if inodes is not None:
                result[NODEFS_INODES_FREE] = inodes
        except OSError as exc:
            log.warning("eviction: statvfs %s: %s", self._root_dir, exc)
        if self._image_mountpoint:
            try:
                space, inodes = filesystem_observations(self._statvfs(self._image_mountpoint))
                result[IMAGEFS_AVAILABLE] = result[CONTAINERFS_AVAILABLE] = space
                if inodes is not None:
                    result[IMAGEFS_INODES_FREE] = result[CONTAINERFS_INODES_FREE] = inodes
                self.dedicated_image_fs = os.stat(self._image_mountpoint).st_dev != os.stat(nodefs_path).st_dev
            except OSError as exc:
                log.warning("eviction: statvfs of the image filesystem %s: %s", self._image_mountpoint, exc)
        try:
            tasks = tasks_in_use(_read(os.path.join(self._proc, "loadavg")))
            observation = pid_observation(_read_int(os.path.join(self._proc, "sys/kernel/pid_max")),
                                          _read_int(os.path.join(self._proc, "sys/kernel/threads-max")), tasks)
            if observation.capacity:
                result[PID_AVAILABLE] = observation
        except (OSError, ValueError) as exc:
            log.warning("eviction: cannot count tasks: %s", exc)
        return result

    def _memory(self) -> Observation:
        meminfo = parse_meminfo(_read(os.path.join(self._proc, "meminfo")))
        if "MemTotal" not in meminfo:
            raise ValueError(f"{os.path.join(self._proc, 'meminfo')}: no MemTotal line")
        memory_root = os.path.join(self._cgroup_root, "memory")
        try:
            usage = int(_read(os.path.join(memory_root, "memory.usage_in_bytes")).strip())
            stat = parse_flat_keyed(_read(os.path.join(memory_root, "memory.stat")))
        except (OSError, ValueError):
            usage, stat = None, None
        return memory_observation(meminfo, usage, stat)


async def image_fs_mountpoint(runtime) -> str:
    """The mountpoint of the runtime's image filesystem (CRI ImageFsInfo), "" when it reports none."""
    info = await runtime.image_fs_info()
    return info.image_filesystems[0].fs_id.mountpoint if info.image_filesystems else ""
