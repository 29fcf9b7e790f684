"""In-place resize decisions (pure): which running containers' cgroup settings differ from their spec, whether
the node can take the new requests (PodResizePending Infeasible / Deferred), which changes restart the
container (resizePolicy RestartContainer), and what the status shows as applied and allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from edgelet.api import podutil, qos
from edgelet.api.podutil import Pod
from edgelet.api.quantity import to_int_ceil, to_millis_ceil
from edgelet.api.resources import MIN_SHARES, QUOTA_PERIOD, SHARES_PER_CPU, effective_request, linux_resources
from edgelet.container.runtime import ContainerState, PodRuntimeStatus

INFEASIBLE = "Infeasible"
DEFERRED = "Deferred"
RESIZE_PENDING = "PodResizePending"
RESIZE_IN_PROGRESS = "PodResizeInProgress"
RESTART_CONTAINER = "RestartContainer"


class Applied(NamedTuple):
    """What a container's cgroup holds: CPU shares, CFS quota (per QUOTA_PERIOD; 0 = none), memory limit (0 = none)."""

    cpu_shares: int
    cpu_quota: int
    memory_limit: int


@dataclass(frozen=True, slots=True)
class ContainerChange:
    name: str
    container_id: str
    desired: Applied
    applied: Applied
    restart: bool  # a changed resource's resizePolicy is RestartContainer

    @property
    def memory_decrease(self) -> bool:
        return 0 < self.desired.memory_limit < self.applied.memory_limit or (
            self.desired.memory_limit > 0 and self.applied.memory_limit == 0)


@dataclass(frozen=True, slots=True)
class ResizePlan:
    changes: tuple[ContainerChange, ...] = ()
    pending: tuple[str, str] | None = None  # (Infeasible | Deferred, message): nothing is applied

    @property
    def accepted(self) -> bool:
        return bool(self.changes) and self.pending is None


def desired_applied(pod: Pod, container: dict[str, Any]) -> Applied:
    """The cgroup settings the container's spec asks for (the kubelet's formulas, as at creation)."""
    # The OOM score is not resized: any capacity serves to compute the rest.
    wanted = linux_resources(pod, container, memory_capacity=1 << 40, cgroup_v2=False)
    return Applied(wanted["cpu_shares"], wanted.get("cpu_quota", 0), wanted["memory_limit_in_bytes"])


def _policy(container: dict[str, Any], resource: str) -> str:
    for entry in container.get("resizePolicy") or []:
        if isinstance(entry, dict) and entry.get("resourceName") == resource:
            return entry.get("restartPolicy") or "NotRequired"
    return "NotRequired"


def needs_restart(container: dict[str, Any], desired: Applied, applied: Applied) -> bool:
    """Whether the changed resources include one whose resizePolicy restarts the container."""
    cpu_changed = (desired.cpu_shares, desired.cpu_quota) != (applied.cpu_shares, applied.cpu_quota)
    memory_changed = desired.memory_limit != applied.memory_limit
    return (cpu_changed and _policy(container, "cpu") == RESTART_CONTAINER) or (
        memory_changed and _policy(container, "memory") == RESTART_CONTAINER)


def pod_requests(pod: Pod) -> tuple[int, int]:
    """The pod's CPU (millicores) and memory (bytes) requests: its regular containers' sum, or the largest
    init container's where that is more (the scheduler's rule)."""
    def total(containers: Sequence[dict[str, Any]]) -> tuple[int, int]:
        cpu = memory = 0
        for container in containers:
            request = effective_request(container, "cpu")
            cpu += to_millis_ceil(request) if request is not None else 0
            request = effective_request(container, "memory")
            memory += to_int_ceil(request) if request is not None else 0
        return cpu, memory
    cpu, memory = total(podutil.containers(pod))
    for init in podutil.init_containers(pod):
        init_cpu, init_memory = total([init])
        cpu, memory = max(cpu, init_cpu), max(memory, init_memory)
    return cpu, memory


def feasibility(requested: tuple[int, int], others: tuple[int, int],
                allocatable: tuple[int, int]) -> tuple[str, str] | None:
    """None when the node can take `requested`; else (Infeasible, ...) when it never could, (Deferred, ...)
    when other pods' allocations are in the way (the kubelet's messages)."""
    for index, resource in enumerate(("cpu", "memory")):
        if requested[index] > allocatable[index]:
            return INFEASIBLE, (f"Node didn't have enough capacity: {resource}, requested: {requested[index]}, "
                                f"capacity: {allocatable[index]}")
    for index, resource in enumerate(("cpu", "memory")):
        if requested[index] + others[index] > allocatable[index]:
            return DEFERRED, (f"Node didn't have enough resource: {resource}, requested: {requested[index]}, "
                              f"used: {others[index]}, capacity: {allocatable[index]}")
    return None


def plan_resize(
    pod: Pod,
    status: PodRuntimeStatus,
    applied: Mapping[str, Applied],
    *,
    others: tuple[int, int] | Callable[[], tuple[int, int]],
    allocatable: tuple[int, int],
    memory_usage: Mapping[str, int] | None = None,
    static_cpu_policy: bool = False,
) -> ResizePlan:
    """What a sync must do for the running containers whose `applied` settings (by container id) differ from
    their spec. All or nothing, as the kubelet's atomic resizes: one change the node cannot take holds them
    all. `others` (the other pods' allocated requests, or a function giving them, called only when there is
    a change to fit) defers a resize the node has no room for; `memory_usage` (bytes, by container id) defers
    a memory limit below what a container uses; with the static CPU policy a Guaranteed pod cannot be resized
    (its CPUs may be exclusive)."""
    changes = []
    for container in podutil.containers(pod):
        running = status.latest_container(container["name"])
        if running is None or running.state != ContainerState.RUNNING or running.id not in applied:
            continue
        desired, current = desired_applied(pod, container), applied[running.id]
        if desired != current:
            changes.append(ContainerChange(container["name"], running.id, desired, current,
                                           needs_restart(container, desired, current)))
    if not changes:
        return ResizePlan()
    if static_cpu_policy and qos.qos_class(pod) == qos.GUARANTEED:
        return ResizePlan(tuple(changes), (INFEASIBLE, "Resize is infeasible for Guaranteed Pods alongside CPU "
                                                       "Manager static policy"))
    pending = feasibility(pod_requests(pod), others() if callable(others) else others, allocatable)
    if pending is None:
        for change in changes:
            usage = (memory_usage or {}).get(change.container_id, 0)
            if not change.restart and change.memory_decrease and usage > change.desired.memory_limit:
                pending = (DEFERRED, f"container {change.name}: memory limit ({change.desired.memory_limit}) "
                                     f"below current usage ({usage})")
                break
    return ResizePlan(tuple(changes), pending)


# -- what the status shows -----------------------------------------------------------------------------


def format_millicores(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def format_memory(count: int) -> str:
    """Bytes as a BinarySI quantity prints: the largest binary suffix that divides, else plain digits."""
    for suffix, unit in (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20),
                         ("Ki", 1 << 10)):
        if count and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def shares_to_millicores(shares: int) -> int:
    return -(-shares * 1000 // SHARES_PER_CPU) if shares >= MIN_SHARES else 0


def applied_resources(allocated: Mapping[str, Any], applied: Applied | None) -> dict[str, Any]:
    """containerStatuses[].resources: the allocated requests and limits with what the cgroup holds laid over
    them (the kubelet's convertContainerStatusResources; a CPU request at the kernel minimum on both sides
    keeps the allocated spelling)."""
    requests = dict(allocated.get("requests") or {})
    limits = dict(allocated.get("limits") or {})
    if applied is not None:
        if limits:
            if applied.cpu_quota > 0:
                limits["cpu"] = format_millicores(applied.cpu_quota * 1000 // QUOTA_PERIOD)
            if applied.memory_limit > 0:
                limits["memory"] = format_memory(applied.memory_limit)
        if requests and applied.cpu_shares > 0:
            actual = shares_to_millicores(applied.cpu_shares)
            allocated_millis = to_millis_ceil(effective_request({"resources": allocated}, "cpu") or 0)
            if actual > MIN_SHARES or allocated_millis > MIN_SHARES:
                requests["cpu"] = format_millicores(actual)
    result: dict[str, Any] = {}
    if limits:
        result["limits"] = limits
    if requests:
        result["requests"] = requests
    return result
