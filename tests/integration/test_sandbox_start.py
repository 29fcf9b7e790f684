"""A pod's first sync against the real runtime: what is made ready while RunPodSandbox runs, and what waits for it.

The containers that start first in a new sandbox have their image ensured and their config built while the
sandbox starts; a config that needs the pod's IP (its hosts file, `status.podIP`) waits for the sandbox's. A pod
whose volumes cannot be set up gets no sandbox, as with the kubelet, which waits for volumes before SyncPod.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from edgelet.container.runtime import PodRuntimeStatus
from edgelet.images.manager import ImageManager
from edgelet.kuberuntime.manager import Collaborators, RuntimeManager
from edgelet.util.backoff import Backoff
from edgelet.util.errors import EdgeletError
from edgelet.volumes import VolumeManager
from tests.helpers import busybox_pod

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

IMAGE = "docker.io/library/busybox:local"
POD_IP_ENV = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


class Calls:
    """Wall-clock spans of the runtime calls a test watches, by name."""

    def __init__(self, cri):
        self.spans: dict[str, list[tuple[float, float]]] = {}
        for name in ("run_pod_sandbox", "image_status", "pod_sandbox_status"):
            setattr(cri, name, self._timed(name, getattr(cri, name)))

    def _timed(self, name, call):
        async def timed(*args, **kwargs):
            began = time.monotonic()
            try:
                return await call(*args, **kwargs)
            finally:
                self.spans.setdefault(name, []).append((began, time.monotonic()))
        return timed


class Events:
    def __init__(self):
        self.seen: list[tuple[str, str, str]] = []

    def event(self, ref, event_type, reason, message):
        self.seen.append((ref.get("fieldPath", ""), reason, message))


def manager(cri, tmp_path, events: Events, **kwargs) -> RuntimeManager:
    images = ImageManager(cri, pull_backoff=Backoff(10, 300), recorder=events)
    volumes = VolumeManager(str(tmp_path / "pods"))
    return RuntimeManager(cri, Collaborators(images=images, volumes=volumes, recorder=events),
                          logs_root=str(tmp_path / "logs"), crash_backoff=Backoff(10, 300),
                          node_ip=lambda: "127.0.0.1", **kwargs)


async def first_sync(cri, tmp_path, command: str, *, host_network: bool) -> tuple[dict, Calls, Events]:
    """One pod's first sync, which starts its one container; the pod, the runtime calls watched, the events."""
    calls, events = Calls(cri), Events()
    pod = busybox_pod(command, name="first", host_network=host_network, env=POD_IP_ENV)
    result = await manager(cri, tmp_path, events).sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    assert result.started == ["app"] and not result.waiting_reasons
    return pod, calls, events


async def container_log(tmp_path, pod: dict, *, lines: int) -> list[str]:
    """The app container's output lines (its CRI log file), once it wrote `lines` of them."""
    meta = pod["metadata"]
    path = tmp_path / "logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "app" / "0.log"
    async with asyncio.timeout(30):
        while True:
            text = path.read_text() if path.exists() else ""
            found = [line.split(" ", 3)[3] for line in text.splitlines()]
            if len(found) >= lines:
                return found
            await asyncio.sleep(0.05)


async def test_the_first_container_is_made_ready_while_its_sandbox_starts(cri, tmp_path):
    pod, calls, events = await first_sync(cri, tmp_path, "echo $POD_IP; sleep 3600", host_network=True)
    ((sandbox_began, sandbox_ended),) = calls.spans["run_pod_sandbox"]
    ((image_began, image_ended),) = calls.spans["image_status"]
    assert sandbox_began <= image_began and image_ended < sandbox_ended
    assert "pod_sandbox_status" not in calls.spans  # the node's network: its IP is the node's
    assert await container_log(tmp_path, pod, lines=1) == ["127.0.0.1"]
    assert [reason for _, reason, _ in events.seen] == ["Pulled", "Created", "Started"]


async def test_a_pod_on_its_own_network_gets_the_ip_of_its_sandbox(cri, tmp_path):
    pod, calls, _ = await first_sync(cri, tmp_path, "echo $POD_IP; grep -c \"^$POD_IP\" /etc/hosts; sleep 3600",
                                     host_network=False)
    sandboxes = await cri.list_pod_sandbox()
    ip = (await cri.pod_sandbox_status(sandboxes[0].id)).status.network.ip
    assert ip and ip != "127.0.0.1"
    assert await container_log(tmp_path, pod, lines=2) == [ip, "1"]  # in its env and its hosts file
    ((_, image_ended),) = calls.spans["image_status"]
    ((_, sandbox_ended),) = calls.spans["run_pod_sandbox"]
    assert image_ended < sandbox_ended  # only the config waited for the sandbox


async def test_a_pod_whose_volumes_fail_gets_no_sandbox(cri, tmp_path):
    events = Events()
    pod = busybox_pod("sleep 3600", name="first", host_network=True, env=POD_IP_ENV)
    missing = tmp_path / "no-such-directory"
    pod["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": str(missing), "type": "Directory"}}]
    result = await manager(cri, tmp_path, events).sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    assert result.started == [] and result.waiting_reasons["app"][0] == "CreateContainerConfigError"
    assert [reason for _, reason, _ in events.seen] == ["FailedMount"]
    assert await cri.list_pod_sandbox() == []


async def test_a_sandbox_that_cannot_start_leaves_no_preparation_behind(cri, tmp_path):
    events = Events()
    pod = busybox_pod("sleep 3600", name="first", host_network=True, env=POD_IP_ENV)
    runtime_manager = manager(cri, tmp_path, events, runtime_handler="no-such-handler")
    with pytest.raises(EdgeletError, match="no-such-handler"):
        await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    await asyncio.sleep(0)  # a cancelled preparation ends at the loop's next turn
    preparing = [task for task in asyncio.all_tasks()
                 if "_prepare_container" in getattr(task.get_coro(), "__qualname__", "")]
    assert preparing == []
    assert ("", "FailedCreatePodSandBox") in [(path, reason) for path, reason, _ in events.seen]
    assert await cri.list_containers() == []
