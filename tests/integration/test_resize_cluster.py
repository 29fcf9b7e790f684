"""In-place resize through the API, as a 1.35 control plane drives it: the real agent against the API server double
answering as 1.35 (1.20, the e2e control plane, has no resize) and the private containerd. The status reports
what the resize subresource needs, a `kubectl patch --subresource resize` reaches the container's cgroup
without a restart, and a resize the node cannot take comes back as PodResizePending.
"""

from __future__ import annotations

import asyncio

import pytest

from edgelet.cri.client import RuntimeClient
from tests.helpers import wait_for
from tests.integration.cluster_harness import NODE, api_pod, main_status, running_container_ids, running_in_api
from tests.kubeapi_double import ApiServerDouble, StatusError

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(cluster_node):
    """This module's agent is a cluster node."""
    return cluster_node

MiB = 1 << 20
SMALL = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
BIG = {"requests": {"cpu": "300m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "96Mi"}}


@pytest.fixture
def api():
    with ApiServerDouble(bookmark_interval=0.5, node_name=NODE, server_minor=35) as double:
        yield double


def cgroup(endpoint: str, container_id: str) -> tuple[int, int, int]:
    async def read() -> tuple[int, ...]:
        async with RuntimeClient(endpoint) as client:
            values = []
            for path in ("/sys/fs/cgroup/cpu/cpu.shares", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                         "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
                code, out, _ = await client.exec_sync(container_id, ["cat", path], 5)
                assert code == 0
                values.append(int(out))
            return tuple(values)
    return asyncio.run(read())


def resize(api: ApiServerDouble, name: str, resources: dict) -> dict:
    return api.patch("pods", name, {"spec": {"containers": [{"name": "main", "resources": resources}]}},
                     namespace="default", subresource="resize")


def condition(pod: dict, kind: str) -> dict | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == kind), None)


def test_a_resize_through_the_api_reaches_the_running_container(agent, api, containerd):
    agent.start()
    pod = api_pod("resizable")
    pod["spec"]["containers"][0]["resources"] = SMALL
    uid = api.create("pods", pod)["metadata"]["uid"]
    pod = wait_for(lambda: (p := running_in_api(api, "resizable")) and "resources" in main_status(p) and p, 30,
                   what="resizable Running with its resources in the API")
    assert main_status(pod)["resources"] == SMALL and main_status(pod)["allocatedResources"] == SMALL["requests"]
    assert pod["status"]["observedGeneration"] == 1
    assert condition(pod, "Ready")["observedGeneration"] == 1
    (container_id,) = running_container_ids(containerd.endpoint, uid)

    resized = resize(api, "resizable", BIG)  # accepted: the node reports running containers' resources
    assert resized["metadata"]["generation"] == 2
    pod = wait_for(lambda: (p := api.get("pods", "resizable", "default"))["status"].get("observedGeneration") == 2
                   and main_status(p).get("resources") == BIG and p, 30, what="the resize in the API status")
    assert main_status(pod)["allocatedResources"] == BIG["requests"]
    assert main_status(pod)["restartCount"] == 0
    assert running_container_ids(containerd.endpoint, uid) == [container_id]  # in place, no restart
    assert cgroup(containerd.endpoint, container_id) == (307, 50000, 96 * MiB)
    assert condition(pod, "PodResizePending") is None and condition(pod, "PodResizeInProgress") is None

    huge = {"requests": {"cpu": "64", "memory": "64Mi"}, "limits": {"cpu": "64", "memory": "96Mi"}}
    resize(api, "resizable", huge)
    pod = wait_for(lambda: (p := api.get("pods", "resizable", "default")) and condition(p, "PodResizePending") and p,
                   30, what="PodResizePending")
    pending = condition(pod, "PodResizePending")
    assert (pending["status"], pending["reason"], pending["observedGeneration"]) == ("True", "Infeasible", 3)
    assert pending["message"].startswith("Node didn't have enough capacity: cpu, requested: 64000, capacity: ")
    assert main_status(pod)["allocatedResources"] == BIG["requests"]  # still what was allocated before
    assert cgroup(containerd.endpoint, container_id) == (307, 50000, 96 * MiB)


def test_a_node_that_reports_no_resources_cannot_be_resized(api):
    """The double keeps the 1.35 API server's rule the report above satisfies."""
    pod = api_pod("old-node")
    pod["spec"]["containers"][0]["resources"] = SMALL
    api.create("pods", pod)
    api.patch("pods", "old-node", {"status": {"containerStatuses": [
        {"name": "main", "state": {"running": {}}, "ready": True, "restartCount": 0, "image": "x", "imageID": ""}]}},
        namespace="default", subresource="status")
    with pytest.raises(StatusError) as refused:
        resize(api, "old-node", BIG)
    assert refused.value.code == 422 and "Pod running on node without support for resize" in str(refused.value)
    with pytest.raises(StatusError, match="Pod QOS Class may not change as a result of resizing"):
        api.patch("pods", "old-node", {"status": {"containerStatuses": [
            {"name": "main", "state": {"running": {}}, "resources": SMALL, "ready": True, "restartCount": 0,
             "image": "x", "imageID": ""}]}}, namespace="default", subresource="status")
        resize(api, "old-node", {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}})
