"""/metrics/cadvisor: each scrape reads the runtime's container stats and the pods' cgroups, and writes the series
(edgelet.cadvisor.series). Nothing runs between scrapes: a node nobody scrapes pays nothing.

Containers: CPU time, working set, RSS, usage and writable-layer usage from CRI ListContainerStats (the figures the
Summary API gives); throttling, page cache, swap, OOM kills, limits and block I/O from the container's cgroup. Pods
(`container=""`): their cgroup, and the network counters of their sandbox's network namespace. The machine: CPUs
and memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from edgelet.container import labels
from edgelet.cri import RuntimeCallError
from edgelet.nodestatus.facts import read_meminfo

from .cgroupfs import CgroupReader, container_id_of, device_names
from .procfs import device_of, mount_sources, parse_net_dev
from .series import Identity, Machine, Sample, Usage, cgroup_samples, machine_samples, render

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContainerFacts:
    """What the pod cache knows of a container beyond its stats."""

    image: str
    started_ns: int


def cri_usage(stats: Any, mount_devices: Mapping[str, str]) -> Usage:
    """The figures of one CRI ContainerStats (absent fields stay None)."""
    usage = Usage()
    if stats.HasField("cpu") and stats.cpu.HasField("usage_core_nano_seconds"):
        usage.cpu_seconds = stats.cpu.usage_core_nano_seconds.value / 1e9
    if stats.HasField("memory"):
        memory = stats.memory
        for field, attribute in (("working_set_bytes", "memory_working_set"), ("usage_bytes", "memory_usage"),
                                 ("rss_bytes", "memory_rss")):
            if memory.HasField(field):
                setattr(usage, attribute, float(getattr(memory, field).value))
    if stats.HasField("writable_layer") and stats.writable_layer.HasField("used_bytes"):
        mountpoint = stats.writable_layer.fs_id.mountpoint
        usage.fs_usage = [(mount_devices.get(mountpoint, mountpoint), float(stats.writable_layer.used_bytes.value))]
    return usage


class CadvisorCollector:
    """Makes the /metrics/cadvisor text on demand."""

    def __init__(self, runtime: Any, *, container_facts: Callable[[], Mapping[str, ContainerFacts]],
                 cgroups: CgroupReader | None = None, clock: Callable[[], float] = time.time) -> None:
        self._runtime = runtime
        self._container_facts = container_facts
        self._cgroups = cgroups or CgroupReader()
        self._clock = clock
        self._machine: Machine | None = None

    async def scrape(self) -> bytes:
        now = self._clock()
        samples: list[Sample] = []
        try:
            stats = await self._runtime.list_container_stats()
        except RuntimeCallError as err:
            log.warning("/metrics/cadvisor: container stats unavailable: %s", err)
            stats, error = [], 1.0
        else:
            error = 0.0
        facts = self._container_facts()
        samples += await asyncio.to_thread(self._cgroup_samples, stats, facts, now)
        samples += machine_samples(self._machine_facts())
        samples.append(("container_scrape_error", (), error))
        return render(samples)

    def _cgroup_samples(self, stats: list[Any], facts: Mapping[str, ContainerFacts], now: float) -> list[Sample]:
        """Blocking: the cgroup files of every pod and container (run in a thread)."""
        pods = self._cgroups.pods()
        with open("/proc/self/mountinfo") as handle:
            sources = mount_sources(handle.read())
        mount_devices = {}
        samples: list[Sample] = []
        pod_names: dict[str, tuple[str, str]] = {}
        containers_seen: set[str] = set()
        io_numbers: set[str] = set()
        records: list[tuple[Identity, Usage]] = []
        for item in stats:
            attributes = item.attributes
            uid = attributes.labels.get(labels.POD_UID, "")
            if not uid:
                continue
            pod, namespace = attributes.labels.get(labels.POD_NAME, ""), attributes.labels.get(labels.POD_NAMESPACE, "")
            pod_names[uid] = (pod, namespace)
            container_id = attributes.id
            containers_seen.add(container_id)
            if item.HasField("writable_layer"):
                mountpoint = item.writable_layer.fs_id.mountpoint
                if mountpoint not in mount_devices:
                    mount_devices[mountpoint] = device_of(mountpoint, sources)
            usage = cri_usage(item, mount_devices)
            path = ""
            pod_cgroup = pods.get(uid)
            if pod_cgroup is not None:
                child = next((name for name in pod_cgroup[1] if container_id_of(name) == container_id), None)
                if child is None:
                    continue  # not running: its cgroup is gone, as it is from cAdvisor's view
                path = f"{pod_cgroup[0]}/{child}"
                usage.merge(self._cgroups.usage(path))
            known = facts.get(container_id)
            if known is not None and known.started_ns:
                usage.start_time = known.started_ns / 1e9
            name = attributes.labels.get(labels.CONTAINER_NAME) or attributes.metadata.name
            records.append((Identity(pod, namespace, path, name, known.image if known else "", container_id), usage))
            io_numbers.update(device for device, _, _ in usage.io)
        for uid, (path, children) in pods.items():
            if uid not in pod_names:
                continue  # a pod cgroup with no container of ours running in it
            usage = self._cgroups.usage(path)
            usage.network = self._pod_network(path, [c for c in children if container_id_of(c) not in containers_seen])
            records.append((Identity(*pod_names[uid], id=path), usage))
            io_numbers.update(device for device, _, _ in usage.io)
        names = device_names(sorted(io_numbers), _read)
        for identity, usage in records:
            usage.io = [(names.get(device, device), read, written) for device, read, written in usage.io]
            samples += cgroup_samples(identity, usage, now)
        return samples

    def _pod_network(self, pod_path: str, sandbox_children: list[str]) -> list[tuple[str, float, float, float, float]]:
        """The counters of the pod's network namespace, from a process of its sandbox; none for a pod on the host's
        network (its traffic is the node's)."""
        for child in sandbox_children:
            pid = self._cgroups.first_pid(f"{pod_path}/{child}")
            if pid is None:
                continue
            try:
                if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
                    return []
                return [cast("tuple[str, float, float, float, float]", (name, *map(float, counters)))
                        for name, counters in parse_net_dev(_read(f"/proc/{pid}/net/dev")).items()]
            except OSError:
                continue
        return []

    def _machine_facts(self) -> Machine:
        if self._machine is None:
            memory_total, _ = read_meminfo()
            self._machine = Machine(os.cpu_count() or 1, memory_total, _first_line("/proc/sys/kernel/random/boot_id"),
                                    _first_line("/etc/machine-id"), _first_line("/sys/class/dmi/id/product_uuid"))
        return self._machine


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _first_line(path: str) -> str:
    try:
        return _read(path).strip()
    except OSError:
        return ""
