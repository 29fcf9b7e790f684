"""Mirror pods: what a mirror carries, and which mirrors one pass creates, replaces and deletes (a pure decision,
table-tested). The passes against an in-memory API, with the statuses they carry, are in test_apisync.py."""

from __future__ import annotations

import pytest

from edgelet.api import podutil
from edgelet.status.mirror import mirror_pod, plan_mirrors, pod_key, split_mirror_pods
from tests.helpers import static_pod

NODE = "edge-1"
NODE_UID = "node-uid-1"


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


# -- which mirrors one pass creates and deletes ------------------------------------------------------------


def mirror_of_hash(name: str, config_hash: str, *, deleting: bool = False) -> dict:
    mirror = mirror_pod(static_pod(name, config_hash), NODE, NODE_UID)
    mirror["metadata"]["uid"] = f"mirror-{name}-{config_hash}"
    if deleting:
        mirror["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    return mirror


@pytest.mark.parametrize(
    ("static", "mirrors", "backoff", "ready", "create", "orphans"),
    [
        pytest.param([], [], set(), True, [], [], id="nothing"),
        pytest.param([("web", "h1")], [], set(), True, [("web", None)], [], id="missing-mirror-created"),
        pytest.param([("web", "h1")], [("web", "h1")], set(), True, [], [], id="current-mirror-kept"),
        pytest.param([("web", "h2")], [("web", "h1")], set(), True, [("web", "h1")], [],
                     id="stale-hash-replaced"),
        pytest.param([("web", "h1")], [("web", "h1", "deleting")], set(), True, [("web", "h1")], [],
                     id="mirror-being-deleted-replaced"),
        pytest.param([("web", "h1")], [], {("web", "h1")}, True, [], [], id="refused-in-backoff-waits"),
        pytest.param([("web", "h2")], [], {("web", "h1")}, True, [("web", None)], [],
                     id="backoff-of-another-hash-does-not-hold-an-edit"),
        pytest.param([], [("old", "h1")], set(), True, [], ["old"], id="orphan-deleted"),
        pytest.param([], [("old", "h1")], set(), False, [], [], id="orphan-kept-until-static-sources-listed"),
        pytest.param([("web", "h1"), ("db", "h1")], [("web", "h1"), ("old", "h1")], set(), True,
                     [("db", None)], ["old"], id="mixed"),
    ],
)
def test_plan_mirrors(static, mirrors, backoff, ready, create, orphans):
    static_pods = {pod_key(pod): pod for pod in (static_pod(name, config_hash) for name, config_hash in static)}
    api_mirrors = [mirror_of_hash(name, config_hash, deleting=bool(rest)) for name, config_hash, *rest in mirrors]
    by_full_name = {podutil.full_name(mirror): mirror for mirror in api_mirrors}
    plan = plan_mirrors(static_pods, api_mirrors, lambda pod: by_full_name.get(podutil.full_name(pod)),
                        lambda key, config_hash: (key[1].removesuffix(f"-{NODE}"), config_hash) in backoff, ready)
    assert [(key, pod) for key, pod, _ in plan.create] == \
        [(("default", f"{name}-{NODE}"), static_pods[("default", f"{name}-{NODE}")]) for name, _ in create]
    assert [podutil.uid(stale) if stale is not None else None for _, _, stale in plan.create] == \
        [f"mirror-{name}-{stale}" if stale else None for name, stale in create]
    assert [key for key, _ in plan.orphans] == [("default", f"{name}-{NODE}") for name in orphans]
