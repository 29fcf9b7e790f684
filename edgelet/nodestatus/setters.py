"""Node status as a list of small pure setters (the kubelet's nodestatus/setters.go layout).

Each `set_xxx(node, inputs)` fills one part of a Node dict from `StatusInputs`; machine facts arrive
in a `NodeInfo` gathered by `edgelet.nodestatus.facts`, so nothing here does I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgelet import KUBELET_COMPAT_VERSION, __version__
from edgelet.api.kubetime import format_time
from edgelet.api.quantity import cpu_quantity
from edgelet.container.runtime import RuntimeFeatures

KUBELET_VERSION = f"{KUBELET_COMPAT_VERSION}-edgelet.{__version__}"  # the suffix says who actually runs

LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"

Node = dict[str, Any]
Health = Mapping[str, tuple[bool, str]]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """Facts about the machine, read once per status update."""

    hostname: str
    operating_system: str = "linux"
    architecture: str = "amd64"  # Go's GOARCH spelling, as the kubernetes.io/arch label wants
    kernel_version: str = ""
    os_image: str = ""
    cpu_count: int = 1
    memory_bytes: int = 0
    memory_available_bytes: int = 0
    fs_capacity_bytes: int = 0
    fs_available_bytes: int = 0
    pid_max: int = 0
    pids_in_use: int = 0
    boot_id: str = ""
    machine_id: str = ""
    system_uuid: str = ""
    addresses: tuple[tuple[str, str], ...] = ()  # (type, address), e.g. ("InternalIP", "10.0.0.5")


@dataclass(frozen=True, slots=True)
class PressureThresholds:
    """When a pressure condition turns True; the first two are the kubelet's hard-eviction defaults.
    The kubelet has no default for PIDs; 5 % left reports exhaustion before fork() starts failing."""

    memory_available_bytes: int = 100 * 1024 * 1024
    nodefs_available_fraction: float = 0.10
    pid_available_fraction: float = 0.05


@dataclass(frozen=True, slots=True)
class Reserved:
    """What kube_reserved and system_reserved keep from the pods together ([cgroups])."""

    cpu_millis: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StatusInputs:
    facts: NodeInfo
    now: float  # seconds since the epoch
    health: Health = field(default_factory=dict)  # e.g. {"runtime": (True, ""), "pleg": (False, "...")}
    runtime_version: str = ""  # "containerd://1.6.20"
    kubelet_version: str = KUBELET_VERSION
    node_labels: Mapping[str, str] = field(default_factory=dict)
    max_pods: int = 110
    thresholds: PressureThresholds = PressureThresholds()
    reserved: Reserved = Reserved()
    pressure: Mapping[str, bool] | None = None  # {"memory", "disk", "pid"} from an eviction manager
    daemon_port: int = 0
    runtime_features: RuntimeFeatures | None = None  # None until the runtime answered a Status call
    register_taints: tuple[Mapping[str, str], ...] = ()  # spec.taints of a Node this agent creates
    # Device plugins' resources: name -> (capacity, allocatable); 0 for a resource whose plugin is gone for good.
    extended_resources: Mapping[str, tuple[int, int]] = field(default_factory=dict)




# -- metadata -----------------------------------------------------------------------------------


def default_labels(inputs: StatusInputs) -> dict[str, str]:
    """Configured labels plus the well-known ones, which configuration cannot override."""
    labels = dict(inputs.node_labels)
    labels[LABEL_HOSTNAME] = inputs.facts.hostname.lower()
    labels[LABEL_OS] = inputs.facts.operating_system
    labels[LABEL_ARCH] = inputs.facts.architecture
    return labels


def set_labels(node: Node, inputs: StatusInputs) -> None:
    meta = node.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **default_labels(inputs)}


# -- status -------------------------------------------------------------------------------------


def set_capacity(node: Node, inputs: StatusInputs) -> None:
    """Capacity from the machine; allocatable = capacity - kube/system reserved - the hard-eviction reserves, as
    the kubelet's GetNodeAllocatableAbsolute and its eviction thresholds make it."""
    facts = inputs.facts
    status = node.setdefault("status", {})
    status["capacity"] = {
        "cpu": str(facts.cpu_count),
        "memory": f"{facts.memory_bytes // 1024}Ki",
        "ephemeral-storage": f"{facts.fs_capacity_bytes // 1024}Ki",
        "pods": str(inputs.max_pods),
        **{name: str(capacity) for name, (capacity, _) in sorted(inputs.extended_resources.items())},
    }
    reserved = inputs.reserved
    memory = max(facts.memory_bytes - reserved.memory_bytes - inputs.thresholds.memory_available_bytes, 0)
    storage = max(int(facts.fs_capacity_bytes * (1 - inputs.thresholds.nodefs_available_fraction)), 0)
    status["allocatable"] = {
        "cpu": cpu_quantity(max(facts.cpu_count * 1000 - reserved.cpu_millis, 0)),
        "memory": f"{memory // 1024}Ki",
        "ephemeral-storage": str(storage),
        "pods": str(inputs.max_pods),
        **{name: str(allocatable) for name, (_, allocatable) in sorted(inputs.extended_resources.items())},
    }


def set_addresses(node: Node, inputs: StatusInputs) -> None:
    addresses = [{"type": kind, "address": address} for kind, address in inputs.facts.addresses]
    if not any(a["type"] == "Hostname" for a in addresses):
        addresses.append({"type": "Hostname", "address": inputs.facts.hostname.lower()})
    node.setdefault("status", {})["addresses"] = addresses


def set_node_info(node: Node, inputs: StatusInputs) -> None:
    facts = inputs.facts
    node.setdefault("status", {})["nodeInfo"] = {
        "machineID": facts.machine_id,
        "systemUUID": facts.system_uuid,
        "bootID": facts.boot_id,
        "kernelVersion": facts.kernel_version,
        "osImage": facts.os_image,
        "containerRuntimeVersion": inputs.runtime_version,
        "kubeletVersion": inputs.kubelet_version,
        "operatingSystem": facts.operating_system,
        "architecture": facts.architecture,
    }


def set_runtime_handlers(node: Node, inputs: StatusInputs) -> None:
    """status.runtimeHandlers as the kubelet fills it from CRI Status (1.30+)."""
    features = inputs.runtime_features
    if features is None:
        return
    node.setdefault("status", {})["runtimeHandlers"] = [
        {"name": handler.name, "features": {"recursiveReadOnlyMounts": handler.recursive_read_only_mounts,
                                            "userNamespaces": handler.user_namespaces}}
        for handler in features.handlers]


def set_features(node: Node, inputs: StatusInputs) -> None:
    """status.features (1.31+): whether pods can ask for supplementalGroupsPolicy Strict here."""
    if inputs.runtime_features is not None:
        node.setdefault("status", {})["features"] = {
            "supplementalGroupsPolicy": inputs.runtime_features.supplemental_groups_policy}


def set_daemon_endpoints(node: Node, inputs: StatusInputs) -> None:
    if inputs.daemon_port:
        node.setdefault("status", {})["daemonEndpoints"] = {"kubeletEndpoint": {"Port": inputs.daemon_port}}


def ready_problems(health: Health) -> list[str]:
    """Why the node is not Ready, most fundamental first; empty when it is."""
    if "runtime" not in health:
        return ["node is starting"]
    problems = []
    ok, message = health["runtime"]
    if not ok:
        problems.append(f"container runtime is down: {message}" if message else "container runtime is down")
    if "pleg" in health and not health["pleg"][0]:
        message = health["pleg"][1]
        problems.append(f"PLEG is not healthy: {message}" if message else "PLEG is not healthy")
    if "network" in health and not health["network"][0]:  # the kubelet's own words, from the runtime state
        problems.append(health["network"][1])
    for name in sorted(set(health) - {"runtime", "pleg", "network"}):
        ok, message = health[name]
        if not ok:
            problems.append(f"{name} is not ready: {message}" if message else f"{name} is not ready")
    return problems


def set_ready_condition(node: Node, inputs: StatusInputs) -> None:
    problems = ready_problems(inputs.health)
    if problems:
        _set_condition(node, "Ready", "False", "KubeletNotReady", "; ".join(problems), inputs.now)
    else:
        _set_condition(node, "Ready", "True", "KubeletReady", "edgelet is posting ready status", inputs.now)


def under_pressure(inputs: StatusInputs) -> dict[str, bool]:
    """memory / disk / pid pressure: as reported by an eviction manager, else from the thresholds."""
    if inputs.pressure is not None:
        return {key: bool(inputs.pressure.get(key, False)) for key in ("memory", "disk", "pid")}
    facts, limits = inputs.facts, inputs.thresholds
    return {
        "memory": facts.memory_bytes > 0 and facts.memory_available_bytes < limits.memory_available_bytes,
        "disk": facts.fs_capacity_bytes > 0
        and facts.fs_available_bytes < facts.fs_capacity_bytes * limits.nodefs_available_fraction,
        "pid": facts.pid_max > 0 and facts.pid_max - facts.pids_in_use < facts.pid_max * limits.pid_available_fraction,
    }


def set_memory_pressure_condition(node: Node, inputs: StatusInputs) -> None:
    if under_pressure(inputs)["memory"]:
        _set_condition(node, "MemoryPressure", "True", "KubeletHasInsufficientMemory",
                       "edgelet has insufficient memory available", inputs.now)
    else:
        _set_condition(node, "MemoryPressure", "False", "KubeletHasSufficientMemory",
                       "edgelet has sufficient memory available", inputs.now)


def set_disk_pressure_condition(node: Node, inputs: StatusInputs) -> None:
    if under_pressure(inputs)["disk"]:
        _set_condition(node, "DiskPressure", "True", "KubeletHasDiskPressure", "edgelet has disk pressure", inputs.now)
    else:
        _set_condition(node, "DiskPressure", "False", "KubeletHasNoDiskPressure", "edgelet has no disk pressure",
                       inputs.now)


def set_pid_pressure_condition(node: Node, inputs: StatusInputs) -> None:
    if under_pressure(inputs)["pid"]:
        _set_condition(node, "PIDPressure", "True", "KubeletHasInsufficientPID",
                       "edgelet has insufficient PID available", inputs.now)
    else:
        _set_condition(node, "PIDPressure", "False", "KubeletHasSufficientPID", "edgelet has sufficient PID available",
                       inputs.now)


def _set_condition(node: Node, kind: str, status: str, reason: str, message: str, now: float) -> None:
    """Heartbeat always moves; the transition time only when the status changes."""
    conditions = node.setdefault("status", {}).setdefault("conditions", [])
    stamp = format_time(now)
    index = next((i for i, c in enumerate(conditions) if isinstance(c, dict) and c.get("type") == kind), None)
    previous = conditions[index] if index is not None else None
    transition = stamp
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        transition = previous["lastTransitionTime"]
    condition = {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": transition,
        "reason": reason,
        "message": message,
    }
    if index is None:
        conditions.append(condition)
    else:
        conditions[index] = condition


STATUS_SETTERS: tuple[Callable[[Node, StatusInputs], None], ...] = (
    set_capacity,
    set_addresses,
    set_node_info,
    set_daemon_endpoints,
    set_runtime_handlers,
    set_features,
    set_memory_pressure_condition,
    set_disk_pressure_condition,
    set_pid_pressure_condition,
    set_ready_condition,
)


def compute_status(previous: Mapping[str, Any] | None, inputs: StatusInputs) -> dict[str, Any]:
    """The node status for `inputs`; `previous` (the last status written or read) keeps condition
    transition times. Conditions set by others (e.g. NetworkUnavailable) are carried over."""
    node: Node = {"status": {"conditions": copy.deepcopy(list((previous or {}).get("conditions") or []))}}
    for setter in STATUS_SETTERS:
        setter(node, inputs)
    return node["status"]


def initial_node(name: str, inputs: StatusInputs) -> Node:
    """The Node object to register."""
    node: Node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}
    if inputs.register_taints:
        node["spec"]["taints"] = [dict(taint) for taint in inputs.register_taints]
    set_labels(node, inputs)
    node["status"] = compute_status(None, inputs)
    return node


def pod_cidrs(node: Mapping[str, Any]) -> str:
    """The Node's pod CIDRs as the kubelet hands them to the runtime: spec.podCIDRs joined by commas, else
    spec.podCIDR; "" while none is assigned."""
    spec = node.get("spec") or {}
    cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    return ",".join(cidr for cidr in cidrs if isinstance(cidr, str))


def missing_labels(existing: Mapping[str, Any], inputs: StatusInputs) -> dict[str, str]:
    """The labels an already registered Node lacks or has with another value (added, never removed)."""
    current = ((existing.get("metadata") or {}).get("labels")) or {}
    return {k: v for k, v in default_labels(inputs).items() if current.get(k) != v}


def material_view(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """A status without heartbeat times: what must differ for a write to be worth it."""
    view = copy.deepcopy(dict(status or {}))
    for condition in view.get("conditions") or []:
        if isinstance(condition, dict):
            condition.pop("lastHeartbeatTime", None)
    return view
