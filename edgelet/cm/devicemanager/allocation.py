"""The device manager's decisions (pure): which devices each container of a pod gets, what the node reports of
each resource, and what the plugins' Allocate answers put into a container.

The kubelet's devicemanager rules (manager.go devicesToAllocate, pod_devices.go): extended resources are read from
a container's limits; init containers go first, and the devices of a regular (non-restartable) init container may
be reused by the containers after it, since it has ended before they start; a sidecar's and an app container's
devices are theirs alone. A container that already holds devices keeps them: after an agent restart or a reboot
it gets the same ones back without asking a plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.api.quantity import NANO, parse_quantity
from edgelet.podconfig.validation import qualified_name_error

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
ADMISSION_REASON = "UnexpectedAdmissionError"  # the kubelet's reason for a pod its resource allocator refuses


class AllocationError(Exception):
    """Why a container's devices cannot be given (the kubelet's error text, without its admission wrapping)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """One container's devices of one resource, and the plugin's Allocate answer for them (a serialized
    v1beta1.ContainerAllocateResponse; empty until the plugin answered)."""

    device_ids: tuple[str, ...]
    response: bytes = b""


# pod uid -> container name -> resource name -> Assignment
PodDevices = dict[str, dict[str, dict[str, Assignment]]]


def is_extended_resource_name(name: str) -> bool:
    """The API's IsExtendedResourceName: a domain-prefixed name outside kubernetes.io, not a quota's
    `requests.` name, and `requests.<name>` a qualified name."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return qualified_name_error("requests." + name) is None


def resource_name_error(name: str) -> str | None:
    """Why a plugin may not register `name` (None: it may)."""
    if not is_extended_resource_name(name):
        return (f"the ResourceName {name!r} is invalid: it must be an extended resource name like "
                f"'example.com/device' (a domain outside kubernetes.io, '/', a name of at most 63 characters)")
    return None


def _count(value: object) -> int:
    try:
        return parse_quantity(value) // NANO  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0


def extended_requests(container: Mapping) -> dict[str, int]:
    """The container's extended resources and how many of each: the limits, as the kubelet reads them (requests
    must equal limits for them), else the requests."""
    resources = container.get("resources") or {}
    amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    return {name: count for name, value in amounts.items()
            if is_extended_resource_name(name) and (count := _count(value)) > 0}


def devices_in_use(pod_devices: Mapping[str, Mapping[str, Mapping[str, Assignment]]], resource: str) -> set[str]:
    return {device for containers in pod_devices.values() for resources in containers.values()
            for name, assignment in resources.items() if name == resource for device in assignment.device_ids}


def plan_pod(pod: Pod, pod_devices: PodDevices, *,
             healthy: Mapping[str, frozenset[str]]) -> dict[str, dict[str, Assignment]]:
    """Every device the pod's containers hold once admitted: what they already hold, and new devices for the rest.
    Only device plugin resources count: those in `healthy` (each resource with a plugin, registered now or
    within its grace period after it went away, and the devices it reports healthy: none once it went away), and
    those some container holds. Raises AllocationError as the kubelet words it."""
    uid = podutil.uid(pod)
    held = pod_devices.get(uid) or {}
    known = set(healthy) | {name for containers in pod_devices.values() for resources in containers.values()
                            for name in resources}
    others = {other: containers for other, containers in pod_devices.items() if other != uid}
    plan: dict[str, dict[str, Assignment]] = {}
    reusable: dict[str, list[str]] = {}
    for container, is_init in [*((c, True) for c in podutil.init_containers(pod)),
                               *((c, False) for c in podutil.containers(pod))]:
        name = container.get("name", "")
        for resource, needed in sorted(extended_requests(container).items()):
            if resource not in known:
                continue
            existing = (held.get(name) or {}).get(resource)
            if existing is not None:
                if len(existing.device_ids) != needed:
                    raise AllocationError(f"pod {uid!r} container {name!r} changed request for resource {resource!r} "
                                          f"from {len(existing.device_ids)} to {needed}")
                assignment = existing
            else:
                in_use = devices_in_use(others, resource) | devices_in_use({uid: plan}, resource)
                assignment = Assignment(_choose(resource, needed, healthy=healthy,
                                                reusable=reusable.get(resource, []), in_use=in_use))
            plan.setdefault(name, {})[resource] = assignment
            pool = reusable.setdefault(resource, [])
            if is_init and not podutil.is_sidecar(container):
                pool.extend(d for d in assignment.device_ids if d not in pool)
            else:
                reusable[resource] = [d for d in pool if d not in assignment.device_ids]
    return plan


def _choose(resource: str, needed: int, *, healthy: Mapping[str, frozenset[str]], reusable: list[str],
            in_use: set[str]) -> tuple[str, ...]:
    if resource not in healthy:
        raise AllocationError(f"cannot allocate unregistered device {resource}")
    devices = healthy[resource]
    if not devices:
        raise AllocationError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
    chosen = [d for d in reusable if d in devices][:needed]
    remaining = needed - len(chosen)
    if remaining == 0:
        return tuple(chosen)
    available = sorted(devices - in_use - set(chosen))
    if len(available) < remaining:
        raise AllocationError(f"requested number of devices unavailable for {resource}. Requested: {remaining}, "
                              f"Available: {len(available)}")
    return tuple(chosen + available[:remaining])


def admission_message(problem: AllocationError) -> str:
    """The kubelet's message for a pod its resource allocator refused."""
    return f"Allocate failed due to {problem}, which is unexpected"


def missing_resource_problem(pod: Pod, missing: Callable[[str], bool]) -> tuple[str, str] | None:
    """The first extended resource of the pod the node does not have (`missing(name)`), and the kubelet's predicate
    message for it (None when there is none)."""
    for container in podutil.all_containers(pod):
        for resource, needed in sorted(extended_requests(container).items()):
            if missing(resource):
                return resource, (f"Node didn't have enough resource: {resource}, requested: {needed}, used: 0, "
                                  f"capacity: 0")
    return None


def prefer(assigned: tuple[str, ...], preferred: Iterable[str], *, available: Iterable[str],
           must_include: Iterable[str]) -> tuple[str, ...]:
    """The devices to give when the plugin answered GetPreferredAllocation: the ones that must be kept (reused from
    an init container), then the plugin's choices among `available`, then the planned ones to make up the count."""
    size = len(assigned)
    result = [d for d in must_include if d in assigned]
    free = set(available) | set(assigned)
    for device in [*preferred, *assigned]:
        if len(result) == size:
            break
        if device in free and device not in result:
            result.append(device)
    return tuple(result) if len(result) == size else assigned


# -- what the node reports ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ResourceCount:
    capacity: int
    allocatable: int


def node_resources(devices: Mapping[str, Mapping[str, str]], *, serving: frozenset[str],
                   removed: Iterable[str] = ()) -> dict[str, ResourceCount]:
    """Capacity (every device a plugin reported) and allocatable (its healthy ones) of each resource, as the
    kubelet's GetCapacity: a resource whose plugin is gone keeps its capacity with nothing allocatable until its
    grace period ends; a resource removed after it reads 0, so that the node's status stops offering it."""
    counts = {name: ResourceCount(len(health), sum(1 for h in health.values() if h == HEALTHY)
                                  if name in serving else 0)
              for name, health in devices.items()}
    for name in removed:
        counts.setdefault(name, ResourceCount(0, 0))
    return counts


# -- into the container ---------------------------------------------------------------------------------------------

@dataclass(slots=True)
class RunOptions:
    """What the containers' Allocate answers add to its CRI config (the kubelet's DeviceRunContainerOptions)."""

    envs: list[tuple[str, str]] = field(default_factory=list)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # (container path, host path, read only)
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # (container path, host path, permissions)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # settings two answers gave differently (the first kept)


def run_options(responses: Iterable) -> RunOptions:
    """Merges v1beta1.ContainerAllocateResponse messages as the kubelet does: an environment variable, mount or
    device path, annotation or CDI device named twice is kept once; a different second value is a conflict."""
    options = RunOptions()
    envs: dict[str, str] = {}
    mounts: dict[str, tuple[str, str, bool]] = {}
    devices: dict[str, tuple[str, str, str]] = {}
    for response in responses:
        for key, value in sorted(response.envs.items()):
            if envs.setdefault(key, value) != value:
                options.conflicts.append(f"environment variable {key}")
        for mount in response.mounts:
            entry = (mount.container_path, mount.host_path, mount.read_only)
            if mounts.setdefault(mount.container_path, entry) != entry:
                options.conflicts.append(f"mount {mount.container_path}")
        for device in response.devices:
            entry = (device.container_path, device.host_path, device.permissions)
            if devices.setdefault(device.container_path, entry) != entry:
                options.conflicts.append(f"device {device.container_path}")
        for key, value in sorted(response.annotations.items()):
            if options.annotations.setdefault(key, value) != value:
                options.conflicts.append(f"annotation {key}")
        for cdi in response.cdi_devices:
            if cdi.name not in options.cdi_devices:
                options.cdi_devices.append(cdi.name)
    options.envs = list(envs.items())
    options.mounts = list(mounts.values())
    options.devices = list(devices.values())
    return options
