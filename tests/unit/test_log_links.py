"""The collectors' links in /var/log/containers and the move of logs from root_dir: names, choices, file trees."""

from __future__ import annotations

import os

import pytest

from edgelet.kuberuntime.loglinks import container_id_of, dead_links_to_remove, link_name
from edgelet.kuberuntime.logmigration import _copy_tree, _rename_tree, moved_path, rotated_name

CID = "0123456789abcdef" * 4


@pytest.mark.parametrize("pod, namespace, container, cid, expected", [
    ("web-7d9c", "default", "nginx", CID, f"web-7d9c_default_nginx-{CID}.log"),
    ("static-node1", "kube-system", "etcd", "abc123", "static-node1_kube-system_etcd-abc123.log"),
])
def test_link_name_as_the_kubelet(pod, namespace, container, cid, expected):
    assert link_name(pod, namespace, container, cid) == expected


def test_a_long_link_name_is_cut_to_255_bytes_before_the_suffix():
    name = link_name("p" * 200, "ns", "c", CID)
    assert len(name) == 255 and name.endswith(".log") and name.startswith("p" * 200 + "_ns_c-")
    assert container_id_of(name) == CID[:255 - 4 - len("p" * 200 + "_ns_c-")]


@pytest.mark.parametrize("name, expected", [
    (f"web_default_nginx-{CID}.log", CID),
    ("my-pod_default_my-container-abcdef.log", "abcdef"),
    ("web_default_nginx-abc.log", None),  # cut below 6 characters
    ("web_default_nginx.log", None),
    (f"web_default_nginx-{CID}.txt", None),
])
def test_container_id_of(name, expected):
    assert container_id_of(name) == expected


def test_dead_links_of_running_containers_stay():
    running = {"a" * 64: True, "b" * 64: False}
    dead = [f"p_ns_c-{'a' * 64}.log", f"p_ns_c-{'b' * 64}.log", f"p_ns_c-{'c' * 64}.log", f"p_ns_c-{'a' * 10}.log",
            "junk.log"]
    assert dead_links_to_remove(dead, running) == [f"p_ns_c-{'b' * 64}.log", f"p_ns_c-{'c' * 64}.log", "junk.log"]


@pytest.mark.parametrize("path, expected", [
    ("/var/lib/edgelet/logs/ns_p_u/c/0.log", "/var/log/pods/ns_p_u/c/0.log"),
    ("/var/lib/edgelet/logs2/ns_p_u/c/0.log", "/var/lib/edgelet/logs2/ns_p_u/c/0.log"),
    ("/var/log/pods/ns_p_u/c/1.log", "/var/log/pods/ns_p_u/c/1.log"),
])
def test_moved_path(path, expected):
    assert moved_path(path, "/var/lib/edgelet/logs", "/var/log/pods") == expected


def test_rotated_name_is_the_last_write_time_made_unique():
    mtime = 1767225600.5  # 2026-01-01T00:00:00Z
    assert rotated_name("0.log", mtime, {"0.log"}) == "0.log.20260101-000000"
    assert rotated_name("0.log", mtime, {"0.log", "0.log.20260101-000000.gz"}) == "0.log.20260101-000000.001"


def _tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def test_rename_tree_merges_and_leaves_what_it_cannot_move(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "ns_a_1" / "c").mkdir(parents=True)
    (old / "ns_a_1" / "c" / "0.log").write_text("a0")
    (old / "ns_b_2" / "c").mkdir(parents=True)
    (old / "ns_b_2" / "c" / "0.log").write_text("old b0")
    (old / "ns_b_2" / "c" / "1.log").write_text("b1")
    (new / "ns_b_2" / "c").mkdir(parents=True)
    (new / "ns_b_2" / "c" / "0.log").write_text("new b0")
    leftovers = _rename_tree(str(old), str(new))
    assert leftovers == [str(old / "ns_b_2" / "c" / "0.log")]
    assert _tree(new) == ["ns_a_1/c/0.log", "ns_b_2/c/0.log", "ns_b_2/c/1.log"]
    assert (new / "ns_b_2" / "c" / "0.log").read_text() == "new b0"


def test_copy_tree_keeps_a_reopened_live_file_as_rotated(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "ns_a_1" / "c").mkdir(parents=True)
    (old / "ns_a_1" / "c" / "0.log").write_text("before\n")
    (old / "ns_a_1" / "c" / "0.log.20251231-000000.gz").write_text("gz")
    os.utime(old / "ns_a_1" / "c" / "0.log", (1767225600, 1767225600))
    (new / "ns_a_1" / "c").mkdir(parents=True)
    (new / "ns_a_1" / "c" / "0.log").write_text("after\n")  # the runtime reopened the live name here
    _copy_tree(str(old), str(new))
    assert _tree(new) == ["ns_a_1/c/0.log", "ns_a_1/c/0.log.20251231-000000.gz", "ns_a_1/c/0.log.20260101-000000"]
    assert (new / "ns_a_1" / "c" / "0.log.20260101-000000").read_text() == "before\n"
    assert (new / "ns_a_1" / "c" / "0.log").read_text() == "after\n"
    assert _tree(old) == []
