"""The kubelet API's pod lookup: which desired pod a path names, by name, by its own uid, or by the uid of the
mirror pod that stands for it in the API."""

from __future__ import annotations

import pytest

from edgelet.container.runtime import PodRuntimeStatus
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
    return PodLookup(NODE, pods.pods, PodRuntimeStatus, pods.translate_pod_uid)


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
