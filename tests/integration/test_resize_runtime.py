"""In-place resize against real containers: a changed `resources` of a running pod reaches the container's
cgroup through UpdateContainerResources (no restart) and the status shows it; resizePolicy RestartContainer
restarts the container; a resize the node cannot take leaves the cgroup alone and says why."""

from __future__ import annotations

import copy
import uuid

import pytest

from edgelet.container.runtime import ContainerState
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images.manager import ImageManager
from edgelet.kuberuntime.manager import Collaborators, RuntimeManager
from edgelet.kuberuntime.resizer import Resizer
from edgelet.pleg.generic import GenericPLEG
from edgelet.status.extras import add_newer_fields
from edgelet.status.generate import generate_pod_status
from edgelet.util.backoff import Backoff

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

MiB = 1 << 20
SMALL = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
BIG = {"requests": {"cpu": "300m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "96Mi"}}


def resizable_pod(resources: dict, policy: list | None = None) -> dict:
    container = {"name": "app", "image": "docker.io/library/busybox:local", "command": ["sh", "-c", "exec sleep 3600"],
                 "resources": resources}
    if policy:
        container["resizePolicy"] = policy
    return {"metadata": {"name": f"resize-{uuid.uuid4().hex[:8]}", "namespace": "default", "uid": str(uuid.uuid4()),
                         "generation": 1},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                     "containers": [container]}}


def resized(pod: dict, resources: dict) -> dict:
    changed = copy.deepcopy(pod)
    changed["spec"]["containers"][0]["resources"] = resources
    changed["metadata"]["generation"] += 1
    return changed


@pytest.fixture
def resizer(cri):
    return Resizer(cri, node_allocatable={"cpu": "2", "memory": str(4096 * MiB)})


@pytest.fixture
def runtime_manager(cri, resizer, tmp_path):
    images = ImageManager(cri, pull_backoff=Backoff(10, 300))
    return RuntimeManager(cri, Collaborators(images=images, resizer=resizer), logs_root=str(tmp_path / "logs"),
                          crash_backoff=Backoff(10, 300))


async def observed(cri, pod):
    """The pod as the PLEG inspects it (a fresh PLEG: nothing cached)."""
    pleg = GenericPLEG(cri)
    await pleg.relist()
    return pleg.get_status(pod["metadata"]["uid"])


async def cgroup(cri, container_id: str) -> tuple[int, int, int]:
    """CPU shares, CFS quota and memory limit as the kernel holds them, read inside the container."""
    async def read(path: str) -> int:
        code, out, err = await cri.exec_sync(container_id, ["cat", path], 5)
        assert code == 0, err
        return int(out)
    return (await read("/sys/fs/cgroup/cpu/cpu.shares"), await read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
            await read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def status_of(pod, runtime, resizer):
    status = generate_pod_status(pod, runtime, old_status=None, now=0)
    return add_newer_fields(status, pod, runtime, resizer.view(pod))


async def test_a_running_container_is_resized_in_place(cri, runtime_manager, resizer):
    pod = resizable_pod(SMALL)
    await runtime_manager.sync_pod(pod, await observed(cri, pod))
    runtime = await observed(cri, pod)
    [container] = runtime.running_containers()
    assert await cgroup(cri, container.id) == (102, 20000, 64 * MiB)
    [item] = status_of(pod, runtime, resizer)["containerStatuses"]
    assert "resources" in item, item
    assert item["resources"] == SMALL and item["allocatedResources"] == SMALL["requests"]

    bigger = resized(pod, BIG)
    result = await runtime_manager.sync_pod(bigger, runtime)
    assert result.requeue_after is None
    runtime = await observed(cri, pod)
    [after] = runtime.running_containers()
    assert after.id == container.id and after.restart_count == 0  # the same container, never restarted
    assert await cgroup(cri, container.id) == (307, 50000, 96 * MiB)
    status = status_of(bigger, runtime, resizer)
    [item] = status["containerStatuses"]
    assert item["resources"] == BIG and item["allocatedResources"] == BIG["requests"]
    assert not [c for c in status["conditions"] if c["type"].startswith("PodResize")]
    assert status["observedGeneration"] == 2


async def test_restart_container_policy_restarts_with_the_new_resources(cri, runtime_manager, resizer):
    pod = resizable_pod(SMALL, [{"resourceName": "memory", "restartPolicy": "RestartContainer"}])
    await runtime_manager.sync_pod(pod, await observed(cri, pod))
    runtime = await observed(cri, pod)
    [first] = runtime.running_containers()
    await runtime_manager.sync_pod(resized(pod, BIG), runtime)
    runtime = await observed(cri, pod)
    [second] = runtime.running_containers()
    assert second.id != first.id and second.restart_count == 1  # restarted though restartPolicy is Never
    assert runtime.latest_container("app") is second
    assert [c.state for c in runtime.containers if c.id == first.id] == [ContainerState.EXITED]
    assert await cgroup(cri, second.id) == (307, 50000, 96 * MiB)


async def test_an_infeasible_resize_leaves_the_container_as_it_is(cri, runtime_manager, resizer):
    pod = resizable_pod(SMALL)
    await runtime_manager.sync_pod(pod, await observed(cri, pod))
    runtime = await observed(cri, pod)
    [container] = runtime.running_containers()
    huge = resized(pod, {"requests": {"cpu": "8", "memory": "32Mi"}, "limits": {"cpu": "8", "memory": "64Mi"}})
    await runtime_manager.sync_pod(huge, runtime)
    assert await cgroup(cri, container.id) == (102, 20000, 64 * MiB)
    status = status_of(huge, await observed(cri, pod), resizer)
    [pending] = [c for c in status["conditions"] if c["type"] == "PodResizePending"]
    assert (pending["status"], pending["reason"], pending["observedGeneration"]) == ("True", "Infeasible", 2)
    assert pending["message"] == "Node didn't have enough capacity: cpu, requested: 8000, capacity: 2000"
    [item] = status["containerStatuses"]
    assert item["allocatedResources"] == SMALL["requests"] and item["resources"] == SMALL
    # Back to what fits: the condition goes.
    status = status_of(pod, await observed(cri, pod), resizer)
    await runtime_manager.sync_pod(pod, await observed(cri, pod))
    status = status_of(pod, await observed(cri, pod), resizer)
    assert not [c for c in status["conditions"] if c["type"].startswith("PodResize")]


async def test_the_runtime_reports_what_the_cgroup_holds(cri, runtime_manager):
    """What a restarted agent compares against: the runtime's own record of the container's resources."""
    pod = resizable_pod(SMALL)
    await runtime_manager.sync_pod(pod, await observed(cri, pod))
    [container] = (await observed(cri, pod)).running_containers()
    await runtime_manager.sync_pod(resized(pod, BIG), await observed(cri, pod))
    reply = await cri.container_status(container.id)
    assert (reply.resources.linux.cpu_shares, reply.resources.linux.cpu_quota,
            reply.resources.linux.memory_limit_in_bytes) == (307, 50000, 96 * MiB)
    assert pb  # the CRI module the assertions read
