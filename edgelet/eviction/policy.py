"""The eviction manager's decisions, as pure functions with the kubelet's rules: which thresholds are met,
which pressure conditions hold (with the transition period), which resource to reclaim, the order in which
pods go, what the evicted pod's status says, and which pods are admitted under pressure.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from edgelet.api import podutil, qos
from edgelet.api.podutil import Pod
from edgelet.api.quantity import parse_quantity, to_int_ceil
from edgelet.api.resources import SYSTEM_CRITICAL_PRIORITY, ResourceError, effective_request
from edgelet.config import Threshold
from edgelet.eviction import signals as sig
from edgelet.eviction.usage import PodUsage

REASON = "Evicted"
HARD_EVICTION_GRACE_SECONDS = 1  # the kubelet's immediateEvictionGracePeriodSeconds
DISRUPTION_TARGET = "DisruptionTarget"
TERMINATION_BY_KUBELET = "TerminationByKubelet"
MEMORY_PRESSURE_TAINT = "node.kubernetes.io/memory-pressure"

MEMORY_PRESSURE = "MemoryPressure"
DISK_PRESSURE = "DiskPressure"
PID_PRESSURE = "PIDPressure"
CONDITIONS = (MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE)
# The keys of the node report's pressure (NodeReport.pressure).
CONDITION_KEYS = {MEMORY_PRESSURE: "memory", DISK_PRESSURE: "disk", PID_PRESSURE: "pid"}

MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
INODES = "inodes"
PIDS = "pids"

SIGNAL_CONDITION = {
    sig.MEMORY_AVAILABLE: MEMORY_PRESSURE,
    sig.ALLOCATABLE_MEMORY_AVAILABLE: MEMORY_PRESSURE,
    sig.NODEFS_AVAILABLE: DISK_PRESSURE,
    sig.NODEFS_INODES_FREE: DISK_PRESSURE,
    sig.IMAGEFS_AVAILABLE: DISK_PRESSURE,
    sig.IMAGEFS_INODES_FREE: DISK_PRESSURE,
    sig.CONTAINERFS_AVAILABLE: DISK_PRESSURE,
    sig.CONTAINERFS_INODES_FREE: DISK_PRESSURE,
    sig.PID_AVAILABLE: PID_PRESSURE,
}
# Ordered as the kubelet ranks thresholds: memory first, then the others.
SIGNAL_RESOURCE = {
    sig.MEMORY_AVAILABLE: MEMORY,
    sig.ALLOCATABLE_MEMORY_AVAILABLE: MEMORY,
    sig.NODEFS_AVAILABLE: EPHEMERAL_STORAGE,
    sig.NODEFS_INODES_FREE: INODES,
    sig.IMAGEFS_AVAILABLE: EPHEMERAL_STORAGE,
    sig.IMAGEFS_INODES_FREE: INODES,
    sig.CONTAINERFS_AVAILABLE: EPHEMERAL_STORAGE,
    sig.CONTAINERFS_INODES_FREE: INODES,
    sig.PID_AVAILABLE: PIDS,
}
_BYTES_RESOURCES = (MEMORY, EPHEMERAL_STORAGE)


# -- thresholds and conditions -----------------------------------------------------------------------

def threshold_quantity(threshold: Threshold, capacity: int) -> int:
    """The threshold as an amount: the quantity itself, or the fraction of capacity (truncated, as the kubelet)."""
    if threshold.quantity is not None:
        return threshold.quantity
    return int(capacity * (threshold.fraction or 0.0))


def thresholds_met(thresholds: Mapping[str, Threshold], observations: sig.Observations) -> list[str]:
    """Signals whose available amount is below their threshold; signals not observed are skipped."""
    met = []
    for signal, threshold in thresholds.items():
        observed = observations.get(signal)
        if observed is not None and threshold_quantity(threshold, observed.capacity) > observed.available:
            met.append(signal)
    return met


def node_conditions(signals: Iterable[str]) -> set[str]:
    return {SIGNAL_CONDITION[signal] for signal in signals if signal in SIGNAL_CONDITION}


def conditions_last_observed(previous: Mapping[str, float], observed: Collection[str], now: float) -> dict[str, float]:
    result = dict(previous)
    result.update((condition, now) for condition in observed)
    return result


def conditions_in_effect(last_observed: Mapping[str, float], period: float, now: float) -> set[str]:
    """Conditions observed within the transition period. One observed now holds even with a zero period
    (the kubelet's strict comparison would never report it then)."""
    return {condition for condition, at in last_observed.items() if at == now or now - at < period}


def pressure_flags(conditions: Collection[str]) -> dict[str, bool]:
    """The node report's pressure (NodeReport.pressure): {"memory": .., "disk": .., "pid": ..}."""
    return {key: condition in conditions for condition, key in CONDITION_KEYS.items()}


def signal_to_reclaim(met: Iterable[str]) -> str | None:
    """The threshold to act on: memory before all others, then the kubelet's signal order."""
    candidates = [signal for signal in met if signal in SIGNAL_RESOURCE]
    order = list(SIGNAL_RESOURCE)
    return min(candidates, key=order.index, default=None)


def shortfall(threshold: Threshold, observation: sig.Observation) -> int:
    """How much must be freed to get back to the threshold."""
    return max(threshold_quantity(threshold, observation.capacity) - observation.available, 0)


# -- pods ---------------------------------------------------------------------------------------------

def is_critical(pod: Pod) -> bool:
    """The kubelet's critical pods, never evicted and admitted under pressure: static pods, mirror pods,
    and pods of system-critical priority."""
    priority = podutil.spec(pod).get("priority")
    return (podutil.is_static(pod) or podutil.is_mirror(pod)
            or (isinstance(priority, int) and priority >= SYSTEM_CRITICAL_PRIORITY))


def priority(pod: Pod) -> int:
    value = podutil.spec(pod).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_request(pod: Pod, resource: str) -> int:
    """The pod's request as the kubelet's PodRequests: its containers' and sidecars' sum, or the largest init
    container plus the sidecars started before it, whichever is more."""
    def request(container: dict) -> int:
        try:
            amount = effective_request(container, resource)
        except ResourceError:
            return 0
        return to_int_ceil(amount) if amount is not None else 0

    total = sum(request(c) for c in podutil.containers(pod))
    sidecars = init_peak = 0
    for container in podutil.init_containers(pod):
        if podutil.is_sidecar(container):
            sidecars += request(container)
            total += request(container)
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + request(container))
    return max(total, init_peak)


def _usage_of(resource: str, usage: PodUsage | None) -> int | None:
    if usage is None:
        return None
    if resource == MEMORY:
        return usage.memory
    if resource == EPHEMERAL_STORAGE:
        return usage.disk
    if resource == INODES:
        return usage.inodes
    return usage.processes


def rank_pods(signal: str, pods: Sequence[Pod], usage: Mapping[str, PodUsage]) -> list[Pod]:
    """Pods in eviction order for the signal, as the kubelet's rank functions order them:

    memory, disk and inodes: pods without stats first, then pods using more than they request, then
    lower priority, then most usage above the request; PIDs: lower priority, then most processes.
    """
    resource = SIGNAL_RESOURCE.get(signal, MEMORY)

    def key(pod: Pod) -> tuple:
        used = _usage_of(resource, usage.get(podutil.uid(pod)))
        if resource == PIDS:
            return (priority(pod), used is not None, -(used or 0))
        request = pod_request(pod, resource)  # 0 for inodes: nobody requests them
        used_or_zero = used or 0
        return (used is not None, not used_or_zero > request, priority(pod), -(used_or_zero - request))

    return sorted(pods, key=key)


# -- messages and statuses ------------------------------------------------------------------------------

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def format_quantity(value: int, binary: bool = True) -> str:
    """A Kubernetes quantity's canonical spelling: the largest exact suffix, else the plain number."""
    if value:
        for suffix, unit in _BINARY if binary else _DECIMAL:
            if value % unit == 0:
                return f"{value // unit}{suffix}"
    return str(value)


def threshold_text(signal: str, threshold: Threshold) -> str:
    """A threshold as configured: "10%", or the quantity ("100Mi", "1k" inodes)."""
    if threshold.fraction is not None:
        return f"{threshold.fraction * 100:g}%"
    return format_quantity(threshold.quantity or 0, SIGNAL_RESOURCE.get(signal, MEMORY) in _BYTES_RESOURCES)


def _container_request(container: dict, resource: str) -> tuple[int, str]:
    """(bytes, text) of the container's request, the limit standing in for a missing one; (0, "0") if none."""
    resources = container.get("resources") or {}
    value = ((resources.get("requests") or {}).get(resource)
             if resource in (resources.get("requests") or {}) else (resources.get("limits") or {}).get(resource))
    if value is None:
        return 0, "0"
    try:
        return to_int_ceil(parse_quantity(value)), str(value)
    except ValueError:
        return 0, "0"


def eviction_message(signal: str, pod: Pod, usage: PodUsage | None, threshold: Threshold,
                     observation: sig.Observation | None) -> str:
    """The kubelet's eviction message: the resource, the threshold and what was left, and every container
    using more than it requested."""
    resource = SIGNAL_RESOURCE.get(signal, MEMORY)
    binary = resource in _BYTES_RESOURCES
    message = f"The node was low on resource: {resource}. "
    if observation is not None:
        quantity = threshold_quantity(threshold, observation.capacity)
        quantity_text = format_quantity(quantity, binary or threshold.fraction is not None)
        message += f"Threshold quantity: {quantity_text}, available: {format_quantity(observation.available, binary)}. "
    if usage is None or resource not in _BYTES_RESOURCES:
        return message
    for container in podutil.containers(pod):
        name = container.get("name", "")
        stats = usage.containers.get(name)
        used = None if stats is None else (stats.memory if resource == MEMORY else stats.disk)
        request_bytes, request_text = _container_request(container, resource)
        if used is not None and used > request_bytes:
            message += (f"Container {name} was using {format_quantity(used)}, request is {request_text}, "
                        f"has larger consumption of {resource}. ")
    return message


def evicted_status(status: Mapping[str, Any], message: str, now: str, *, reason: str = REASON) -> dict[str, Any]:
    """`status` as an evicted pod reports it: phase Failed, reason Evicted (or Terminated at node shutdown),
    and a DisruptionTarget condition (`now` is an RFC 3339 time; a condition already there keeps its
    transition time)."""
    result = dict(status)
    result.update(phase="Failed", reason=reason, message=message)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != DISRUPTION_TARGET]
    previous = next((c for c in status.get("conditions") or [] if c.get("type") == DISRUPTION_TARGET
                     and c.get("status") == "True"), None)
    conditions.append({"type": DISRUPTION_TARGET, "status": "True", "reason": TERMINATION_BY_KUBELET,
                       "message": message, "lastTransitionTime": (previous or {}).get("lastTransitionTime", now)})
    result["conditions"] = conditions
    return result


# -- admission ------------------------------------------------------------------------------------------

def _tolerates_memory_pressure(pod: Pod) -> bool:
    for toleration in podutil.spec(pod).get("tolerations") or []:
        if not isinstance(toleration, dict) or toleration.get("effect") not in (None, "", "NoSchedule"):
            continue
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        if operator == "Exists" and key in ("", MEMORY_PRESSURE_TAINT):
            return True
        if operator == "Equal" and key == MEMORY_PRESSURE_TAINT and not toleration.get("value"):
            return True
    return False


def admit(conditions: Collection[str], pod: Pod, *,
          is_critical: Callable[[Pod], bool] = is_critical) -> tuple[bool, str, str]:
    """(admitted, reason, message): under memory pressure alone only BestEffort pods are refused (unless they
    tolerate the memory-pressure taint); any other pressure refuses every pod; critical pods always pass."""
    if not conditions or is_critical(pod):
        return True, "", ""
    if set(conditions) == {MEMORY_PRESSURE}:
        try:
            best_effort = qos.qos_class(pod) == qos.BEST_EFFORT
        except ValueError:
            best_effort = False
        if not best_effort or _tolerates_memory_pressure(pod):
            return True, "", ""
    ordered = [c for c in CONDITIONS if c in conditions]
    return False, REASON, f"The node had condition: [{' '.join(ordered)}]. "
