"""Node status setters: labels, capacity, addresses, nodeInfo and conditions as pure functions."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from edgelet.api.kubetime import format_micro_time, format_time
from edgelet.nodestatus.facts import goarch
from edgelet.nodestatus.lease import next_renewal, renewed_lease
from edgelet.nodestatus.setters import (
    KUBELET_VERSION,
    NodeInfo,
    StatusInputs,
    compute_status,
    initial_node,
    material_view,
    missing_labels,
    ready_problems,
    set_addresses,
    set_capacity,
    set_labels,
    set_node_info,
    under_pressure,
)

GiB = 1024**3
MiB = 1024**2
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z

FACTS = NodeInfo(
    hostname="Edge-1",
    operating_system="linux",
    architecture="arm64",
    kernel_version="6.1.0-18-arm64",
    os_image="Debian GNU/Linux 12 (bookworm)",
    cpu_count=4,
    memory_bytes=4 * GiB,
    memory_available_bytes=3 * GiB,
    fs_capacity_bytes=100 * GiB,
    fs_available_bytes=50 * GiB,
    pid_max=32768,
    pids_in_use=300,
    boot_id="boot-1",
    machine_id="machine-1",
    system_uuid="uuid-1",
    addresses=(("InternalIP", "192.168.1.20"),),
)
HEALTHY = {"runtime": (True, ""), "pleg": (True, "")}


def inputs(**changes: Any) -> StatusInputs:
    base = StatusInputs(facts=FACTS, now=T0, health=HEALTHY, runtime_version="containerd://1.6.20")
    return replace(base, **changes)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_labels_are_the_well_known_ones_plus_configured_ones() -> None:
    node: dict[str, Any] = {"metadata": {"labels": {"existing": "kept"}}}
    set_labels(node, inputs(node_labels={"site": "plant-7", "kubernetes.io/os": "windows"}))
    assert node["metadata"]["labels"] == {
        "existing": "kept",
        "site": "plant-7",
        "kubernetes.io/hostname": "edge-1",
        "kubernetes.io/os": "linux",  # configuration cannot override the machine's facts
        "kubernetes.io/arch": "arm64",
    }


def test_capacity_and_allocatable() -> None:
    node: dict[str, Any] = {}
    set_capacity(node, inputs(max_pods=50))
    assert node["status"]["capacity"] == {"cpu": "4", "memory": "4194304Ki", "ephemeral-storage": "104857600Ki",
                                          "pods": "50"}
    assert node["status"]["allocatable"] == {
        "cpu": "4",
        "memory": f"{(4 * GiB - 100 * MiB) // 1024}Ki",  # minus memory.available<100Mi
        "ephemeral-storage": str(int(100 * GiB * 0.9)),  # minus nodefs.available<10%
        "pods": "50",
    }


@pytest.mark.parametrize(
    "addresses, expected",
    [
        ((("InternalIP", "192.168.1.20"),),
         [{"type": "InternalIP", "address": "192.168.1.20"}, {"type": "Hostname", "address": "edge-1"}]),
        ((), [{"type": "Hostname", "address": "edge-1"}]),
        ((("InternalIP", "10.0.0.1"), ("Hostname", "edge-1.lan")),
         [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "edge-1.lan"}]),
    ],
)
def test_addresses(addresses: tuple, expected: list) -> None:
    node: dict[str, Any] = {}
    set_addresses(node, inputs(facts=replace(FACTS, addresses=addresses)))
    assert node["status"]["addresses"] == expected


def test_node_info() -> None:
    node: dict[str, Any] = {}
    set_node_info(node, inputs())
    info = node["status"]["nodeInfo"]
    assert info == {
        "machineID": "machine-1",
        "systemUUID": "uuid-1",
        "bootID": "boot-1",
        "kernelVersion": "6.1.0-18-arm64",
        "osImage": "Debian GNU/Linux 12 (bookworm)",
        "containerRuntimeVersion": "containerd://1.6.20",
        "kubeletVersion": KUBELET_VERSION,
        "operatingSystem": "linux",
        "architecture": "arm64",
    }
    assert re.fullmatch(r"v1\.\d+\.\d+-edgelet\.\d+\.\d+\.\d+.*", KUBELET_VERSION)


NETWORK_DOWN = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                "message:Network plugin returns error: cni plugin not initialized")


@pytest.mark.parametrize(
    "health, problems",
    [
        ({}, ["node is starting"]),
        ({"pleg": (True, "")}, ["node is starting"]),
        (HEALTHY, []),
        ({"runtime": (False, "")}, ["container runtime is down"]),
        ({"runtime": (False, "connection refused")}, ["container runtime is down: connection refused"]),
        ({"runtime": (True, ""), "pleg": (False, "pleg was last seen active 3m0s ago")},
         ["PLEG is not healthy: pleg was last seen active 3m0s ago"]),
        (
            {"runtime": (False, "socket missing"), "pleg": (False, "no relist"), "network": (False, NETWORK_DOWN)},
            ["container runtime is down: socket missing", "PLEG is not healthy: no relist", NETWORK_DOWN],
        ),
        ({"runtime": (True, ""), "network": (False, NETWORK_DOWN), "shutdown": (False, "shutting down")},
         [NETWORK_DOWN, "shutdown is not ready: shutting down"]),
    ],
)
def test_ready_problems(health: dict, problems: list[str]) -> None:
    assert ready_problems(health) == problems


@pytest.mark.parametrize(
    "health, status, reason, message",
    [
        (HEALTHY, "True", "KubeletReady", "edgelet is posting ready status"),
        ({"runtime": (False, "dial unix /run/containerd/containerd.sock: connect: no such file")}, "False",
         "KubeletNotReady",
         "container runtime is down: dial unix /run/containerd/containerd.sock: connect: no such file"),
        ({}, "False", "KubeletNotReady", "node is starting"),
    ],
)
def test_ready_condition(health: dict, status: str, reason: str, message: str) -> None:
    ready = condition(compute_status(None, inputs(health=health)), "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (status, reason, message)
    assert ready["lastHeartbeatTime"] == ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_transition_time_is_kept_while_the_status_holds() -> None:
    first = compute_status(None, inputs())
    same = compute_status(first, inputs(now=T0 + 10))
    assert condition(same, "Ready")["lastHeartbeatTime"] == format_time(T0 + 10)
    assert condition(same, "Ready")["lastTransitionTime"] == format_time(T0)
    flipped = compute_status(same, inputs(now=T0 + 20, health={"runtime": (False, "")}))
    assert condition(flipped, "Ready")["lastTransitionTime"] == format_time(T0 + 20)
    assert condition(flipped, "MemoryPressure")["lastTransitionTime"] == format_time(T0)


def test_material_view_ignores_heartbeats_only() -> None:
    first = compute_status(None, inputs())
    later = compute_status(first, inputs(now=T0 + 10))
    assert first != later
    assert material_view(first) == material_view(later)
    unhealthy = compute_status(later, inputs(now=T0 + 20, health={"runtime": (True, ""), "pleg": (False, "stuck")}))
    assert material_view(unhealthy) != material_view(later)
    assert material_view(compute_status(later,
                                        inputs(now=T0 + 20,
                                               facts=replace(FACTS, boot_id="boot-2")))) != material_view(later)


def test_conditions_of_others_are_carried_over() -> None:
    previous = {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]}
    status = compute_status(previous, inputs())
    assert [c["type"] for c in status["conditions"]] == ["NetworkUnavailable", "MemoryPressure", "DiskPressure",
                                                         "PIDPressure", "Ready"]


@pytest.mark.parametrize(
    "facts_change, pressure, expected",
    [
        ({}, None, {"memory": False, "disk": False, "pid": False}),
        ({"memory_available_bytes": 99 * MiB}, None, {"memory": True, "disk": False, "pid": False}),
        ({"fs_available_bytes": 9 * GiB}, None, {"memory": False, "disk": True, "pid": False}),
        ({"pids_in_use": 32000}, None, {"memory": False, "disk": False, "pid": True}),
        ({"memory_available_bytes": 0}, {"memory": False, "disk": True}, {"memory": False, "disk": True, "pid": False}),
    ],
)
def test_pressure(facts_change: dict, pressure: dict | None, expected: dict) -> None:
    given = inputs(facts=replace(FACTS, **facts_change), pressure=pressure)
    assert under_pressure(given) == expected
    status = compute_status(None, given)
    assert condition(status, "MemoryPressure")["status"] == str(expected["memory"])
    assert condition(status, "DiskPressure")["status"] == str(expected["disk"])
    assert condition(status, "PIDPressure")["status"] == str(expected["pid"])


def test_initial_node_and_missing_labels() -> None:
    node = initial_node("edge-1", inputs(node_labels={"site": "a"}))
    assert node["metadata"] == {"name": "edge-1", "labels": {"site": "a", "kubernetes.io/hostname": "edge-1",
                                                              "kubernetes.io/os": "linux",
                                                             "kubernetes.io/arch": "arm64"}}
    assert condition(node["status"], "Ready")["status"] == "True"
    registered = {"metadata": {"labels": {"kubernetes.io/hostname": "edge-1", "kubernetes.io/os": "linux",
                                          "kubernetes.io/arch": "amd64", "other": "x"}}}
    assert missing_labels(registered, inputs(node_labels={"site": "a"})) == {"kubernetes.io/arch": "arm64", "site": "a"}
    assert missing_labels(node, inputs(node_labels={"site": "a"})) == {}


@pytest.mark.parametrize("machine, arch",
                         [("x86_64", "amd64"), ("aarch64", "arm64"), ("armv7l", "arm"), ("riscv64", "riscv64")])
def test_goarch(machine: str, arch: str) -> None:
    assert goarch(machine) == arch


@pytest.mark.parametrize("previous_due, now, expected", [
    (None, 100.0, 103.0),  # the first renewal: the node's phase, a random part of the interval later
    (110.0, 110.2, 120.0),  # on time
    (110.0, 113.0, 120.0),  # held up 3 s (a stall): the next one keeps the phase, 7 s later
    (110.0, 135.0, 140.0),  # held up past two slots (an outage): the next free slot of the same phase
    (110.0, 130.0, 140.0),  # exactly on a later slot: that slot is taken by this renewal
])
def test_lease_renewals_keep_their_phase_through_stalls_and_outages(previous_due, now, expected) -> None:
    assert next_renewal(previous_due, now, 10.0, 0.3) == expected


def test_lease_body() -> None:
    assert format_micro_time(T0 + 0.25) == "2026-01-01T00:00:00.250000Z"
    fresh = renewed_lease(None, "edge-1", 40, T0, "")
    assert fresh["metadata"] == {"name": "edge-1", "namespace": "kube-node-lease"}
    assert fresh["spec"] == {"holderIdentity": "edge-1", "leaseDurationSeconds": 40,
                             "renewTime": "2026-01-01T00:00:00.000000Z"}
    owned = renewed_lease(fresh, "edge-1", 40, T0 + 10, "node-uid")
    assert owned["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "edge-1",
                                                     "uid": "node-uid"}]
    assert owned["spec"]["renewTime"] == "2026-01-01T00:00:10.000000Z"
    assert "ownerReferences" not in fresh["metadata"]  # the base is not modified
    # The Node deleted and registered again: the owner follows its new uid, other owners stay.
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm"}
    owned["metadata"]["ownerReferences"].insert(0, other)
    moved = renewed_lease(owned, "edge-1", 40, T0 + 20, "node-uid-2")
    assert moved["metadata"]["ownerReferences"] == [other,
                                                    {"apiVersion": "v1", "kind": "Node", "name": "edge-1",
                                                     "uid": "node-uid-2"}]


def test_runtime_handlers_and_features_come_from_the_runtime_as_edgelet_passes_them_on() -> None:
    from edgelet.cri import runtime_v1_pb2 as pb
    from edgelet.kubelet.runtimestate import runtime_features

    reply = pb.StatusResponse(
        runtime_handlers=[pb.RuntimeHandler(name="", features=pb.RuntimeHandlerFeatures(
                              recursive_read_only_mounts=True, user_namespaces=True)),
                          pb.RuntimeHandler(name="runc")],
        features=pb.RuntimeFeatures(supplemental_groups_policy=True))
    status = compute_status(None, inputs(runtime_features=runtime_features(reply)))
    # edgelet refuses hostUsers: false and recursiveReadOnly: Enabled, so it offers neither.
    assert status["runtimeHandlers"] == [
        {"name": "", "features": {"recursiveReadOnlyMounts": False, "userNamespaces": False}},
        {"name": "runc", "features": {"recursiveReadOnlyMounts": False, "userNamespaces": False}}]
    assert status["features"] == {"supplementalGroupsPolicy": True}
    # A runtime before these fields (containerd 1.x): none, and no Strict policy.
    status = compute_status(None, inputs(runtime_features=runtime_features(pb.StatusResponse())))
    assert status["runtimeHandlers"] == [] and status["features"] == {"supplementalGroupsPolicy": False}
    # Not asked yet: nothing said.
    assert "runtimeHandlers" not in compute_status(None, inputs()) and "features" not in compute_status(None, inputs())
