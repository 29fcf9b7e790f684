"""ApiClient against the API server double over real HTTP(S) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgelet.kubeapi import (
    AlreadyExists,
    ApiClient,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    ServerError,
    Unauthorized,
    WatchStreamError,
    load_kubeconfig,
)
from edgelet.util.errors import PermanentError, TemporaryError
from tests.kubeapi_double import ApiServerDouble

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, node: str = "edge-1", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec}}


@pytest.fixture
def api() -> Iterator[ApiServerDouble]:
    with ApiServerDouble(bookmark_interval=0.1) as double:
        yield double


@pytest.fixture
async def client(api: ApiServerDouble) -> AsyncIterator[ApiClient]:
    async with ApiClient(api.url, timeout=2.0) as c:
        yield c


async def collect(client: ApiClient, params: dict[str, str], *, until: int = 100,
                  path: str = "/api/v1/pods") -> list[tuple[str, dict]]:
    events: list[tuple[str, dict]] = []

    async def run() -> None:
        async with contextlib.aclosing(client.watch(path, params)) as stream:
            async for event in stream:
                events.append(event)
                if len(events) >= until:
                    return

    await asyncio.wait_for(run(), timeout=5)
    return events


async def test_create_get_list_with_field_selector(client: ApiClient) -> None:
    created = await client.create(PODS, pod("a"))
    await client.create(PODS, pod("b", node="edge-2"))
    assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"]
    got = await client.get(f"{PODS}/a")
    assert got["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    listed = await client.list("/api/v1/pods", {"fieldSelector": "spec.nodeName=edge-1"})
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]
    assert int(listed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    by_name = await client.list(PODS, {"fieldSelector": "metadata.name=b"})
    assert [p["spec"]["nodeName"] for p in by_name["items"]] == ["edge-2"]
    with pytest.raises(AlreadyExists):
        await client.create(PODS, pod("a"))
    with pytest.raises(NotFound):
        await client.get(f"{PODS}/missing")


async def test_label_selector(client: ApiClient) -> None:
    for name, labels in (("x", {"app": "web", "tier": "front"}), ("y", {"app": "db"}), ("z", {})):
        body = pod(name)
        body["metadata"]["labels"] = labels
        await client.create(PODS, body)

    async def names(selector: str) -> list[str]:
        return [p["metadata"]["name"] for p in (await client.list(PODS, {"labelSelector": selector}))["items"]]

    assert await names("app=web") == ["x"]
    assert await names("app!=web") == ["y", "z"]
    assert await names("app in (web,db),!tier") == ["y"]
    assert await names("tier") == ["x"]


async def test_put_with_a_stale_resource_version_conflicts(client: ApiClient) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    lease = await client.create(path, {"metadata": {"name": "edge-1"}, "spec": {"holderIdentity": "edge-1"}})
    lease["spec"]["leaseDurationSeconds"] = 40
    updated = await client.replace(f"{path}/edge-1", lease)
    assert int(updated["metadata"]["resourceVersion"]) > int(lease["metadata"]["resourceVersion"])
    with pytest.raises(Conflict) as caught:
        await client.replace(f"{path}/edge-1", lease)  # still carries the old resourceVersion
    assert caught.value.status == 409 and not isinstance(caught.value, TemporaryError)


NULL_TIMES = {"lastProbeTime": None, "lastTransitionTime": None}


async def test_status_patch_merges_conditions_by_type_and_replaces_container_statuses(client: ApiClient,
                                                                                      api: ApiServerDouble) -> None:
    created = await client.create(PODS, pod("a"))
    await client.patch(f"{PODS}/a/status", {"status": {
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "c", "ready": False, "restartCount": 0},
                              {"name": "d", "ready": False, "restartCount": 0}],
    }})
    patched = await client.patch(f"{PODS}/a/status", {
        "metadata": {"uid": created["metadata"]["uid"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "c", "ready": True}]},
    })
    # Conditions merge by type and come back with null times; container statuses have no merge key.
    assert patched["status"]["conditions"] == [{"type": "Ready", "status": "True", **NULL_TIMES},
                                               {"type": "PodScheduled", "status": "True", **NULL_TIMES}]
    assert patched["status"]["containerStatuses"] == [{"name": "c", "ready": True}]
    with pytest.raises(Conflict, match="UID in precondition"):
        await client.patch(f"{PODS}/a/status", {"metadata": {"uid": "another-uid"}, "status": {"phase": "Running"}})
    # A status patch leaves the spec alone; a merge patch replaces lists whole.
    merged = await client.patch(f"{PODS}/a/status",
                                {"spec": {"nodeName": "x"},
                                 "status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "merge")
    assert merged["spec"]["nodeName"] == "edge-1"
    assert merged["status"]["conditions"] == [{"type": "Ready", "status": "False", **NULL_TIMES}]
    labelled = await client.patch(f"{PODS}/a", [{"op": "add", "path": "/metadata/labels", "value": {"k": "v"}}], "json")
    assert labelled["metadata"]["labels"] == {"k": "v"}


async def test_an_element_order_for_container_statuses_drops_the_connection(client: ApiClient,
                                                                            api: ApiServerDouble) -> None:
    # kube-apiserver panics in strategicpatch on these lists, which have no merge key.
    await client.create(PODS, pod("a"))
    await client.patch(f"{PODS}/a/status",
                       {"status": {"containerStatuses": [{"name": "c", "ready": False, "restartCount": 0}]}})
    with pytest.raises(ServerError) as caught:
        await client.patch(f"{PODS}/a/status", {"status": {
            "containerStatuses": [{"name": "c", "ready": True}],
            "$setElementOrder/containerStatuses": [{"name": "c"}]}})
    assert caught.value.status == 0 and len(api.panics) == 1
    assert (await client.get(f"{PODS}/a"))["status"]["containerStatuses"][0]["ready"] is False


async def test_status_fields_unknown_to_the_server_version_are_dropped(client: ApiClient) -> None:
    await client.create(PODS, pod("a"))
    patched = await client.patch(f"{PODS}/a/status", {"status": {
        "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}], "message": "", "notAStatusField": "x",
        "containerStatuses": [{"name": "c", "ready": True, "restartCount": 0, "user": {"linux": {"uid": 0}},
                               "notAContainerStatusField": 1}]}})
    assert (patched["status"]["hostIP"], patched["status"]["hostIPs"]) == ("10.0.0.1", [{"ip": "10.0.0.1"}])
    assert "message" not in patched["status"] and "notAStatusField" not in patched["status"]
    assert patched["status"]["containerStatuses"] == [{"name": "c", "ready": True, "restartCount": 0,
                                                       "user": {"linux": {"uid": 0}}}]
    assert (await client.get("/version"))["minor"] == "36"


async def test_a_watch_from_before_a_restart_gets_410(client: ApiClient, api: ApiServerDouble) -> None:
    created = await client.create(PODS, pod("a"))
    await client.create(PODS, pod("b"))
    api.restart()  # the new watch cache starts at the current resourceVersion

    async def watch_from(rv: str) -> None:
        async for _ in client.watch(PODS, {"resourceVersion": rv, "timeoutSeconds": "1"}):
            pass

    with pytest.raises(Gone, match="too old resource version"):
        await asyncio.wait_for(watch_from(created["metadata"]["resourceVersion"]), 5)
    listed = await client.list(PODS)
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a", "b"]
    await asyncio.wait_for(watch_from(listed["metadata"]["resourceVersion"]), 5)  # from the relist: fine


# -- NodeRestriction and the Node authorizer: 403 for one request, not refused credentials -------------


@pytest.fixture
def node_api() -> Iterator[ApiServerDouble]:
    with ApiServerDouble(node_name="edge-1") as double:
        double.create("nodes", {"metadata": {"name": "edge-1"}})
        double.create("nodes", {"metadata": {"name": "edge-2"}})
        yield double


def mirror(name: str, node_uid: str, **spec: object) -> dict:
    manifest = pod(name)
    manifest["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    manifest["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "edge-1", "uid": node_uid}]
    manifest["spec"].update(spec)
    return manifest


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"volumes": [{"name": "v", "configMap": {"name": "c"}}]},
         'node "edge-1" can not create pods that reference configmaps'),
        ({"volumes": [{"name": "v", "configMap": {"name": "c"}}, {"name": "s", "secret": {"secretName": "s"}}]},
         'node "edge-1" can not create pods that reference secrets'),
        ({"serviceAccountName": "default"}, 'node "edge-1" can not create pods that reference a service account'),
        ({"nodeName": "edge-2"}, 'node "edge-1" can only create pods with spec.nodeName set to itself'),
    ],
)
async def test_node_restriction_forbids_mirror_pods_referencing_other_objects(node_api: ApiServerDouble, spec: dict,
                                                                              message: str) -> None:
    node_uid = node_api.get("nodes", "edge-1")["metadata"]["uid"]
    async with ApiClient(node_api.url) as client:
        with pytest.raises(Forbidden, match=message):
            await client.create(PODS, mirror("m", node_uid, **spec))
        assert (await client.create(PODS, mirror("ok", node_uid)))["metadata"]["name"] == "ok"


async def test_node_restriction_forbids_what_is_not_the_nodes_own(node_api: ApiServerDouble) -> None:
    node_api.create("pods", {**pod("elsewhere"), "spec": {**pod("x")["spec"], "nodeName": "edge-2"}})
    async with ApiClient(node_api.url) as client:
        with pytest.raises(Forbidden, match="UID mismatch"):
            await client.create(PODS, mirror("m", "an-old-node-uid"))
        with pytest.raises(Forbidden, match="can only create mirror pods"):
            await client.create(PODS, pod("plain"))
        with pytest.raises(Forbidden):
            await client.patch(f"{PODS}/elsewhere/status", {"status": {"phase": "Running"}})
        with pytest.raises(Forbidden):
            await client.patch("/api/v1/nodes/edge-2/status", {"status": {"phase": "Running"}})
        with pytest.raises(Forbidden):
            await client.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                                {"metadata": {"name": "edge-2"}})
        await client.patch("/api/v1/nodes/edge-1/status", {"status": {"phase": "Running"}})  # its own: fine


async def test_delete_with_preconditions_and_grace(client: ApiClient, api: ApiServerDouble) -> None:
    created = await client.create(PODS, pod("a"))
    with pytest.raises(Conflict, match="Precondition failed"):
        await client.delete(f"{PODS}/a", preconditions_uid="not-the-uid")
    deleting = await client.delete(f"{PODS}/a", grace_period=30)
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 30 and deleting["metadata"]["deletionTimestamp"]
    assert (await client.get(f"{PODS}/a"))["metadata"]["deletionTimestamp"]
    await client.delete(f"{PODS}/a", preconditions_uid=created["metadata"]["uid"], grace_period=0)
    with pytest.raises(NotFound):
        await client.get(f"{PODS}/a")
    await client.create(PODS, pod("unbound", node=""))
    await client.delete(f"{PODS}/unbound")  # never scheduled: goes at once
    assert api.list("pods") == []


async def test_watch_from_a_resource_version_then_bookmarks_then_timeout(client: ApiClient,
                                                                         api: ApiServerDouble) -> None:
    await client.create(PODS, pod("before"))
    listed = await client.list("/api/v1/pods", {"fieldSelector": "spec.nodeName=edge-1"})
    await client.create(PODS, pod("mine"))
    await client.create(PODS, pod("other", node="edge-2"))
    await client.delete(f"{PODS}/mine", grace_period=0)
    params = {"fieldSelector": "spec.nodeName=edge-1", "resourceVersion": listed["metadata"]["resourceVersion"],
              "allowWatchBookmarks": "true", "timeoutSeconds": "1"}
    events = await collect(client, params)  # ends by itself after the server timeout
    kinds = [(t, o["metadata"].get("name")) for t, o in events]
    assert kinds[:2] == [("ADDED", "mine"), ("DELETED", "mine")]
    bookmarks = [o for t, o in events if t == "BOOKMARK"]
    assert bookmarks and bookmarks[-1]["metadata"]["resourceVersion"] == str(api.resource_version)


async def test_binding_a_pod_to_the_node_shows_as_added(client: ApiClient, api: ApiServerDouble) -> None:
    await client.create(PODS, pod("pending", node=""))
    rv = (await client.list("/api/v1/pods"))["metadata"]["resourceVersion"]
    api.patch("pods", "pending", {"spec": {"nodeName": "edge-1"}})
    events = await collect(client, {"fieldSelector": "spec.nodeName=edge-1", "resourceVersion": rv}, until=1)
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("ADDED", "pending")]


@pytest.mark.parametrize("gone_as_http", [False, True])
async def test_watch_from_a_compacted_resource_version_is_gone(gone_as_http: bool) -> None:
    with ApiServerDouble(gone_as_http=gone_as_http) as api:
        async with ApiClient(api.url) as client:
            await client.create(PODS, pod("a"))
            api.compact()
            with pytest.raises(Gone) as caught:
                await collect(client, {"resourceVersion": "1"})
            assert caught.value.status == 410


async def test_a_short_history_window_expires_old_resource_versions() -> None:
    with ApiServerDouble(history_size=2) as api:
        async with ApiClient(api.url) as client:
            for name in "abc":
                await client.create(PODS, pod(name))
            with pytest.raises(Gone):
                await collect(client, {"resourceVersion": "1"})
            assert len(await collect(client, {"resourceVersion": "2"}, until=2)) == 2


@pytest.mark.parametrize("control", ["inject_watch_garbage", "truncate_watches"])
async def test_garbage_or_truncated_stream_is_a_temporary_error(client: ApiClient, api: ApiServerDouble,
                                                                control: str) -> None:
    async def break_stream() -> None:
        while api.active_watches == 0:
            await asyncio.sleep(0.01)
        getattr(api, control)()

    breaker = asyncio.create_task(break_stream())
    with pytest.raises(WatchStreamError) as caught:
        await collect(client, {"resourceVersion": "1"})
    await breaker
    assert isinstance(caught.value, TemporaryError)


async def test_failures_map_to_error_types(client: ApiClient, api: ApiServerDouble) -> None:
    api.fail_next(1, 500)
    with pytest.raises(ServerError) as caught:
        await client.list(PODS)
    assert isinstance(caught.value, TemporaryError) and caught.value.status == 500
    api.fail_next(1, 401)
    with pytest.raises(Unauthorized) as refused:
        await client.list(PODS)
    assert isinstance(refused.value, PermanentError)
    api.fail_next(1, 403)  # this request is forbidden, the credentials are fine: not an Unauthorized
    with pytest.raises(Forbidden) as forbidden:
        await client.list(PODS)
    assert isinstance(forbidden.value, PermanentError) and not isinstance(forbidden.value, Unauthorized)
    api.fail_next(1, 0)  # connection closed without an answer
    with pytest.raises(ServerError):
        await client.list(PODS)
    api.go_down()
    with pytest.raises(ServerError, match="ConnectionError"):
        await client.list(PODS)
    api.come_up()
    assert (await client.list(PODS))["items"] == []


async def test_bearer_token_is_sent_and_checked() -> None:
    with ApiServerDouble(token="good-token") as api:
        async with ApiClient(api.url, token="bad-token") as wrong:
            with pytest.raises(Unauthorized) as caught:
                await wrong.list(PODS)
            assert "bad-token" not in str(caught.value)
        async with ApiClient(api.url, token="good-token") as right:
            assert (await right.list(PODS))["items"] == []


# -- TLS: the kubeconfig's CA verifies the server, the client certificate authenticates us -----------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=test-ca", "-days", "1",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=system:node:{name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=d)
    return d


@pytest.fixture
def tls_api(pki: Path) -> Iterator[ApiServerDouble]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    with ApiServerDouble(ssl_context=ctx) as double:
        yield double


async def test_tls_with_inline_ca_and_client_certificate(tls_api: ApiServerDouble, pki: Path, tmp_path: Path) -> None:
    path = tls_api.write_kubeconfig(str(tmp_path / "kubeconfig"), ca_pem=(pki / "ca.crt").read_bytes(),
                                    client_cert_pem=(pki / "client.crt").read_bytes(),
                                    client_key_pem=(pki / "client.key").read_bytes())
    async with ApiClient.from_kubeconfig(path) as client:
        assert client.server.startswith("https://127.0.0.1:")
        assert (await client.create(PODS, pod("tls")))["metadata"]["name"] == "tls"


async def test_tls_refuses_a_server_the_ca_does_not_vouch_for(tls_api: ApiServerDouble, pki: Path,
                                                              tmp_path: Path) -> None:
    from tests.kubeapi_double.testcerts import TEST_CERT

    path = tls_api.write_kubeconfig(str(tmp_path / "kubeconfig"), ca_pem=TEST_CERT.encode(),
                                    client_cert_pem=(pki / "client.crt").read_bytes(),
                                    client_key_pem=(pki / "client.key").read_bytes())
    async with ApiClient.from_kubeconfig(load_kubeconfig(path)) as client:
        with pytest.raises(ServerError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.list(PODS)


async def test_new_credentials_leave_a_running_watch_alone(api: ApiServerDouble, client: ApiClient) -> None:
    """A certificate rotation (`use_tls`) must not drop the pod watch: it ends on the old connection,
    new requests go through the new pool, and the old pool is closed once the watch is done."""
    events: list[tuple[str, dict]] = []
    got_first = asyncio.Event()

    async def watch() -> None:
        async with contextlib.aclosing(client.watch(PODS, {"timeoutSeconds": "30"})) as stream:
            async for event in stream:
                events.append(event)
                got_first.set()
                if len(events) == 2:
                    return

    watching = asyncio.create_task(watch())
    for _ in range(200):
        if api.active_watches == 1:
            break
        await asyncio.sleep(0.01)
    old_pool = client._http
    await client.create(PODS, pod("before"))
    await asyncio.wait_for(got_first.wait(), 5)

    client.use_tls(ssl.create_default_context())
    await client.create(PODS, pod("after"))  # through the new pool, delivered on the old watch
    await asyncio.wait_for(watching, 5)
    assert [obj["metadata"]["name"] for _, obj in events] == ["before", "after"]
    assert client._http is not old_pool
    for _ in range(50):
        if old_pool.is_closed:
            break
        await asyncio.sleep(0.01)
    assert old_pool.is_closed and not client._http.is_closed
    assert (await client.get(f"{PODS}/after"))["metadata"]["name"] == "after"
