"""The API double agrees with a real kube-apiserver 1.36: each test runs the same requests against both.

Status PATCH merge keys (conditions by type, container statuses replaced whole, `$setElementOrder` on them
breaking the request), null condition times, what a pod status keeps (current fields such as hostIPs and
containers' user) and drops (unknown ones), 401 vs 403 (NodeRestriction on mirror pods, a node listing pods not
bound to it), 410 for a watch from before a restart, and pods/ephemeralcontainers (a Pod; additions only,
defaulted; not for nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from edgelet.kubeapi import ApiClient, Forbidden, Gone, Invalid, NotFound, ServerError, Unauthorized
from tests.helpers import wait_for
from tests.kubeapi_double import ApiServerDouble

pytestmark = pytest.mark.containerd

PODS = "/api/v1/namespaces/default/pods"
ADMIN_TOKEN = "admin-of-the-double"


@dataclass
class ApiUnderTest:
    kind: str  # "double" or "real"
    node_name: str
    node: ApiClient  # the node's credentials: NodeRestriction applies
    admin: ApiClient  # a cluster admin
    stranger: ApiClient  # credentials the server does not accept
    restart: Callable[[], None]
    panics: Callable[[], int]  # requests that made the server panic (the double counts; the real one logs)


@pytest.fixture(params=["double", "real"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[ApiUnderTest]:
    if request.param == "double":
        with ApiServerDouble(token="node-token", node_name="edge-node", admin_token=ADMIN_TOKEN) as double:
            under_test = ApiUnderTest("double", "edge-node", ApiClient(double.url, token="node-token"),
                                      ApiClient(double.url, token=ADMIN_TOKEN),
                                      ApiClient(double.url, token="nobody"), double.restart, lambda: len(double.panics))
            async with under_test.node, under_test.admin, under_test.stranger:
                yield under_test
        return
    plane = request.getfixturevalue("control_plane")
    # A node of its own, so that no running agent's Node is touched.
    name = f"sem-{uuid.uuid4().hex[:6]}"
    plain_tls = ssl.create_default_context(cafile=str(plane.dir / "pki" / "ca.crt"))
    under_test = ApiUnderTest("real", name, ApiClient.from_kubeconfig(str(plane.node_kubeconfig(name))),
                              ApiClient.from_kubeconfig(str(plane.admin_kubeconfig)),
                              ApiClient(plane.server, token="nobody", tls=plain_tls),
                              lambda: _restart_apiserver(plane, request.getfixturevalue("kubectl")), lambda: 0)
    async with under_test.node, under_test.admin, under_test.stranger:
        try:
            yield under_test
        finally:
            for pod in (await under_test.admin.list(PODS))["items"]:
                if (pod.get("spec") or {}).get("nodeName") == name:
                    await under_test.admin.delete(f"{PODS}/{pod['metadata']['name']}", grace_period=0)
            with contextlib.suppress(NotFound):
                await under_test.admin.delete(f"/api/v1/nodes/{name}")


def _restart_apiserver(plane, kubectl) -> None:
    # kube-controller-manager exits if the apiserver is away while it starts its controllers (resource
    # discovery is fatal then): restart only once its controllers run, shown by the default ServiceAccount.
    wait_for(lambda: kubectl.get("serviceaccount", "default", "default"), 120, interval=0.5,
             what="kube-controller-manager's controllers running")
    plane.stop_apiserver()
    plane.start_apiserver()


async def register(api: ApiUnderTest) -> str:
    node = await api.node.create("/api/v1/nodes", {"metadata": {"name": api.node_name}})
    return node["metadata"]["uid"]


async def once_admission_knows_the_node(api: ApiUnderTest, request: Callable[[], Awaitable[Any]],
                                        within: float = 10.0) -> Any:
    """`request()` awaited, again while it gets 404 for the node itself: the real server's NodeRestriction
    reads Nodes from an informer cache, which can lag a registration by a moment on a loaded machine."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await request()
        except NotFound as exc:
            if f'node "{api.node_name}" not found' not in str(exc) or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


def pod(name: str, node: str, **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec}}


def container_status(ready: bool, restarts: int = 0) -> dict:
    return {"name": "c", "ready": ready, "restartCount": restarts, "image": "busybox", "imageID": "",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}


async def test_conditions_merge_by_type_and_come_back_with_null_times(api: ApiUnderTest) -> None:
    await api.admin.create(PODS, pod("merge", api.node_name))
    path = f"{PODS}/merge/status"
    await api.node.patch(path, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "example.com/gate", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    patched = await api.node.patch(path, {"status": {
        "$setElementOrder/conditions": [{"type": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True"}]}})
    conditions = {c["type"]: c for c in patched["status"]["conditions"]}
    assert conditions["Ready"] == {"type": "Ready", "status": "True", "lastProbeTime": None,
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}
    assert conditions["example.com/gate"]["status"] == "True"  # others' conditions stay


async def test_container_statuses_are_replaced_whole(api: ApiUnderTest) -> None:
    created = await api.admin.create(PODS, pod("replace", api.node_name))
    path = f"{PODS}/replace/status"
    first = [container_status(False), {**container_status(False), "name": "d"}]
    await api.node.patch(path, {"status": {"containerStatuses": first}})
    patched = await api.node.patch(path, {"metadata": {"uid": created["metadata"]["uid"]},
                                          "status": {"containerStatuses": [container_status(True, 1)]}})
    assert [(s["name"], s["ready"], s["restartCount"]) for s in patched["status"]["containerStatuses"]] == [("c", True,
                                                                                                             1)]


async def test_an_element_order_for_container_statuses_fails_the_request(api: ApiUnderTest) -> None:
    await api.admin.create(PODS, pod("order", api.node_name))
    path = f"{PODS}/order/status"
    await api.node.patch(path, {"status": {"containerStatuses": [container_status(False)]}})
    panics = api.panics()
    with pytest.raises(ServerError) as caught:
        await api.node.patch(path, {"status": {"$setElementOrder/containerStatuses": [{"name": "c"}],
                                               "containerStatuses": [{"name": "c", "ready": True}]}})
    print(f"\n{api.kind}: $setElementOrder/containerStatuses -> {caught.value}")
    assert caught.value.status in (0, 500)
    assert api.kind == "real" or api.panics() == panics + 1
    stored = await api.admin.get(f"{PODS}/order")
    assert stored["status"]["containerStatuses"][0]["ready"] is False  # nothing was written


async def test_status_keeps_the_fields_of_its_release_and_drops_unknown_ones(api: ApiUnderTest) -> None:
    await api.admin.create(PODS, pod("unknown", api.node_name))
    patched = await api.node.patch(f"{PODS}/unknown/status", {"status": {
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "message": "", "notAStatusField": "x",
        "containerStatuses": [{**container_status(True), "user": {"linux": {"uid": 0, "gid": 0}},
                               "notAContainerStatusField": 1}]}})
    status = patched["status"]
    assert (status["hostIP"], status["hostIPs"]) == ("127.0.0.1", [{"ip": "127.0.0.1"}])
    assert "message" not in status and "notAStatusField" not in status
    (container,) = status["containerStatuses"]
    assert container["user"] == {"linux": {"uid": 0, "gid": 0}} and "notAContainerStatusField" not in container
    assert (await api.admin.get("/version"))["minor"] == "36"


async def test_401_refused_credentials_and_403_for_one_forbidden_mirror_pod(api: ApiUnderTest) -> None:
    with pytest.raises(Unauthorized):
        await api.stranger.list(PODS)
    node_uid = await register(api)
    mirror = pod("mirror", api.node_name, volumes=[{"name": "v", "configMap": {"name": "settings"}}])
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    mirror["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": api.node_name,
                                              "uid": node_uid, "controller": True}]
    with pytest.raises(Forbidden, match=f'node "{api.node_name}" can not create pods that reference configmaps'):
        await once_admission_knows_the_node(api, lambda: api.node.create(PODS, mirror))
    mirror["spec"].pop("volumes")
    stale_owner = {**mirror["metadata"]["ownerReferences"][0], "uid": "the-uid-of-a-deleted-node"}
    with pytest.raises(Forbidden, match="UID mismatch"):
        await api.node.create(PODS, {**mirror, "metadata": {**mirror["metadata"], "ownerReferences": [stale_owner]}})
    with pytest.raises(Forbidden, match="can only create mirror pods"):
        await api.node.create(PODS, pod("plain", api.node_name))
    created = await api.node.create(PODS, mirror)  # the same credentials go on working
    assert created["metadata"]["ownerReferences"][0]["uid"] == node_uid


async def test_a_node_lists_and_watches_only_its_own_pods(api: ApiUnderTest) -> None:
    await api.admin.create(PODS, pod("mine", api.node_name))
    await api.admin.create(PODS, pod("theirs", "another-node"))
    own = await api.node.list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={api.node_name}"})
    assert [p["metadata"]["name"] for p in own["items"]] == ["mine"]
    with pytest.raises(Forbidden, match="can only list/watch pods with spec.nodeName field selector"):
        await api.node.list(PODS)
    with pytest.raises(Forbidden, match='cannot list resource "pods" in API group "" at the cluster scope'):
        await api.node.list("/api/v1/pods", {"fieldSelector": "spec.nodeName=another-node"})
    with pytest.raises(Forbidden, match='cannot watch resource "pods"'):
        async for _ in api.node.watch("/api/v1/pods", {"timeoutSeconds": "1"}):
            pass


async def test_a_watch_from_before_a_restart_gets_410_too_old(api: ApiUnderTest) -> None:
    created = await api.admin.create(PODS, pod("old", api.node_name))
    await api.admin.create(PODS, pod("newer", api.node_name))
    await asyncio.to_thread(api.restart)

    async def watch_from(rv: str) -> None:
        async for _ in api.node.watch("/api/v1/pods", {"resourceVersion": rv, "timeoutSeconds": "1",
                                                       "fieldSelector": f"spec.nodeName={api.node_name}"}):
            pass

    async def answering() -> None:
        while True:
            try:
                await api.node.list(PODS, {"fieldSelector": f"spec.nodeName={api.node_name}"})
                return
            except ServerError:
                await asyncio.sleep(0.2)

    await asyncio.wait_for(answering(), 60)
    with pytest.raises(Gone, match="too old resource version"):
        await asyncio.wait_for(watch_from(created["metadata"]["resourceVersion"]), 10)


async def test_ephemeral_containers_subresource_takes_a_pod(api: ApiUnderTest) -> None:
    await api.admin.create(PODS, pod("debugged", api.node_name))
    path = f"{PODS}/debugged/ephemeralcontainers"
    current = await api.admin.get(path)
    assert (current["kind"], current["metadata"]["name"]) == ("Pod", "debugged")
    assert not current["spec"].get("ephemeralContainers")
    debugger = {"name": "debugger", "image": "busybox:1.36", "stdin": True, "targetContainerName": "c"}

    def with_debugger(pod: dict, containers: list) -> dict:
        return {**pod, "spec": {**pod["spec"], "ephemeralContainers": containers}}

    with pytest.raises(Forbidden):  # the node may not add them
        await api.node.replace(path, with_debugger(current, [debugger]))
    written = await api.admin.replace(path, with_debugger(current, [debugger]))
    assert written["kind"] == "Pod"
    (stored,) = written["spec"]["ephemeralContainers"]
    assert stored == {**debugger, "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
                      "terminationMessagePolicy": "File", "resources": {}}
    assert (await api.admin.get(f"{PODS}/debugged"))["spec"]["ephemeralContainers"] == [stored]
    with pytest.raises(Invalid, match='existing ephemeral containers "debugger" may not be removed'):
        await api.admin.replace(path, with_debugger(written, []))
    with pytest.raises(Invalid, match='existing ephemeral containers "debugger" may not be changed'):
        await api.admin.replace(path, with_debugger(written, [{**stored, "image": "busybox:2"}]))
