"""The CPU manager's policies as pure functions over an immutable `CPUState`: which CPUs a container gets.

"static" is the kubelet's static policy: a container of a Guaranteed pod that requests a whole number of
CPUs gets that many CPUs for itself, chosen topology-first (whole sockets, then whole cores, then single
threads that fill partly used cores); every other container runs on the shared pool, which is every CPU
no container holds exclusively. "none" pins nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from edgelet.api import podutil, qos
from edgelet.api.podutil import Pod
from edgelet.api.quantity import to_millis_ceil
from edgelet.api.resources import ResourceError, container_quantity
from edgelet.util.cpuset import format_cpuset
from edgelet.util.errors import PermanentError

if TYPE_CHECKING:  # the topology is read only under the static policy (see CPUManager.start)
    from edgelet.cm.topology import CPUTopology

POLICY_NONE = "none"
POLICY_STATIC = "static"
POLICIES = (POLICY_NONE, POLICY_STATIC)

Assignments = Mapping[str, Mapping[str, frozenset[int]]]  # pod uid -> container name -> CPUs


class CPUAllocationError(PermanentError):
    """The CPUs a container needs cannot be given; the message is the kubelet's."""


class CPUStateError(PermanentError):
    """Recorded assignments that do not fit this machine or configuration."""


@dataclass(frozen=True)
class CPUState:
    """What the CPU manager records: the shared pool (`default`) and the exclusive assignments."""

    policy: str
    default: frozenset[int]
    assignments: Assignments = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = {uid: MappingProxyType(dict(containers)) for uid, containers in self.assignments.items()}
        object.__setattr__(self, "assignments", MappingProxyType(frozen))

    def assigned(self, uid: str, name: str) -> frozenset[int] | None:
        return (self.assignments.get(uid) or {}).get(name)

    def assign(self, uid: str, name: str, cpus: frozenset[int]) -> CPUState:
        entries = {pod: dict(containers) for pod, containers in self.assignments.items()}
        entries.setdefault(uid, {})[name] = cpus
        return CPUState(self.policy, self.default - cpus, entries)

    def without_pod(self, uid: str) -> CPUState:
        containers = self.assignments.get(uid)
        if not containers:
            return self
        freed = frozenset().union(*containers.values())
        entries = {pod: c for pod, c in self.assignments.items() if pod != uid}
        return CPUState(self.policy, self.default | freed, entries)

    def exclusive_cpus(self) -> frozenset[int]:
        return frozenset().union(*(cpus for c in self.assignments.values() for cpus in c.values()))


def initial_state(policy: str, topology: CPUTopology) -> CPUState:
    return CPUState(policy, topology.all_cpus)


def check_policy(state: CPUState, policy: str) -> None:
    """Another policy's state is dropped when it holds no exclusive CPUs; otherwise CPUStateError."""
    if state.policy != policy and state.assignments:
        raise CPUStateError(f'configured policy "{policy}" differs from state checkpoint policy "{state.policy}"')


def validate_state(state: CPUState, policy: str, topology: CPUTopology, reserved: frozenset[int]) -> CPUState:
    """The state to run with: `state` itself when it fits, a fresh one when it holds nothing that matters.

    Raises CPUStateError as the kubelet refuses to start: another policy's exclusive assignments, reserved
    CPUs missing from the shared pool, an assignment overlapping the shared pool, or CPUs that differ
    from this machine's.
    """
    if state.policy != policy:
        check_policy(state, policy)
        return initial_state(policy, topology)
    if not state.default and not state.assignments:
        return initial_state(policy, topology)
    if not reserved <= state.default:
        raise CPUStateError(f'not all reserved cpus: "{format_cpuset(reserved)}" are present in '
                            f'defaultCpuSet: "{format_cpuset(state.default)}"')
    for uid, containers in sorted(state.assignments.items()):
        for name, cpus in sorted(containers.items()):
            if cpus & state.default:
                raise CPUStateError(f'pod: {uid}, container: {name} cpuset: "{format_cpuset(cpus)}" overlaps '
                                    f'with default cpuset "{format_cpuset(state.default)}"')
    known = state.default | state.exclusive_cpus()
    if known != topology.all_cpus:
        raise CPUStateError(f'current set of available CPUs "{format_cpuset(topology.all_cpus)}" doesn\'t match '
                            f'with CPUs in state "{format_cpuset(known)}"')
    return state


def guaranteed_cpus(pod: Pod, container: dict) -> int:
    """Exclusive CPUs the container asks for: its whole-number CPU request in a Guaranteed pod, else 0."""
    try:
        if qos.qos_class(pod) != qos.GUARANTEED:
            return 0
    except ValueError:
        return 0
    try:
        request = container_quantity(container, "requests", "cpu")
        if request is None:  # a Guaranteed container's request defaults to its limit
            request = container_quantity(container, "limits", "cpu")
    except ResourceError:
        return 0
    if request is None:
        return 0
    millis = to_millis_ceil(request)
    return millis // 1000 if millis % 1000 == 0 else 0


def _not_enough(requested: int, available: int) -> CPUAllocationError:
    return CPUAllocationError(f"not enough cpus available to satisfy request: requested={requested}, "
                              f"available={available}")


def take_by_topology(topology: CPUTopology, available: frozenset[int], count: int) -> frozenset[int]:
    """`count` CPUs of `available`, best fit for the topology (the kubelet's takeByTopology):

    1. whole free sockets while the request needs at least a socket;
    2. whole free cores while it needs at least a core, packing onto the socket with the fewest free cores;
    3. single threads, first on sockets already used by this allocation, then where the fewest CPUs are
       free, so partly used cores are filled and whole cores stay whole for the next request.
    """
    if count <= 0:
        return frozenset()
    if len(available) < count:
        raise _not_enough(count, len(available))
    free = set(available)
    taken: set[int] = set()

    def take(cpus: frozenset[int] | set[int]) -> None:
        taken.update(cpus)
        free.difference_update(cpus)

    if count - len(taken) >= topology.cpus_per_socket:
        for socket in topology.sockets:
            cpus = topology.cpus_in_socket(socket)
            if cpus <= free and count - len(taken) >= len(cpus):
                take(cpus)

    if count - len(taken) >= topology.cpus_per_core:
        def free_cores_in(socket: int) -> list[int]:
            return [c for c in topology.cores_in_socket(socket) if topology.cpus_in_core(c) <= free]

        sockets = sorted(topology.sockets, key=lambda s: (len(free_cores_in(s)), s))
        for socket in sockets:
            for core in free_cores_in(socket):
                cpus = topology.cpus_in_core(core)
                if count - len(taken) >= len(cpus):
                    take(cpus)

    if count > len(taken):
        def preference(cpu: int) -> tuple:
            info = topology.cpus[cpu]
            socket_cpus = topology.cpus_in_socket(info.socket)
            return (-len(socket_cpus & taken), len(socket_cpus & free),
                    len(topology.cpus_in_core(info.core) & free), info.socket, info.core, cpu)

        for cpu in sorted(free, key=preference)[:count - len(taken)]:
            take({cpu})
    return frozenset(taken)


def _is_restartable_init(container: dict) -> bool:
    return container.get("restartPolicy") == "Always"


class StaticPolicy:
    """Exclusive CPUs for integer requests of Guaranteed pods; `reserved` CPUs never leave the shared pool.

    Without reserved CPUs one CPU always stays shared, for the pods' sandboxes and every container that
    holds none (the kubelet insists on reserved CPUs instead); it is the CPU the kubelet would have
    reserved, so on a two-CPU machine CPU 0 stays shared and CPU 1 is the one given away.
    """

    name = POLICY_STATIC

    def __init__(self, topology: CPUTopology, reserved: frozenset[int] = frozenset()):
        unknown = reserved - topology.all_cpus
        if unknown:
            raise CPUStateError(f'reserved CPUs "{format_cpuset(unknown)}" are not online CPUs of this machine '
                                f'("{format_cpuset(topology.all_cpus)}")')
        if reserved and reserved == topology.all_cpus:
            raise CPUStateError(f'reserved CPUs "{format_cpuset(reserved)}" leave no CPU to give exclusively')
        self.topology = topology
        self.reserved = reserved

    def _take(self, state: CPUState, count: int, reusable: frozenset[int]) -> frozenset[int]:
        # CPUs an init container of this pod held come first: they are the pod's already.
        from_reusable = take_by_topology(self.topology, reusable, min(count, len(reusable)))
        needed = count - len(from_reusable)
        if not needed:
            return from_reusable
        pool = state.default - self.reserved - reusable
        keep_shared = 0 if self.reserved else 1
        available = max(len(pool) - keep_shared, 0)
        if needed > available:
            raise _not_enough(count, available + len(reusable))
        if keep_shared:
            # Spare the CPU the kubelet would have reserved (the first one by topology, CPU 0 on a fresh
            # machine) and take the rest from what remains.
            pool -= take_by_topology(self.topology, pool, 1)
        return from_reusable | take_by_topology(self.topology, pool, needed)

    def allocate(self, state: CPUState, pod: Pod) -> CPUState:
        """The state after giving every container of `pod` its CPUs; all of them or none (raises)."""
        uid = podutil.uid(pod)
        reusable: frozenset[int] = frozenset()
        init_names = {c.get("name") for c in podutil.init_containers(pod)}
        for container in podutil.all_containers(pod):
            name = container.get("name", "")
            count = guaranteed_cpus(pod, container)
            if count == 0:
                continue
            cpus = state.assigned(uid, name)
            if cpus is None:
                cpus = self._take(state, count, reusable)
                state = state.assign(uid, name, cpus)
            if name in init_names and not _is_restartable_init(container):
                reusable |= cpus
            else:
                reusable -= cpus
        return state

    def cpuset(self, state: CPUState, uid: str, name: str) -> frozenset[int]:
        """The container's exclusive CPUs, else the shared pool."""
        assigned = state.assigned(uid, name)
        return assigned if assigned is not None else state.default
