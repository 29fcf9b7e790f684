"""The pod config merger (ops per change, order, readiness), inotify record parsing and the manifest scanner."""

from __future__ import annotations

import builtins
import copy
import os
import shutil
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgelet.api import podutil
from edgelet.container.runtime import PodRuntimeStatus
from edgelet.events.model import pod_ref
from edgelet.podconfig import file as file_source
from edgelet.podconfig.config import Op, PodConfig, PodUpdate, merge_source
from edgelet.podconfig.file import RACY_NS, ManifestScanner, is_manifest_name
from edgelet.podconfig.inotify import IN_CREATE, IN_ISDIR, IN_Q_OVERFLOW, InotifyEvent, parse_events
from edgelet.status.generate import generate_pod_status
from edgelet.status.mirror import mirror_pod
from edgelet.status.view import present_pods

NOW = "2024-01-01T00:00:00.000000Z"
LATER = "2024-01-02T00:00:00.000000Z"


def pod(uid: str, name: str | None = None, *, image: str = "busybox:1", **extra) -> dict:
    result = {"metadata": {"uid": uid, "name": name or f"pod-{uid}", "namespace": "default"},
              "spec": {"containers": [{"name": "c", "image": image}]}, "status": {}}
    for key, value in extra.items():
        section, _, field = key.partition("__")
        result[section][field] = value
    return result


def ops(result) -> dict[Op, list[str]]:
    return {op: [podutil.uid(p) for p in pods] for op, pods in result.changes.items()}


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([], [pod("a"), pod("b")], {Op.ADD: ["a", "b"]}),
        ([pod("a")], [pod("a")], {}),
        ([pod("a"), pod("b")], [pod("b")], {Op.REMOVE: ["a"]}),
        ([pod("a")], [pod("a", image="busybox:2")], {Op.UPDATE: ["a"]}),
        ([pod("a")], [pod("a", metadata__labels={"x": "y"})], {Op.UPDATE: ["a"]}),
        ([pod("a")], [pod("a", metadata__annotations={"note": "y"})], {Op.UPDATE: ["a"]}),
        ([pod("a")], [pod("a", metadata__generation=2)], {Op.UPDATE: ["a"]}),
        ([pod("a")], [pod("a", metadata__deletionTimestamp=LATER)], {Op.DELETE: ["a"]}),
        ([pod("a", metadata__deletionTimestamp=LATER)],
         [pod("a", metadata__deletionTimestamp=LATER, metadata__deletionGracePeriodSeconds=0)], {Op.DELETE: ["a"]}),
        ([pod("a")], [pod("a", status__phase="Running")], {Op.RECONCILE: ["a"]}),
        ([pod("a")], [pod("a", metadata__annotations={podutil.CONFIG_SEEN_ANNOTATION: LATER})], {}),
        ([pod("a")], [pod("a", metadata__resourceVersion="99")], {}),
        ([pod("a"), pod("b"), pod("c")], [pod("b", image="x:1"), pod("c", status__phase="Failed"), pod("d")],
         {Op.REMOVE: ["a"], Op.ADD: ["d"], Op.UPDATE: ["b"], Op.RECONCILE: ["c"]}),
    ],
)
def test_merge_ops(before, after, expected):
    existing = merge_source({}, before, "api", now=NOW).state
    result = merge_source(existing, after, "api", now=LATER)
    assert ops(result) == expected
    assert list(result.state) == [podutil.uid(p) for p in after]


def test_updates_come_in_kubelet_order_one_per_op():
    existing = merge_source({}, [pod("a"), pod("b"), pod("c")], "file", now=NOW).state
    result = merge_source(existing, [pod("b", image="x:1"), pod("c", metadata__deletionTimestamp=LATER),
                                     pod("d"), pod("e")], "file", now=LATER)
    updates = result.updates("file")
    assert [u.op for u in updates] == [Op.REMOVE, Op.ADD, Op.UPDATE, Op.DELETE]
    assert [podutil.uid(p) for p in updates[1].pods] == ["d", "e"]
    assert all(u.source == "file" for u in updates)


def test_merge_annotates_copies_and_never_touches_its_input():
    incoming = [pod("a")]
    snapshot = copy.deepcopy(incoming)
    result = merge_source({}, incoming, "file", now=NOW)
    assert incoming == snapshot
    annotations = result.state["a"]["metadata"]["annotations"]
    assert annotations == {podutil.CONFIG_SOURCE_ANNOTATION: "file", podutil.CONFIG_SEEN_ANNOTATION: NOW}


def test_first_seen_time_survives_updates():
    existing = merge_source({}, [pod("a")], "api", now=NOW).state
    updated = merge_source(existing, [pod("a", image="x:2")], "api", now=LATER)
    assert podutil.annotations(updated.state["a"])[podutil.CONFIG_SEEN_ANNOTATION] == NOW


def test_seen_annotation_from_the_source_is_kept_on_add():
    incoming = pod("a", metadata__annotations={podutil.CONFIG_SEEN_ANNOTATION: "2020-01-01T00:00:00Z"})
    result = merge_source({}, [incoming], "file", now=NOW)
    assert podutil.annotations(result.state["a"])[podutil.CONFIG_SEEN_ANNOTATION] == "2020-01-01T00:00:00Z"


def test_unchanged_pods_keep_their_identity():
    existing = merge_source({}, [pod("a")], "api", now=NOW).state
    result = merge_source(existing, [pod("a")], "api", now=LATER)
    assert result.state["a"] is existing["a"]


def test_reconcile_keeps_spec_and_takes_status():
    existing = merge_source({}, [pod("a")], "api", now=NOW).state
    result = merge_source(existing, [pod("a", status__phase="Running")], "api", now=LATER)
    (reconciled,) = result.changes[Op.RECONCILE]
    assert reconciled["status"] == {"phase": "Running"}
    assert podutil.annotations(reconciled)[podutil.CONFIG_SEEN_ANNOTATION] == NOW


@pytest.mark.parametrize(
    ("incoming", "kept", "reason"),
    [
        ([pod("")], [], "has no metadata.uid"),
        ([pod("a"), pod("a", name="other")], ["a"], "duplicates"),
        ([pod("a", name="same"), pod("b", name="same")], ["a"], "duplicates pod same_default"),
    ],
)
def test_invalid_and_duplicate_pods_are_rejected(incoming, kept, reason):
    result = merge_source({}, incoming, "file", now=NOW)
    assert list(result.state) == kept
    assert len(result.rejected) == 1 and reason in result.rejected[0][1]


async def test_pod_config_queues_updates_and_merges_sources():
    config = PodConfig()
    files = config.source("file")
    api = config.source("api")
    files.set([pod("f1")])
    api.set([pod("a1"), pod("a2")])
    assert await config.updates.get() == PodUpdate(Op.ADD, [config.get_pods()[0]], "file")
    update = await config.updates.get()
    assert (update.op, update.source, [podutil.uid(p) for p in update.pods]) == (Op.ADD, "api", ["a1", "a2"])
    assert [podutil.uid(p) for p in config.get_pods()] == ["f1", "a1", "a2"]
    files.set([])
    update = await config.updates.get()
    assert (update.op, [podutil.uid(p) for p in update.pods]) == (Op.REMOVE, ["f1"])
    files.set([])
    assert config.updates.empty()  # nothing changed, nothing sent
    assert [podutil.uid(p) for p in config.get_pods()] == ["a1", "a2"]
    assert "f1" not in {podutil.uid(p) for p in config.get_pods()}


async def test_readiness_needs_every_source():
    config = PodConfig()
    files = config.source("file")
    api = config.source("api")
    assert not config.all_sources_ready()
    files.set([])  # delivering pods is not the same as being ready
    files.mark_ready()
    assert files.ready and not api.ready and not config.all_sources_ready()
    api.mark_ready()
    assert config.all_sources_ready()
    assert config.source("file").ready  # registering again is idempotent
    config.source("http")
    assert not config.all_sources_ready()


def test_static_pods_are_those_of_the_node_s_own_sources_and_ready_without_the_api():
    config = PodConfig()
    files, api = config.source("file"), config.source("api")
    files.set([pod("f1")])
    api.set([pod("a1")])
    assert [podutil.uid(p) for p in config.static_pods()] == ["f1"]
    assert not config.static_pods_ready()
    files.mark_ready()
    assert config.static_pods_ready() and not api.ready  # the API's listing is not waited for
    config.source("http")
    assert not config.static_pods_ready()


async def test_each_source_becoming_ready_wakes_who_waits_for_it():
    config = PodConfig()
    files, api = config.source("file"), config.source("api")
    first = config.source_became_ready
    assert not first.is_set()
    files.mark_ready()
    assert first.is_set()  # one source is enough: the start-up clean-up waits for the sources it needs
    second = config.source_became_ready
    files.mark_ready()  # already ready: nothing new to wake anyone for
    assert not second.is_set() and config.source_became_ready is second
    api.mark_ready()
    assert second.is_set()


def test_unknown_source_is_a_programming_error():
    config = PodConfig()
    handle = config.source("file")
    handle.name = "nope"
    with pytest.raises(KeyError):
        handle.set([])


def test_rejections_are_logged_once(caplog):
    config = PodConfig()
    handle = config.source("file")
    for _ in range(3):
        handle.set([pod("a", name="same"), pod("b", name="same")])
    assert caplog.text.count("ignoring pod same_default") == 1
    handle.set([pod("a", name="same")])
    handle.set([pod("a", name="same"), pod("b", name="same")])
    assert caplog.text.count("ignoring pod same_default") == 2  # it came back after being resolved


def _record(wd: int, mask: int, name: bytes, pad_to: int = 16) -> bytes:
    padded = name + b"\0" * (pad_to - len(name)) if name else b""
    return struct.pack("=iIII", wd, mask, 0, len(padded)) + padded


def test_parse_inotify_events():
    buffer = (_record(1, IN_CREATE, b"web.yaml") + _record(1, IN_CREATE | IN_ISDIR, b"sub")
              + _record(-1, IN_Q_OVERFLOW, b""))
    assert parse_events(buffer) == [InotifyEvent(1, IN_CREATE, 0, "web.yaml"),
                                    InotifyEvent(1, IN_CREATE | IN_ISDIR, 0, "sub"),
                                    InotifyEvent(-1, IN_Q_OVERFLOW, 0, "")]
    assert parse_events(buffer[:-1]) == parse_events(buffer)[:2]  # a cut record is dropped, not misread
    assert parse_events(b"") == []


@pytest.mark.parametrize(
    ("name", "is_manifest"),
    [("web.yaml", True), ("web.json", True), ("pod", True), (".web.yaml", False), ("..data", False),
     ("web.yaml~", False), (".web.yaml.swp", False), ("web.yaml.swp", False), ("#web.yaml#", False),
     ("web.yaml.dpkg-new", False), ("web.yaml.bak", False), ("", False)],
)
def test_manifest_names(name, is_manifest):
    assert is_manifest_name(name) is is_manifest


POD_YAML = "kind: Pod\nmetadata: {name: %s}\nspec: {containers: [{name: c, image: 'busybox:1'}]}\n"


def test_scanner_loads_good_files_and_reports_bad_ones_once(tmp_path):
    (tmp_path / "a.yaml").write_text(POD_YAML % "a")
    (tmp_path / "b.yaml").write_text(POD_YAML % "B")
    (tmp_path / ".hidden.yaml").write_text(POD_YAML % "hidden")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text(POD_YAML % "c")
    scanner = ManifestScanner(str(tmp_path), "n")
    first = scanner.scan()
    assert [p["metadata"]["name"] for p in first.objects.pods] == ["a-n"]
    assert [(e.path, e.key) for e in first.new_errors] == [(str(tmp_path / "b.yaml"), "metadata.name"),
                                                           (str(tmp_path / "sub"), "")]  # said once, not read
    second = scanner.scan()
    assert second.new_errors == [] and second.objects.pods[0] is first.objects.pods[0]  # cached, not re-parsed
    (tmp_path / "b.yaml").write_text(POD_YAML % "B" + "# edited, still wrong\n")
    assert len(scanner.scan().new_errors) == 1  # new content: reported again
    (tmp_path / "b.yaml").write_text(POD_YAML % "b")
    fixed = scanner.scan()
    assert fixed.recovered == [str(tmp_path / "b.yaml")]
    assert sorted(p["metadata"]["name"] for p in fixed.objects.pods) == ["a-n", "b-n"]


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The paths the file source opens."""
    opened: list[str] = []

    def counting_open(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(file_source, "open", counting_open, raising=False)
    return opened


def test_a_rescan_reads_only_the_files_whose_stat_changed(tmp_path, reads):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.yaml").write_text(POD_YAML % name)
    later = os.stat(tmp_path / "c.yaml").st_ctime_ns + RACY_NS + 1
    scanner = ManifestScanner(str(tmp_path), "n", clock=lambda: later)
    first = scanner.scan()
    assert reads == ["a.yaml", "b.yaml", "c.yaml"]
    reads.clear()
    assert scanner.scan().objects == first.objects and reads == []  # nothing changed: nothing read
    (tmp_path / "b.yaml").write_text(POD_YAML % "x")  # the same size
    mtime = os.stat(tmp_path / "a.yaml").st_mtime_ns
    os.utime(tmp_path / "b.yaml", ns=(mtime, mtime))  # and its mtime put back: the ctime still tells
    (tmp_path / "d.yaml").write_text(POD_YAML % "d")
    names = [p["metadata"]["name"] for p in scanner.scan().objects.pods]
    assert reads == ["b.yaml", "d.yaml"] and names == ["a-n", "x-n", "c-n", "d-n"]


def test_a_file_changed_just_before_it_was_read_is_read_again_at_the_next_scan(tmp_path, reads):
    """Within RACY_NS of the read, a second write could leave the same stat on a coarse clock."""
    path = tmp_path / "a.yaml"
    path.write_text(POD_YAML % "a")
    changed = max(os.stat(path).st_mtime_ns, os.stat(path).st_ctime_ns)
    now = [changed + RACY_NS // 2]
    scanner = ManifestScanner(str(tmp_path), "n", clock=lambda: now[0])
    scanner.scan()
    scanner.scan()
    assert reads == ["a.yaml", "a.yaml"]  # racily clean: not trusted
    now[0] = changed + RACY_NS + 1
    scanner.scan()
    scanner.scan()
    scanner.scan()
    assert reads == ["a.yaml"] * 3  # read once more, late enough to vouch; trusted from then on


def test_a_static_pod_is_held_once_and_what_reads_it_leaves_it_as_accepted(tmp_path):
    (tmp_path / "a.yaml").write_text(POD_YAML % "a")
    scanned = ManifestScanner(str(tmp_path), "n").scan().objects.pods
    (accepted,) = merge_source({}, scanned, podutil.SOURCE_FILE, now=NOW).state.values()
    assert accepted is scanned[0]  # the merger keeps the source's pod (its subtrees too), not a copy
    as_accepted = copy.deepcopy(accepted)
    runtime = PodRuntimeStatus(uid=podutil.uid(accepted))
    generate_pod_status(accepted, runtime, old_status=None, now=0.0, host_ip="10.0.0.1")
    mirror_pod(accepted, "n", "node-uid")
    pod_ref(accepted, "c")
    present_pods([accepted], runtime_ready=False, manifest_uids=set())
    assert accepted == as_accepted


def test_a_read_given_the_changed_names_looks_at_those_entries_alone(tmp_path, reads, monkeypatch):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.yaml").write_text(POD_YAML % name)
    later = os.stat(tmp_path / "c.yaml").st_ctime_ns + RACY_NS + 1
    scanner = ManifestScanner(str(tmp_path), "n", clock=lambda: later)
    scanner.read()
    reads.clear()
    stats: list[str] = []

    def counting_stat(path, *args, **kwargs):
        stats.append(os.path.basename(path))
        return real_stat(path, *args, **kwargs)

    real_stat = os.stat
    monkeypatch.setattr(os, "stat", counting_stat)
    (tmp_path / "b.yaml").write_text(POD_YAML % "x")  # the same size
    (tmp_path / "c.yaml").unlink()
    (tmp_path / "d.yaml").write_text(POD_YAML % "d")
    (tmp_path / "e").mkdir()
    result = scanner.read(["b.yaml", "c.yaml", "d.yaml", "e", ".d.yaml.swp"])
    assert sorted(stats) == ["b.yaml", "c.yaml", "d.yaml", "e"] and reads == ["b.yaml", "d.yaml"]
    assert [p["metadata"]["name"] for p in result.objects.pods] == ["a-n", "x-n", "d-n"]
    assert [(e.path, e.message) for e in result.new_errors] == [
        (str(tmp_path / "e"), "not a manifest file: a directory (subdirectories are not read); skipped")]
    stats.clear()
    assert scanner.read().objects == result.objects and "a.yaml" in stats  # a whole rescan lists every entry


def test_a_read_of_the_named_entries_reads_a_named_file_whose_stat_is_as_it_was(tmp_path, reads):
    """A name inotify gave is a write: the file is read even where its stat would vouch for its bytes."""
    path = tmp_path / "a.yaml"
    path.write_text(POD_YAML % "a")
    later = os.stat(path).st_ctime_ns + RACY_NS + 1
    scanner = ManifestScanner(str(tmp_path), "n", clock=lambda: later)
    scanner.read()
    assert scanner.read(["a.yaml"]).objects.pods[0]["metadata"]["name"] == "a-n"
    assert reads == ["a.yaml", "a.yaml"]


_NAMES = ("a.yaml", "b.yaml", "c.yml", "d.json", "e.yaml", ".hidden.yaml", "f.yaml~")
_CONTENTS = (POD_YAML % "a", POD_YAML % "b", POD_YAML % "c", POD_YAML % "d", POD_YAML % "a", POD_YAML % "B",
             "kind: Pod\nmetadata: [", "", "kind: ConfigMap\nmetadata: {name: cm}\ndata: {k: v}\n")
_OPS = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(_NAMES), st.sampled_from(_CONTENTS)),
    st.tuples(st.just("remove"), st.sampled_from(_NAMES), st.none()),
    st.tuples(st.just("rename"), st.sampled_from(_NAMES), st.sampled_from(_NAMES)),
    st.tuples(st.just("mkdir"), st.sampled_from(_NAMES), st.none()),
    st.tuples(st.just("symlink"), st.sampled_from(_NAMES), st.sampled_from(_CONTENTS)),
)


def _apply(directory: str, outside: str, op: tuple) -> list[str]:
    """Does `op` to the directory; the names it touched, as inotify would give them."""
    kind, name, arg = op
    path = os.path.join(directory, name)

    def clear(target: str) -> None:
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)

    if kind == "write":
        if os.path.isdir(path) and not os.path.islink(path):
            return []
        with open(path, "w") as f:  # in place, through a symlink too
            f.write(arg)
    elif kind == "remove":
        clear(path)
    elif kind == "rename":
        if not os.path.lexists(path) or name == arg:
            return []
        clear(os.path.join(directory, arg))
        os.rename(path, os.path.join(directory, arg))
        return [name, arg]
    elif kind == "mkdir":
        clear(path)
        os.mkdir(path)
    else:
        target = os.path.join(outside, f"{len(os.listdir(outside))}.yaml")
        with open(target, "w") as f:
            f.write(arg)
        clear(path)
        os.symlink(target, path)
    return [name]


def _seen(result) -> tuple:
    return ([(p["metadata"]["name"], p["metadata"]["uid"]) for p in result.objects.pods],
            [c["metadata"]["name"] for c in result.objects.configmaps],
            sorted(str(e) for e in result.new_errors), sorted(result.recovered))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_OPS, min_size=2, max_size=16), st.booleans())
def test_reads_of_the_named_entries_agree_with_whole_rescans(ops, trusted):
    """Oracle: a scanner told the names each change touched sees what one that lists everything every time sees,
    the errors it reports once included; with stats old enough to vouch for the files (`trusted`) and without."""
    directory, outside = tempfile.mkdtemp(), tempfile.mkdtemp()
    try:
        clock = (lambda: 2**62) if trusted else None
        options = {"clock": clock} if clock else {}
        whole, named = ManifestScanner(directory, "n", **options), ManifestScanner(directory, "n", **options)
        assert _seen(whole.read()) == _seen(named.read())
        for op in ops:
            touched = _apply(directory, outside, op)
            assert _seen(whole.read()) == _seen(named.read(touched)), op
    finally:
        shutil.rmtree(directory)
        shutil.rmtree(outside)


def test_scanner_missing_directory_and_single_file(tmp_path):
    scanner = ManifestScanner(str(tmp_path / "missing"), "n")
    result = scanner.scan()
    assert result.missing and result.objects.pods == () and result.new_errors == []
    single = tmp_path / "one.yaml"
    single.write_text(POD_YAML % "one")
    result = ManifestScanner(str(single), "n").scan()
    assert [p["metadata"]["name"] for p in result.objects.pods] == ["one-n"]
