"""Node registration, NodeStatus updates and the Lease heartbeat against the API server double, alone and as the
simulator's hollow node wires them (the agent's own cluster wiring)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from edgelet.kubeapi import ApiClient
from edgelet.nodestatus.health import NodeHealth
from edgelet.nodestatus.lease import LeaseController
from edgelet.nodestatus.manager import NodeReport, NodeStatusManager
from edgelet.nodestatus.setters import KUBELET_VERSION, NodeInfo
from edgelet.nodestatus.taints import parse_taint
from edgelet.simulate.node import HollowNode, Timings
from edgelet.util.errors import EdgeletError
from edgelet.util.tasks import TaskGroup
from tests.helpers import eventually
from tests.kubeapi_double import ApiServerDouble

NODE = "edge-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
STATUS_PATH = f"{NODE_PATH}/status"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
FACTS = NodeInfo(hostname=NODE, architecture="arm64", kernel_version="6.1.0", os_image="Debian GNU/Linux 12 (bookworm)",
                 cpu_count=4, memory_bytes=4 << 30, memory_available_bytes=3 << 30, fs_capacity_bytes=64 << 30,
                 fs_available_bytes=32 << 30, pid_max=32768, pids_in_use=200, boot_id="boot-1", machine_id="m-1",
                 addresses=(("InternalIP", "192.168.1.20"),))


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        return self.now


class Machine:
    """What the providers report; tests change it while the manager runs."""

    def __init__(self) -> None:
        self.facts = FACTS
        self.health: dict[str, tuple[bool, str]] = {"runtime": (True, ""), "pleg": (True, "")}
        self.polls = 0

    def get_facts(self) -> NodeInfo:
        self.polls += 1
        return self.facts

    def node_health(self, settled: Callable[[], bool] = lambda: True) -> NodeHealth:
        """The checks read what the test sets in `health` at the moment the manager asks."""
        return NodeHealth({name: functools.partial(self.health.__getitem__, name) for name in self.health},
                          settled=settled)


@pytest.fixture
def api() -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as double:
        yield double


@pytest.fixture
async def client(api: ApiServerDouble) -> AsyncIterator[ApiClient]:
    async with ApiClient(api.url, timeout=1.0) as c:
        yield c


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task]]:
    running: list[asyncio.Task] = []
    yield running
    for task in running:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def manager(client: ApiClient, machine: Machine, clock: Clock, *, health_settled: Callable[[], bool] = lambda: True,
            **options: Any) -> NodeStatusManager:
    async def runtime_version() -> str:
        return "containerd://1.6.20"

    options = {"update_frequency": 0.01, "report_frequency": 300.0, "backoff_initial": 0.01, **options}
    report = NodeReport(facts=machine.get_facts, node_health=machine.node_health(health_settled),
                        runtime_version=runtime_version)
    return NodeStatusManager(client, NODE, report, node_labels={"site": "plant-7"}, clock=clock,
                             rng=random.Random(0), **options)


def condition(node: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in node["status"]["conditions"] if c["type"] == kind)


async def test_registration_creates_the_node_with_labels_and_node_info(api: ApiServerDouble, client: ApiClient,
                                                                       tasks: list) -> None:
    m = manager(client, Machine(), Clock())
    tasks.append(asyncio.create_task(m.run()))
    await asyncio.wait_for(m.registered.wait(), 5)
    node = api.get("nodes", NODE)
    assert m.node_uid == node["metadata"]["uid"]
    assert node["metadata"]["labels"] == {"site": "plant-7", "kubernetes.io/hostname": NODE,
                                          "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == "containerd://1.6.20"
    assert info["kubeletVersion"] == KUBELET_VERSION and info["bootID"] == "boot-1" and info["architecture"] == "arm64"
    assert node["status"]["capacity"]["cpu"] == "4"
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "192.168.1.20"},
                                           {"type": "Hostname", "address": NODE}]
    assert condition(node, "Ready")["status"] == "True"


async def test_an_existing_node_is_adopted_and_reconciled(api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    api.create("nodes", {"metadata": {"name": NODE, "labels": {"kubernetes.io/arch": "amd64", "owner": "ops"}},
                         "status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}],
                                    "conditions": [{"type": "Ready", "status": "True",
                                                    "lastTransitionTime": "2025-06-01T00:00:00Z"},
                                                   {"type": "NetworkUnavailable", "status": "False"}]}})
    uid = api.get("nodes", NODE)["metadata"]["uid"]
    m = manager(client, Machine(), Clock())
    tasks.append(asyncio.create_task(m.run()))
    await eventually(lambda: m.status_writes == 1)
    node = api.get("nodes", NODE)
    assert m.node_uid == uid
    assert node["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"
    assert node["metadata"]["labels"]["owner"] == "ops"  # labels are added, never removed
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "192.168.1.20"},
                                           {"type": "Hostname", "address": NODE}]
    assert condition(node, "Ready")["lastTransitionTime"] == "2025-06-01T00:00:00Z"  # Ready all along
    assert condition(node, "NetworkUnavailable")["status"] == "False"  # others' conditions survive
    assert api.write_count("POST", "/api/v1/nodes") == 1 and api.write_count("PATCH", NODE_PATH) == 1


async def test_a_restart_writes_no_status_before_the_runtime_health_is_known(
        api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    # A restarted agent's first Status call may not be answered yet: "waiting for the container runtime" would
    # turn a Ready node NotReady for that moment (and the node lifecycle controller taints a NotReady node).
    api.create("nodes", {"metadata": {"name": NODE}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2025-06-01T00:00:00Z"}]}})
    machine, settled = Machine(), False
    machine.health["runtime"] = (False, "waiting for the container runtime at unix:///run/containerd.sock")
    m = manager(client, machine, Clock(), update_frequency=10.0, health_settled=lambda: settled)
    tasks.append(asyncio.create_task(m.run()))
    await asyncio.wait_for(m.registered.wait(), 5)
    await asyncio.sleep(0.3)
    assert m.status_writes == 0 and condition(api.get("nodes", NODE), "Ready")["status"] == "True"
    machine.health["runtime"], settled = (True, ""), True
    await eventually(lambda: m.status_writes == 1)
    assert condition(api.get("nodes", NODE), "Ready")["lastTransitionTime"] == "2025-06-01T00:00:00Z"  # Ready all along


async def test_a_runtime_silent_at_start_is_reported_after_one_update_period(
        api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)

    machine = Machine()
    machine.health["runtime"] = (False, "waiting for the container runtime at unix:///run/containerd.sock")
    m = manager(client, machine, clock, update_frequency=10.0, health_settled=lambda: False, sleep=sleep)
    tasks.append(asyncio.create_task(m.run()))
    await eventually(lambda: m.status_writes >= 1)
    ready = condition(api.get("nodes", NODE), "Ready")
    assert ready["status"] == "False" and "waiting for the container runtime" in ready["message"]


async def test_status_is_written_only_on_change_or_report_frequency(api: ApiServerDouble, client: ApiClient,
                                                                    tasks: list) -> None:
    machine, clock = Machine(), Clock()
    m = manager(client, machine, clock, report_frequency=60.0)
    tasks.append(asyncio.create_task(m.run()))
    await asyncio.wait_for(m.registered.wait(), 5)
    polls = machine.polls
    await eventually(lambda: machine.polls >= polls + 20)  # 20 status computations
    clock.now += 30  # heartbeat times move; nothing material does
    await eventually(lambda: machine.polls >= polls + 40)
    assert api.write_count("PATCH", STATUS_PATH) == 0

    machine.health["pleg"] = (False, "pleg was last seen active 3m0s ago; threshold is 3m0s")
    await eventually(lambda: api.write_count("PATCH", STATUS_PATH) == 1)
    ready = condition(api.get("nodes", NODE), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    assert ready["message"] == "PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s"
    polls = machine.polls
    await eventually(lambda: machine.polls >= polls + 20)
    assert api.write_count("PATCH", STATUS_PATH) == 1

    clock.now += 61  # report_frequency passed: written although unchanged
    await eventually(lambda: api.write_count("PATCH", STATUS_PATH) == 2)
    assert condition(api.get("nodes", NODE), "Ready")["lastHeartbeatTime"] == "2026-01-01T00:01:31Z"

    machine.health["runtime"] = (False, "")
    await eventually(lambda: api.write_count("PATCH", STATUS_PATH) == 3)
    assert condition(api.get("nodes", NODE), "Ready")["message"].startswith("container runtime is down")

    machine.facts = replace(FACTS, addresses=(("InternalIP", "192.168.1.99"),))
    await eventually(lambda: api.write_count("PATCH", STATUS_PATH) == 4)
    assert api.get("nodes", NODE)["status"]["addresses"][0] == {"type": "InternalIP", "address": "192.168.1.99"}
    assert len(api.get("nodes", NODE)["status"]["addresses"]) == 2  # the old address is gone


async def test_registration_and_updates_survive_an_outage(api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    machine = Machine()
    api.go_down()
    m = manager(client, machine, Clock())
    task = asyncio.create_task(m.run())
    tasks.append(task)
    await asyncio.sleep(0.2)
    assert not m.registered.is_set() and not task.done()
    api.come_up()
    await asyncio.wait_for(m.registered.wait(), 5)
    api.go_down()
    machine.health["runtime"] = (False, "connection refused")
    await asyncio.sleep(0.2)
    assert not task.done()
    api.fail_next(3, 500, path_prefix=STATUS_PATH)
    api.come_up()
    await eventually(lambda: m.status_writes == 1)
    assert condition(api.get("nodes", NODE), "Ready")["message"] == "container runtime is down: connection refused"
    assert api.write_count("PATCH", STATUS_PATH) == 4  # three refused, then written


async def test_a_deleted_node_is_registered_again(api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    machine = Machine()
    m = manager(client, machine, Clock())
    tasks.append(asyncio.create_task(m.run()))
    await asyncio.wait_for(m.registered.wait(), 5)
    first_uid = m.node_uid
    api.delete("nodes", NODE)
    machine.health["runtime"] = (False, "")  # forces a write, which finds the node gone
    await eventually(lambda: api.write_count("POST", "/api/v1/nodes") == 2 and m.registered.is_set())
    assert api.get("nodes", NODE)["metadata"]["uid"] == m.node_uid != first_uid


# -- the Lease --------------------------------------------------------------------------------------


async def test_lease_is_created_owned_by_the_node_and_renewed(api: ApiServerDouble, client: ApiClient,
                                                              tasks: list) -> None:
    node = api.create("nodes", {"metadata": {"name": NODE}})
    lease = LeaseController(client, NODE, duration=40, renew_interval=0.02, rng=random.Random(0))
    tasks.append(asyncio.create_task(lease.run()))
    await eventually(lambda: lease.renewals >= 10)
    stored = api.get("leases", NODE, "kube-node-lease")
    assert stored["spec"]["holderIdentity"] == NODE and stored["spec"]["leaseDurationSeconds"] == 40
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stored["spec"]["renewTime"])
    assert stored["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                      "uid": node["metadata"]["uid"]}]
    assert api.write_count("POST", LEASE_PATH.rsplit("/", 1)[0]) == 1
    assert api.write_count("PUT", LEASE_PATH) >= 9


async def test_lease_conflicts_are_resolved_by_rereading(api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    lease = LeaseController(client, NODE, renew_interval=0.02, rng=random.Random(0))
    task = asyncio.create_task(lease.run())
    tasks.append(task)
    await eventually(lambda: lease.renewals >= 2)
    for i in range(5):  # someone else writes the Lease between our renewals
        # A merge patch carries no resourceVersion: it cannot itself lose the race with the controller (the
        # double runs on its own thread), and it moves the version the controller's next update presents.
        api.patch("leases", NODE, {"metadata": {"annotations": {"touched": str(i)}}}, patch_type="merge",
                  namespace="kube-node-lease")
        await asyncio.sleep(0.01)
    renewals = lease.renewals
    await eventually(lambda: lease.renewals >= renewals + 5)
    assert not task.done()
    assert "touched" in api.get("leases", NODE, "kube-node-lease")["metadata"]["annotations"]
    rereads = sum(1 for r in api.requests if r.method == "GET" and r.path == LEASE_PATH)
    assert rereads >= 2  # the first read, then at least one after a 409


async def test_lease_resumes_after_an_outage(api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    clock = Clock()
    lease = LeaseController(client, NODE, renew_interval=0.02, rng=random.Random(0), clock=clock, backoff_initial=0.01)
    task = asyncio.create_task(lease.run())
    tasks.append(task)
    await eventually(lambda: lease.renewals >= 3)
    api.go_down()
    await asyncio.sleep(0.1)
    renewals_during_outage = lease.renewals
    await asyncio.sleep(0.2)
    assert lease.renewals == renewals_during_outage and not task.done()
    clock.now += 100
    api.come_up()
    await eventually(lambda: lease.renewals >= renewals_during_outage + 3)
    assert api.get("leases", NODE, "kube-node-lease")["spec"]["renewTime"].startswith("2026-01-01T00:01:40.")


async def test_a_lapsed_lease_makes_the_node_status_heal_what_the_controller_set(
        api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    """While the Lease lapsed, the node lifecycle controller set Ready Unknown. Our own last write still
    says True, so only a look at the server's Node notices: the first renewal after the lapse asks for it."""
    clock = Clock()
    m = manager(client, Machine(), clock, update_frequency=0.02)
    lapses: list[float] = []
    lease = LeaseController(client, NODE, duration=40, renew_interval=0.02, rng=random.Random(0), clock=clock,
                            backoff_initial=0.01, node_uid=lambda: m.node_uid,
                            on_lapse_ended=lambda: (lapses.append(clock.now), m.reconcile_with_server()))
    tasks.append(asyncio.create_task(m.run()))
    tasks.append(asyncio.create_task(lease.run()))
    await eventually(lambda: lease.renewals >= 3 and m.registered.is_set())
    writes = api.write_count("PATCH", STATUS_PATH)

    api.go_down()
    await asyncio.sleep(0.1)
    clock.now += 60  # longer than the Lease's 40 s
    controller = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                  "message": "Kubelet stopped posting node status."}
    api.come_up()
    api.patch("nodes", NODE, {"status": {"conditions": [controller]}}, subresource="status")
    await eventually(lambda: lapses and condition(api.get("nodes", NODE), "Ready")["status"] == "True")
    assert api.write_count("PATCH", STATUS_PATH) == writes + 1


async def test_a_lease_renewed_late_counts_as_a_lapse(api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    clock = Clock()
    lapses: list[float] = []
    lease = LeaseController(client, NODE, duration=40, renew_interval=0.02, rng=random.Random(0), clock=clock,
                            on_lapse_ended=lambda: lapses.append(clock.now))
    tasks.append(asyncio.create_task(lease.run()))
    await eventually(lambda: lease.renewals >= 3)
    clock.now += 39  # a late renewal within the duration is no lapse
    await eventually(lambda: lease.renewals >= 5)
    assert lapses == []
    clock.now += 41  # e.g. the device was suspended
    await eventually(lambda: lapses)


async def test_the_lease_follows_a_node_deleted_and_registered_again(api: ApiServerDouble, client: ApiClient,
                                                                     tasks: list) -> None:
    # Without a garbage collector (no controller-manager) the Lease outlives the Node: its owner must move.
    machine = Machine()
    m = manager(client, machine, Clock())
    lease = LeaseController(client, NODE, renew_interval=0.02, rng=random.Random(0), node_uid=lambda: m.node_uid)
    tasks += [asyncio.create_task(m.run()), asyncio.create_task(lease.run())]
    await asyncio.wait_for(m.registered.wait(), 5)
    first_uid = m.node_uid

    def owner() -> str:
        leases = api.list("leases", "kube-node-lease")
        refs = leases[0]["metadata"].get("ownerReferences") or [] if leases else []
        return refs[0]["uid"] if len(refs) == 1 else ""

    await eventually(lambda: owner() == first_uid)
    api.delete("nodes", NODE)
    machine.health["runtime"] = (False, "")  # forces a status write, which finds the node gone
    await eventually(lambda: m.node_uid != first_uid and owner() == m.node_uid)
    assert api.get("nodes", NODE)["metadata"]["uid"] == m.node_uid
    assert api.get("leases", NODE, "kube-node-lease")["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": m.node_uid}]


HOLLOW = "hollow-0000"
HOLLOW_TIMINGS = Timings(lease_duration=4.0, lease_renew_interval=0.05, node_status_update_frequency=0.05,
                         node_status_report_frequency=1.0, status_resync=0.05)


async def test_a_hollow_node_registers_holds_its_lease_and_runs_a_pod(api: ApiServerDouble, client: ApiClient,
                                                                      tmp_path) -> None:
    """The simulator's node runs the agent's cluster wiring (edgelet/cluster/clusterapi.py) with no container
    runtime."""
    node = HollowNode(HOLLOW, client, state_dir=str(tmp_path), timings=HOLLOW_TIMINGS, rng=random.Random(0))
    tasks = TaskGroup()
    node.start(tasks, pods=1)
    try:
        await eventually(lambda: node.node_status.registered.is_set())
        node_uid = api.get("nodes", HOLLOW)["metadata"]["uid"]

        def lease_owner() -> str:
            refs = api.get("leases", HOLLOW, "kube-node-lease")["metadata"].get("ownerReferences") or []
            return refs[0]["uid"] if refs else ""

        await eventually(lambda: node.lease.renewals >= 2 and lease_owner() == node_uid)
        # The Lease learns the Node's uid from the node status, as the agent's does: it never reads the Node.
        assert not [r for r in api.requests if r.method == "GET" and r.path == f"/api/v1/nodes/{HOLLOW}"]

        def phase() -> str:
            pods = api.list("pods", "default")
            return pods[0].get("status", {}).get("phase", "") if pods else ""

        await eventually(lambda: phase() == "Running")
        # The double applies a PATCH before its reply reaches the syncer, which counts the write on the reply.
        await eventually(lambda: node.syncer.api_writes >= 1)
        assert node.runtime.starts == 1 and not tasks.crashed
    finally:
        await tasks.cancel_all(grace=1.0)


NETWORK_DOWN = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                "message:Network plugin returns error: cni plugin not initialized")


def node_reads(api: ApiServerDouble) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and r.path == NODE_PATH)


async def test_registered_with_taints_and_not_ready_while_the_pod_network_is_not(
        api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    machine = Machine()
    machine.health["network"] = (False, NETWORK_DOWN)
    taints = tuple(parse_taint(t) for t in ("dedicated=edge:NoSchedule", "node.example.com/wan-only:NoExecute"))
    m = manager(client, machine, Clock(), register_taints=taints)
    tasks.append(asyncio.create_task(m.run()))
    await asyncio.wait_for(m.registered.wait(), 5)
    node = api.get("nodes", NODE)
    assert node["spec"]["taints"] == [{"key": "dedicated", "value": "edge", "effect": "NoSchedule"},
                                      {"key": "node.example.com/wan-only", "effect": "NoExecute"}]
    ready = condition(node, "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "KubeletNotReady", NETWORK_DOWN)
    machine.health["network"] = (True, "")
    await eventually(lambda: condition(api.get("nodes", NODE), "Ready")["status"] == "True")


async def test_the_pod_cidr_reaches_the_runtime_once_assigned(
        api: ApiServerDouble, client: ApiClient, tasks: list) -> None:
    handed: list[str] = []
    failures = [EdgeletError("runtime busy")]

    async def update_pod_cidr(cidr: str) -> None:
        if failures:
            raise failures.pop()
        handed.append(cidr)

    m = manager(client, Machine(), Clock(), on_pod_cidr=update_pod_cidr)
    tasks.append(asyncio.create_task(m.run()))
    await asyncio.wait_for(m.registered.wait(), 5)
    await eventually(lambda: node_reads(api) >= 2)  # read at each sync while none is assigned
    assert handed == []
    # The node IPAM controller assigns it; a runtime that fails is asked again at the next sync.
    api.patch("nodes", NODE, {"spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24", "fd00:3::/64"]}})
    await eventually(lambda: handed == ["10.244.3.0/24,fd00:3::/64"])
    assert m.pod_cidr == "10.244.3.0/24,fd00:3::/64"
    reads = node_reads(api)
    await asyncio.sleep(0.1)  # several syncs
    assert node_reads(api) == reads  # once handed over, the Node is no longer read for it
    assert handed == ["10.244.3.0/24,fd00:3::/64"]
