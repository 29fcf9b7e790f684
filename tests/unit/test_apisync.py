"""The API half of the status manager: status patches, dirty handling, uid preconditions, mirror pods, final deletes,
and what the real API server does to them (nulls, dropped fields, 403 for one object)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
import uuid
from typing import Any

import pytest

from edgelet import core
from edgelet.api import podutil
from edgelet.kubeapi.errors import AlreadyExists, Conflict, Forbidden, NotFound, ServerError
from edgelet.pod.manager import PodManager
from edgelet.status.apidiff import api_view, dropped_fields, normal_form, status_differs, status_patch
from edgelet.status.apisync import StatusSyncer
from edgelet.status.manager import PodStatusEntry
from edgelet.status.mirror import MirrorPods
from tests.helpers import static_pod
from tests.kubeapi_double.patch import StrategicMergePanic, strategic_merge
from tests.kubeapi_double.schema import stored_pod_status

NODE = "edge-1"
NODE_UID = "node-uid-1"


# -- status_patch ---------------------------------------------------------------------------------------

RUNNING = {"running": {"startedAt": "2026-01-01T00:00:01Z"}}
WAITING = {"waiting": {"reason": "ContainerCreating"}}


def cstatus(name: str, state: dict, ready: bool = False) -> dict:
    return {"name": name, "state": state, "ready": ready, "restartCount": 0}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({"phase": "Running"}, {"phase": "Running"}, {}, id="equal"),
        pytest.param({"phase": "Pending"}, {"phase": "Running"}, {"phase": "Running"}, id="scalar"),
        pytest.param({"phase": "Failed", "reason": "Evicted"}, {"phase": "Failed"}, {"reason": None},
                     id="owned-field-removed"),
        pytest.param({"phase": "Running", "nominatedNodeName": "n"}, {"phase": "Running"}, {},
                     id="foreign-field-kept"),
        pytest.param(
            {"conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]},
            {"conditions": [{"type": "Ready", "status": "True"}]},
            {"conditions": [{"type": "Ready", "status": "True", "reason": None}],
             "$setElementOrder/conditions": [{"type": "Ready"}]},
            id="condition-item-diff"),
        pytest.param(
            {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]},
            {"conditions": [{"type": "B", "status": "True"}, {"type": "A", "status": "True"}]},
            {}, id="order-only-is-no-change"),
        pytest.param(
            {"conditions": [{"type": "A", "status": "True"}, {"type": "Mine", "status": "True"}]},
            {"conditions": [{"type": "Mine", "status": "True"}]},
            {}, id="conditions-of-others-never-deleted"),
        # Container status lists have no merge key in the API: replaced whole, never item by item.
        pytest.param(
            {"containerStatuses": [cstatus("a", WAITING)]},
            {"containerStatuses": [cstatus("a", RUNNING, True)]},
            {"containerStatuses": [cstatus("a", RUNNING, True)]},
            id="container-state-transition"),
        pytest.param(
            {"containerStatuses": [cstatus("a", RUNNING), cstatus("b", RUNNING)]},
            {"containerStatuses": [cstatus("a", RUNNING)]},
            {"containerStatuses": [cstatus("a", RUNNING)]},
            id="container-removed"),
        pytest.param(
            {"initContainerStatuses": [cstatus("i", WAITING)], "ephemeralContainerStatuses": [cstatus("e", WAITING)]},
            {"initContainerStatuses": [cstatus("i", RUNNING)], "ephemeralContainerStatuses": [cstatus("e", RUNNING)]},
            {"initContainerStatuses": [cstatus("i", RUNNING)], "ephemeralContainerStatuses": [cstatus("e", RUNNING)]},
            id="init-and-ephemeral-replaced"),
        pytest.param(
            {"containerStatuses": [cstatus("a", RUNNING), cstatus("b", RUNNING)]},
            {"containerStatuses": [cstatus("a", RUNNING), cstatus("b", RUNNING)]},
            {}, id="container-statuses-equal"),
        pytest.param(
            {"hostIPs": [{"ip": "a"}, {"ip": "b"}]}, {"hostIPs": [{"ip": "b"}]},
            {"hostIPs": [{"$patch": "delete", "ip": "a"}], "$setElementOrder/hostIPs": [{"ip": "b"}]},
            id="keyed-ip-list-removal"),
        pytest.param({}, {"podIPs": [{"ip": "10.0.0.2"}]}, {"podIPs": [{"ip": "10.0.0.2"}]}, id="new-list"),
        pytest.param({"weird": [1, 2]}, {"weird": [2]}, {"weird": [2]}, id="plain-list-replaced"),
    ],
)
def test_status_patch(old, new, expected):
    assert status_patch(old, new) == expected


def test_status_patch_never_merges_container_status_lists_by_key():
    # What made kube-apiserver panic: a $setElementOrder directive or a partial item for these lists.
    old = {"containerStatuses": [cstatus("a", WAITING), cstatus("b", RUNNING)],
           "initContainerStatuses": [cstatus("i", RUNNING)]}
    new = {"containerStatuses": [cstatus("b", RUNNING, True), cstatus("a", RUNNING)],
           "initContainerStatuses": [cstatus("i", {"terminated": {"exitCode": 0}})]}
    patch = status_patch(old, new)
    assert not [key for key in patch if key.startswith("$")]
    assert patch["containerStatuses"] == new["containerStatuses"]
    assert patch["initContainerStatuses"] == new["initContainerStatuses"]
    strategic_merge({"status": old}, {"status": patch})  # the double panics as the real server does


@pytest.mark.parametrize(
    "patch",
    [
        {"containerStatuses": [{"name": "a", "ready": True}], "$setElementOrder/containerStatuses": [{"name": "a"}]},
        {"containerStatuses": [{"name": "a", "state": {"running": {}, "waiting": None}, "ready": True}],
         "$setElementOrder/containerStatuses": [{"name": "a"}]},
        {"initContainerStatuses": [{"$patch": "delete", "name": "a"}]},
    ],
    ids=["set-element-order", "partial-item-and-order", "delete-directive"],
)
def test_the_double_panics_on_keyed_patches_of_container_status_lists(patch):
    with pytest.raises(StrategicMergePanic):
        strategic_merge({"status": {"containerStatuses": [cstatus("a", WAITING)]}}, {"status": patch})


SERVED_CONDITION = {"type": "Ready", "status": "True", "lastProbeTime": None,
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize(
    ("api_status", "status", "differs"),
    [
        pytest.param({"conditions": [SERVED_CONDITION]},
                     {"conditions": [{"type": "Ready", "status": "True",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                     False, id="null-lastProbeTime"),
        pytest.param({"phase": "Running", "conditions": [{"type": "example.com/gate", "status": "True"}]},
                     {"phase": "Running", "conditions": [{"type": "example.com/gate", "status": "False"}]},
                     False, id="foreign-condition-not-ours-to-write"),
        pytest.param({"phase": "Running", "message": ""}, {"phase": "Running"}, False, id="empty-string"),
        pytest.param({"phase": "Running"}, {"phase": "Running", "podIPs": []}, False, id="empty-list"),
        pytest.param({"containerStatuses": [cstatus("a", RUNNING)]},
                     {"containerStatuses": [cstatus("a", RUNNING, True)]}, True, id="readiness"),
        pytest.param({"containerStatuses": [cstatus("a", WAITING)]},
                     {"containerStatuses": [{**cstatus("a", WAITING), "restartCount": 1}]}, True, id="restart-count"),
        pytest.param({"phase": "Running"}, {"phase": "Running", "hostIPs": [{"ip": "10.0.0.1"}]}, True,
                     id="unknown-field-not-learnt-yet"),
    ],
)
def test_status_differs_compares_normal_forms(api_status, status, differs):
    assert status_differs(api_status, status) is differs


def test_normal_form_leaves_out_unknown_fields_at_any_depth():
    status = {"hostIPs": [{"ip": "a"}], "containerStatuses": [{**cstatus("a", RUNNING), "resources": {"x": 1}}]}
    assert normal_form(status, [("hostIPs",), ("containerStatuses", "resources")]) == {
        "containerStatuses": [cstatus("a", RUNNING)]}
    assert status_differs({}, {"hostIPs": [{"ip": "a"}]}, [("hostIPs",)]) is False


def test_dropped_fields_are_those_sent_with_a_value_and_not_returned():
    sent = {"phase": "Running", "hostIPs": [{"ip": "a"}], "message": None,
            "$setElementOrder/conditions": [{"type": "Ready"}],
            "conditions": [{"type": "Ready", "status": "True", "reason": None}],
            "containerStatuses": [{**cstatus("a", RUNNING), "volumeMounts": [{"name": "v"}]}]}
    returned = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}],
                "containerStatuses": [cstatus("a", RUNNING)]}
    assert dropped_fields(sent, returned) == {("hostIPs",), ("containerStatuses", "volumeMounts")}
    assert dropped_fields({"phase": "Running", "message": ""}, {"phase": "Running"}) == set()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False", "reason": "X", "message": "m"}],
          "containerStatuses": [cstatus("a", WAITING), cstatus("gone", RUNNING)], "message": "hello"},
         {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
          "containerStatuses": [cstatus("a", RUNNING, True), cstatus("b", WAITING)], "podIP": "10.0.0.9",
          "podIPs": [{"ip": "10.0.0.9"}]}),
        ({}, {"phase": "Pending", "qosClass": "BestEffort"}),
        ({"phase": "Running", "hostIPs": [{"ip": "a"}, {"ip": "b"}]}, {"phase": "Running", "hostIPs": [{"ip": "b"}]}),
    ],
)
def test_status_patch_applied_by_a_strategic_merge_gives_the_new_status(old, new):
    # The API server's strategic merge of our patch must reproduce our status exactly (list order aside).
    merged = strategic_merge({"status": old}, {"status": status_patch(old, new)})["status"]
    assert _canonical(merged) == _canonical(new)


def _canonical(status: dict) -> dict:
    result = copy.deepcopy(status)
    for key in ("conditions", "containerStatuses", "hostIPs"):
        if key in result:
            result[key] = sorted(result[key], key=lambda item: str(sorted(item.items())))
    return result


# -- the syncer against an in-memory API ----------------------------------------------------------------


# The FakeApi stores statuses as a server older than the agent does (1.20 drops hostIPs): the syncer must cope
# with a server that drops what it writes.
OLD_SERVER_MINOR = 20


class FakeApi:
    """Pods by (namespace, name) with the rules the syncer relies on: uid preconditions, strategic merge
    on /status (stored as a v1.20 server stores it: hostIPs dropped, null lastProbeTime), graceful vs
    grace-0 deletes. `down` makes every call a ServerError (an outage); names in `forbidden` get a 403."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.down = False
        self.forbidden: dict[str, str] = {}
        self.patches: list[dict] = []
        self._rv = 100

    def add(self, name: str, *, uid: str | None = None, status: dict | None = None, **meta: Any) -> dict:
        self._rv += 1
        pod = {"metadata": {"name": name, "namespace": "default", "uid": uid or str(uuid.uuid4()),
                            "resourceVersion": str(self._rv), **meta},
               "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]},
               "status": status or {"phase": "Pending"}}
        self.pods[("default", name)] = pod
        return copy.deepcopy(pod)

    def writes(self, method: str | None = None) -> int:
        return sum(1 for m, _ in self.calls if m != "GET" and (method is None or m == method))

    def _enter(self, method: str, path: str, name: str = "") -> tuple[tuple[str, str], bool]:
        self.calls.append((method, path))
        if self.down:
            raise ServerError(0, "ConnectionError", "connection refused", method=method, path=path)
        parts = path.strip("/").split("/")  # api v1 namespaces NS pods [NAME [status]]
        key = (parts[3], parts[5] if len(parts) > 5 else name)
        if key[1] in self.forbidden and method != "GET":
            raise Forbidden(403, "Forbidden", f'pods "{key[1]}" is forbidden: {self.forbidden[key[1]]}', method=method,
                            path=path)
        return key, path.endswith("/status")

    def _existing(self, key: tuple[str, str], method: str, path: str) -> dict:
        if key not in self.pods:
            raise NotFound(404, "NotFound", "pod not found", method=method, path=path)
        return self.pods[key]

    async def get(self, path: str) -> dict:
        key, _ = self._enter("GET", path)
        return copy.deepcopy(self._existing(key, "GET", path))

    async def patch(self, path: str, body: dict, patch_type: str = "strategic") -> dict:
        key, _ = self._enter("PATCH", path)
        pod = self._existing(key, "PATCH", path)
        if body["metadata"]["uid"] != pod["metadata"]["uid"]:
            raise Conflict(409, "Conflict", "Precondition failed: UID in precondition", method="PATCH", path=path)
        self.patches.append(copy.deepcopy(body["status"]))
        pod["status"] = stored_pod_status(strategic_merge({"status": pod["status"]},
                                                          {"status": body["status"]})["status"],
                                          OLD_SERVER_MINOR)
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        return copy.deepcopy(pod)

    async def create(self, path: str, obj: dict) -> dict:
        name = obj["metadata"]["name"]
        self._enter("POST", path, name)
        if ("default", name) in self.pods:
            raise AlreadyExists(409, "AlreadyExists", "exists", method="POST", path=path)
        created = copy.deepcopy(obj)
        created["metadata"].update(namespace="default", uid=str(uuid.uuid4()), resourceVersion="1")
        created["status"] = {"phase": "Pending"}
        self.pods[("default", name)] = created
        return copy.deepcopy(created)

    async def delete(self, path: str, preconditions_uid: str | None = None, grace_period: int | None = None) -> dict:
        key, _ = self._enter("DELETE", path)
        pod = self._existing(key, "DELETE", path)
        if preconditions_uid and preconditions_uid != pod["metadata"]["uid"]:
            raise Conflict(409, "Conflict", "Precondition failed: UID in precondition", method="DELETE", path=path)
        self.deletes.append((path, preconditions_uid, grace_period))
        del self.pods[key]
        return pod

    deletes: list[tuple[str, str | None, int | None]]


class FakeStatuses:
    """The StatusManager's interface the syncer uses: listeners, entries, known uids."""

    def __init__(self) -> None:
        self.entries: dict[str, PodStatusEntry] = {}
        self.listeners: list = []

    def add_listener(self, listener) -> None:
        self.listeners.append(listener)

    def known_uids(self) -> set[str]:
        return set(self.entries)

    def get_entry(self, uid: str) -> PodStatusEntry | None:
        return self.entries.get(uid)

    def set(self, pod: dict, status: dict) -> None:
        uid = podutil.uid(pod)
        stored = {"metadata": pod["metadata"], "spec": pod["spec"], "status": status}
        entry = self.entries.get(uid)
        if entry is not None and entry.status_hash == core.status_hash(status):
            return
        version = entry.version + 1 if entry else 1
        self.entries[uid] = PodStatusEntry(stored, core.status_hash(status), version)
        for listener in self.listeners:
            listener(stored, version)

    def remove(self, uid: str) -> None:
        self.entries.pop(uid, None)


class World:
    """The API, the pod manager and the node's static pods (a `StaticPods`) around a status syncer."""

    def __init__(self, clock=None) -> None:
        self.api = FakeApi()
        self.api.deletes = []
        self.statuses = FakeStatuses()
        self.static: list[dict] = []
        self.static_ready = True
        self.node_uid = NODE_UID
        self.now = 1000.0
        self.pods = PodManager()
        clock = clock or (lambda: self.now)
        self.mirrors = MirrorPods(self.api, NODE, self.pods, clock=clock, static=self, node_uid=lambda: self.node_uid)
        self.running: set[str] = set()  # uids whose containers may still run
        self.syncer = StatusSyncer(
            self.api, NODE, self.statuses, self.pods, self.mirrors, resync=10.0, clock=clock,
            api_pod=lambda uid: next((copy.deepcopy(p) for p in self.api.pods.values() if podutil.uid(p) == uid), None),
            could_have_running_containers=self.running.__contains__,
        )

    def static_pods(self) -> list[dict]:
        return list(self.static)

    def static_pods_ready(self) -> bool:
        return self.static_ready

    def api_mirrors(self) -> list[dict]:
        return [copy.deepcopy(p) for p in self.api.pods.values() if podutil.is_mirror(p)]

    async def sync(self) -> None:
        self.mirrors.set_mirror_pods(self.api_mirrors())
        await self.syncer.sync_once()


@pytest.fixture
def world() -> World:
    return World()


STATUS = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
          "containerStatuses": [cstatus("main", RUNNING, True)]}


async def test_dirty_status_is_patched_once_with_the_uid_precondition(world):
    pod = world.api.add("web")
    world.statuses.set(pod, STATUS)
    await world.sync()
    assert world.api.writes("PATCH") == 1
    stored = world.api.pods[("default", "web")]
    assert stored["status"]["phase"] == "Running"
    assert stored["status"]["containerStatuses"] == STATUS["containerStatuses"]
    assert world.syncer.api_writes == 1 and world.syncer.pending == 0


async def test_nothing_is_written_while_nothing_changes(world):
    pods = [world.api.add(f"p{i}") for i in range(5)]
    for pod in pods:
        world.statuses.set(pod, STATUS)
    await world.sync()
    assert world.api.writes() == 5
    for _ in range(20):  # many resync periods
        world.syncer.mark_resync()
        await world.sync()
    assert world.api.writes() == 5
    assert world.syncer.api_writes == 5


async def test_a_changed_status_sends_only_the_difference(world):
    pod = world.api.add("web")
    world.statuses.set(pod, STATUS)
    await world.sync()
    calls = len(world.api.calls)
    world.statuses.set(pod, {**STATUS, "message": "hello"})
    await world.sync()
    assert world.api.calls[calls:] == [("PATCH", "/api/v1/namespaces/default/pods/web/status")]
    assert world.api.pods[("default", "web")]["status"]["message"] == "hello"


async def test_a_status_changed_by_someone_else_is_corrected_at_resync(world):
    pod = world.api.add("web")
    world.statuses.set(pod, STATUS)
    await world.sync()
    world.api.pods[("default", "web")]["status"]["phase"] = "Unknown"
    world.api.pods[("default", "web")]["metadata"]["resourceVersion"] = "999"
    world.syncer.mark_resync()
    await world.sync()
    assert world.api.pods[("default", "web")]["status"]["phase"] == "Running"
    assert world.api.writes("PATCH") == 2


async def test_a_pod_recreated_with_the_same_name_never_gets_our_status(world):
    old = world.api.add("web")
    world.statuses.set(old, STATUS)
    await world.sync()
    world.api.pods.clear()
    world.api.add("web", uid="someone-elses")
    world.statuses.set(old, {**STATUS, "message": "late"})
    await world.sync()
    assert world.api.pods[("default", "web")]["status"] == {"phase": "Pending"}  # refused by the precondition
    assert world.syncer.api_writes == 1
    attempts = world.api.writes("PATCH")
    world.statuses.set(old, {**STATUS, "message": "later"})
    world.syncer.mark_resync()
    await world.sync()
    assert world.api.writes("PATCH") == attempts  # not even tried again
    assert world.api.pods[("default", "web")]["status"] == {"phase": "Pending"}


async def test_a_pod_gone_from_the_api_stops_being_synced(world):
    pod = world.api.add("web")
    world.statuses.set(pod, STATUS)
    await world.sync()
    del world.api.pods[("default", "web")]
    world.statuses.set(pod, {**STATUS, "message": "x"})
    await world.sync()
    calls = len(world.api.calls)
    world.statuses.set(pod, {**STATUS, "message": "y"})
    world.syncer.mark_resync()
    await world.sync()
    assert world.api.calls[calls:] == []


async def test_an_outage_keeps_statuses_pending_until_the_api_answers(world):
    pod = world.api.add("web")
    world.api.down = True
    world.statuses.set(pod, STATUS)
    with pytest.raises(ServerError):
        await world.sync()
    assert world.syncer.pending == 1
    world.api.down = False
    await world.sync()
    assert world.syncer.pending == 0
    assert world.api.pods[("default", "web")]["status"]["phase"] == "Running"


async def test_pods_forgotten_by_the_status_manager_are_forgotten(world):
    pod = world.api.add("web")
    world.statuses.set(pod, STATUS)
    world.statuses.remove(podutil.uid(pod))
    await world.sync()
    assert world.api.writes() == 0 and world.syncer.pending == 0


async def test_terminated_api_pod_being_deleted_gets_the_final_delete(world):
    pod = world.api.add("web", deletionTimestamp="2026-01-01T00:00:30Z")
    world.syncer.pod_terminated(pod)
    world.syncer.pod_terminated(world.api.add("kept"))  # not being deleted: nothing to do
    await world.sync()
    assert world.api.deletes == [("/api/v1/namespaces/default/pods/web", podutil.uid(pod), 0)]
    assert ("default", "kept") in world.api.pods


async def test_final_delete_never_removes_a_replacement_pod(world):
    pod = world.api.add("web", deletionTimestamp="2026-01-01T00:00:30Z")
    world.api.pods.clear()
    world.api.add("web")
    world.syncer.pod_terminated(pod)
    await world.sync()
    assert ("default", "web") in world.api.pods and world.syncer.pending == 0


async def test_final_delete_waits_out_an_outage(world):
    pod = world.api.add("web", deletionTimestamp="2026-01-01T00:00:30Z")
    world.syncer.pod_terminated(pod)
    world.api.down = True
    with pytest.raises(ServerError):
        await world.sync()
    world.api.down = False
    await world.sync()
    assert ("default", "web") not in world.api.pods


# -- mirror pod lifecycle -------------------------------------------------------------------------------


async def test_static_pod_gets_a_mirror_pod_carrying_its_status(world):
    pod = static_pod()
    world.static = [pod]
    world.statuses.set(pod, STATUS)
    await world.sync()
    (mirror,) = world.api_mirrors()
    assert mirror["metadata"]["annotations"][podutil.CONFIG_MIRROR_ANNOTATION] == "hash-1"
    assert mirror["metadata"]["ownerReferences"][0]["uid"] == NODE_UID
    assert mirror["status"]["phase"] == "Running"
    assert world.api.writes("POST") == 1 and world.api.writes("PATCH") == 1
    for _ in range(5):
        world.syncer.mark_resync()
        await world.sync()
    assert world.api.writes() == 2


async def test_mirror_pod_is_replaced_when_the_static_pod_changes_and_deleted_when_it_goes(world):
    first = static_pod(config_hash="hash-1")
    world.static = [first]
    world.statuses.set(first, STATUS)
    await world.sync()
    (old_mirror,) = world.api_mirrors()

    second = static_pod(config_hash="hash-2")  # edited manifest: new hash, new uid, same name
    world.static = [second]
    world.statuses.remove(podutil.uid(first))
    world.statuses.set(second, {**STATUS, "message": "v2"})
    await world.sync()
    (new_mirror,) = world.api_mirrors()
    assert podutil.uid(new_mirror) != podutil.uid(old_mirror)
    assert podutil.uid(world.pods.mirror_pod_by_pod(second)) == podutil.uid(new_mirror)  # the pod manager's pairing
    assert new_mirror["metadata"]["annotations"][podutil.CONFIG_MIRROR_ANNOTATION] == "hash-2"
    assert new_mirror["status"]["message"] == "v2"
    assert (f"/api/v1/namespaces/default/pods/web-{NODE}", podutil.uid(old_mirror), 0) in world.api.deletes

    world.static = []
    world.statuses.remove(podutil.uid(second))
    await world.sync()
    assert world.api_mirrors() == [] and world.pods.mirror_pods() == []


async def test_a_deleted_mirror_pod_is_recreated(world):
    pod = static_pod()
    world.static = [pod]
    world.statuses.set(pod, STATUS)
    await world.sync()
    await world.sync()  # the pod source has now listed the mirror
    world.api.pods.clear()  # someone deleted it
    await world.sync()
    (mirror,) = world.api_mirrors()
    assert mirror["status"]["phase"] == "Running"


async def test_mirror_pods_wait_for_the_node_and_orphans_for_the_static_sources(world):
    world.node_uid = ""
    world.static = [static_pod()]
    await world.sync()
    assert world.api_mirrors() == []
    world.node_uid = NODE_UID
    await world.sync()
    assert len(world.api_mirrors()) == 1

    world.static = []
    world.static_ready = False  # the file source has not listed yet: the mirror may still be wanted
    await world.sync()
    assert len(world.api_mirrors()) == 1
    world.static_ready = True
    await world.sync()
    assert world.api_mirrors() == []


async def test_no_mirror_replaces_an_api_pod_of_the_same_name(world):
    world.api.add(f"web-{NODE}")
    world.static = [static_pod()]
    await world.sync()
    await world.sync()
    assert world.api_mirrors() == [] and world.api.writes("POST") == 1


async def test_run_loop_writes_nothing_over_many_quiet_resyncs():
    world = World(clock=time.monotonic)
    pod = world.api.add("web")
    world.statuses.set(pod, STATUS)
    world.mirrors.set_mirror_pods([])
    world.syncer.resync = 0.01
    task = asyncio.create_task(world.syncer.run())
    try:
        for _ in range(200):
            if world.syncer.pending == 0 and world.api.writes() == 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # about 30 resync periods
        assert world.api.writes() == 1
        world.statuses.set(pod, {**STATUS, "message": "changed"})
        for _ in range(200):
            if world.api.writes() == 2:
                break
            await asyncio.sleep(0.01)
        assert world.api.writes() == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- an idle node sends nothing ---------------------------------------------------------------------------

# A status as the agent generates it: hostIPs (unknown to a 1.20 server), conditions without lastProbeTime.
FULL_STATUS = {
    "phase": "Running", "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
    "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}], "startTime": "2026-01-01T00:00:00Z", "qosClass": "BestEffort",
    "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                   for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")],
    "containerStatuses": [{**cstatus("main", RUNNING, True), "image": "busybox", "imageID": "sha256:1",
                           "containerID": "containerd://1", "started": True, "lastState": {}}],
}


async def test_idle_pods_cost_no_request_at_all(world):
    pods = [world.api.add(f"p{i}") for i in range(10)]
    for pod in pods:
        world.statuses.set(pod, FULL_STATUS)
    await world.sync()
    assert world.api.writes("PATCH") == 10
    calls = len(world.api.calls)
    for _ in range(30):  # five minutes of resyncs, the watch showing each pod as the API holds it
        world.now += 10
        world.syncer.mark_resync()
        await world.sync()
    assert world.api.calls[calls:] == []


async def test_a_watch_copy_with_stale_metadata_but_our_status_is_no_reason_to_read(world):
    # The pod config keeps a pod's old metadata when only its status changed: the resourceVersion lags.
    pod = world.api.add("web")
    world.statuses.set(pod, FULL_STATUS)
    await world.sync()
    stale = copy.deepcopy(world.api.pods[("default", "web")])
    stale["metadata"]["resourceVersion"] = "1"
    world.syncer._api_pod = lambda uid: stale
    calls = len(world.api.calls)
    for _ in range(5):
        world.syncer.mark_resync()
        await world.sync()
    assert world.api.calls[calls:] == []


async def test_after_a_restart_statuses_the_api_holds_are_compared_with_the_watch_and_not_written(world):
    pods = [world.api.add(f"p{i}") for i in range(5)]
    for pod in pods:
        world.statuses.set(pod, FULL_STATUS)
    await world.sync()
    restarted = World()
    restarted.api = restarted.syncer.client = world.api
    for pod in pods:
        restarted.statuses.set(pod, FULL_STATUS)
    calls = len(world.api.calls)
    for _ in range(3):
        restarted.syncer.mark_resync()
        await restarted.sync()
    methods = [method for method, _ in world.api.calls[calls:]]
    # Nothing read (the watch's copies are the base); a single PATCH teaches the new process that this server
    # drops hostIPs.
    assert methods == ["PATCH"]


async def test_after_a_restart_before_the_watch_has_listed_statuses_are_read_once(world):
    pods = [world.api.add(f"p{i}") for i in range(3)]
    restarted = World()
    restarted.api = restarted.syncer.client = world.api
    restarted.syncer._api_pod = lambda uid: None
    for pod in pods:
        restarted.statuses.set(pod, {"phase": "Pending"})
    for _ in range(3):
        restarted.syncer.mark_resync()
        await restarted.sync()
    assert [method for method, _ in world.api.calls] == ["GET"] * 3


async def test_a_new_pods_first_status_is_diffed_against_the_watch_copy_without_a_read(world):
    pod = world.api.add("web", status={"phase": "Pending", "qosClass": "BestEffort"})
    world.statuses.set(pod, {**STATUS, "qosClass": "BestEffort"})
    await world.sync()
    assert world.api.calls == [("PATCH", "/api/v1/namespaces/default/pods/web/status")]
    assert "qosClass" not in world.api.patches[0]  # the diff is against what the watch showed
    assert world.api.pods[("default", "web")]["status"]["phase"] == "Running"


async def test_a_pod_replaced_under_the_same_name_is_read_not_taken_from_the_watch(world):
    old = world.api.add("web")
    world.statuses.set(old, STATUS)
    world.api.pods.clear()
    world.api.add("web")
    await world.sync()
    assert [method for method, _ in world.api.calls] == ["GET"]
    assert world.api.writes() == 0


async def test_readiness_and_restarts_are_sent_as_whole_container_status_lists(world):
    pod = world.api.add("web")
    world.statuses.set(pod, FULL_STATUS)
    await world.sync()
    restarted = copy.deepcopy(FULL_STATUS)
    restarted["containerStatuses"][0].update(ready=False, restartCount=1)
    world.statuses.set(pod, restarted)
    await world.sync()
    patch = world.api.patches[-1]
    assert patch["containerStatuses"] == restarted["containerStatuses"]
    assert not [key for key in patch if key.startswith("$") and "containerStatuses" in key.lower()]
    stored = world.api.pods[("default", "web")]["status"]["containerStatuses"][0]
    assert (stored["ready"], stored["restartCount"]) == (False, 1)


async def test_fields_the_server_drops_are_learnt_and_no_longer_sent(world, caplog):
    pod = world.api.add("web")
    world.statuses.set(pod, FULL_STATUS)
    with caplog.at_level(logging.INFO, logger="edgelet.status.apisync"):
        await world.sync()
    assert "hostIPs" in world.api.patches[0] and "does not store the pod status fields hostIPs" in caplog.text
    world.statuses.set(pod, {**FULL_STATUS, "hostIPs": [{"ip": "10.0.0.2"}]})
    await world.sync()
    assert len(world.api.patches) == 1  # a change of an unknown field alone is no change
    world.statuses.set(pod, {**FULL_STATUS, "hostIPs": [{"ip": "10.0.0.3"}], "message": "m"})
    await world.sync()
    assert world.api.patches[-1] == {"message": "m"}


# -- 403: one object refused, every other one written ------------------------------------------------------


async def test_a_forbidden_status_is_reported_once_and_does_not_stop_the_others(world, caplog):
    bad, good = world.api.add("bad"), world.api.add("good")
    world.api.forbidden["bad"] = "node 'edge-1' cannot update pod status for pods on other nodes"
    with caplog.at_level(logging.WARNING, logger="edgelet.status.apisync"):
        for message in ("a", "b", "c"):
            world.statuses.set(bad, {**STATUS, "message": message})
            world.statuses.set(good, {**STATUS, "message": message})
            await world.sync()  # never raises: a 403 concerns its object only
    assert world.api.pods[("default", "good")]["status"]["message"] == "c"
    assert list(world.syncer.refusals) == ["default/bad"] and "403 Forbidden" in world.syncer.refusals["default/bad"]
    assert caplog.text.count("default/bad") == 1 and world.syncer.last_error is None
    del world.api.forbidden["bad"]
    world.statuses.set(bad, {**STATUS, "message": "d"})
    await world.sync()
    assert world.api.pods[("default", "bad")]["status"]["message"] == "d" and world.syncer.refusals == {}


async def test_a_forbidden_mirror_pod_is_retried_with_backoff_and_created_once_allowed(world):
    world.static = [static_pod("cfg")]
    world.statuses.set(world.static[0], STATUS)
    api_pod = world.api.add("web")
    world.statuses.set(api_pod, STATUS)
    world.api.forbidden[f"cfg-{NODE}"] = 'node "edge-1" can not create pods that reference configmaps'
    attempts = []
    for step in range(40):  # 20 s in half-second steps
        posts = world.api.writes("POST")
        await world.sync()
        if world.api.writes("POST") > posts:
            attempts.append(step * 0.5)
        world.now += 0.5
    assert world.api.pods[("default", "web")]["status"]["phase"] == "Running"  # not held up
    assert list(world.syncer.refusals) == [f"default/cfg-{NODE}"]
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert gaps == [1.0, 2.0, 4.0, 8.0], attempts  # doubling from 1 s
    del world.api.forbidden[f"cfg-{NODE}"]  # the cause is gone
    world.now += 16
    await world.sync()
    (mirror,) = world.api_mirrors()
    assert mirror["status"]["phase"] == "Running" and world.syncer.refusals == {}


async def test_a_re_registered_node_retries_refused_mirror_pods_at_once(world):
    world.static = [static_pod()]
    world.api.forbidden[f"web-{NODE}"] = "node edge-1 UID mismatch"
    await world.sync()
    world.now += 0.1
    await world.sync()
    assert world.api.writes("POST") == 1 and world.api_mirrors() == []
    del world.api.forbidden[f"web-{NODE}"]
    world.node_uid = "node-uid-2"
    await world.sync()
    (mirror,) = world.api_mirrors()
    assert mirror["metadata"]["ownerReferences"][0]["uid"] == "node-uid-2"


READY_TRUE = [{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]


@pytest.mark.parametrize("api_status, status, could_run, expected", [
    # Containers may run: the terminal phase, its reason and message wait; the API's phase stays.
    ({"phase": "Running"}, {"phase": "Failed", "reason": "DeadlineExceeded", "message": "m", "startTime": "t"}, True,
     {"phase": "Running", "startTime": "t"}),
    ({"phase": "Running", "reason": "R"}, {"phase": "Succeeded"}, True, {"phase": "Running", "reason": "R"}),
    # A DisruptionTarget the API has not got waits with it.
    ({"phase": "Running"}, {"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True"}]}, True,
     {"phase": "Running", "conditions": []}),
    # All stopped, or terminal in the API already: sent as it is.
    ({"phase": "Running"}, {"phase": "Succeeded"}, False, {"phase": "Succeeded"}),
    ({"phase": "Failed"}, {"phase": "Failed", "reason": "X"}, True, {"phase": "Failed", "reason": "X"}),
    ({"phase": "Running"}, {"phase": "Running"}, True, {"phase": "Running"}),
    # A terminal phase never goes out with Ready or ContainersReady True.
    ({}, {"phase": "Failed", "conditions": READY_TRUE}, False,
     {"phase": "Failed", "conditions": [{"type": "ContainersReady", "status": "False", "reason": "PodFailed"},
                                        {"type": "Ready", "status": "False", "reason": "PodFailed"}]}),
])
def test_api_view(api_status, status, could_run, expected):
    assert api_view(api_status, status, could_run) == expected


async def test_a_terminal_phase_reaches_the_api_once_the_containers_stopped(world):
    pod = world.api.add("job")
    uid = podutil.uid(pod)
    world.statuses.set(pod, STATUS)
    await world.sync()
    world.running.add(uid)
    world.statuses.set(pod, {**STATUS, "phase": "Failed", "reason": "DeadlineExceeded"})
    await world.sync()
    assert world.api.pods[("default", "job")]["status"]["phase"] == "Running"
    world.syncer.mark_resync()  # held back: looked at again at each resync
    await world.sync()
    assert world.api.pods[("default", "job")]["status"]["phase"] == "Running"
    world.running.discard(uid)
    world.syncer.mark_resync()
    await world.sync()
    stored = world.api.pods[("default", "job")]["status"]
    assert (stored["phase"], stored["reason"]) == ("Failed", "DeadlineExceeded")
