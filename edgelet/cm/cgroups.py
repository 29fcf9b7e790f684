"""The kubelet's cgroup layout as pure functions: QoS and pod cgroup names in the cgroupfs and systemd spellings,
the pod cgroup's CPU and memory settings (ResourceConfigForPod), and node allocatable (capacity - reserved).

Names are tuples of components, as the kubelet's CgroupName: ("kubepods", "burstable", "pod<uid>") is
`/kubepods/burstable/pod<uid>` for cgroupfs and
`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice` for systemd.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edgelet.api import podutil, qos
from edgelet.api.quantity import parse_quantity, to_int_ceil, to_millis_ceil
from edgelet.api.resources import (
    MIN_SHARES,
    QUOTA_PERIOD,
    container_quantity,
    effective_request,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    pod_total,
)

CGROUPFS = "cgroupfs"
SYSTEMD = "systemd"
DRIVERS = (CGROUPFS, SYSTEMD)

KUBEPODS = "kubepods"
BURSTABLE = "burstable"
BESTEFFORT = "besteffort"
POD_PREFIX = "pod"

CgroupName = tuple[str, ...]


def root_name(cgroup_root: str) -> CgroupName:
    """The kubelet's --cgroup-root ("/" by default) as components, in the cgroupfs spelling it is given in."""
    return tuple(part for part in cgroup_root.split("/") if part)


def qos_names(cgroup_root: str = "/") -> dict[str, CgroupName]:
    """The QoS cgroups by class: Guaranteed pods live in kubepods itself."""
    kubepods = (*root_name(cgroup_root), KUBEPODS)
    return {qos.GUARANTEED: kubepods, qos.BURSTABLE: (*kubepods, BURSTABLE), qos.BEST_EFFORT: (*kubepods, BESTEFFORT)}


def pod_name(uid: str, qos_class: str, cgroup_root: str = "/") -> CgroupName:
    return (*qos_names(cgroup_root)[qos_class], POD_PREFIX + uid)


def pod_uid_of(component: str) -> str | None:
    """The uid a pod cgroup's last component names (either spelling), or None for anything else."""
    if component.endswith(".slice"):
        component = component[:-len(".slice")].rsplit("-", 1)[-1].replace("_", "-")
    return component[len(POD_PREFIX):] if component.startswith(POD_PREFIX) and len(component) > 3 else None


def to_cgroupfs(name: CgroupName) -> str:
    return "/" + "/".join(name)


def to_systemd(name: CgroupName) -> str:
    """systemd's slice path: each component's dashes become underscores (a dash nests slices), and every prefix
    of the joined name is a slice of its own (systemd's ExpandSlice)."""
    if not name:
        return "/"
    parts = [component.replace("-", "_") for component in name]
    return "".join("/" + "-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))


def spell(name: CgroupName, driver: str) -> str:
    """The name as the runtime expects a cgroup parent for its driver."""
    return to_systemd(name) if driver == SYSTEMD else to_cgroupfs(name)


@dataclass(frozen=True, slots=True)
class CgroupResources:
    """What a cgroup is given; None leaves the kernel's value (no limit)."""

    cpu_shares: int | None = None
    cpu_quota: int | None = None  # microseconds per cpu_period; -1 for none
    cpu_period: int | None = None
    memory_limit: int | None = None  # bytes


def _overhead(pod: podutil.Pod, resource: str) -> int:
    value = (podutil.spec(pod).get("overhead") or {}).get(resource)
    return parse_quantity(value) if value is not None else 0


def _millis(value: int | None) -> int | None:
    return to_millis_ceil(value) if value is not None else None


def _positive_bytes(value: int | None) -> int | None:
    """A limit of zero declares none (the kubelet's IsZero)."""
    return to_int_ceil(value) if value is not None and value > 0 else None


def _positive_millis(value: int | None) -> int | None:
    return to_millis_ceil(value) if value is not None and value > 0 else None


def pod_resources(pod: podutil.Pod, *, cpu_cfs_quota: bool = True, cpu_period: int = QUOTA_PERIOD) -> CgroupResources:
    """The pod cgroup's settings, as the kubelet's ResourceConfigForPod: shares from the CPU requests; quota and
    memory limit only when every container has that limit (always for Guaranteed); BestEffort the minimum shares."""
    qos_class = qos.qos_class(pod)
    if qos_class == qos.BEST_EFFORT:
        return CgroupResources(cpu_shares=MIN_SHARES)
    cpu_requests, _ = pod_total(pod, lambda c: _millis(effective_request(c, "cpu")))
    cpu_limits, cpu_declared = pod_total(pod, lambda c: _positive_millis(container_quantity(c, "limits", "cpu")))
    memory_limits, memory_declared = pod_total(
        pod, lambda c: _positive_bytes(container_quantity(c, "limits", "memory")))
    cpu_requests += to_millis_ceil(_overhead(pod, "cpu"))
    cpu_limits += to_millis_ceil(_overhead(pod, "cpu"))
    memory_limits += to_int_ceil(_overhead(pod, "memory"))
    shares = milli_cpu_to_shares(cpu_requests)
    quota = milli_cpu_to_quota(cpu_limits, cpu_period) if cpu_cfs_quota else -1
    if qos_class == qos.GUARANTEED:
        return CgroupResources(cpu_shares=shares, cpu_quota=quota, cpu_period=cpu_period, memory_limit=memory_limits)
    return CgroupResources(
        cpu_shares=shares,
        cpu_quota=quota if cpu_declared else None,
        cpu_period=cpu_period if cpu_declared else None,
        memory_limit=memory_limits if memory_declared else None,
    )


def widest(first: CgroupResources, second: CgroupResources) -> CgroupResources:
    """What holds both: the larger of each setting, no limit where either has none (a pod cgroup during an
    in-place resize, so that neither its old nor its new containers' limits exceed it)."""
    def larger(a: int | None, b: int | None, unlimited: int | None) -> int | None:
        if a is None or b is None or a == unlimited or b == unlimited:
            return unlimited
        return max(a, b)
    shares = max(first.cpu_shares or 0, second.cpu_shares or 0) or None
    quota = larger(first.cpu_quota, second.cpu_quota, -1)
    return CgroupResources(cpu_shares=shares, cpu_quota=quota,
                           cpu_period=first.cpu_period or second.cpu_period if quota != -1 else None,
                           memory_limit=larger(first.memory_limit, second.memory_limit, None))


def burstable_shares(pods: list[podutil.Pod]) -> int:
    """The burstable QoS cgroup's cpu.shares: the CPU requests of its pods (the kubelet's setCPUCgroupConfig)."""
    millis = 0
    for pod in pods:
        if qos.qos_class(pod) == qos.BURSTABLE:
            millis += pod_total(pod, lambda c: _millis(effective_request(c, "cpu")))[0]
    return milli_cpu_to_shares(millis)


@dataclass(frozen=True, slots=True)
class Allocatable:
    cpu_millis: int
    memory_bytes: int


def _reserved(reserved: Mapping[str, str], resource: str, to_int) -> int:
    value = reserved.get(resource)
    return to_int(parse_quantity(value)) if value else 0


def reserved_total(*reserved: Mapping[str, str]) -> Allocatable:
    """CPU millis and memory bytes that kube-reserved and system-reserved keep from the pods together."""
    return Allocatable(cpu_millis=sum(_reserved(r, "cpu", to_millis_ceil) for r in reserved),
                       memory_bytes=sum(_reserved(r, "memory", to_int_ceil) for r in reserved))


def node_allocatable(cpu_count: int, memory_bytes: int, *reserved: Mapping[str, str]) -> Allocatable:
    """Capacity minus every reservation (kube-reserved, system-reserved), never below zero: what the kubepods cgroup
    is given. The Node's allocatable further subtracts the hard eviction thresholds (nodestatus)."""
    total = reserved_total(*reserved)
    return Allocatable(cpu_millis=max(cpu_count * 1000 - total.cpu_millis, 0),
                       memory_bytes=max(memory_bytes - total.memory_bytes, 0))
