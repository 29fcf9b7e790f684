"""Termination messages as the kubelet reads them: the message file's end, the log's end under
FallbackToLogsOnError for a failed container, the runtime's message first, and the pod's share per container."""

from __future__ import annotations

import pytest

from edgelet.kuberuntime.termmessage import (
    MAX_LOG_MESSAGE_BYTES,
    MAX_MESSAGE_BYTES,
    joined_message,
    log_tail_text,
    message_host_path,
    termination_message,
    trim_pod_messages,
)


def cri(stream: str, tag: str, text: str) -> bytes:
    return f"2026-12-07T17:00:00.000000000Z {stream} {tag} {text}\n".encode()


@pytest.mark.parametrize("raw, expected", [
    (cri("stdout", "P", "DONE"), "DONE"),  # `echo -n DONE`: the runtime ends the log with a partial line
    (cri("stdout", "F", "DONE"), "DONE\n"),
    (cri("stdout", "P", "a") + cri("stderr", "F", "b"), "ab\n"),
    (b"not a cri line\n" + cri("stdout", "F", "x"), "x\n"),
    (cri("stdout", "F", ""), "\n"),
    (b"", ""),
])
def test_log_tail_text(raw, expected):
    assert log_tail_text(raw) == expected


def test_log_tail_keeps_the_last_80_lines_then_the_last_2048_bytes():
    raw = b"".join(cri("stdout", "F", f"line {i}") for i in range(200))
    text = log_tail_text(raw)
    assert text.splitlines()[0] == "line 120" and text.endswith("line 199\n")
    long = b"".join(cri("stdout", "F", "x" * 100 + str(i)) for i in range(30))
    assert len(log_tail_text(long)) == MAX_LOG_MESSAGE_BYTES and log_tail_text(long).endswith("x29\n")


def test_message_host_path():
    mounts = [("/etc/hosts", "/h"), ("/dev/termination-log", "/pods/u/containers/c/1")]
    assert message_host_path(mounts, "/dev/termination-log") == "/pods/u/containers/c/1"
    assert message_host_path(mounts, "/tmp/other") is None


@pytest.fixture
def files(tmp_path):
    message = tmp_path / "message"
    log = tmp_path / "0.log"
    log.write_bytes(cri("stdout", "P", "from the log"))
    return message, log


@pytest.mark.parametrize("written, policy, exit_code, expected", [
    (b"DONE", "File", 0, "DONE"),
    (b"DONE", "FallbackToLogsOnError", 1, "DONE"),  # the file wins when it says something
    (b"", "FallbackToLogsOnError", 1, "from the log"),
    (b"", "FallbackToLogsOnError", 0, ""),  # a container that succeeded says nothing from its log
    (b"", "File", 1, ""),
    (None, "FallbackToLogsOnError", 2, "from the log"),  # no message file at all
])
def test_termination_message(files, written, policy, exit_code, expected):
    message, log = files
    if written is not None:
        message.write_bytes(written)
    mounts = [("/dev/termination-log", str(message))]
    assert termination_message(mounts, "/dev/termination-log", policy, exit_code, str(log)) == expected


def test_the_message_file_gives_its_last_4_kib(files):
    message, log = files
    message.write_bytes(b"a" * 10 + b"b" * MAX_MESSAGE_BYTES)
    text = termination_message([("/m", str(message))], "/m", "File", 0, str(log))
    assert text == "b" * MAX_MESSAGE_BYTES


def test_a_path_nothing_is_mounted_at_falls_back_to_the_log_only_on_failure(files):
    _, log = files
    assert termination_message([], "/dev/termination-log", "FallbackToLogsOnError", 1, str(log)) == "from the log"
    assert termination_message([], "/dev/termination-log", "File", 1, str(log)) == ""


def test_an_unreadable_message_file_says_why(tmp_path):
    directory = tmp_path / "adir"
    directory.mkdir()
    text = termination_message([("/m", str(directory))], "/m", "FallbackToLogsOnError", 1, "")
    assert text.startswith(f"Error on reading termination log {directory}:")


def test_a_long_log_is_read_from_its_end(files):
    _, log = files
    log.write_bytes(b"".join(cri("stdout", "F", f"{i:05d}" + "y" * 200) for i in range(2000)))
    text = termination_message([], "", "FallbackToLogsOnError", 1, str(log))
    assert len(text) == MAX_LOG_MESSAGE_BYTES and text.endswith("01999" + "y" * 200 + "\n")


@pytest.mark.parametrize("runtime, left, expected", [
    ("", "", ""), ("OOMKilled", "", "OOMKilled"), ("", "bye", "bye"), ("oom", "bye", "oom: bye")])
def test_joined_message(runtime, left, expected):
    assert joined_message(runtime, left) == expected


def test_each_container_keeps_its_share_of_the_pod_budget():
    statuses = [{"state": {"terminated": {"message": "m" * 5000}}, "lastState": {"terminated": {"message": "short"}}},
                {"state": {"running": {}}, "lastState": {}}]
    trim_pod_messages(statuses, 3)
    assert len(statuses[0]["state"]["terminated"]["message"]) == 4096
    assert statuses[0]["lastState"]["terminated"]["message"] == "short"
