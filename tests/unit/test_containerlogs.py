"""CRI log parsing, partial-line joining, rotation bookkeeping and log file lookup."""

from __future__ import annotations

import os

import pytest

from edgelet.containerlogs import (
    LogLine,
    LogsError,
    container_log_files,
    files_to_delete,
    find_pod_dir,
    join_partials,
    parse_line,
    rotated_files,
)


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"2026-01-01T00:00:00.000000001Z stdout F hello\n",
         LogLine("2026-01-01T00:00:00.000000001Z", "stdout", False, b"hello")),
        (b"2026-01-01T00:00:00Z stderr P part", LogLine("2026-01-01T00:00:00Z", "stderr", True, b"part")),
        (b"2026-01-01T00:00:00Z stdout F \n", LogLine("2026-01-01T00:00:00Z", "stdout", False, b"")),
        (b"2026-01-01T00:00:00Z stdout F  two  spaces", LogLine("2026-01-01T00:00:00Z", "stdout", False,
                                                               b" two  spaces")),
        (b"garbage", None),
        (b"2026-01-01T00:00:00Z stdin F x", None),
        (b"2026-01-01T00:00:00Z stdout X x", None),
    ],
)
def test_parse_line(raw, expected):
    assert parse_line(raw) == expected


def test_join_partials_per_stream():
    lines = [
        LogLine("t", "stdout", True, b"hel"),
        LogLine("t", "stderr", False, b"oops"),
        LogLine("t", "stdout", True, b"lo "),
        LogLine("t", "stdout", False, b"world"),
        LogLine("t", "stdout", False, b"next"),
    ]
    assert list(join_partials(lines)) == [b"oops\n", b"hello world\n", b"next\n"]


@pytest.mark.parametrize(
    "count, max_files, expected_deleted",
    [(0, 5, 0), (3, 5, 0), (4, 5, 0), (5, 5, 1), (9, 5, 5), (2, 2, 1), (1, 1, 1)],
)
def test_files_to_delete_keeps_max_files_including_the_live_one(count, max_files, expected_deleted):
    rotated = [f"0.log.2026010{i}-000000" for i in range(count)]
    deleted = files_to_delete(rotated, max_files)
    assert len(deleted) == expected_deleted
    assert deleted == rotated[:expected_deleted]  # oldest go first


def test_rotated_files_sorted_oldest_first(tmp_path):
    live = tmp_path / "0.log"
    for name in ("0.log", "0.log.20260102-000000", "0.log.20260101-120000", "0.log.tmp", "1.log.20260101-000000"):
        (tmp_path / name).write_text("x")
    assert [os.path.basename(p) for p in rotated_files(str(live))] == [
        "0.log.20260101-120000", "0.log.20260102-000000"]


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
    with pytest.raises(LogsError, match="one of: a b"):
        container_log_files(str(pod_dir), None, False)
    with pytest.raises(LogsError, match="'c' not found"):
        container_log_files(str(pod_dir), "c", False)
    single = make_pod_dir(tmp_path, "q", uid="u2", restarts=(0,))
    with pytest.raises(LogsError, match="previous terminated container"):
        container_log_files(str(single), None, True)
