"""The kubelet API's pod lookup: which desired pod a path names, by name, by its own uid, or by the uid of the
mirror pod that stands for it in the API."""

from __future__ import annotations

import pytest

from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus
from edgelet.kubeletapi import PodLookup
from edgelet.kubeletapi.paths import parse_route
from edgelet.kubeletapi.server import NotFoundError
from edgelet.pod.manager import PodManager

NODE = "edge-1"


def pod(uid: str, name: str, namespace: str = "default", *annotations: tuple[str, str]) -> dict:
    return {"metadata": {"uid": uid, "name": name, "namespace": namespace, "annotations": dict(annotations)}}


def lookup() -> PodLookup:
    pods = PodManager()
    pods.set(pod("static-uid", f"web-{NODE}", "default", ("kubernetes.io/config.source", "file")))
    pods.set(pod("api-uid", "api-pod"))
    pods.set_mirror_pods([pod("mirror-uid", f"web-{NODE}", "default", ("kubernetes.io/config.mirror", "hash")),
                          pod("orphan-mirror-uid", f"gone-{NODE}", "default", ("kubernetes.io/config.mirror", "x"))])
    return PodLookup(NODE, pods, PodRuntimeStatus)


@pytest.mark.parametrize("path, found", [
    (f"/exec/default/web-{NODE}/main", "static-uid"),
    ("/exec/default/web/main", "static-uid"),  # a static pod also answers to its manifest name
    (f"/exec/default/web-{NODE}/static-uid/main", "static-uid"),
    (f"/exec/default/web-{NODE}/mirror-uid/main", "static-uid"),  # what a client knows from the API
    (f"/portForward/default/web-{NODE}/mirror-uid", "static-uid"),
    ("/run/default/api-pod/api-uid/main", "api-uid"),
    (f"/exec/default/web-{NODE}/api-uid/main", None),  # another pod's uid
    (f"/exec/default/web-{NODE}/unknown/main", None),
    (f"/exec/default/gone-{NODE}/orphan-mirror-uid/main", None),  # a mirror whose static pod is gone
    (f"/exec/kube-system/web-{NODE}/mirror-uid/main", None),
])
def test_pod_uid_translates_a_mirror_pods_uid(path, found):
    route = parse_route(path)
    if found is None:
        with pytest.raises(NotFoundError):
            lookup().pod_uid(route)
    else:
        assert lookup().pod_uid(route) == found


def test_container_facts_and_start_times_cover_every_desired_pod():
    pods = PodManager()
    pods.set(pod("a", "web"))
    pods.set(pod("b", "db"))

    def runtime_status(uid: str) -> PodRuntimeStatus:
        container = ContainerStatus(id=f"c-{uid}", name="main", sandbox_id="s", state=ContainerState.RUNNING,
                                    created_at=1, started_at=7, image=f"img-{uid}")
        return PodRuntimeStatus(uid=uid, containers=[container])

    found = PodLookup(NODE, pods, runtime_status)
    assert {cid: (facts.image, facts.started_ns) for cid, facts in found.container_facts().items()} == {
        "c-a": ("img-a", 7), "c-b": ("img-b", 7)}
    assert found.container_start("c-b") == 7 and found.container_start("gone") == 0
