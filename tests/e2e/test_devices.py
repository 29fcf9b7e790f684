"""Device plugins on a joined node: the plugin's resource reaches the API Node's capacity and allocatable, the
scheduler places a pod asking for it on the node, the pod runs with its device, a pod asking for more than the node
has stays Pending, and the plugin's health reaches the API."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import condition, pod_phase, wait_pod
from tests.helpers import wait_for
from tests.integration.device_plugin import UNHEALTHY, TestDevicePlugin

pytestmark = pytest.mark.containerd

CAM = "example.com/camera"


def camera_pod(name: str, count: int) -> str:
    """No nodeName: the scheduler chooses the node by the extended resource."""
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "hostNetwork": True, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
                        "command": ["sh", "-c", 'test -c /dev/cam0 && echo has-device; echo "TEST_DEVICES='
                                    '$TEST_DEVICES"; exec sleep 3600'],
                        "resources": {"limits": {CAM: str(count)}}}]}})


def api_resources(kubectl, node: str) -> tuple[str, str]:
    status = (kubectl.get("node", node, None) or {}).get("status") or {}
    return (status.get("capacity") or {}).get(CAM, ""), (status.get("allocatable") or {}).get(CAM, "")


def test_extended_resource_reaches_the_api_and_the_scheduler(node_ready, control_plane, kubectl, tmp_path):
    node = control_plane.node
    agent = node_ready
    wait_for(lambda: (agent.plugin_dir / "kubelet.sock").exists(), 30, what="kubelet.sock")
    plugin = TestDevicePlugin(agent.plugin_dir, CAM, ["cam0", "cam1"])
    try:
        registered = time.monotonic()
        plugin.start()
        wait_for(lambda: api_resources(kubectl, node) == ("2", "2"), 60, interval=0.2,
                 what="the camera in the Node's status")
        print(f"registration -> allocatable in the API: {(time.monotonic() - registered) * 1000:.0f} ms "
              f"(node_status_update_frequency 2s)")

        kubectl.apply(camera_pod("viewer", 1))
        pod = wait_pod(kubectl, "viewer", lambda p: pod_phase(p) == "Running", 60)
        assert pod["spec"]["nodeName"] == node
        logs = wait_for(lambda: "TEST_DEVICES" in (out := kubectl("logs", "viewer")) and out, 30,
                        what="viewer's output")
        assert logs.splitlines() == ["has-device", "TEST_DEVICES=cam0"]

        kubectl.apply(camera_pod("greedy", 3))
        greedy = wait_pod(kubectl, "greedy", lambda p: condition(p, "PodScheduled") == "False", 30)
        scheduled = next(c for c in greedy["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["reason"] == "Unschedulable" and f"Insufficient {CAM}" in scheduled["message"]

        plugin.set_health("cam1", UNHEALTHY)
        wait_for(lambda: api_resources(kubectl, node) == ("2", "1"), 30, interval=0.2,
                 what="allocatable shrunk in the API")
    finally:
        plugin.stop()
