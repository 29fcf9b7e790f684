"""ConfigMaps and Secrets of API pods: which ones a pod references, fetched into the store, persisted, forgotten,
and loaded back for an offline restart (an in-memory API; checkpoints in tmp_path)."""

from __future__ import annotations

import asyncio
import copy
import os
import stat

import orjson
import pytest

from edgelet.api.objectstore import CLAIM, CONFIGMAP, SECRET, VOLUME, ObjectStore, object_key
from edgelet.kubeapi.errors import Forbidden, NotFound, ServerError
from edgelet.kubeapi.objects import ObjectSyncer, object_path, referenced_objects
from edgelet.util.checkpoint import CheckpointStore

NS = "apps"


def pod(spec: dict) -> dict:
    return {"metadata": {"name": "p", "namespace": NS, "uid": "u1"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [{"name": "c"}]}, set()),
        ({"volumes": [{"name": "v", "configMap": {"name": "cm"}}, {"name": "s", "secret": {"secretName": "sec"}},
                      {"name": "e", "emptyDir": {}}]},
         {(CONFIGMAP, NS, "cm"), (SECRET, NS, "sec")}),
        ({"volumes": [{"name": "p", "projected": {"sources": [
            {"configMap": {"name": "pcm"}}, {"secret": {"name": "psec"}}, {"downwardAPI": {"items": []}},
            {"serviceAccountToken": {"path": "token"}}]}}]},
         {(CONFIGMAP, NS, "pcm"), (SECRET, NS, "psec")}),
        ({"initContainers": [{"name": "i",
                              "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "icm", "key": "k"}}}]}],
          "containers": [{"name": "c",
                          "env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "csec", "key": "k"}}},
                                               {"name": "C", "value": "plain"},
                                               {"name": "D",
                                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                          "envFrom": [{"configMapRef": {"name": "all-cm"}}, {"secretRef": {"name": "all-sec"}}]}]},
         {(CONFIGMAP, NS, "icm"), (SECRET, NS, "csec"), (CONFIGMAP, NS, "all-cm"), (SECRET, NS, "all-sec")}),
        ({"imagePullSecrets": [{"name": "registry"}, {}]}, {(SECRET, NS, "registry")}),
        # Claims: named, or the one the ephemeral volume controller makes for the pod (`<pod>-<volume>`).
        ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
                      {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                      {"name": "bad", "persistentVolumeClaim": {"claimName": ""}}]},
         {(CLAIM, NS, "db"), (CLAIM, NS, "p-scratch")}),
        ({"volumes": "not a list", "containers": [{"name": "c", "env": [None, {"valueFrom": "bad"}]}]}, set()),
    ],
)
def test_referenced_objects(spec, expected):
    assert referenced_objects(pod(spec)) == expected


def configmap(name: str, value: str = "v1", rv: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"key": value},
            "metadata": {"name": name, "namespace": NS, "resourceVersion": rv, "managedFields": [{"manager": "x"}]}}


def secret(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "data": {"token": "c2VjcmV0"},
            "metadata": {"name": name, "namespace": NS, "resourceVersion": "1"}}


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.gets: list[str] = []
        self.down = False
        self.refuse: set[str] = set()

    def put(self, obj: dict) -> None:
        self.objects[object_path(object_key(obj))] = obj

    async def get(self, path: str) -> dict:
        self.gets.append(path)
        if self.down:
            raise ServerError(0, "ConnectionError", "refused", method="GET", path=path)
        if path in self.refuse:
            raise Forbidden(403, "Forbidden", "no relationship found between node and this object")
        if path not in self.objects:
            raise NotFound(404, "NotFound", "not found", method="GET", path=path)
        return copy.deepcopy(self.objects[path])


def uses(*names: str, secrets: tuple[str, ...] = ()) -> dict:
    volumes = [{"name": n, "configMap": {"name": n}} for n in names]
    volumes += [{"name": n, "secret": {"secretName": n}} for n in secrets]
    return pod({"volumes": volumes, "containers": [{"name": "c"}]})


@pytest.fixture
def api() -> FakeApi:
    fake = FakeApi()
    fake.put(configmap("settings"))
    fake.put(secret("token"))
    return fake


async def test_fetch_store_persist_and_load_after_a_restart(api, tmp_path):
    store = ObjectStore()
    syncer = ObjectSyncer(api, store, str(tmp_path / "objects"))
    await syncer.ensure([uses("settings", secrets=("token",))], timeout=0)  # no run loop: returns at once
    await syncer.refresh_once(full=False)
    assert store.get_configmap(NS, "settings")["data"] == {"key": "v1"}
    assert "managedFields" not in store.get_configmap(NS, "settings")["metadata"]
    assert store.get_secret(NS, "token") is not None
    files = sorted(os.listdir(tmp_path / "objects"))
    assert len([f for f in files if f.endswith(".ckpt")]) == 2
    assert stat.S_IMODE(os.stat(tmp_path / "objects").st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(tmp_path / "objects" / f).st_mode) == 0o600 for f in files if f.endswith(".ckpt"))

    # A restart without network: everything is there before the API answers.
    api.down = True
    restarted = ObjectStore()
    assert ObjectSyncer(api, restarted, str(tmp_path / "objects")).load() == 2
    assert restarted.get_configmap(NS, "settings") == store.get_configmap(NS, "settings")
    assert restarted.get_secret(NS, "token") == store.get_secret(NS, "token")


async def test_unchanged_objects_are_not_rewritten_and_changes_are(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([uses("settings")])
    await syncer.refresh_once()
    await syncer.refresh_once()
    assert syncer.disk_writes == 1
    api.put(configmap("settings", value="v2", rv="2"))
    await syncer.refresh_once()
    assert syncer.disk_writes == 2 and syncer.store.get_configmap(NS, "settings")["data"] == {"key": "v2"}


async def test_unreferenced_objects_are_forgotten_in_memory_and_on_disk(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([uses("settings", secrets=("token",))])
    await syncer.refresh_once()
    syncer.set_pods([uses("settings")])
    await syncer.refresh_once(full=False)
    assert syncer.store.get_secret(NS, "token") is None
    assert ObjectSyncer(api, ObjectStore(), str(tmp_path)).load() == 1


async def test_loaded_objects_are_kept_until_the_pods_are_known(api, tmp_path):
    first = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    first.set_pods([uses("settings")])
    await first.refresh_once()
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.load()
    await syncer.refresh_once()  # no pod set yet: nothing may be forgotten
    assert syncer.store.get_configmap(NS, "settings") is not None


async def test_an_outage_keeps_what_is_cached_and_a_deleted_object_goes(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([uses("settings")])
    await syncer.refresh_once()
    api.down = True
    with pytest.raises(ServerError):
        await syncer.refresh_once()
    assert syncer.store.get_configmap(NS, "settings") is not None
    api.down = False
    api.objects.clear()
    await syncer.refresh_once()
    assert syncer.store.get_configmap(NS, "settings") is None
    assert ObjectSyncer(api, ObjectStore(), str(tmp_path)).load() == 0


async def test_refused_and_invalid_objects_keep_the_last_good_version(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([uses("settings")])
    await syncer.refresh_once()
    path = f"/api/v1/namespaces/{NS}/configmaps/settings"
    api.refuse.add(path)
    await syncer.refresh_once()
    api.refuse.clear()
    api.objects[path] = {**configmap("settings"), "data": {"key": 42}}  # not a string: unusable
    await syncer.refresh_once()
    assert syncer.store.get_configmap(NS, "settings")["data"] == {"key": "v1"}


async def test_objects_of_other_sources_are_left_alone(api, tmp_path):
    store = ObjectStore()
    store.replace_all("file", [{**configmap("local"), "metadata": {"name": "local", "namespace": NS}}])
    syncer = ObjectSyncer(api, store, str(tmp_path))
    syncer.set_pods([])
    await syncer.refresh_once()
    assert store.get_configmap(NS, "local") is not None


async def test_ensure_waits_for_new_references_but_not_for_an_unreachable_api(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path), backoff_initial=0.01, backoff_max=0.02)
    task = asyncio.create_task(syncer.run())
    try:
        await asyncio.wait_for(syncer.ensure([uses("settings")], timeout=5), 5)
        assert syncer.store.get_configmap(NS, "settings") is not None
        api.down = True
        await asyncio.wait_for(syncer.ensure([uses("settings", secrets=("token",))], timeout=30), 5)
        assert syncer.store.get_secret(NS, "token") is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_damaged_and_mismatched_entries_are_not_loaded(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([uses("settings", secrets=("token",))])
    await syncer.refresh_once()
    (checkpoint,) = [p for p in tmp_path.iterdir() if p.name.startswith("Secret")]
    checkpoint.write_bytes(checkpoint.read_bytes()[:-3])
    assert ObjectSyncer(api, ObjectStore(), str(tmp_path)).load() == 1
    # An entry holding another object than its name says is removed, not served.
    CheckpointStore(tmp_path, kind="object").write(f"ConfigMap/{NS}/other", orjson.dumps(configmap("settings")))
    store = ObjectStore()
    assert ObjectSyncer(api, store, str(tmp_path)).load() == 1
    assert store.get_configmap(NS, "other") is None


async def test_an_object_missing_when_its_pod_is_synced_is_read_then(api, tmp_path):
    """Found absent by an earlier read, created since: the pod's sync reads it again instead of taking it as gone;
    nothing is asked when everything is there, and a real NotFound leaves it absent."""
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([uses("settings", "late")])
    await syncer.refresh_once()
    assert syncer.store.get_configmap(NS, "late") is None
    api.put(configmap("late", "fresh"))
    await syncer.fetch_missing(uses("settings", "late"))
    assert syncer.store.get_configmap(NS, "late")["data"] == {"key": "fresh"}
    assert any(name.startswith("ConfigMap") and "late" in name for name in os.listdir(tmp_path))  # kept offline
    asked = len(api.gets)
    await syncer.fetch_missing(uses("settings", "late"))
    assert len(api.gets) == asked
    await syncer.fetch_missing(uses("settings", "never"))
    assert syncer.store.get_configmap(NS, "never") is None and len(api.gets) == asked + 1
    # A static pod's objects come from files: the API is not asked for them.
    static = uses("absent")
    static["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    await syncer.fetch_missing(static)
    assert len(api.gets) == asked + 1


async def test_an_unreachable_api_leaves_a_missing_object_missing(api, tmp_path):
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([])
    api.down = True
    await syncer.fetch_missing(uses("settings"))
    assert syncer.store.get_configmap(NS, "settings") is None


async def test_pods_set_while_a_round_reads_wake_the_next_round(api, tmp_path):
    """A pod that arrives while the loop's GETs are under way is read in the next round, not a refresh later."""
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path), refresh=3600)
    reading = asyncio.Event()
    release = asyncio.Event()
    get = api.get

    async def slow_get(path):
        if path.endswith("/settings"):
            reading.set()
            await release.wait()
        return await get(path)

    api.get = slow_get
    syncer.set_pods([uses("settings")])
    task = asyncio.create_task(syncer.run())
    try:
        await asyncio.wait_for(reading.wait(), 5)
        syncer.set_pods([uses("settings", secrets=("token",))])
        release.set()
        await asyncio.wait_for(syncer.ensure([uses("settings", secrets=("token",))], timeout=5), 5)
        assert syncer.store.get_secret(NS, "token") is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def claim(name: str, volume: str = "", phase: str = "Pending") -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"volumeName": volume} if volume else {}, "status": {"phase": phase}}


def volume(name: str, claim_name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"hostPath": {"path": f"/srv/{name}"},
                     "claimRef": {"namespace": NS, "name": claim_name, "uid": f"uid-{claim_name}"}},
            "status": {"phase": "Bound"}}


def claims(*names: str) -> dict:
    return pod({"volumes": [{"name": n, "persistentVolumeClaim": {"claimName": n}} for n in names],
                "containers": [{"name": "c"}]})


async def test_a_claim_and_its_volume_are_read_persisted_and_loaded_offline(api, tmp_path):
    api.put(claim("data", "pv-data", "Bound"))
    api.put(volume("pv-data", "data"))
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([claims("data")])
    await syncer.refresh_once()
    assert syncer.store.get(VOLUME, "", "pv-data")["spec"]["hostPath"] == {"path": "/srv/pv-data"}
    assert "/api/v1/persistentvolumes/pv-data" in api.gets  # cluster-scoped
    api.down = True
    store = ObjectStore()
    assert ObjectSyncer(api, store, str(tmp_path)).load() == 2
    assert store.get(CLAIM, NS, "data")["spec"]["volumeName"] == "pv-data"
    assert store.get(VOLUME, NS, "pv-data") == store.get(VOLUME, "", "pv-data") is not None


async def test_a_pending_claim_is_read_again_at_each_sync_until_bound_then_its_volume(api, tmp_path):
    api.put(claim("data"))
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    syncer.set_pods([claims("data")])
    await syncer.refresh_once()
    await syncer.fetch_missing(claims("data"))
    assert api.gets.count(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data") == 2
    api.put(claim("data", "pv-data", "Bound"))
    api.put(volume("pv-data", "data"))
    await syncer.fetch_missing(claims("data"))
    assert syncer.store.get(VOLUME, "", "pv-data") is not None
    asked = len(api.gets)
    await syncer.fetch_missing(claims("data"))  # bound and there: nothing asked
    assert len(api.gets) == asked
    # The volume stays as long as a pod's claim is bound to it, and goes with the claim.
    await syncer.refresh_once()
    assert syncer.store.get(VOLUME, "", "pv-data") is not None
    syncer.set_pods([])
    await syncer.refresh_once()
    assert syncer.store.get(VOLUME, "", "pv-data") is None and not list(tmp_path.glob("*.ckpt"))


async def test_ensure_waits_for_the_volume_of_a_claim(api, tmp_path):
    api.put(claim("data", "pv-data", "Bound"))
    api.put(volume("pv-data", "data"))
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path))
    task = asyncio.create_task(syncer.run())
    try:
        await asyncio.wait_for(syncer.ensure([claims("data")], timeout=5), 5)
        assert syncer.store.get(VOLUME, "", "pv-data") is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_claim_pods_wait_for_is_read_again_soon_until_it_is_bound(api, tmp_path):
    api.put(claim("data"))
    now = [0.0]
    syncer = ObjectSyncer(api, ObjectStore(), str(tmp_path), refresh=3600, clock=lambda: now[0])
    path = f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data"
    syncer.set_pods([claims("data")])
    task = asyncio.create_task(syncer.run())
    try:
        await asyncio.wait_for(syncer.ensure([claims("data")], timeout=5), 5)
        api.put(claim("data", "pv-data", "Bound"))
        api.put(volume("pv-data", "data"))
        for _ in range(100):  # the loop's short wait (PENDING_CLAIM_POLL) passes; the refresh (3600 s) does not
            if syncer.store.get(VOLUME, "", "pv-data") is not None:
                break
            await asyncio.sleep(0.05)
        assert syncer.store.get(VOLUME, "", "pv-data") is not None
        reads = api.gets.count(path)
        await asyncio.sleep(2.5)  # bound now: no more reads until the refresh
        assert api.gets.count(path) == reads
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
