"""The device manager and its sockets against a real device plugin over unix sockets (no runtime needed):
registration and its refusals, devices and health reaching the node's capacity, a plugin going away and coming
back, admission, Allocate with GetPreferredAllocation and PreStartContainer, the checkpoint across a restart, and
the pod resources API."""

from __future__ import annotations

import asyncio
import functools
import time

import grpc
import pytest

from edgelet.cm.devicemanager.allocation import ResourceCount
from edgelet.cm.devicemanager.manager import DeviceError, DeviceManager
from edgelet.cm.devicemanager.server import DeviceServer
from edgelet.podresources import podresources_v1_pb2 as pr
from edgelet.podresources import podresources_v1_pb2_grpc as pr_grpc
from edgelet.podresources.server import ResourceSources, add_to_server
from tests.integration.device_plugin import HEALTHY, UNHEALTHY, TestDevicePlugin

CAM = "example.com/camera"


def make_pod(uid: str, count: int, *, name: str = "", init: int = 0) -> dict:
    def container(cname, n):
        return {"name": cname, "image": "busybox", "resources": {"limits": {CAM: str(n)}}}
    spec = {"containers": [container("main", count)]}
    if init:
        spec["initContainers"] = [container("setup", init)]
    return {"metadata": {"name": name or f"pod-{uid}", "namespace": "default", "uid": uid}, "spec": spec}


class Node:
    """A device manager with its gRPC server, as the agent wires them."""

    def __init__(self, tmp_path, *, stop_grace: float = 300.0, sources_ready=lambda: True):
        # The plugins' sockets are looked at every 0.1 s here (5 s in the agent).
        self.plugin_dir = tmp_path / "dp"
        self.pods: dict[str, dict] = {}
        self.manager = DeviceManager(str(self.plugin_dir), state_dir=str(tmp_path / "state"),
                                     active_pods=lambda: list(self.pods.values()), stop_grace=stop_grace,
                                     sources_ready=sources_ready, socket_check_period=0.1)
        self.pod_resources_socket = str(tmp_path / "pr" / "kubelet.sock")
        sources = ResourceSources(
            active_pods=lambda: list(self.pods.values()), container_devices=self.manager.container_devices,
            container_cpus=lambda uid, name: (), allocatable_devices=self.manager.healthy_devices,
            allocatable_cpus=lambda: (), topology=self.manager.topology)
        self.server = DeviceServer(self.manager, pod_resources_socket=self.pod_resources_socket,
                                   add_pod_resources=functools.partial(add_to_server, sources=sources))
        self.task: asyncio.Task | None = None

    async def start(self) -> Node:
        self.manager.start()
        await self.server.start()
        self.task = asyncio.create_task(self.manager.run())
        return self

    async def stop(self) -> None:
        self.task.cancel()
        await self.manager.close()
        await self.server.close()

    def admit(self, pod: dict) -> tuple[bool, str, str]:
        verdict = self.manager.admit(pod)
        if verdict[0]:
            self.pods[pod["metadata"]["uid"]] = pod
        return verdict


async def eventually(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def node(tmp_path):
    node = await Node(tmp_path).start()
    yield node
    await node.stop()


@pytest.fixture
def plugins():
    started: list[TestDevicePlugin] = []
    yield started
    for plugin in started:
        plugin.stop()


async def start_plugin(node: Node, plugins: list, resource: str = CAM, devices=("cam0", "cam1", "cam2"),
                       **options) -> TestDevicePlugin:
    plugin = TestDevicePlugin(node.plugin_dir, resource, list(devices), **options)
    plugins.append(plugin)
    await asyncio.to_thread(plugin.start)
    return plugin


async def test_registration_reaches_capacity_and_health_shrinks_allocatable(node, plugins):
    plugin = await start_plugin(node, plugins)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the devices")
    assert [name for name, _ in plugin.calls[:2]] == ["GetDevicePluginOptions", "ListAndWatch"]
    plugin.set_health("cam1", UNHEALTHY)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 2)}, what="the unhealthy device")
    plugin.set_health("cam1", HEALTHY)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the device healthy again")


@pytest.mark.parametrize("version, resource, code, message", [
    ("v1alpha", CAM, grpc.StatusCode.INVALID_ARGUMENT, "requested API version 'v1alpha' is not supported"),
    ("v1beta1", "camera", grpc.StatusCode.INVALID_ARGUMENT, "the ResourceName 'camera' is invalid"),
    ("v1beta1", "kubernetes.io/camera", grpc.StatusCode.INVALID_ARGUMENT, "is invalid"),
])
async def test_registration_refused(node, plugins, version, resource, code, message):
    plugin = TestDevicePlugin(node.plugin_dir, resource, ["d0"], endpoint="p.sock", version=version)
    plugins.append(plugin)
    await asyncio.to_thread(plugin.serve)
    with pytest.raises(grpc.RpcError) as refused:
        await asyncio.to_thread(plugin.register)
    assert refused.value.code() == code and message in refused.value.details()
    assert node.manager.capacity() == {}


async def test_duplicate_refused_while_the_first_serves_and_a_restart_replaces(node, plugins):
    first = await start_plugin(node, plugins, endpoint="first.sock")
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the first plugin")
    second = TestDevicePlugin(node.plugin_dir, CAM, ["x0"], endpoint="second.sock")
    plugins.append(second)
    await asyncio.to_thread(second.serve)
    with pytest.raises(grpc.RpcError) as refused:
        await asyncio.to_thread(second.register)
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already registered by the device plugin at" in refused.value.details()
    # The first plugin ends; the second may now take the resource.
    first.stop()
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 0)}, what="the first plugin gone")
    await asyncio.to_thread(second.register)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(1, 1)}, what="the second plugin")
    # The same plugin registering again (a restart on the same socket) replaces its registration.
    await asyncio.to_thread(second.register)
    await eventually(lambda: second.calls.count(("ListAndWatch", ())) == 2, what="the second stream")
    assert node.manager.capacity() == {CAM: ResourceCount(1, 1)}


async def test_admission_allocation_and_restart_without_plugin(tmp_path, plugins):
    node = await Node(tmp_path).start()
    try:
        plugin = await start_plugin(node, plugins, pre_start_required=True,
                                    preferred=lambda available, must, size: must + sorted(
                                        set(available) - set(must))[len(must) - size:])
        await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the devices")
        pod = make_pod("u1", 2, init=1)
        assert node.admit(pod) == (True, "", "")
        # Nothing asked of the plugin before a container is made; the plan is recorded.
        assert [call for call, _ in plugin.calls if call == "Allocate"] == []
        options = await node.manager.container_options(pod, pod["spec"]["containers"][0])
        preferred = [args for call, args in plugin.calls if call == "GetPreferredAllocation"]
        # The init container's device must stay; the plugin's preference decides the other.
        assert preferred == [(["cam0", "cam1", "cam2"], ["cam0"], 2)]
        allocated = [args[0] for call, args in plugin.calls if call == "Allocate"]
        assert allocated == [["cam0", "cam2"]]
        assert options.envs == [("TEST_DEVICES", "cam0,cam2")]
        assert [d[0] for d in options.devices] == ["/dev/cam0", "/dev/cam2"]
        assert ("PreStartContainer", (["cam0", "cam2"],)) in plugin.calls
        # A second pod asking for more than is left is refused in the kubelet's words.
        assert node.admit(make_pod("u2", 2)) == (
            False, "UnexpectedAdmissionError", "Allocate failed due to requested number of devices unavailable for "
            "example.com/camera. Requested: 2, Available: 1, which is unexpected")
        assert node.admit(make_pod("u3", 1))[0]
        # A container made again (a restart) needs no new Allocate.
        again = await node.manager.container_options(pod, pod["spec"]["containers"][0])
        assert again == options
        assert len([c for c, _ in plugin.calls if c == "Allocate"]) == 1
    finally:
        await node.stop()
    for plugin in plugins:
        plugin.stop()
    # The agent restarts while the plugin is down (its pod sources not all listed yet): the pod gets the same
    # devices and options from the checkpoint.
    node = await Node(tmp_path, sources_ready=lambda: False).start()
    try:
        assert node.manager.capacity() == {CAM: ResourceCount(3, 0)}
        assert node.admit(pod) == (True, "", "")
        restored = await node.manager.container_options(pod, pod["spec"]["containers"][0])
        assert (restored.envs, restored.devices) == (options.envs, options.devices)
        # A new pod cannot have devices until the plugin is back.
        assert node.admit(make_pod("u4", 1))[2] == (
            "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices example.com/camera, "
            "which is unexpected")
        # u3 was admitted but never allocated: its container waits for the plugin.
        u3 = make_pod("u3", 1)
        assert node.admit(u3)[0]
        with pytest.raises(DeviceError, match="device plugin example.com/camera is not registered"):
            await node.manager.container_options(u3, u3["spec"]["containers"][0])
        # The pod ends: its devices go back.
        node.manager.remove("u1")
        assert node.manager.container_devices("u1", "main") == {}
    finally:
        await node.stop()


async def test_plugin_gone_for_good_leaves_the_node(tmp_path, plugins):
    node = await Node(tmp_path, stop_grace=0.3).start()
    try:
        plugin = await start_plugin(node, plugins)
        await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the devices")
        plugin.stop()
        await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(0, 0)}, what="the grace period")
        # The node reports 0 of it: the kubelet's predicate refuses a pod asking for it.
        assert node.admit(make_pod("u1", 1)) == (False, "OutOfexample.com/camera", "Node didn't have enough resource: "
                                                 "example.com/camera, requested: 1, used: 0, capacity: 0")
        # A restarted plugin registers again and its devices are back.
        await asyncio.to_thread(plugin.start)
        await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the plugin back")
        assert node.admit(make_pod("u1", 1))[0]
    finally:
        await node.stop()


async def test_static_pod_waits_for_its_plugin(node, plugins):
    """On a device's boot the plugin registers after the static pods are admitted: a static pod waits for its
    devices at its container's creation; an API pod is judged at once, as the kubelet judges it."""
    static = make_pod("u1", 1)
    static["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    assert node.admit(static) == (True, "", "")
    with pytest.raises(DeviceError, match="waiting for the device plugin of example.com/camera to register"):
        await node.manager.container_options(static, static["spec"]["containers"][0])
    plugin = await start_plugin(node, plugins, devices=["cam0"])
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(1, 1)}, what="the devices")
    options = await node.manager.container_options(static, static["spec"]["containers"][0])
    assert options.envs == [("TEST_DEVICES", "cam0")]
    # A second static pod now that the plugin serves is judged at once.
    second = make_pod("u2", 1)
    second["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    assert node.admit(second)[1] == "UnexpectedAdmissionError"
    # A waiting pod that finds too few devices keeps waiting, saying why.
    third = make_pod("u3", 1)
    third["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    plugin.stop()
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(1, 0)}, what="the plugin gone")
    assert node.admit(third) == (True, "", "")
    await asyncio.to_thread(plugin.start)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(1, 1)}, what="the plugin back")
    with pytest.raises(DeviceError, match="requested number of devices unavailable for example.com/camera. "
                                          "Requested: 1, Available: 0; waiting for devices"):
        await node.manager.container_options(third, third["spec"]["containers"][0])
    node.manager.remove("u1")
    assert (await node.manager.container_options(third, third["spec"]["containers"][0])).envs == [
        ("TEST_DEVICES", "cam0")]


async def test_pod_resources_api(node, plugins):
    await start_plugin(node, plugins)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the devices")
    pod = make_pod("u1", 2, name="viewer")
    assert node.admit(pod)[0]
    async with grpc.aio.insecure_channel(f"unix://{node.pod_resources_socket}") as channel:
        lister = pr_grpc.PodResourcesListerStub(channel)
        listed = await lister.List(pr.ListPodResourcesRequest())
        assert [(p.name, p.namespace, [(c.name, [(d.resource_name, list(d.device_ids)) for d in c.devices])
                                       for c in p.containers]) for p in listed.pod_resources] == [
            ("viewer", "default", [("main", [(CAM, ["cam0", "cam1"])])])]
        got = await lister.Get(pr.GetPodResourcesRequest(name="viewer", namespace="default"))
        assert got.pod_resources == listed.pod_resources[0]
        allocatable = await lister.GetAllocatableResources(pr.AllocatableResourcesRequest())
        assert [(d.resource_name, list(d.device_ids)) for d in allocatable.devices] == [(CAM, ["cam0", "cam1", "cam2"])]
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await lister.Get(pr.GetPodResourcesRequest(name="nope", namespace="default"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_devices_of_pods_gone_while_nobody_looked_go_back_after_two_passes(node, plugins):
    """A pod deleted while the agent was down is never terminated here: housekeeping frees its devices once two
    passes found it inactive (one pass may run between a source's listing and the pod's admission)."""
    await start_plugin(node, plugins)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the devices")
    assert node.admit(make_pod("u1", 3))[0]
    del node.pods["u1"]
    node.manager._release_inactive()
    assert node.manager.container_devices("u1", "main") == {CAM: ("cam0", "cam1", "cam2")}
    node.manager._release_inactive()
    assert node.manager.container_devices("u1", "main") == {}
    assert node.admit(make_pod("u2", 3))[0]


async def test_a_plugin_whose_socket_vanishes_is_dropped(node, plugins):
    plugin = await start_plugin(node, plugins)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the devices")
    plugin.socket_path.unlink()  # its process and stream live on
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 0)}, what="the plugin dropped")
    assert node.admit(make_pod("u1", 1))[2].startswith("Allocate failed due to no healthy devices present")
    await asyncio.to_thread(plugin.serve)
    await asyncio.to_thread(plugin.register)
    await eventually(lambda: node.manager.capacity() == {CAM: ResourceCount(3, 3)}, what="the plugin back")
