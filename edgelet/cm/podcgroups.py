"""Pod cgroups as the kubelet's container manager keeps them: the QoS tree (kubepods held to node allocatable,
burstable, besteffort) made once, each pod's cgroup made with its limits before its sandbox, and the cgroups of
pods that are gone removed at housekeeping. With the systemd driver the runtime makes the slices itself.

cgroupfs on cgroup v1 (a directory per controller) and v2 (one tree, controllers enabled per level). The driver
is the runtime's answer to RuntimeConfig (containerd >= 2.0), else the `[cgroups] driver` setting, else cgroupfs.

On v1 a pod cgroup is made and removed in every hierarchy, as libcontainer does for the kubelet: the runtime makes
each container's cgroup in all of them, and a pod cgroup missing from one would be made there by the runtime and
never removed (and every cpuset left behind makes each later write of `cpuset.cpus` on the node slower: what a
write costs the kernel grows with the cpusets alive). The QoS tree's cpusets clone their children
(`cgroup.clone_children`), so that the kernel gives each pod and container cpuset its parent's CPUs and memory
nodes as it makes it, and neither this nor the runtime has any to write.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Iterable

from edgelet.api import podutil, qos
from edgelet.api.resources import MIN_SHARES, QUOTA_PERIOD, milli_cpu_to_shares
from edgelet.util.errors import TemporaryError

from ..config import CgroupsConfig
from ..cri import CRIError
from ..cri import runtime_v1_pb2 as pb
from ..cri.client import RuntimeClient
from . import cgroups
from .cgroups import Allocatable, CgroupName, CgroupResources

log = logging.getLogger(__name__)

CGROUP_FS = "/sys/fs/cgroup"
# The controllers the pod cgroups are given limits in. On v1 their hierarchies come first, and housekeeping lists the
# pods from the first.
V1_CONTROLLERS = ("cpu", "memory", "pids")
V2_CONTROLLERS = "+cpu +memory +pids"
CPUSET = "cpuset"
CPUSET_FILES = ("cpuset.cpus", "cpuset.mems")


class CgroupError(TemporaryError):
    """A cgroup file could not be written; the message names it."""


def driver_of(runtime_answer: int | None, configured: str) -> tuple[str, str]:
    """The driver to use and a warning ("" for none): the runtime's answer wins, as in the kubelet since 1.34."""
    if runtime_answer is None:
        return configured or cgroups.CGROUPFS, ""
    runtime_driver = cgroups.SYSTEMD if runtime_answer == pb.SYSTEMD else cgroups.CGROUPFS
    if configured and configured != runtime_driver:
        return runtime_driver, (f"[cgroups] driver = {configured!r}, but the runtime uses {runtime_driver}: "
                                f"following the runtime")
    return runtime_driver, ""


def v1_hierarchies(fs_root: str) -> list[str]:
    """The cgroup v1 hierarchies mounted under `fs_root`, one directory each (cpu and cpuacct are often one
    hierarchy with a link for each name): the controllers with limits first, in V1_CONTROLLERS' order, then the
    others by name (a hybrid host's `unified` and the named `systemd` hierarchy among them)."""
    try:
        entries = sorted(os.listdir(fs_root))
    except FileNotFoundError:
        return []
    ordered = [c for c in V1_CONTROLLERS if c in entries] + [e for e in entries if e not in V1_CONTROLLERS]
    hierarchies, seen = [], set()
    for entry in ordered:
        path = os.path.join(fs_root, entry)
        real = os.path.realpath(path)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            hierarchies.append(path)
    return hierarchies


def cpu_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 cpu.shares (the runtimes' and the kubelet's conversion)."""
    return 1 + ((shares - 2) * 9999) // 262142


def v1_writes(resources: CgroupResources) -> list[tuple[str, str, str]]:
    """(controller, file, value) for cgroup v1; the period before the quota (the kernel checks the quota against it)."""
    writes = []
    if resources.cpu_shares is not None:
        writes.append(("cpu", "cpu.shares", str(resources.cpu_shares)))
    if resources.cpu_period is not None:
        writes.append(("cpu", "cpu.cfs_period_us", str(resources.cpu_period)))
    if resources.cpu_quota is not None:
        writes.append(("cpu", "cpu.cfs_quota_us", str(resources.cpu_quota)))
    if resources.memory_limit is not None:
        writes.append(("memory", "memory.limit_in_bytes", str(resources.memory_limit)))
    return writes


def v2_writes(resources: CgroupResources) -> list[tuple[str, str]]:
    """(file, value) for cgroup v2."""
    writes = []
    if resources.cpu_shares is not None:
        writes.append(("cpu.weight", str(cpu_weight(resources.cpu_shares))))
    if resources.cpu_quota is not None or resources.cpu_period is not None:
        quota = resources.cpu_quota if resources.cpu_quota is not None and resources.cpu_quota > 0 else "max"
        writes.append(("cpu.max", f"{quota} {resources.cpu_period or QUOTA_PERIOD}"))
    if resources.memory_limit is not None:
        writes.append(("memory.max", str(resources.memory_limit)))
    return writes


class PodCgroups:
    """The node's pod cgroup tree. `parent_for(pod)` is the CRI cgroup parent of the pod's sandbox (made first);
    `remove_orphans(keep)` removes the pod cgroups of pods not in `keep` that nothing runs in any more."""

    def __init__(self, settings: CgroupsConfig, runtime: RuntimeClient, allocatable: Allocatable, *,
                 active_pods: Callable[[], Iterable[podutil.Pod]] = tuple, fs_root: str = CGROUP_FS):
        self._settings = settings
        self._runtime = runtime
        self._allocatable = allocatable
        self._active_pods = active_pods
        self._fs = fs_root
        self._v2 = os.path.exists(os.path.join(fs_root, "cgroup.controllers"))
        self._hierarchies = [] if self._v2 else v1_hierarchies(fs_root)
        cpuset = os.path.join(fs_root, CPUSET)
        self._cpuset = cpuset if cpuset in self._hierarchies else None
        self._qos = cgroups.qos_names(settings.root)
        # The first sweep lists the pods of every hierarchy, for cgroups left in some by a crash or by an older
        # agent (which made pod cgroups for the limited controllers only); later ones list the first hierarchy,
        # from which a pod cgroup is removed last.
        self._swept_every_hierarchy = False
        self.driver: str | None = None  # known after the first pod
        self._tree_ready = False
        self._lock = asyncio.Lock()

    async def parent_for(self, pod: podutil.Pod, create: bool = True) -> str:
        """The cgroup parent for the pod's sandbox ("" without per-QoS cgroups); with `create` (a sandbox is about to
        start) its cgroup is made and limited first."""
        if not self._settings.per_qos:
            return ""
        if self.driver is None or (create and not self._tree_ready):
            async with self._lock:  # once: the driver, and the QoS tree every pod cgroup goes into
                if self.driver is None:
                    self.driver = await self._discover_driver()
                if create and not self._tree_ready:
                    if self.driver == cgroups.CGROUPFS:
                        await asyncio.to_thread(self._make_qos_tree)
                    self._tree_ready = True
        name = cgroups.pod_name(podutil.uid(pod), qos.qos_class(pod), self._settings.root)
        if create and self.driver == cgroups.CGROUPFS:
            # Pods of a burst make their own cgroups side by side, one thread hop each.
            await asyncio.to_thread(self._make_pod, name, cgroups.pod_resources(pod))
        return cgroups.spell(name, self.driver)

    async def set_limits(self, pod: podutil.Pod, resources: CgroupResources) -> None:
        """Rewrites the limits of a running pod's cgroup (an in-place resize); nothing where the runtime's
        systemd driver owns the cgroups or there are no pod cgroups."""
        if not self._settings.per_qos or self.driver != cgroups.CGROUPFS:
            return
        name = cgroups.pod_name(podutil.uid(pod), qos.qos_class(pod), self._settings.root)
        async with self._lock:
            await asyncio.to_thread(self._make_pod, name, resources)

    def _make_pod(self, name: CgroupName, resources: CgroupResources) -> None:
        self._make(name, resources)
        if name[-2] == cgroups.BURSTABLE:
            self._set_burstable_shares()

    async def _discover_driver(self) -> str:
        try:
            answer: int | None = (await self._runtime.runtime_config()).linux.cgroup_driver
        except CRIError as exc:
            if exc.code != "UNIMPLEMENTED":
                raise
            answer = None
        driver, warning = driver_of(answer, self._settings.driver)
        if warning:
            log.warning("cgroups: %s", warning)
        log.info("cgroups: driver %s (%s), pods under %s", driver,
                 "the runtime's" if answer is not None else "configured" if self._settings.driver else "default",
                 cgroups.spell(self._qos[qos.GUARANTEED], driver))
        return driver

    # -- cgroupfs ------------------------------------------------------------------------------------------

    def _make_qos_tree(self) -> None:
        """kubepods gets node allocatable (the kubelet's enforce-node-allocatable=pods); besteffort the minimum
        shares; burstable the requests of its pods, updated with every pod."""
        allocatable = CgroupResources(cpu_shares=milli_cpu_to_shares(self._allocatable.cpu_millis),
                                      memory_limit=self._allocatable.memory_bytes)
        self._make(self._qos[qos.GUARANTEED], allocatable, clone_cpusets=True)
        self._make(self._qos[qos.BURSTABLE], CgroupResources(), clone_cpusets=True)
        self._make(self._qos[qos.BEST_EFFORT], CgroupResources(cpu_shares=MIN_SHARES), clone_cpusets=True)

    def _set_burstable_shares(self) -> None:
        shares = cgroups.burstable_shares(list(self._active_pods()))
        self._make(self._qos[qos.BURSTABLE], CgroupResources(cpu_shares=shares))

    def _dirs(self, name: CgroupName) -> list[str]:
        path = cgroups.to_cgroupfs(name).lstrip("/")
        if self._v2:
            return [os.path.join(self._fs, path)]
        return [os.path.join(hierarchy, path) for hierarchy in self._hierarchies]

    def _make(self, name: CgroupName, resources: CgroupResources, *, clone_cpusets: bool = False) -> None:
        try:
            if self._v2:
                self._enable_controllers(name)
            # In the first hierarchy first, as it goes from there last: a cgroup made or removed only in part is
            # found there by the next sweep.
            for directory in self._dirs(name):
                if self._cpuset is not None and directory.startswith(self._cpuset + os.sep):
                    self._make_cpuset(self._cpuset, name, clone_children=clone_cpusets)
                else:
                    os.makedirs(directory, exist_ok=True)
            if self._v2:
                writes = [(os.path.join(self._dirs(name)[0], file), value) for file, value in v2_writes(resources)]
            else:
                writes = [(os.path.join(self._fs, controller, cgroups.to_cgroupfs(name).lstrip("/"), file), value)
                          for controller, file, value in v1_writes(resources)]
            for path, value in writes:
                with open(path, "w") as f:
                    f.write(value)
        except OSError as exc:
            raise CgroupError(f"cgroup {cgroups.to_cgroupfs(name)}: {exc}") from None

    def _make_cpuset(self, hierarchy: str, name: CgroupName, *, clone_children: bool) -> None:
        """Makes the cpuset levels of `name` that are missing, each given its parent's CPUs and memory nodes where
        the kernel left them empty (no process can join an empty cpuset; libcontainer copies them the same way);
        with `clone_children`, every level also clones its future children."""
        directory = hierarchy
        for component in name:
            parent, directory = directory, os.path.join(directory, component)
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not clone_children:
                    continue
            for file in CPUSET_FILES:
                if not _read_value(directory, file):
                    _write_value(directory, file, _read_value(parent, file))
            if clone_children:
                _write_value(directory, "cgroup.clone_children", "1")

    def _enable_controllers(self, name: CgroupName) -> None:
        """cgroup v2 hands a controller to a child only when every ancestor enabled it for its children."""
        for depth in range(len(name)):
            parent = os.path.join(self._fs, *name[:depth])
            os.makedirs(parent, exist_ok=True)
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write(V2_CONTROLLERS)

    async def run(self, keep: Callable[[], set[str]], period: float = 10.0) -> None:
        """Housekeeping: every `period`, the cgroups of pods that neither a source nor the runtime knows go."""
        while True:
            await asyncio.sleep(period)
            try:
                removed = await self.remove_orphans(keep())
            except Exception:  # a bug here must not end the agent's other work, but must be seen
                log.exception("cgroups: removing orphaned pod cgroups failed")
            else:
                if removed:
                    log.info("cgroups: removed the cgroups of %d pods gone: %s", len(removed), ", ".join(removed))

    # -- clean-up -------------------------------------------------------------------------------------------

    def pod_cgroups(self, *, every_hierarchy: bool = False) -> dict[str, CgroupName]:
        """The pod cgroups that exist under the QoS tree, by pod uid: in the first hierarchy (where a pod cgroup
        goes last), or with `every_hierarchy` in any."""
        found = {}
        for qos_name in self._qos.values():
            directories = self._dirs(qos_name)
            for directory in directories if every_hierarchy else directories[:1]:
                try:
                    entries = os.listdir(directory)
                except FileNotFoundError:
                    continue
                for entry in entries:
                    uid = cgroups.pod_uid_of(entry)
                    if uid is not None and entry.startswith(cgroups.POD_PREFIX):
                        found[uid] = (*qos_name, entry)
        return found

    async def remove_orphans(self, keep: set[str]) -> list[str]:
        """Removes the cgroups of pods not in `keep`; one that still holds a container stays for the next round
        (the kubelet's cleanupOrphanedPodCgroups). Returns the uids removed."""
        if self.driver != cgroups.CGROUPFS:  # unknown until a pod needed it; systemd removes its own slices
            return []
        async with self._lock:
            return await asyncio.to_thread(self._remove_orphans, keep)

    def _remove_orphans(self, keep: set[str]) -> list[str]:
        removed = []
        found = self.pod_cgroups(every_hierarchy=not self._swept_every_hierarchy)
        self._swept_every_hierarchy = True
        for uid, name in found.items():
            if uid in keep:
                continue
            try:
                # The first hierarchy last: while any part of the cgroup is left, the next sweep finds it there.
                for directory in reversed(self._dirs(name)):
                    if os.path.isdir(directory):
                        os.rmdir(directory)
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    log.warning("cgroups: removing %s: %s", cgroups.to_cgroupfs(name), exc)
                continue
            removed.append(uid)
        return removed


def _read_value(directory: str, file: str) -> str:
    try:
        with open(os.path.join(directory, file)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _write_value(directory: str, file: str, value: str) -> None:
    with open(os.path.join(directory, file), "w") as f:
        f.write(value)
