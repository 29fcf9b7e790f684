"""The machine's CPU topology (sockets, physical cores, hardware threads, NUMA nodes) as the CPU manager sees it.

`discover` reads /sys/devices/system/cpu; `topology_from_cpus` and `build_topology` are pure, so the
policy is tested on synthetic machines (say two sockets of eight hyper-threaded cores) on any host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from edgelet.util.cpuset import parse_cpuset

SYSFS_CPU = "/sys/devices/system/cpu"


@dataclass(frozen=True, slots=True)
class CPUInfo:
    """Where one logical CPU sits. `core` is unique on the machine: the lowest CPU id among the core's
    threads (sysfs core_id values repeat on every socket)."""

    socket: int
    core: int
    numa_node: int = 0


@dataclass(frozen=True)
class CPUTopology:
    """Logical CPUs by id; the set-valued views are computed once."""

    cpus: Mapping[int, CPUInfo]
    _by_core: Mapping[int, frozenset[int]] = field(init=False, repr=False, compare=False)
    _by_socket: Mapping[int, frozenset[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_core: dict[int, set[int]] = {}
        by_socket: dict[int, set[int]] = {}
        for cpu, info in self.cpus.items():
            by_core.setdefault(info.core, set()).add(cpu)
            by_socket.setdefault(info.socket, set()).add(cpu)
        object.__setattr__(self, "cpus", MappingProxyType(dict(self.cpus)))
        object.__setattr__(self, "_by_core", {k: frozenset(v) for k, v in by_core.items()})
        object.__setattr__(self, "_by_socket", {k: frozenset(v) for k, v in by_socket.items()})

    @property
    def all_cpus(self) -> frozenset[int]:
        return frozenset(self.cpus)

    @property
    def sockets(self) -> list[int]:
        return sorted(self._by_socket)

    @property
    def cores(self) -> list[int]:
        return sorted(self._by_core)

    @property
    def cpus_per_core(self) -> int:
        return max((len(cpus) for cpus in self._by_core.values()), default=1)

    @property
    def cpus_per_socket(self) -> int:
        return max((len(cpus) for cpus in self._by_socket.values()), default=1)

    def cpus_in_core(self, core: int) -> frozenset[int]:
        return self._by_core.get(core, frozenset())

    def cpus_in_socket(self, socket: int) -> frozenset[int]:
        return self._by_socket.get(socket, frozenset())

    def cores_in_socket(self, socket: int) -> list[int]:
        return sorted({self.cpus[cpu].core for cpu in self.cpus_in_socket(socket)})

    def describe(self) -> str:
        return (f"{len(self.cpus)} CPUs, {len(self._by_core)} cores, {len(self._by_socket)} sockets "
                f"({self.cpus_per_core} threads per core)")


def topology_from_cpus(cpus: Mapping[int, tuple[int, frozenset[int], int]]) -> CPUTopology:
    """A topology from (socket, thread siblings, NUMA node) per CPU id, as sysfs reports them."""
    result = {}
    for cpu, (socket, siblings, numa_node) in cpus.items():
        present = (siblings & cpus.keys()) | {cpu}
        result[cpu] = CPUInfo(socket=max(socket, 0), core=min(present), numa_node=max(numa_node, 0))
    return CPUTopology(result)


def build_topology(sockets: int, cores_per_socket: int, threads_per_core: int = 1) -> CPUTopology:
    """A synthetic machine numbered as Linux numbers x86 CPUs: every core's first thread, socket by
    socket, then every core's second thread (2x8 with HT: core 0 of socket 0 is CPUs 0 and 16)."""
    cores = sockets * cores_per_socket
    cpus = {}
    for thread in range(threads_per_core):
        for socket in range(sockets):
            for core in range(cores_per_socket):
                first = socket * cores_per_socket + core
                cpus[thread * cores + first] = CPUInfo(socket=socket, core=first, numa_node=socket)
    return CPUTopology(cpus)


def _read(path: str) -> str:
    with open(path) as file:
        return file.read().strip()


def discover(sysfs: str = SYSFS_CPU) -> CPUTopology:
    """The online CPUs of this machine; OSError or ValueError (naming the file) when sysfs is unreadable."""
    online_path = os.path.join(sysfs, "online")
    try:
        online = parse_cpuset(_read(online_path))
    except ValueError as exc:
        raise ValueError(f"{online_path}: {exc}") from None
    cpus = {}
    for cpu in sorted(online):
        base = os.path.join(sysfs, f"cpu{cpu}")
        topology_dir = os.path.join(base, "topology")
        socket = int(_read(os.path.join(topology_dir, "physical_package_id")))
        siblings_path = os.path.join(topology_dir, "core_cpus_list")
        if not os.path.exists(siblings_path):  # kernels before 5.7 only have the older name
            siblings_path = os.path.join(topology_dir, "thread_siblings_list")
        try:
            siblings = parse_cpuset(_read(siblings_path))
        except ValueError as exc:
            raise ValueError(f"{siblings_path}: {exc}") from None
        nodes = [int(name[4:]) for name in os.listdir(base) if name.startswith("node") and name[4:].isdigit()]
        cpus[cpu] = (socket, siblings, min(nodes, default=0))
    if not cpus:
        raise ValueError(f"{online_path}: no online CPUs")
    return topology_from_cpus(cpus)
