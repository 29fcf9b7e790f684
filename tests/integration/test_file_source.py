"""The file source on a real directory: inotify events, debounced bursts, broken files, a directory coming and going."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time

from edgelet.api import podutil
from edgelet.podconfig import file as file_source
from edgelet.podconfig.config import Op, PodConfig
from edgelet.podconfig.file import FileSource, ManifestScanner, ParsedManifests
from edgelet.util import checkpoint
from tests.helpers import eventually

NODE = "node1"
WAIT = 10.0  # generous upper bound for an event to arrive; nothing asserts how fast it is
NEVER = 3600.0  # a rescan period long enough that only inotify can explain a change

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: app
    image: busybox:{tag}
"""


def write_atomically(directory, name: str, text: str) -> None:
    """Write like kubectl, editors and config management do: a temp file renamed into place."""
    temp = os.path.join(directory, f".{name}.tmp")
    with open(temp, "w") as file:
        file.write(text)
    os.rename(temp, os.path.join(directory, name))


def pod_yaml(name: str, tag: str = "1") -> str:
    return POD.format(name=name, tag=tag)


@contextlib.asynccontextmanager
async def running(manifest_dir, *, check_frequency=NEVER, **kwargs):
    config = PodConfig()
    source = FileSource(str(manifest_dir), NODE, config.source("file"), check_frequency=check_frequency, **kwargs)
    task = asyncio.create_task(source.run(), name="file-source")
    try:
        yield config, source
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_for_pods(config: PodConfig, names: set[str]) -> list:
    """Drain updates until the merged pods have exactly these names; returns the updates seen meanwhile."""
    seen = []

    async def until_match() -> None:
        while {podutil.name(p) for p in config.get_pods()} != names:
            seen.append(await config.updates.get())

    await asyncio.wait_for(until_match(), WAIT)
    return seen


async def wait_ready(config) -> None:
    """Until every source registered with the pod config gave its first full view."""
    while not config.all_sources_ready():
        await config.source_became_ready.wait()


async def test_initial_pods_then_add_change_and_delete(tmp_path):
    write_atomically(tmp_path, "web.yaml", pod_yaml("web"))
    async with running(tmp_path) as (config, _):
        await wait_for_pods(config, {"web-node1"})
        await wait_ready(config)
        old_uid = podutil.uid(config.get_pods()[0])

        write_atomically(tmp_path, "db.yaml", pod_yaml("db"))
        updates = await wait_for_pods(config, {"web-node1", "db-node1"})
        assert [u.op for u in updates] == [Op.ADD]

        write_atomically(tmp_path, "web.yaml", pod_yaml("web", tag="2"))  # an edit gives a new uid
        await eventually(lambda: all(podutil.uid(p) != old_uid for p in config.get_pods()), WAIT)
        web = next(p for p in config.get_pods() if podutil.name(p) == "web-node1")
        assert web["spec"]["containers"][0]["image"] == "busybox:2"

        os.unlink(tmp_path / "db.yaml")
        updates = await wait_for_pods(config, {"web-node1"})
        assert updates[-1].op == Op.REMOVE and podutil.name(updates[-1].pods[0]) == "db-node1"


async def test_a_configmap_volume_as_the_manifest_directory_is_followed_through_its_swaps(tmp_path, monkeypatch):
    """A ConfigMap volume changes its files through symlinks: `web.yaml -> ..data/web.yaml`, and an update renames a
    new `..data` over the old one. No event names web.yaml; the source looks at every entry again."""
    monkeypatch.setattr(file_source, "RACY_NS", 0)  # every stat vouches for its file: only a new stat is a change

    def publish(version: str, tag: str) -> None:
        os.mkdir(tmp_path / version)
        (tmp_path / version / "web.yaml").write_text(pod_yaml("web", tag=tag))
        os.symlink(version, tmp_path / "..data_tmp")
        os.rename(tmp_path / "..data_tmp", tmp_path / "..data")

    publish("..2024_01", "1")
    os.symlink("..data/web.yaml", tmp_path / "web.yaml")
    async with running(tmp_path) as (config, _):
        await wait_for_pods(config, {"web-node1"})
        publish("..2024_02", "2")
        await eventually(lambda: config.get_pods()[0]["spec"]["containers"][0]["image"] == "busybox:2", WAIT)


async def test_in_place_write_is_noticed(tmp_path):
    async with running(tmp_path) as (config, _):
        await wait_ready(config)
        with open(tmp_path / "web.yaml", "w") as file:  # create + write + close: IN_CREATE then IN_CLOSE_WRITE
            file.write(pod_yaml("web"))
        await wait_for_pods(config, {"web-node1"})


async def test_a_burst_of_files_is_scanned_a_few_times_not_once_per_file(tmp_path):
    staging = tmp_path / "staging"
    manifests = tmp_path / "manifests"
    staging.mkdir()
    manifests.mkdir()
    names = {f"pod{i:03d}-node1" for i in range(110)}
    for i in range(110):
        (staging / f"pod{i:03d}.yaml").write_text(pod_yaml(f"pod{i:03d}"))
    async with running(manifests) as (config, source):
        await wait_ready(config)
        scans_before = source.scan_count

        def move_all() -> None:
            # From another thread, as a deploy tool would, a little apart: the loop sees the events trickle in.
            for i in range(110):
                os.rename(staging / f"pod{i:03d}.yaml", manifests / f"pod{i:03d}.yaml")
                time.sleep(0.001)

        await asyncio.to_thread(move_all)
        updates = await wait_for_pods(config, names)
        assert sum(len(u.pods) for u in updates if u.op == Op.ADD) == 110
        assert source.scan_count - scans_before < 10, "events were not debounced"


async def test_broken_file_is_reported_once_and_the_rest_proceeds(tmp_path, caplog):
    write_atomically(tmp_path, "good.yaml", pod_yaml("good"))
    write_atomically(tmp_path, "broken.yaml", pod_yaml("broken").replace("busybox:1", "''"))
    errors = []
    with caplog.at_level(logging.WARNING, logger="edgelet.podconfig.file"):
        async with running(tmp_path, check_frequency=0.02, on_error=errors.append) as (config, source):
            await wait_for_pods(config, {"good-node1"})
            await eventually(lambda: source.scan_count >= 10, WAIT)  # many rescans of the same broken file
            assert len(errors) == 1
            assert (errors[0].path, errors[0].key) == (str(tmp_path / "broken.yaml"), "spec.containers[0].image")
            warnings = [r.getMessage() for r in caplog.records if "broken.yaml" in r.getMessage()]
            assert len(warnings) == 1 and "spec.containers[0].image: is required" in warnings[0]

            write_atomically(tmp_path, "broken.yaml", pod_yaml("broken"))  # fixed
            await wait_for_pods(config, {"good-node1", "broken-node1"})
            assert len(errors) == 1


async def test_ignored_files_make_no_pods(tmp_path):
    async with running(tmp_path) as (config, _):
        await wait_ready(config)
        for name in (".web.yaml", "web.yaml~", ".web.yaml.swp", "web.yaml.dpkg-new"):
            (tmp_path / name).write_text(pod_yaml(name.strip(".~").split(".")[0] + "x"))
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "nested.yaml").write_text(pod_yaml("nested"))
        write_atomically(tmp_path, "real.yaml", pod_yaml("real"))
        await wait_for_pods(config, {"real-node1"})
        await asyncio.sleep(0.2)  # give stray events time to (wrongly) add something
        assert {podutil.name(p) for p in config.get_pods()} == {"real-node1"}


async def test_missing_directory_is_waited_for_quietly(tmp_path, caplog):
    manifests = tmp_path / "etc" / "edgelet" / "manifests"
    with caplog.at_level(logging.INFO, logger="edgelet.podconfig"):
        async with running(manifests) as (config, _):
            await wait_ready(config)  # ready with no pods, as the kubelet is
            assert config.get_pods() == []
            manifests.mkdir(parents=True)
            write_atomically(manifests, "web.yaml", pod_yaml("web"))
            await wait_for_pods(config, {"web-node1"})

            shutil.rmtree(manifests)  # the directory goes away: its pods go with it
            await wait_for_pods(config, set())
            manifests.mkdir()
            write_atomically(manifests, "db.yaml", pod_yaml("db"))
            await wait_for_pods(config, {"db-node1"})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert caplog.text.count("does not exist yet") == 2


async def test_directory_moved_away_and_back(tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_atomically(manifests, "web.yaml", pod_yaml("web"))
    async with running(manifests) as (config, _):
        await wait_for_pods(config, {"web-node1"})
        os.rename(manifests, tmp_path / "parked")
        await wait_for_pods(config, set())
        write_atomically(tmp_path / "parked", "db.yaml", pod_yaml("db"))  # the old watch must not react
        os.rename(tmp_path / "parked", manifests)
        await wait_for_pods(config, {"web-node1", "db-node1"})


async def test_polling_without_inotify(tmp_path):
    async with running(tmp_path, check_frequency=0.05, use_inotify=False) as (config, _):
        await wait_ready(config)
        write_atomically(tmp_path, "web.yaml", pod_yaml("web"))
        await wait_for_pods(config, {"web-node1"})


async def test_single_manifest_file(tmp_path):
    path = tmp_path / "web.yaml"
    async with running(path) as (config, _):
        await wait_ready(config)
        write_atomically(tmp_path, "web.yaml", pod_yaml("web"))
        await wait_for_pods(config, {"web-node1"})
        write_atomically(tmp_path, "other.yaml", pod_yaml("other"))  # not the file we serve
        write_atomically(tmp_path, "web.yaml", pod_yaml("web2"))
        await wait_for_pods(config, {"web2-node1"})


async def test_configmaps_and_secrets_are_exposed(tmp_path):
    write_atomically(tmp_path, "web.yaml", pod_yaml("web") + """\
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data: {index.html: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret}
stringData: {token: abc}
""")
    handed_over = []

    def on_objects(objects: list) -> None:
        if not handed_over:
            assert config.get_pods() == [], "objects must arrive before the pods that use them"
        handed_over.append([(o["kind"], o["metadata"]["name"]) for o in objects])

    async with running(tmp_path, on_objects=on_objects) as (config, source):
        await wait_for_pods(config, {"web-node1"})
        assert [c["metadata"]["name"] for c in source.objects.configmaps] == ["web-config"]
        assert [s["metadata"]["name"] for s in source.objects.secrets] == ["web-secret"]
        assert handed_over == [[("ConfigMap", "web-config"), ("Secret", "web-secret")]]

        write_atomically(tmp_path, "db.yaml", pod_yaml("db"))  # pods change, objects do not: no call
        await wait_for_pods(config, {"web-node1", "db-node1"})
        write_atomically(tmp_path, "extra.yaml", "kind: ConfigMap\nmetadata: {name: extra}\n")
        await eventually(lambda: len(handed_over) == 2, WAIT)
        assert ("ConfigMap", "extra") in handed_over[1]


def parsed_record(state):
    return state / checkpoint.key_to_filename("parsed")


async def test_what_was_parsed_is_recorded_once_the_manifests_are_quiet(tmp_path):
    """The record of parsed manifests only speeds up the next start: it is not written beside the starts of the
    pods just handed on, but once no change came for `record_quiet`, and a stream of changes writes it once."""
    manifests, state = tmp_path / "manifests", tmp_path / "state"
    manifests.mkdir()
    async with running(manifests, parsed_dir=str(state), record_quiet=0.5) as (config, _):
        await wait_ready(config)
        for i in range(4):  # closer together than record_quiet
            write_atomically(manifests, f"pod{i}.yaml", pod_yaml(f"pod{i}"))
            await wait_for_pods(config, {f"pod{j}-node1" for j in range(i + 1)})
            assert not parsed_record(state).exists()
            await asyncio.sleep(0.1)
        await eventually(parsed_record(state).exists, WAIT)
    restarted = ManifestScanner(str(manifests), NODE, parsed=ParsedManifests(str(state), NODE))
    assert not restarted.record_pending(restarted.read())  # all four are in it


async def test_a_source_stopped_before_the_quiet_records_what_it_parsed(tmp_path):
    manifests, state = tmp_path / "manifests", tmp_path / "state"
    manifests.mkdir()
    write_atomically(manifests, "web.yaml", pod_yaml("web"))
    async with running(manifests, parsed_dir=str(state), record_quiet=NEVER) as (config, _):
        await wait_for_pods(config, {"web-node1"})
        assert not parsed_record(state).exists()
    assert parsed_record(state).exists()
