"""The offline pod cache: round trips, writes only on real changes, damaged and foreign entries set aside,
and the caching handle's order (persist, then apply; ready only after what came before) (files in tmp_path)."""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import stat

import orjson
import pytest

from edgelet.api import podutil
from edgelet.podconfig.cache import POD_KIND, CachingHandle, PodCheckpoints, content_version
from edgelet.podconfig.config import Op, PodConfig
from edgelet.util import checkpoint
from edgelet.util.checkpoint import CheckpointStore, key_to_filename

NODE = "edge-1"


def api_pod(uid: str, name: str | None = None, *, node: str = NODE, image: str = "busybox:1", **meta) -> dict:
    return {
        "metadata": {"name": name or f"pod-{uid}", "namespace": "default", "uid": uid, "resourceVersion": "1", **meta},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}]},
        "status": {"phase": "Pending"},
    }


def corrupt_files(directory) -> list[str]:
    corrupt = directory / checkpoint.CORRUPT_DIR
    return sorted(os.listdir(corrupt)) if corrupt.exists() else []


def entry_path(directory, uid: str):
    return directory / key_to_filename(uid)


# -- PodCheckpoints ---------------------------------------------------------------------------------------------


def test_round_trip_and_completeness(tmp_path):
    cache = PodCheckpoints(str(tmp_path), NODE)
    assert cache.load() == ([], False)  # never written: not a list anyone may trust
    pods = [api_pod("a"), api_pod("b")]
    cache.sync(pods)
    restored, complete = PodCheckpoints(str(tmp_path), NODE).load()
    assert complete is True
    assert sorted(restored, key=podutil.uid) == pods


def test_empty_list_from_the_api_is_complete(tmp_path):
    PodCheckpoints(str(tmp_path), NODE).sync([])
    assert PodCheckpoints(str(tmp_path), NODE).load() == ([], True)


def test_cache_of_another_node_name_is_not_trusted(tmp_path):
    PodCheckpoints(str(tmp_path), "old-name").sync([api_pod("a", node="old-name")])
    pods, complete = PodCheckpoints(str(tmp_path), NODE).load()
    assert (pods, complete) == ([], False)


def test_status_changes_are_not_rewritten_but_spec_changes_are(tmp_path):
    cache = PodCheckpoints(str(tmp_path), NODE)
    pod = api_pod("a")
    cache.sync([pod])
    assert cache.writes == 1
    running = copy.deepcopy(pod)
    running["status"] = {"phase": "Running"}
    running["metadata"]["resourceVersion"] = "2"  # what every status write does
    cache.sync([running])
    assert cache.writes == 1
    cache.sync([api_pod("a", image="busybox:2")])
    assert cache.writes == 2
    deleting = api_pod("a", image="busybox:2", deletionTimestamp="2026-01-01T00:00:00Z")
    cache.sync([deleting])
    assert cache.writes == 3
    assert PodCheckpoints(str(tmp_path), NODE).load()[0] == [deleting]


def test_pods_gone_from_the_api_are_removed(tmp_path):
    cache = PodCheckpoints(str(tmp_path), NODE)
    cache.sync([api_pod("a"), api_pod("b")])
    cache.sync([api_pod("b")])
    assert not entry_path(tmp_path, "a").exists()
    assert [podutil.uid(p) for p in PodCheckpoints(str(tmp_path), NODE).load()[0]] == ["b"]


def test_entries_are_root_only(tmp_path):
    cache_dir = tmp_path / "cache"
    PodCheckpoints(str(cache_dir), NODE).sync([api_pod("a")])
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(entry_path(cache_dir, "a")).st_mode) == 0o600


def test_content_version_ignores_status_and_resource_version():
    pod = api_pod("a")
    other = copy.deepcopy(pod)
    other["status"] = {"phase": "Running"}
    other["metadata"]["resourceVersion"] = "77"
    assert content_version(pod) == content_version(other)
    assert content_version(pod) != content_version(api_pod("a", image="x:1"))


def damage_truncate(path):
    path.write_bytes(path.read_bytes()[:-5])


def damage_flip(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def damage_empty(path):
    path.write_bytes(b"")


def damage_garbage(path):
    path.write_bytes(b"\x00\xff not a checkpoint at all")


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_empty, damage_garbage])
def test_damaged_entries_are_set_aside_and_the_rest_restored(tmp_path, caplog, damage):
    PodCheckpoints(str(tmp_path), NODE).sync([api_pod("a"), api_pod("b")])
    damage(entry_path(tmp_path, "a"))
    with caplog.at_level(logging.WARNING):
        pods, complete = PodCheckpoints(str(tmp_path), NODE).load()
    assert [podutil.uid(p) for p in pods] == ["b"] and not complete
    assert not entry_path(tmp_path, "a").exists()
    assert len(corrupt_files(tmp_path)) == 1
    assert "damaged" in caplog.text


def write_entry(directory, key: str, payload: bytes, kind: str = POD_KIND) -> None:
    CheckpointStore(directory, kind=kind).write(key, payload)


@pytest.mark.parametrize(
    ("key", "payload", "kind", "reason"),
    [
        pytest.param("a", orjson.dumps(api_pod("a")), "pod-status", "holds a 'pod-status' checkpoint", id="other-kind"),
        pytest.param("a", b"{not json", POD_KIND, "not JSON", id="not-json"),
        pytest.param("a", orjson.dumps(api_pod("zzz")), POD_KIND, "holds pod uid", id="uid-mismatch"),
        pytest.param("a", orjson.dumps([1, 2]), POD_KIND, "is not a JSON object", id="not-an-object"),
        pytest.param("a", orjson.dumps({"metadata": {"uid": "a"}}), POD_KIND, "has no metadata.name", id="not-a-pod"),
        pytest.param("a", b"null", POD_KIND, "is not a JSON object", id="null"),
        pytest.param("a", orjson.dumps({**api_pod("a"), "metadata": {**api_pod("a")["metadata"], "labels": ["x"]}}),
                     POD_KIND, "metadata.labels", id="wrong-types"),
        pytest.param("a", orjson.dumps({**api_pod("a"), "spec": {**api_pod("a")["spec"], "priority": 2**64 - 1}}),
                     POD_KIND, "does not fit in 64 bits", id="beyond-int64"),
        pytest.param("a", orjson.dumps(api_pod("a", annotations={podutil.CONFIG_MIRROR_ANNOTATION: "h"})),
                     POD_KIND, "is a mirror pod", id="mirror-pod"),
    ],
)
def test_foreign_entries_are_set_aside(tmp_path, caplog, key, payload, kind, reason):
    PodCheckpoints(str(tmp_path), NODE).sync([api_pod("b")])
    write_entry(tmp_path, key, payload, kind)
    with caplog.at_level(logging.WARNING):
        pods, _ = PodCheckpoints(str(tmp_path), NODE).load()
    assert [podutil.uid(p) for p in pods] == ["b"]
    assert len(corrupt_files(tmp_path)) == 1
    assert reason in caplog.text


def test_pods_bound_to_another_node_are_dropped_not_kept(tmp_path):
    write_entry(tmp_path, "a", orjson.dumps(api_pod("a", node="other-node")))
    cache = PodCheckpoints(str(tmp_path), NODE)
    assert cache.load() == ([], False)
    cache.sync([])
    assert not entry_path(tmp_path, "a").exists() and corrupt_files(tmp_path) == []


def test_stray_files_are_left_alone(tmp_path):
    (tmp_path / "README").write_text("notes")
    (tmp_path / ".tmp-123-a.ckpt").write_bytes(b"half a write")  # what a crash mid-write leaves
    PodCheckpoints(str(tmp_path), NODE).sync([api_pod("a")])
    pods, _ = PodCheckpoints(str(tmp_path), NODE).load()
    assert [podutil.uid(p) for p in pods] == ["a"]
    assert (tmp_path / "README").exists() and not (tmp_path / ".tmp-123-a.ckpt").exists()


# -- CachingHandle --------------------------------------------------------------------------------------


def drain_updates(config: PodConfig) -> list[tuple[Op, list[str]]]:
    updates = []
    while not config.updates.empty():
        update = config.updates.get_nowait()
        updates.append((update.op, [podutil.uid(p) for p in update.pods]))
    return updates


async def test_restore_applies_cached_pods_and_marks_ready_only_when_complete(tmp_path):
    config = PodConfig()
    handle = CachingHandle(config.source("api"), PodCheckpoints(str(tmp_path), NODE))
    assert handle.restore() == []
    assert not config.all_sources_ready()  # no evidence of a complete list: wait for the API

    PodCheckpoints(str(tmp_path / "c2"), NODE).sync([api_pod("a")])
    config = PodConfig()
    handle = CachingHandle(config.source("api"), PodCheckpoints(str(tmp_path / "c2"), NODE))
    assert [podutil.uid(p) for p in handle.restore()] == ["a"]
    assert config.all_sources_ready()
    assert drain_updates(config) == [(Op.ADD, ["a"])]


async def test_sets_are_persisted_before_they_are_applied(tmp_path):
    config = PodConfig()
    seen_on_disk: list[bool] = []
    api = config.source("api")

    class Probe:
        def set(self, pods):
            seen_on_disk.extend(entry_path(tmp_path, podutil.uid(p)).exists() for p in pods)
            api.set(pods)

        def mark_ready(self):
            api.mark_ready()

        ready = property(lambda self: api.ready)

    handle = CachingHandle(Probe(), PodCheckpoints(str(tmp_path), NODE))
    handle.set([api_pod("a")])
    handle.mark_ready()
    assert not config.all_sources_ready()  # nothing applied yet: ready must wait for the set before it
    await handle.drain()
    assert seen_on_disk == [True]
    assert config.all_sources_ready()
    assert drain_updates(config) == [(Op.ADD, ["a"])]


async def test_newest_set_wins_and_before_apply_runs_first(tmp_path):
    config = PodConfig()
    prepared: list[list[str]] = []
    gate = asyncio.Event()

    async def before_apply(pods):
        prepared.append([podutil.uid(p) for p in pods])
        await gate.wait()

    handle = CachingHandle(config.source("api"), PodCheckpoints(str(tmp_path), NODE), before_apply=before_apply)
    handle.set([api_pod("a")])
    await asyncio.sleep(0)
    handle.set([api_pod("b")])
    handle.set([api_pod("c")])
    gate.set()
    await handle.drain()
    assert prepared == [["a"], ["c"]]
    assert drain_updates(config) == [(Op.ADD, ["a"]), (Op.REMOVE, ["a"]), (Op.ADD, ["c"])]
    await handle.close()


async def test_a_failing_disk_or_helper_never_keeps_pods_from_the_agent(tmp_path, caplog):
    class FullDisk(PodCheckpoints):
        def sync(self, pods):
            raise OSError(28, "No space left on device")

    async def broken(pods):
        raise RuntimeError("helper bug")

    config = PodConfig()
    handle = CachingHandle(config.source("api"), FullDisk(str(tmp_path), NODE), before_apply=broken)
    with caplog.at_level(logging.WARNING):
        handle.set([api_pod("a")])
        await handle.drain()
    assert drain_updates(config) == [(Op.ADD, ["a"])]
    assert "No space left on device" in caplog.text and "helper bug" in caplog.text


def test_a_damaged_entry_makes_the_list_incomplete(tmp_path):
    # The damaged entry may have been a running pod: trusting the rest as complete would remove it offline.
    PodCheckpoints(str(tmp_path), NODE).sync([api_pod("a"), api_pod("b")])
    damage_flip(entry_path(tmp_path, "a"))
    pods, complete = PodCheckpoints(str(tmp_path), NODE).load()
    assert [podutil.uid(p) for p in pods] == ["b"] and complete is False


@pytest.mark.parametrize("payload", [b"null", b"[]", b'{"node": 7}', b"{not json"])
def test_cache_state_with_wrong_content_is_set_aside_and_the_list_not_trusted(tmp_path, caplog, payload):
    PodCheckpoints(str(tmp_path), NODE).sync([api_pod("a")])
    CheckpointStore(tmp_path / "state", kind="pod-cache-state").write("state", payload)
    with caplog.at_level(logging.WARNING):
        pods, complete = PodCheckpoints(str(tmp_path), NODE).load()
    assert [podutil.uid(p) for p in pods] == ["a"] and not complete
    assert "state.ckpt" in caplog.text and len(list((tmp_path / "state" / "corrupt").iterdir())) == 1
