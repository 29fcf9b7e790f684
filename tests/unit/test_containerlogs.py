"""CRI log parsing, partial-line joining and selection (shared by `edgelet logs` and the kubelet API),
rotation bookkeeping and log file lookup."""

from __future__ import annotations

import gzip
import os

import pytest

from edgelet.api.kubetime import parse_rfc3339_ns
from edgelet.logs.reader import (
    DEFAULT_CONTAINER_ANNOTATION,
    LineJoiner,
    LogsError,
    choose_containers,
    container_log_files,
    find_pod_dir,
    instance_ended,
    render,
    select,
    split_line,
)
from edgelet.logs.rotation import compress, open_log_file, plan_rotation, rotated_files


@pytest.mark.parametrize("raw, parts", [
    (b"2026-01-01T00:00:00.000000001Z stdout F hello\n",
     (b"2026-01-01T00:00:00.000000001Z", b"stdout", False, b"hello")),
    (b"t stderr P part", (b"t", b"stderr", True, b"part")),
    (b"t stdout F \n", (b"t", b"stdout", False, b"")),
    (b"t stdout F\n", (b"t", b"stdout", False, b"")),
    (b"t stdout F  two  spaces", (b"t", b"stdout", False, b" two  spaces")),
    (b"t stdout F:x tagged", (b"t", b"stdout", False, b"tagged")),
    (b"garbage", None),
    (b"t stdin F x", None),
    (b"t stdout X x", None),
])
def test_split_line(raw, parts):
    assert split_line(raw) == parts


def test_joiner_joins_per_stream_and_stamps_a_message_with_its_first_piece():
    joiner = LineJoiner()
    out = list(joiner.feed([b"t1 stdout P hel", b"t2 stderr F oops", b"not a line", b"t3 stdout P lo "]))
    out += list(joiner.feed([b"t4 stdout F world\n", b"t5 stdout F next"]))  # a later read (or file) ends it
    assert out == [(b"t2", b"oops\n"), (b"t1", b"hello world\n"), (b"t5", b"next\n")]


@pytest.mark.parametrize("lines, expected", [
    # A process whose last write had no newline (`cat` of a file without one): its text, without a newline.
    ([b"t1 stdout P done"], [(b"t1", b"done")]),
    ([b"t1 stdout P a", b"t2 stdout P b"], [(b"t1", b"ab")]),
    ([b"t1 stdout F whole\n", b"t2 stderr P half"], [(b"t1", b"whole\n"), (b"t2", b"half")]),
    ([b"t1 stdout F whole\n"], [(b"t1", b"whole\n")]),
    ([], []),
])
def test_a_log_read_to_its_end_keeps_the_line_no_f_line_finished(lines, expected):
    joiner = LineJoiner()
    assert list(joiner.read_all(lines)) == expected
    assert list(joiner.flush()) == []  # flushed once


def test_render():
    entry = (b"2026-01-01T00:00:00Z", b"hi\n")
    assert render(entry, False) == b"hi\n"
    assert render(entry, True) == b"2026-01-01T00:00:00Z hi\n"


def _stamped(day: int, gz: bool = False) -> str:
    return f"0.log.202601{day:02d}-000000" + (".gz" if gz else "")


@pytest.mark.parametrize(
    "siblings, max_files, deleted, gzipped",
    [
        # nothing rotated yet
        ([], 5, [], []),
        # the newest rotated file is plain; at the next rotation it is gzipped
        ([_stamped(1)], 5, [], [_stamped(1)]),
        ([_stamped(1, gz=True), _stamped(2)], 5, [], [_stamped(2)]),
        # max_files 5: the live file, the one rotated now and 3 older ones
        ([_stamped(d, gz=True) for d in (1, 2, 3)] + [_stamped(4)], 5, [_stamped(1, gz=True)], [_stamped(4)]),
        ([_stamped(d, gz=True) for d in range(1, 9)], 5, [_stamped(d, gz=True) for d in range(1, 6)], []),
        # max_files 2: only the live file and the one rotated now
        ([_stamped(1)], 2, [_stamped(1)], []),
        # left over by a crash mid-compression: the temporary file goes, the plain file stays and is gzipped
        ([_stamped(1), _stamped(1, gz=True) + ".tmp"], 5, [_stamped(1, gz=True) + ".tmp"], [_stamped(1)]),
        # gzipped but not yet removed: the plain copy goes
        ([_stamped(1), _stamped(1, gz=True)], 5, [_stamped(1)], []),
        # other files beside the log are not ours
        (["0.log.tmp", "0.log.old"], 5, [], []),
    ],
)
def test_plan_rotation_as_the_kubelet(siblings, max_files, deleted, gzipped):
    assert plan_rotation(siblings, max_files) == (deleted, gzipped)


def test_rotated_files_sorted_oldest_first(tmp_path):
    live = tmp_path / "0.log"
    for name in ("0.log", "0.log.20260102-000000", "0.log.20260101-120000.gz", "0.log.20260101-000000.gz.tmp",
                 "0.log.tmp", "1.log.20260101-000000", "0.log.20260102-000000.500"):
        (tmp_path / name).write_text("x")
    assert [os.path.basename(p) for p in rotated_files(str(live))] == [
        "0.log.20260101-120000.gz", "0.log.20260102-000000", "0.log.20260102-000000.500"]


def test_compress_then_read_back(tmp_path):
    rotated = tmp_path / "0.log.20260101-000000"
    rotated.write_bytes(b"2026-01-01T00:00:00Z stdout F one\n2026-01-01T00:00:01Z stdout F two\n")
    with open_log_file(str(rotated)) as plain:
        before = list(plain)
    compress(str(rotated))
    assert not rotated.exists() and not (tmp_path / "0.log.20260101-000000.gz.tmp").exists()
    assert gzip.decompress((tmp_path / "0.log.20260101-000000.gz").read_bytes()).splitlines(keepends=True) == before
    # a reader that listed the plain name before compression reads the .gz
    with open_log_file(str(rotated)) as reread:
        assert list(reread) == before


def make_pod_dir(root, name, uid="u1", containers=("main",), restarts=(0,)):
    pod_dir = root / f"default_{name}_{uid}"
    for container in containers:
        (pod_dir / container).mkdir(parents=True)
        for restart in restarts:
            (pod_dir / container / f"{restart}.log").write_text("")
    return pod_dir


def test_find_pod_dir_accepts_static_name_without_node_suffix(tmp_path):
    pod_dir = make_pod_dir(tmp_path, "web-node1")
    assert find_pod_dir(str(tmp_path), None, "web", "node1") == str(pod_dir)
    assert find_pod_dir(str(tmp_path), "default", "web-node1", "node1") == str(pod_dir)
    with pytest.raises(LogsError, match="not found in namespace kube-system"):
        find_pod_dir(str(tmp_path), "kube-system", "web", "node1")
    with pytest.raises(LogsError, match="'nope' not found"):
        find_pod_dir(str(tmp_path), None, "nope", "node1")


def test_container_log_files_current_previous_and_choice(tmp_path):
    pod_dir = make_pod_dir(tmp_path, "p", containers=("a", "b"), restarts=(0, 1, 2))
    (pod_dir / "a" / "2.log.20260101-000000").write_text("")
    assert [os.path.basename(p) for p in container_log_files(str(pod_dir), "a", False)] == [
        "2.log.20260101-000000", "2.log"]
    assert [os.path.basename(p) for p in container_log_files(str(pod_dir), "a", True)] == ["1.log"]
    with pytest.raises(LogsError, match="'c' has no logs yet \\(containers with logs: a b\\)"):
        container_log_files(str(pod_dir), "c", False)
    single = make_pod_dir(tmp_path, "q", uid="u2", restarts=(0,))
    with pytest.raises(LogsError, match="previous terminated container"):
        container_log_files(str(single), "main", True)


def _spec_pod(containers, init=(), annotation=None, ephemeral=()):
    meta = {"annotations": {DEFAULT_CONTAINER_ANNOTATION: annotation}} if annotation else {}
    return {"metadata": meta, "spec": {"containers": [{"name": n} for n in containers],
                                       "initContainers": [{"name": n} for n in init],
                                       "ephemeralContainers": [{"name": n} for n in ephemeral]}}


@pytest.mark.parametrize(
    ("pod", "container", "all_containers", "expected", "note"),
    [
        (_spec_pod(["app"]), None, False, ["app"], ""),
        (_spec_pod(["app", "side"]), None, False, ["app"], 'Defaulted container "app" out of: app, side'),
        (_spec_pod(["app", "side"], init=["setup"]), None, False, ["app"],
         'Defaulted container "app" out of: app, side, setup (init)'),
        (_spec_pod(["app", "side"], annotation="side"), None, False, ["side"],
         'Defaulted container "side" out of: app, side'),
        (_spec_pod(["app", "side"], annotation="nope"), None, False, ["app"],
         'Defaulted container "app" out of: app, side'),
        (_spec_pod(["app", "side"]), "side", False, ["side"], ""),
        (_spec_pod(["app"], init=["setup"], ephemeral=["debug"]), None, False, ["app"],
         'Defaulted container "app" out of: app, setup (init), debug (ephem)'),
        (_spec_pod(["app"], init=["setup"], ephemeral=["debug"]), "debug", False, ["debug"], ""),
        (_spec_pod(["app", "side"], init=["setup"], ephemeral=["debug"]), None, True,
         ["setup", "app", "side", "debug"], ""),
        (_spec_pod(["app", "side"], init=["setup"]), None, True, ["setup", "app", "side"], ""),
        (None, None, False, ["main"], ""),  # the status is gone: the single log directory tells
    ],
)
def test_choose_containers_defaults_like_kubectl(pod, container, all_containers, expected, note):
    on_disk = ["app", "side", "setup", "debug"] if pod is not None else ["main"]
    assert choose_containers(pod, on_disk, container, all_containers=all_containers) == (expected, note)


def test_choose_containers_refuses_an_unknown_or_ambiguous_container():
    with pytest.raises(LogsError, match="'db' not found, one of: app side"):
        choose_containers(_spec_pod(["app", "side"]), ["app"], "db", all_containers=False)
    with pytest.raises(LogsError, match="must be given with -c, one of: a b"):
        choose_containers(None, ["b", "a"], None, all_containers=False)


LINES = [
    b"2026-01-01T00:00:01.000000001Z stdout F one",
    b"2026-01-01T00:00:02Z stdout P t",
    b"2026-01-01T00:00:03+00:00 stdout F wo",
    b"2026-01-01T00:00:04Z stderr F three",
]


@pytest.mark.parametrize(
    ("since", "tail", "timestamps", "expected"),
    [
        (None, None, False, [b"one\n", b"two\n", b"three\n"]),
        (None, 2, False, [b"two\n", b"three\n"]),
        (None, 0, False, []),
        (None, 50, False, [b"one\n", b"two\n", b"three\n"]),
        ("2026-01-01T00:00:01.000000001Z", None, False, [b"one\n", b"two\n", b"three\n"]),
        ("2026-01-01T00:00:01.000000002Z", None, False, [b"two\n", b"three\n"]),  # nanoseconds count
        ("2026-01-01T00:00:02.5Z", None, False, [b"three\n"]),
        ("2026-01-01T00:00:02Z", 1, False, [b"three\n"]),  # since first, then the tail
        (None, 2, True, [b"2026-01-01T00:00:02Z two\n", b"2026-01-01T00:00:04Z three\n"]),
    ],
)
def test_select_since_tail_and_timestamps(since, tail, timestamps, expected):
    since_ns = parse_rfc3339_ns(since) if since else None
    selected = select(LineJoiner().feed(LINES), since_ns=since_ns, tail=tail)
    assert [render(entry, timestamps) for entry in selected] == expected


@pytest.mark.parametrize(
    ("state", "restart_count", "followed", "ended"),
    [
        ({"running": {}}, 0, 0, False),
        ({"waiting": {"reason": "ContainerCreating"}}, 0, 0, False),
        ({"terminated": {"exitCode": 0}}, 0, 0, True),
        ({"running": {}}, 1, 0, True),  # restarted since: the followed instance ended
        ({"waiting": {"reason": "CrashLoopBackOff"}}, 1, 1, True),  # instance 1 ended, waits to restart
        ({"waiting": {}}, 1, 1, False),  # instance 1 created, not started yet
    ],
)
def test_instance_ended(state, restart_count, followed, ended):
    pod = {"status": {"containerStatuses": [{"name": "main", "restartCount": restart_count, "state": state}]}}
    assert instance_ended(pod, "main", followed) is ended
    assert instance_ended(pod, "other", followed) is False
