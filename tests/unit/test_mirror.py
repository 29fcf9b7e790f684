"""Mirror pods: what a mirror carries. The passes against an in-memory API, with the statuses they carry, are in
test_apisync.py."""

from __future__ import annotations

from typing import Any

from edgelet import podutil
from edgelet.status.mirror import mirror_pod, split_mirror_pods

NODE = "edge-1"
NODE_UID = "node-uid-1"



def static_pod(name: str = "web", config_hash: str = "hash-1", **spec_extra: Any) -> dict:
    return {
        "metadata": {
            "name": f"{name}-{NODE}", "namespace": "default", "uid": config_hash,
            "labels": {"app": name}, "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {podutil.CONFIG_SOURCE_ANNOTATION: "file", podutil.CONFIG_HASH_ANNOTATION: config_hash},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}], **spec_extra},
        "status": {"phase": "Running"},
    }


def test_mirror_pod_carries_the_hash_and_the_node_owner_and_nothing_the_server_assigns():
    mirror = mirror_pod(static_pod(), NODE, NODE_UID)
    meta = mirror["metadata"]
    assert meta["annotations"][podutil.CONFIG_MIRROR_ANNOTATION] == "hash-1"
    assert meta["annotations"][podutil.CONFIG_HASH_ANNOTATION] == "hash-1"
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID,
                                        "controller": True}]
    assert {"uid", "resourceVersion", "creationTimestamp"}.isdisjoint(meta)
    assert meta["labels"] == {"app": "web"} and meta["name"] == f"web-{NODE}"
    assert "status" not in mirror and mirror["spec"]["nodeName"] == NODE
    assert podutil.is_mirror(mirror)


def test_split_mirror_pods():
    regular = {"metadata": {"uid": "a"}}
    mirror = mirror_pod(static_pod(), NODE, NODE_UID)
    assert split_mirror_pods([regular, mirror]) == ([regular], [mirror])
