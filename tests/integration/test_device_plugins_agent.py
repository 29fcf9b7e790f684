"""Device plugins against the agent on a real containerd: a plugin built for the kubelet registers, a pod gets its
device node, mount and variable, the node's resources follow the plugin's health, a pod asking for more than there is
is refused, the pod resources API shows the assignment, and the allocation outlives a plugin restart, an agent
restart, and an agent killed while the plugin is down followed by a reboot (the runtime emptied)."""

from __future__ import annotations

import json
import signal

import grpc
import pytest

from edgelet.podresources import podresources_v1_pb2 as pr
from edgelet.podresources import podresources_v1_pb2_grpc as pr_grpc
from tests.helpers import wait_for
from tests.integration.agent_harness import AgentProcess, container_state, is_running
from tests.integration.device_plugin import HEALTHY, UNHEALTHY, TestDevicePlugin
from tests.runtime_cleanup import empty_runtime_at

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

CAM = "example.com/camera"
SCRIPT = ('test -c /dev/cam0 && echo has-device; cat /run/devices/cam0; echo "TEST_DEVICES=$TEST_DEVICES"; '
          'exec sleep 3600')


def device_pod(name: str, count: int, command: str = SCRIPT) -> str:
    """A static pod asking for `count` cameras (JSON, which is YAML too)."""
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "hostNetwork": True, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
                        "command": ["sh", "-c", command], "resources": {"limits": {CAM: str(count)}}}]}})


def node_resources(agent: AgentProcess) -> dict[str, tuple[str, str]]:
    """(capacity, allocatable) of each device resource, as `edgelet describe node` prints them."""
    result = agent.cli("describe", "node")
    assert result.returncode == 0, result.stderr
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in result.stdout.splitlines():
        if not line.startswith(" "):
            current = line.split(":")[0]
            continue
        name, _, value = line.strip().rpartition(":")
        sections.setdefault(current, {})[name.strip()] = value.strip()
    return {name: (count, sections.get("Allocatable", {}).get(name, ""))
            for name, count in sections.get("Capacity", {}).items()}


def listed_devices(agent: AgentProcess) -> list[tuple[str, str, list[tuple[str, list[str]]]]]:
    with grpc.insecure_channel(f"unix://{agent.pod_resources_socket}") as channel:
        answer = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=10)
    return sorted((p.name, c.name, [(d.resource_name, list(d.device_ids)) for d in c.devices])
                  for p in answer.pod_resources for c in p.containers)


@pytest.fixture
def agent(tmp_path, containerd):
    process = AgentProcess(tmp_path, containerd.endpoint)
    yield process
    process.close()


@pytest.fixture
def plugin(agent, tmp_path):
    plugin = TestDevicePlugin(agent.plugin_dir, CAM, ["cam0", "cam1"], host_files=tmp_path / "device-files")
    yield plugin
    plugin.stop()


def allocations(plugin: TestDevicePlugin) -> list[list[str]]:
    return [args[0] for call, args in plugin.calls if call == "Allocate"]


def test_device_plugin_with_the_agent(agent, plugin, containerd):
    agent.start()
    wait_for(lambda: (agent.plugin_dir / "kubelet.sock").exists(), 30, what="kubelet.sock")
    plugin.start()
    wait_for(lambda: node_resources(agent) == {CAM: ("2", "2")}, 30, interval=0.3,
             what="the devices in the node's resources")

    # A pod asking for one camera runs with its device node, its mount and its variable.
    agent.write_manifest("viewer.yaml", device_pod("viewer", 1))
    pod = wait_for(lambda: (p := agent.pod("viewer")) and is_running(p) and p, 60, what="viewer Running")
    logs = wait_for(lambda: "TEST_DEVICES" in (out := agent.cli("logs", "viewer").stdout) and out, 30,
                    what="viewer's output")
    assert logs.splitlines() == ["has-device", "cam0", "TEST_DEVICES=cam0"]
    assert allocations(plugin) == [["cam0"]]
    container_id = container_state(pod)["containerID"]
    assert listed_devices(agent) == [("viewer-testnode", "main", [(CAM, ["cam0"])])]

    # A pod asking for more than is left is refused as the kubelet refuses it.
    agent.write_manifest("greedy.yaml", device_pod("greedy", 2))
    greedy = wait_for(lambda: (p := agent.pod("greedy")) and p["status"].get("phase") == "Failed" and p, 30,
                      what="greedy refused")
    assert greedy["status"]["reason"] == "UnexpectedAdmissionError"
    assert greedy["status"]["message"] == ("Allocate failed due to requested number of devices unavailable for "
                                           "example.com/camera. Requested: 2, Available: 1, which is unexpected")

    # Health follows the plugin's stream; a plugin that stops takes its devices with it until it is back.
    plugin.set_health("cam1", UNHEALTHY)
    wait_for(lambda: node_resources(agent) == {CAM: ("2", "1")}, 30, interval=0.3, what="allocatable shrunk")
    plugin.stop()
    wait_for(lambda: node_resources(agent) == {CAM: ("2", "0")}, 30, interval=0.3, what="the plugin gone")
    plugin.set_health("cam1", HEALTHY)
    plugin.start()
    wait_for(lambda: node_resources(agent) == {CAM: ("2", "2")}, 30, interval=0.3, what="the plugin back")
    assert plugin.registrations == 2

    # The agent restarts: the plugin sees kubelet.sock made anew and registers again; the pod keeps running.
    assert agent.stop() == 0
    agent.start()
    wait_for(lambda: plugin.registrations == 3, 30, what="the plugin registering with the restarted agent")
    wait_for(lambda: node_resources(agent) == {CAM: ("2", "2")}, 30, interval=0.3,
             what="the devices after the restart")
    pod = wait_for(lambda: (p := agent.pod("viewer")) and is_running(p) and p, 30, what="viewer still Running")
    assert container_state(pod)["containerID"] == container_id
    assert listed_devices(agent) == [("viewer-testnode", "main", [(CAM, ["cam0"])])]

    # Killed while the plugin is down, then the node reboots (its containers gone): the pod comes back with its
    # device from the checkpoint, without a new Allocate and without the plugin.
    agent.stop(signal.SIGKILL)
    plugin.stop()
    empty_runtime_at(containerd.endpoint)
    agent.start()
    wait_for(lambda: (p := agent.pod("viewer")) and is_running(p) and container_state(p)["containerID"] != container_id,
             60, what="viewer back after the reboot")
    # The new container's lines follow the old one's in the same log file (restart count 0 again: a new sandbox).
    logs = wait_for(lambda: (out := agent.cli("logs", "viewer").stdout).count("TEST_DEVICES") == 2 and out, 30,
                    what="viewer's output after the reboot")
    assert logs.splitlines()[-3:] == ["has-device", "cam0", "TEST_DEVICES=cam0"]
    assert allocations(plugin) == [["cam0"]]
    assert node_resources(agent) == {CAM: ("2", "0")}


def test_cdi_devices_reach_the_runtime(agent, tmp_path, containerd):
    """The Allocate answer's CDI device names go to CRI CDI_devices; containerd (2.x: CDI on) applies the spec's
    edits from its own spec directory (hack/local-containerd.sh)."""
    if containerd.release != "2.1":
        pytest.skip("CDI is on by default from containerd 2.0")
    spec = {"cdiVersion": "0.6.0", "kind": CAM, "devices": [
        {"name": name, "containerEdits": {"env": [f"CDI_CAMERA={name}"],
                                          "deviceNodes": [{"path": f"/dev/cdi-{name}", "hostPath": "/dev/null"}]}}
        for name in ("cam0", "cam1")]}
    (containerd.state_dir / "cdi" / "edgelet-test-camera.json").write_text(json.dumps(spec))
    plugin = TestDevicePlugin(agent.plugin_dir, CAM, ["cam0", "cam1"], cdi=True)
    try:
        agent.start()
        wait_for(lambda: (agent.plugin_dir / "kubelet.sock").exists(), 30, what="kubelet.sock")
        plugin.start()
        agent.write_manifest("cdi.yaml", device_pod("cdi", 1, 'test -c /dev/cdi-cam0 && echo cdi-device; '
                                                         'echo "CDI_CAMERA=$CDI_CAMERA"; exec sleep 3600'))
        logs = wait_for(lambda: "CDI_CAMERA" in (out := agent.cli("logs", "cdi").stdout) and out, 60,
                        what="the pod's output")
        assert logs.splitlines() == ["cdi-device", "CDI_CAMERA=cam0"]
    finally:
        plugin.stop()
        (containerd.state_dir / "cdi" / "edgelet-test-camera.json").unlink(missing_ok=True)
