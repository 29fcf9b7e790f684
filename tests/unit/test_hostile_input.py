"""Hostile input where it enters: numbers beyond int64, alias bombs, deep nesting, huge values, special files,
duplicate pod names, checkpoints whose checksum is right but whose content is not, absurd config values."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import tracemalloc

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from edgelet import yamlload
from edgelet.api import podutil
from edgelet.api.limits import MAX_DEPTH, _first_problem, document_problem
from edgelet.config import load_config, parse_duration
from edgelet.pod.workers import PodRecords, PodWorkers
from edgelet.podconfig.apiserver import pod_problem
from edgelet.podconfig.file import ManifestScanner
from edgelet.podconfig.manifest import _check_yaml_events, _may_alias_or_nest_deep, parse_manifest
from edgelet.podconfig.validation import validate_pod
from edgelet.status.manager import StatusManager, read_pod_list
from edgelet.util.checkpoint import CheckpointStore
from edgelet.util.errors import ConfigError, cut_long_values
from edgelet.util.tasks import TaskGroup

NODE = "n"
POD_YAML = "kind: Pod\nmetadata: {name: %s}\nspec: {containers: [{name: c, image: 'busybox:1'%s}]}\n"


def pod_yaml(name: str, extra: str = "") -> str:
    return POD_YAML % (name, extra)


def parse(text: str, path: str = "/m/pod.yaml"):
    return parse_manifest(text.encode(), path, NODE)


# -- numbers and depth ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"a": [1, 2**63 - 1, -(2**63)]}, None),
        ({"spec": {"activeDeadlineSeconds": 2**70}}, ("spec.activeDeadlineSeconds", "does not fit in 64 bits")),
        ({"a": [0, {"b": -(2**63) - 1}]}, ("a[1].b", "does not fit in 64 bits")),
        ({"a": float("inf")}, ("a", "out of range")),
        ({"a": float("nan")}, ("a", "out of range")),
        ({"a": 10**5000}, ("a", "2^16609 or more")),  # str() of it would raise
        ({"ok": True, "x": 1.5}, None),
    ],
)
def test_document_problem(document, problem):
    found = document_problem(document)
    if problem is None:
        assert found is None
    else:
        assert found[0] == problem[0] and problem[1] in found[1]


@pytest.mark.parametrize("max_depth", [1, 2, 3])
@pytest.mark.parametrize("document", [
    {}, [], "text", 7, 2**64, float("nan"), True, [[[]]], {"a": {"b": {}}}, {"a": [{"b": [1, {"c": 2**63}]}]},
    {"a": "x", "b": [float("-inf"), 1]}, [{"k": 1.0}, [True, None]],
])
def test_document_problem_at_every_depth_limit(document, max_depth):
    """The quick check and the walk that names the field agree on every document, at every depth limit."""
    assert document_problem(document, max_depth=max_depth) == _first_problem(document, max_depth)


def test_document_problem_depth_is_iterative():
    deep: list = []
    for _ in range(100_000):  # far beyond the interpreter's recursion limit
        deep = [deep]
    path, message = document_problem({"spec": deep})
    assert path.startswith("spec[0][0]") and f"more than {MAX_DEPTH} levels" in message


def test_active_deadline_beyond_int64_names_file_and_field():
    text = pod_yaml("big", "").replace("spec: {", f"spec: {{activeDeadlineSeconds: {2**70}, ")
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert (caught.value.path, caught.value.key) == ("/m/pod.yaml", "spec.activeDeadlineSeconds")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("livenessProbe", {"exec": {"command": ["true"]}, "periodSeconds": 2**31}, "at most 2147483647"),
        ("livenessProbe", {"exec": {"command": ["true"]}, "failureThreshold": 0}, "at least 1"),
    ],
)
def test_int32_fields_are_bounded_like_the_api_server(field, value, message):
    pod = {"metadata": {"name": "p"}, "spec": {"restartPolicy": "Always", "containers": [
        {"name": "c", "image": "i", "imagePullPolicy": "Never", field: value}]}}
    problems = dict(validate_pod(pod))
    key = next(k for k in problems if k.startswith(f"spec.containers[0].{field}"))
    assert message in problems[key]


def test_api_pod_with_huge_number_is_refused_where_it_enters():
    pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u"},
           "spec": {"nodeName": NODE, "containers": [{"name": "c"}], "activeDeadlineSeconds": 2**64 + 1}}
    assert "spec.activeDeadlineSeconds" in pod_problem(pod, NODE)
    pod["spec"]["activeDeadlineSeconds"] = 5
    pod["metadata"]["annotations"] = ["not", "a", "map"]
    assert "metadata.annotations" in pod_problem(pod, NODE)


def test_status_manager_never_raises_on_an_unencodable_pod(tmp_path, caplog):
    manager = StatusManager(str(tmp_path))
    bad = {"metadata": {"uid": "u", "name": "p", "namespace": "d"}, "spec": {"activeDeadlineSeconds": 2**70}}
    with caplog.at_level(logging.ERROR):
        assert manager.set_pod_status(bad, {"phase": "Failed"}) is False
    assert "status not recorded" in caplog.text


# -- YAML, JSON and size limits -------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def test_alias_bomb_is_refused_without_growing_memory():
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="anchors and aliases are not allowed"):
            parse(BOMB, "/m/bomb.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024


@pytest.mark.parametrize("text", [
    "[" * 10_000 + "]" * 10_000,  # JSON
    "{a: " * 10_000 + "1" + "}" * 10_000,  # YAML flow
    "".join(" " * i + "-\n" for i in range(1_500)),  # YAML block
])
def test_deep_nesting_is_one_clear_error(text):
    with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} levels deep") as caught:
        parse(text, "/m/deep.yaml")
    assert caught.value.path == "/m/deep.yaml"


@pytest.mark.parametrize(("text", "walked"), [
    (pod_yaml("plain"), False),  # the common manifest skips the event walk
    (pod_yaml("plain") + "  annotations: {a: 'x && y'}\n", True),  # an '&' anywhere: walked
    ("a: *b\n", True),
    ("[" * 100 + "]" * 100, False),  # nested exactly MAX_DEPTH deep: allowed either way
    ("[" * 101 + "]" * 101, True),
    ("- " * 101 + "x\n", True),  # compact block sequences open a level per '-'
    ("? " * 101 + "x\n", True),
])
def test_the_event_walk_is_skipped_only_where_it_cannot_refuse(text, walked):
    assert _may_alias_or_nest_deep(text) is walked


_nested = st.recursive(
    st.one_of(st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=12,
)


@given(_nested, st.booleans())
def test_a_skipped_walk_would_have_found_nothing(document, flow):
    """With a bound of 3, any document the character count lets through is at most 3 deep."""
    text = yaml.safe_dump(document, default_flow_style=flow)
    if not _may_alias_or_nest_deep(text, max_depth=3):
        depth = deepest = 0
        for event in yaml.parse(text):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        assert deepest <= 3
    _check_yaml_events(yamlload.parse(text), "/m/x.yaml")  # no anchors in a dump of plain data, and shallow


def test_a_bomb_costs_its_own_file_only(tmp_path):
    (tmp_path / "a-bomb.yaml").write_text(BOMB)
    (tmp_path / "b-deep.json").write_text("[" * 10_000 + "]" * 10_000)
    (tmp_path / "c-good.yaml").write_text(pod_yaml("good"))
    result = ManifestScanner(str(tmp_path), NODE).scan()
    assert [p["metadata"]["name"] for p in result.objects.pods] == ["good-n"]
    assert sorted(os.path.basename(e.path) for e in result.new_errors) == ["a-bomb.yaml", "b-deep.json"]


def test_huge_values_are_cut_in_errors():
    with pytest.raises(ConfigError) as caught:
        parse(pod_yaml("'%s'" % ("A" * 1_000_000)))
    message = str(caught.value)
    assert len(message) < 1000 and re.search(r"…\(100000\d bytes\)", message)
    assert cut_long_values("short 'x'") == "short 'x'"


def test_cutting_a_huge_value_needs_no_memory_of_its_size():
    text = "metadata.name: '%s' is not a DNS-1123 subdomain" % ("n" * 1_000_000)
    tracemalloc.start()
    try:
        cut = cut_long_values(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cut.endswith("…(1000002 bytes) is not a DNS-1123 subdomain")
    assert peak < 10 * 1024 * 1024, f"{peak >> 20} MB to cut one 1 MB value"


# -- special files and duplicate names in the manifest directory -----------------------------------

def test_special_files_are_reported_once_and_dot_files_ignored(tmp_path):
    os.mkfifo(tmp_path / "pipe.yaml")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock.yaml"))
    (tmp_path / "dir.yaml").mkdir()
    os.symlink("loop-b.yaml", tmp_path / "loop-a.yaml")
    os.symlink("loop-a.yaml", tmp_path / "loop-b.yaml")
    os.mkfifo(tmp_path / ".hidden-pipe")
    (tmp_path / "web.yaml").write_text(pod_yaml("web"))
    try:
        scanner = ManifestScanner(str(tmp_path), NODE)
        first = scanner.scan()  # must not block on the FIFO
        assert [p["metadata"]["name"] for p in first.objects.pods] == ["web-n"]
        reported = {os.path.basename(e.path): e.message for e in first.new_errors}
        assert set(reported) == {"pipe.yaml", "sock.yaml", "dir.yaml", "loop-a.yaml", "loop-b.yaml"}
        assert "FIFO" in reported["pipe.yaml"] and "socket" in reported["sock.yaml"]
        assert "directory" in reported["dir.yaml"] and "symbolic links" in reported["loop-a.yaml"]
        assert scanner.scan().new_errors == []  # once
    finally:
        listener.close()


def names_by_file(result) -> list[str]:
    return [p["metadata"]["name"] for p in result.objects.pods]


def test_same_pod_name_in_two_files_first_file_wins_and_is_reported_once(tmp_path):
    (tmp_path / "a.yaml").write_text(pod_yaml("web"))
    (tmp_path / "b.yaml").write_text(pod_yaml("web", ", command: [sleep, '1']"))
    scanner = ManifestScanner(str(tmp_path), NODE)
    first = scanner.scan()
    (winner,) = first.objects.pods
    assert winner["spec"]["containers"][0].get("command") is None
    (note,) = first.new_errors
    assert note.path == str(tmp_path / "b.yaml") and str(tmp_path / "a.yaml") in note.message
    assert scanner.scan().new_errors == []


def test_an_earlier_named_file_appearing_later_never_replaces_the_running_pod(tmp_path):
    (tmp_path / "m.yaml").write_text(pod_yaml("web"))
    scanner = ManifestScanner(str(tmp_path), NODE)
    (running,) = scanner.scan().objects.pods
    (tmp_path / "a.yaml").write_text(pod_yaml("web", ", command: [sleep, '1']"))
    later = scanner.scan()
    assert [podutil.uid(p) for p in later.objects.pods] == [podutil.uid(running)]
    assert [e.path for e in later.new_errors] == [str(tmp_path / "a.yaml")]
    # The owner is edited: it stays the owner (its pod is replaced by its own new version, not by a.yaml's).
    (tmp_path / "m.yaml").write_text(pod_yaml("web", ", args: ['edited']"))
    (edited,) = scanner.scan().objects.pods
    assert edited["spec"]["containers"][0]["args"] == ["edited"]
    # The owner is edited into an invalid state: it still holds the name, the other file does not step in.
    (tmp_path / "m.yaml").write_text("kind: Pod\nmetadata: {name: web\n")
    broken = scanner.scan()
    assert broken.objects.pods == ()
    # The owner goes away: now the other file's pod is the one.
    (tmp_path / "m.yaml").unlink()
    (successor,) = scanner.scan().objects.pods
    assert successor["spec"]["containers"][0]["command"] == ["sleep", "1"]


def test_after_a_restart_the_pod_the_last_run_ran_keeps_its_name(tmp_path):
    (tmp_path / "m.yaml").write_text(pod_yaml("web"))
    (running,) = ManifestScanner(str(tmp_path), NODE).scan().objects.pods
    (tmp_path / "a.yaml").write_text(pod_yaml("web", ", command: [sleep, '1']"))
    restarted = ManifestScanner(str(tmp_path), NODE, incumbent_uids=lambda: {podutil.uid(running)})
    assert [podutil.uid(p) for p in restarted.scan().objects.pods] == [podutil.uid(running)]
    fresh = ManifestScanner(str(tmp_path), NODE)  # no history: the first file by name, deterministically
    assert [p["spec"]["containers"][0].get("command") for p in fresh.scan().objects.pods] == [["sleep", "1"]]


# -- checkpoints with a valid checksum and wrong content ------------------------------------------

@pytest.mark.parametrize("payload", [b"null", b"[]", b'{"metadata": null}', b'{"metadata": {"uid": 7}}',
                                     b'{"metadata": {"uid": "u"}, "spec": {}, "status": "Running"}'])
def test_status_checkpoint_with_wrong_content_is_set_aside_like_damage(tmp_path, caplog, payload):
    good = StatusManager(str(tmp_path))
    good.set_pod_status({"metadata": {"uid": "ok", "name": "p"}, "spec": {}}, {"phase": "Running"})
    good.flush()
    CheckpointStore(str(tmp_path), kind="pod-status").write("bad", payload)
    with caplog.at_level(logging.WARNING):
        manager = StatusManager(str(tmp_path))
        manager.load()
    assert manager.known_uids() == {"ok"}
    assert [r for r in caplog.records if "bad.ckpt" in r.getMessage() and "corrupt" in r.getMessage()]
    (aside,) = (tmp_path / "corrupt").iterdir()
    assert aside.name.startswith("bad.ckpt")
    assert [p["metadata"]["uid"] for p in read_pod_list(str(tmp_path))["items"]] == ["ok"]


@pytest.mark.parametrize("payload", [b"null", b'{"kind": "Secret", "metadata": {"name": "s"}, "data": {"k": 5}}'])
def test_object_cache_entry_with_wrong_content_is_set_aside(tmp_path, payload):
    from edgelet.api.objectstore import ObjectStore
    from edgelet.kubeapi.objects import ObjectSyncer

    CheckpointStore(str(tmp_path), kind="object").write("Secret/default/s", payload)
    store = ObjectStore()
    assert ObjectSyncer(None, store, str(tmp_path)).load() == 0
    assert store.objects() == [] and len(list((tmp_path / "corrupt").iterdir())) == 1


# -- the agent's own resilience: crashed tasks, repeated failures -----------------------------------

async def test_a_crashed_task_fails_health_and_calls_back():
    crashes = []
    group = TaskGroup(on_crash=lambda name, exc: crashes.append(name))
    assert group.health() == (True, "ok")

    async def boom():
        raise TypeError("Integer exceeds 64-bit range")

    group.start("sync-loop", boom())
    await asyncio.sleep(0.01)
    healthy, message = group.health()
    assert not healthy and "sync-loop" in message and "64-bit" in message
    assert crashes == ["sync-loop"]


async def test_a_pod_failing_the_same_way_is_logged_once(caplog):
    class Failing:
        calls = 0

        async def sync_pod(self, record):
            self.calls += 1
            raise TypeError("Integer exceeds 64-bit range")

        async def terminate_pod(self, record, grace):
            return None

        async def on_terminated(self, record):
            return False

    clock = [0.0]
    lifecycle = Failing()
    workers = PodWorkers(PodRecords(), lifecycle, clock=lambda: clock[0])
    pod = {"metadata": {"uid": "u", "name": "p", "namespace": "d"}}
    with caplog.at_level(logging.ERROR):
        for _ in range(4):
            workers.update(pod)
            await workers.wait_idle()
    assert lifecycle.calls == 4
    assert len([r for r in caplog.records if "error syncing pod" in r.getMessage()]) == 1


# -- the config file --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("toml", "key", "fragment"),
    [
        ('root_dir = ""', "root_dir", "must not be empty"),
        ('root_dir = "/var/lib/x\\u0000y"', "root_dir", "NUL"),
        ('[pods]\nmanifest_dir = "/etc/m\\u0000"', "pods.manifest_dir", "NUL"),
        ('[sync]\nsync_frequency = "99999999999999999999h"', "sync.sync_frequency", "out of range"),
        ('[sync]\nsync_frequency = "1' + "0" * 5000 + 's"', "sync.sync_frequency", "is not a duration"),
        ("max_pods = 99999999999999999999", "max_pods", "does not fit in 64 bits"),
        ("max_pods = 99999", "max_pods", "between 1 and 10000"),
        ("[gc]\nmax_containers = 9999999999999", "gc.max_containers", "at most 2147483647"),
        ("x = " + "[" * 5000 + "]" * 5000, "", "nested more than"),
        ("max_pods = 1" + "0" * 5000, "", "out of range"),  # beyond Python's int-from-text limit
        (".".join(["a"] * 10_000) + " = 1", "",
         "more than 64 dot-separated parts in one key or value (line 2)"),  # quadratic in tomllib
        ("[" + ".".join(['"a"'] * 100) + "]", "", "more than 64 dot-separated parts"),
    ],
)
def test_absurd_config_values_name_the_key(tmp_path, toml, key, fragment):
    path = tmp_path / "edgelet.toml"
    path.write_text('node_name = "n"\n' + toml + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (caught.value.path, caught.value.key) == (str(path), key)
    assert fragment in caught.value.message


def test_oversized_config_file_names_the_limit(tmp_path):
    path = tmp_path / "edgelet.toml"
    path.write_text("# " + "x" * (2 * 1024 * 1024))
    with pytest.raises(ConfigError, match="bytes allowed"):
        load_config(path)


def test_duration_at_the_int64_bound():
    assert parse_duration("2562047h") == 2562047 * 3600.0
    with pytest.raises(ValueError, match="out of range"):
        parse_duration("2562048h")



def test_root_lock_names_root_dir_and_holder(tmp_path):
    from edgelet.util.rootlock import RootDirLocked, RootLock

    first, second = RootLock(str(tmp_path)), RootLock(str(tmp_path))
    first.acquire()
    with pytest.raises(RootDirLocked) as caught:
        second.acquire()
    assert str(tmp_path) in str(caught.value) and f"PID {os.getpid()}" in str(caught.value)
    first.release()
    second.acquire()  # released: the next agent takes it
    second.release()


def test_a_file_where_a_checkpoint_directory_belongs_is_set_aside(tmp_path, caplog):
    (tmp_path / "pods").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        store = CheckpointStore(tmp_path / "pods", kind="pod-status")
    store.write("a", b"{}")
    assert store.read("a") == b"{}"
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("pods.corrupt-")]
    assert aside.read_bytes() == b"garbage" and "was not a directory" in caplog.text
