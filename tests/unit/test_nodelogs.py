"""The node log query of /logs/ (the kubelet's NodeLogQuery): parsing and validation, journalctl's arguments, the
file heuristics and the directory listing; reading a file and a service's file under a directory."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from edgelet.kubeletapi.nodelogs import (
    NodeLogQuery,
    NotFound,
    inside,
    journalctl_args,
    listing,
    logs_to_journal,
    parse_node_log_query,
    query_chunks,
    read_path,
    service_files,
)
from edgelet.kubeletapi.paths import BadRequest

T1 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T2 = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize("query, expected", [
    ({}, None),
    ({"unrelated": ["1"]}, None),
    ({"query": ["kubelet"]}, NodeLogQuery(services=("kubelet",))),
    ({"query": ["kubelet", "containerd"], "tailLines": ["10"]}, NodeLogQuery(("kubelet", "containerd"),
                                                                            tail_lines=10)),
    ({"query": ["/syslog"]}, NodeLogQuery(files=("/syslog",))),
    ({"query": ["journal/x.log"]}, NodeLogQuery(files=("journal/x.log",))),
    ({"query": ["kubelet"], "sinceTime": ["2026-01-02T03:04:05Z"], "untilTime": ["2026-01-02T05:00:00+01:00"],
      "boot": ["-1"], "pattern": ["err.*"]},
     NodeLogQuery(("kubelet",), since=T1, until=T2, boot=-1, pattern="err.*")),
])
def test_parse(query, expected):
    assert parse_node_log_query(query) == expected


@pytest.mark.parametrize("query, message", [
    ({"query": ["  "]}, "query cannot be empty"),
    ({"tailLines": ["5"]}, "cannot be empty with options"),
    ({"query": ["kubelet", "/syslog"]}, "cannot specify a file and service"),
    ({"query": ["/a", "/b"]}, "cannot specify more than one file"),
    ({"query": ["/syslog"], "tailLines": ["5"]}, "cannot specify file with options"),
    ({"query": ["ku;belet"]}, "unsupported characters"),
    ({"query": ["a", "b", "c", "d", "e"]}, "Too many: 5"),
    ({"query": ["kubelet"], "sinceTime": ["yesterday"]}, 'sinceTime: Invalid value: "yesterday"'),
    ({"query": ["kubelet"], "sinceTime": ["2026-01-02T05:00:00Z"], "untilTime": ["2026-01-02T04:00:00Z"]},
     "must be after `sinceTime`"),
    ({"query": ["kubelet"], "boot": ["1"]}, "must be less than 1"),
    ({"query": ["kubelet"], "tailLines": ["100001"]}, "must be between 0 and 100000"),
    ({"query": ["kubelet"], "tailLines": ["many"]}, 'tailLines: Invalid value: "many"'),
    ({"query": ["kubelet"], "pattern": ["(unclosed"]}, "pattern: Invalid value"),
])
def test_bad_queries_name_the_parameter(query, message):
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse_node_log_query(query)


def test_journalctl_args_as_the_kubelet_builds_them():
    q = NodeLogQuery(("kubelet",), since=T1, until=T2, tail_lines=10, boot=-1, pattern="err")
    assert journalctl_args(q, ["kubelet", "containerd"]) == [
        "--utc", "--no-pager", "--since=2026-01-02 03:04:05", "--until=2026-01-02 04:00:00", "--pager-end",
        "--lines=10", "--unit=kubelet", "--unit=containerd", "--grep=err", "--case-sensitive=false", "--boot", "-1",
        "--output=short-precise"]
    assert journalctl_args(NodeLogQuery(("ssh",)), ["ssh"]) == ["--utc", "--no-pager", "--unit=ssh",
                                                                "--output=short-precise"]
    # A configured journal directory is read instead of the system journal.
    assert journalctl_args(NodeLogQuery(("ssh",)), ["ssh"], "/data/journal") == [
        "--directory=/data/journal", "--utc", "--no-pager", "--unit=ssh", "--output=short-precise"]


def test_which_services_log_to_the_journal():
    units = "containerd.service\nssh.service\nsession-1.scope\n"
    assert logs_to_journal("containerd", units) and logs_to_journal("ssh", units)
    assert not logs_to_journal("contain", units) and not logs_to_journal("edgelet", units)
    assert service_files("foo") == ["foo", "foo.log", "foo/foo.log"]


def test_paths_stay_inside_the_log_directory(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "secret").write_text("no")
    os.symlink(tmp_path / "secret", tmp_path / "logs" / "escape")
    root = str(tmp_path / "logs")
    assert inside(root, "a/b.log") == os.path.join(os.path.realpath(root), "a", "b.log")
    assert inside(root, "/a.log") == os.path.join(os.path.realpath(root), "a.log")
    assert inside(root, "../secret") is None
    assert inside(root, "escape") is None


def test_listing_as_go_file_server():
    page = listing([("syslog", False), ("journal", True), ("a&b", False)]).decode()
    assert page == ('<!doctype html>\n<meta name="viewport" content="width=device-width">\n<pre>\n'
                    '<a href="a%26b">a&amp;b</a>\n<a href="journal/">journal/</a>\n<a href="syslog">syslog</a>\n'
                    '</pre>\n')


def test_read_path_lists_a_directory_and_names_a_file(tmp_path):
    (tmp_path / "pods").mkdir()
    (tmp_path / "syslog").write_text("boot\n")
    page, file = read_path(str(tmp_path), "")
    assert b'<a href="pods/">pods/</a>' in page and file is None
    assert read_path(str(tmp_path), "syslog") == (None, str(tmp_path / "syslog"))
    with pytest.raises(NotFound):
        read_path(str(tmp_path), "nothing")
    with pytest.raises(NotFound):
        read_path(str(tmp_path), "../../etc/passwd")


async def _collect(q, log_dir):
    return b"".join([chunk async for chunk in query_chunks(q, log_dir)])


async def test_a_service_without_a_journal_unit_is_read_from_its_file(tmp_path):
    (tmp_path / "edgelet-test-unit").mkdir()
    (tmp_path / "edgelet-test-unit" / "edgelet-test-unit.log").write_text("started\n")
    assert await _collect(NodeLogQuery(("edgelet-test-unit",)), str(tmp_path)) == b"started\n"
    assert await _collect(NodeLogQuery(("edgelet-test-none",)), str(tmp_path)) == \
        b"\nlog not found for edgelet-test-none\n"
    with_options = await _collect(NodeLogQuery(("edgelet-test-unit",), tail_lines=1), str(tmp_path))
    assert b"options present and query resolved to log files" in with_options
    assert await _collect(NodeLogQuery(files=("edgelet-test-unit/edgelet-test-unit.log",)), str(tmp_path)) == \
        b"started\n"
