"""The eviction manager on this machine's real signals and the private containerd's real pods.

A memory.available threshold above the machine's memory puts the node under memory pressure for sure:
pressure is reported, BestEffort pods are refused, and pods are evicted one per pass, the BestEffort pod
(using more than its zero request) before the Burstable one (within its request); a static pod is never
evicted. An imagefs threshold of 100 % shows image reclaim tried before any eviction.
"""

from __future__ import annotations

import asyncio

import pytest

from edgelet.api import podutil
from edgelet.config import Threshold
from edgelet.container.runtime import ContainerState
from edgelet.eviction import EvictionManager, NodeSignals, PodUsageReader, image_fs_mountpoint
from edgelet.eviction.manager import Collaborators
from edgelet.kuberuntime.container import make_container_config
from edgelet.kuberuntime.sandbox import make_sandbox_config
from edgelet.pleg.generic import GenericPLEG
from tests.helpers import busybox_pod

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def evictable_pod(name: str, *, memory_request: str | None = None, source: str | None = None) -> dict:
    """A busybox pod with the kubelet's default grace, its memory request and config source as given."""
    return busybox_pod(name=name, grace=30,
                       annotations={podutil.CONFIG_SOURCE_ANNOTATION: source} if source else None,
                       resources={"requests": {"memory": memory_request}} if memory_request else {})


@pytest.fixture
async def node(cri, containerd, tmp_path):
    """Runs pods as the runtime manager would and kills them as an eviction does."""

    class Node:
        def __init__(self):
            self.pleg = GenericPLEG(cri)
            self.pods: list[dict] = []
            self.evicted: list[tuple[str, str, str, int]] = []
            self.sandboxes: dict[str, str] = {}

        async def start(self, pod: dict) -> None:
            sandbox_config = make_sandbox_config(pod, 0, logs_root=str(tmp_path / "logs"))
            sandbox_id = await cri.run_pod_sandbox(sandbox_config)
            container = pod["spec"]["containers"][0]
            config = make_container_config(pod, container, image_ref=containerd.image, restart_count=0,
                                           container_hash="0", env=[], command=container["command"], args=[],
                                           mounts=[])
            container_id = await cri.create_container(sandbox_id, config, sandbox_config)
            await cri.start_container(container_id)
            self.sandboxes[podutil.uid(pod)] = sandbox_id
            self.pods.append(pod)

        def active(self) -> list[dict]:
            evicted = {name for name, *_ in self.evicted}
            return [pod for pod in self.pods if podutil.name(pod) not in evicted]

        async def evict(self, pod: dict, reason: str, message: str, grace: int) -> None:
            self.evicted.append((podutil.name(pod), reason, message, grace))
            for container in self.pleg.get_status(podutil.uid(pod)).running_containers():
                await cri.stop_container(container.id, grace)
            await cri.stop_pod_sandbox(self.sandboxes[podutil.uid(pod)])
            await self.pleg.relist()

    return Node()


def make_manager(node, cri, tmp_path, thresholds, **kwargs) -> tuple[EvictionManager, PodUsageReader]:
    usage = PodUsageReader(runtime_status=node.pleg.get_status, pods_dir=str(tmp_path / "pods"),
                           logs_dir=str(tmp_path / "logs"))
    signals = NodeSignals(str(tmp_path), image_fs_mountpoint=lambda: image_fs_mountpoint(cri))
    collaborators = Collaborators(signals=signals, usage=usage, active_pods=node.active, evict=node.evict, **kwargs)
    manager = EvictionManager({k: Threshold.parse(v) for k, v in thresholds.items()}, collaborators,
                              pressure_transition_period=0)
    return manager, usage


async def test_memory_pressure_evicts_best_effort_first_then_burstable_never_static(node, cri, tmp_path):
    best_effort = evictable_pod("best-effort")
    burstable = evictable_pod("burstable", memory_request="512Mi")
    static = evictable_pod("static", source="file")
    for pod in (burstable, best_effort, static):
        await node.start(pod)
    await node.pleg.relist()
    # Far above any machine's memory: memory.available is below it, deterministically.
    manager, usage = make_manager(node, cri, tmp_path, {"memory.available": "1Pi"})

    measured = await usage.usage([best_effort, burstable])
    assert measured[podutil.uid(best_effort)].memory > 0, "container memory not found in the cgroups"
    assert measured[podutil.uid(burstable)].memory < 512 * 2**20

    evicted = await manager.synchronize()
    assert manager.pressure() == {"memory": True, "disk": False, "pid": False}
    assert podutil.name(evicted) == podutil.name(best_effort)
    name, reason, message, grace = node.evicted[0]
    assert (reason, grace) == ("Evicted", 1)
    assert message.startswith("The node was low on resource: memory. Threshold quantity: 1Pi, available: ")
    assert "Container app was using " in message and "request is 0, has larger consumption of memory." in message
    status = node.pleg.get_status(podutil.uid(best_effort))
    assert status.containers and all(c.state == ContainerState.EXITED for c in status.containers)

    assert manager.admit(evictable_pod("late-best-effort")) == (
        False, "Evicted", "The node had condition: [MemoryPressure]. ")
    assert manager.admit(evictable_pod("late-burstable", memory_request="1Mi"))[0]

    assert podutil.name(await manager.synchronize()) == podutil.name(burstable)
    assert await manager.synchronize() is None  # only the static pod is left: it is critical
    assert [name for name, *_ in node.evicted] == [podutil.name(best_effort), podutil.name(burstable)]
    assert node.pleg.get_status(podutil.uid(static)).running_containers()


async def test_image_pressure_reclaims_images_before_evicting(node, cri, tmp_path):
    pod = evictable_pod("victim")
    await node.start(pod)
    await node.pleg.relist()
    calls = []

    async def reclaim_images(amount: int) -> int:
        calls.append(("images", amount))
        return 0

    async def reclaim_containers() -> None:
        calls.append(("containers", 0))

    # 100 % of the image filesystem must be free: never true, so reclaiming cannot help.
    manager, _ = make_manager(node, cri, tmp_path, {"imagefs.available": "100%"},
                              reclaim_images=reclaim_images, reclaim_containers=reclaim_containers)
    evicted = await asyncio.wait_for(manager.synchronize(), 30)
    assert [what for what, _ in calls] == ["containers", "images"] and calls[1][1] > 0
    assert podutil.name(evicted) == podutil.name(pod)
    assert manager.pressure()["disk"] is True
    assert node.evicted[0][2].startswith("The node was low on resource: ephemeral-storage. Threshold quantity: ")
