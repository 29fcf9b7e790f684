"""A container's cgroup settings (CPU shares and quota, memory limit, OOM score) and the downward API's
resource values, with the kubelet's formulas (pure; two cached host facts are read at the edge).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

from edgelet.api import podutil, qos
from edgelet.api.podutil import Pod
from edgelet.api.quantity import NANO, parse_quantity, to_int_ceil, to_millis_ceil
from edgelet.util.errors import PermanentError

MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
QUOTA_PERIOD = 100_000  # microseconds, the CFS default the kubelet uses
MIN_QUOTA_PERIOD = 1000
GUARANTEED_OOM_SCORE_ADJ = -997
BEST_EFFORT_OOM_SCORE_ADJ = 1000
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
SYSTEM_NODE_CRITICAL = "system-node-critical"
# CRI fields are int64: a quantity beyond it saturates there, as Quantity.Value() does in the kubelet.
INT64_MAX = 2**63 - 1

# Limits the downward API reads as node allocatable when a container sets none (the kubelet's
# defaultPodLimitsForDownwardAPI).
_ALLOCATABLE_DEFAULTED = ("cpu", "memory", "ephemeral-storage")


class ResourceError(PermanentError):
    """A resource quantity or selector that cannot be used; the message names the field."""


def _amount(value: Any, where: str) -> int:
    """The quantity in nano-units (edgelet.api.quantity)."""
    try:
        return parse_quantity(value)
    except ValueError as exc:
        raise ResourceError(f"{where}: {exc}") from None


def container_quantity(container: dict[str, Any], section: str, resource: str) -> int | None:
    """`resources.<section>.<resource>` of a container in nano-units; None when not set."""
    values = (container.get("resources") or {}).get(section) or {}
    if resource not in values:
        return None
    return _amount(values[resource], f"container {container.get('name')!r}: resources.{section}.{resource}")


def effective_request(container: dict[str, Any], resource: str) -> int | None:
    """The request, or the limit when the request is left out (the API server's defaulting)."""
    request = container_quantity(container, "requests", resource)
    return request if request is not None else container_quantity(container, "limits", resource)


def milli_cpu_to_shares(milli_cpu: int) -> int:
    """cpu.shares for a CPU request; 0 maps to the kernel minimum, not to "unset" (1024)."""
    if milli_cpu == 0:
        return MIN_SHARES
    return min(max(milli_cpu * SHARES_PER_CPU // 1000, MIN_SHARES), MAX_SHARES)


def milli_cpu_to_quota(milli_cpu: int, period: int = QUOTA_PERIOD) -> int:
    """The CFS quota for a CPU limit over `period`; 0 (no limit) stays 0, anything else at least 1 ms."""
    if milli_cpu == 0:
        return 0
    return max(milli_cpu * period // 1000, MIN_QUOTA_PERIOD)


def is_node_critical(pod: Pod) -> bool:
    """A critical pod (static, mirror or system priority) in the system-node-critical class."""
    spec = podutil.spec(pod)
    if spec.get("priorityClassName") != SYSTEM_NODE_CRITICAL:
        return False
    priority = spec.get("priority")
    return (podutil.is_static(pod) or podutil.is_mirror(pod)
            or (isinstance(priority, int) and priority >= SYSTEM_CRITICAL_PRIORITY))


def _is_sidecar(pod: Pod, container: dict[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always" and any(
        c is container or c.get("name") == container.get("name") for c in podutil.init_containers(pod))


def _memory_request(container: dict[str, Any]) -> int:
    request = effective_request(container, "memory")
    return 0 if request is None else to_int_ceil(request)


def oom_score_adj(pod: Pod, container: dict[str, Any], memory_capacity: int) -> int:
    """The kubelet's OOM policy: Guaranteed -997, BestEffort 1000, Burstable by share of memory requested.

    A private containerd with restrict_oom_score_adj raises values below its own score to that score.
    """
    if is_node_critical(pod):
        return GUARANTEED_OOM_SCORE_ADJ
    try:
        qos_class = qos.qos_class(pod)
    except ValueError as exc:
        raise ResourceError(str(exc)) from None
    if qos_class == qos.GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos_class == qos.BEST_EFFORT:
        return BEST_EFFORT_OOM_SCORE_ADJ
    capacity = max(int(memory_capacity), 1)
    adjust = 1000 - 1000 * _memory_request(container) // capacity
    regular = podutil.containers(pod)
    if regular and _is_sidecar(pod, container):
        # A sidecar must not outlive the containers it serves: never score below the smallest of them.
        smallest = min(_memory_request(c) for c in regular)
        adjust = min(adjust, 1000 - 1000 * smallest // capacity)
    if adjust < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adjust == BEST_EFFORT_OOM_SCORE_ADJ:
        return adjust - 1  # Burstable stays a little safer than BestEffort
    return adjust


@functools.cache
def machine_memory_capacity() -> int:
    """Physical memory in bytes (what the kubelet reads from cAdvisor's MemTotal)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@functools.cache
def cgroup_v2_unified() -> bool:
    """Whether the host runs the unified cgroup v2 hierarchy."""
    return os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def linux_resources(
    pod: Pod,
    container: dict[str, Any],
    *,
    memory_capacity: int | None = None,
    cpu_cfs_quota: bool = True,
    cgroup_v2: bool | None = None,
    single_process_oom_kill: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for CRI LinuxContainerResources, as generateLinuxContainerResources sets them.

    `memory_capacity` and `cgroup_v2` default to this host's. Hugepages, swap and memory QoS are not set.
    """
    cpu_request = container_quantity(container, "requests", "cpu")
    cpu_limit = container_quantity(container, "limits", "cpu")
    memory_limit = container_quantity(container, "limits", "memory")
    limit_millis = min(to_millis_ceil(cpu_limit), INT64_MAX // QUOTA_PERIOD) if cpu_limit is not None else 0
    # A request left out defaults to the limit, as the API server would have done.
    shares_millis = to_millis_ceil(cpu_request) if cpu_request is not None else limit_millis
    result: dict[str, Any] = {
        "cpu_shares": milli_cpu_to_shares(shares_millis),
        "memory_limit_in_bytes": min(to_int_ceil(memory_limit), INT64_MAX) if memory_limit is not None else 0,
        "oom_score_adj": oom_score_adj(
            pod, container, machine_memory_capacity() if memory_capacity is None else memory_capacity),
    }
    if cpu_cfs_quota:
        result["cpu_period"] = QUOTA_PERIOD
        result["cpu_quota"] = milli_cpu_to_quota(limit_millis, QUOTA_PERIOD)
    if (cgroup_v2_unified() if cgroup_v2 is None else cgroup_v2) and not single_process_oom_kill:
        # On cgroup v2 the kubelet has the kernel kill the whole container on OOM, not one process.
        result["unified"] = {"memory.oom.group": "1"}
    return result


# -- downward API ----------------------------------------------------------------------------------

def _find_container(pod: Pod, name: str) -> dict[str, Any]:
    for container in podutil.all_containers(pod):
        if container.get("name") == name:
            return container
    raise ResourceError(f"container {name} not found")


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def resource_field_value(pod: Pod, container_name: str, selector: dict[str, Any],
                         node_allocatable: Mapping[str, Any] | None = None) -> str:
    """A resourceFieldRef's value: the quantity divided by `divisor` (default 1), rounded up.

    Limits a container leaves unset read as the node's allocatable amount, when one is given.
    """
    container = _find_container(pod, container_name)
    resource = selector.get("resource") or ""
    section, _, name = resource.partition(".")
    if section not in ("limits", "requests") or not (
            name in _ALLOCATABLE_DEFAULTED or name.startswith("hugepages-")):
        raise ResourceError(f"unsupported container resource : {resource}")
    divisor = _amount(selector["divisor"], f"resourceFieldRef {resource}: divisor") \
        if selector.get("divisor") not in (None, "") else 0
    if divisor == 0:
        divisor = NANO
    if section == "requests":
        amount = effective_request(container, name)
    else:
        amount = container_quantity(container, "limits", name)
        if amount is None and name in _ALLOCATABLE_DEFAULTED and node_allocatable and name in node_allocatable:
            amount = _amount(node_allocatable[name], f"node allocatable {name}")
    amount = amount if amount is not None else 0
    if name == "cpu":
        return str(_ceil_div(to_millis_ceil(amount), max(to_millis_ceil(divisor), 1)))
    return str(_ceil_div(to_int_ceil(amount), max(to_int_ceil(divisor), 1)))


def pod_memory_limit(pod: Pod) -> int | None:
    """The pod's memory limit in bytes, or None when some container has none (then there is no limit).

    Regular containers and sidecars run together; each other init container runs with the sidecars
    started before it. The largest of those sums bounds the pod, as in the kubelet's PodLimits.
    """
    pod_level = ((podutil.spec(pod).get("resources") or {}).get("limits") or {}).get("memory")
    if pod_level is not None:
        return to_int_ceil(_amount(pod_level, "spec.resources.limits.memory"))
    total, every_container = pod_total(pod, lambda c: _int_or_none(container_quantity(c, "limits", "memory")))
    return (total or None) if every_container else None


def _int_or_none(value: int | None) -> int | None:
    return to_int_ceil(value) if value is not None else None


def pod_total(pod: Pod, amount: Callable[[dict[str, Any]], int | None]) -> tuple[int, bool]:
    """The pod's total of `amount(container)` as the kubelet's PodRequests/PodLimits add it up, and whether every
    container has one (not None). Regular containers and sidecars run together; each other init container runs
    with the sidecars started before it; the largest of those sums bounds the pod."""
    values = {id(container): amount(container) for container in podutil.all_containers(pod)}
    every_container = all(value is not None for value in values.values())
    sidecars = init_peak = 0
    for container in podutil.init_containers(pod):
        if container.get("restartPolicy") == "Always":
            sidecars += values[id(container)] or 0
        else:
            init_peak = max(init_peak, sidecars + (values[id(container)] or 0))
    regular = sum(values[id(c)] or 0 for c in podutil.containers(pod)) + sidecars
    return max(regular, init_peak), every_container
