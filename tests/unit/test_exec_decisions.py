"""`edgelet exec`'s decisions (which pod, which container, whether a terminal) and the SPDY frames and exit status
of edgelet.cli.remotecommand, as kubectl and the runtimes' streaming server have them."""

from __future__ import annotations

import struct
import zlib

import orjson
import pytest

from edgelet.cli.exec import NO_TTY_WARNING, ExecError, check_runnable, choose_container, find_pod, terminal_choice
from edgelet.cli.remotecommand import (
    FLAG_FIN,
    GOAWAY,
    PING,
    SYN_REPLY,
    SYN_STREAM,
    Frame,
    FrameReader,
    SessionError,
    control_frame,
    data_frame,
    exit_status,
    header_block,
    syn_stream,
    url_target,
)


def _pod(name, namespace="default", *, phase="Running", containers=("main",), init=(), ephemeral=(),
         annotations=None, uid=None):
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid or f"{namespace}-{name}",
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": c} for c in containers],
                     "initContainers": [{"name": c} for c in init],
                     "ephemeralContainers": [{"name": c} for c in ephemeral]},
            "status": {"phase": phase}}


PODS = [_pod("web"), _pod("web", "edge"), _pod("db", "edge"), _pod("clock-node1", "kube-system"),
        _pod("job", phase="Succeeded", uid="old"), _pod("job", uid="new"), _pod("done", phase="Failed")]


@pytest.mark.parametrize("namespace, name, uid", [
    ("default", "web", "default-web"),
    ("edge", "web", "edge-web"),
    (None, "db", "edge-db"),  # without -n, the only namespace that has it
    (None, "clock", "kube-system-clock-node1"),  # a static pod without its node suffix
    (None, "clock-node1", "kube-system-clock-node1"),
    ("default", "job", "new"),  # of two records of one name, the one still running
    (None, "done", "default-done"),
])
def test_find_pod(namespace, name, uid):
    assert find_pod(PODS, namespace=namespace, name=name, node_name="node1")["metadata"]["uid"] == uid


@pytest.mark.parametrize("namespace, name, message", [
    (None, "nosuch", 'Error from server (NotFound): pods "nosuch" not found'),
    ("default", "db", 'Error from server (NotFound): pods "db" not found'),
    (None, "web", 'error: pod "web" is in several namespaces (default, edge); choose one with -n'),
])
def test_find_pod_errors_as_kubectl(namespace, name, message):
    with pytest.raises(ExecError) as error:
        find_pod(PODS, namespace=namespace, name=name, node_name="node1")
    assert str(error.value) == message


def test_a_completed_pod_is_refused_with_its_phase():
    check_runnable(_pod("web"))
    with pytest.raises(ExecError, match="^error: cannot exec into a container in a completed pod; current phase "
                                        "is Failed$"):
        check_runnable(_pod("done", phase="Failed"))


@pytest.mark.parametrize("pod, container, chosen, note", [
    (_pod("p"), None, "main", ""),
    (_pod("p"), "other", "other", ""),  # as given: the runtime says whether it runs
    (_pod("p", containers=("a", "b")), None, "a", 'Defaulted container "a" out of: a, b'),
    (_pod("p", containers=("a",), init=("setup",), ephemeral=("debug",)), None, "a",
     'Defaulted container "a" out of: a, setup (init), debug (ephem)'),
    (_pod("p", containers=("a", "b"), annotations={"kubectl.kubernetes.io/default-container": "b"}), None, "b", ""),
    (_pod("p", containers=("a",), ephemeral=("debug",),
          annotations={"kubectl.kubernetes.io/default-container": "debug"}), None, "debug", ""),
    (_pod("p", containers=("a", "b"), annotations={"kubectl.kubernetes.io/default-container": "gone"}), None, "a",
     'Defaulted container "a" out of: a, b'),
])
def test_choose_container_as_kubectl_exec(pod, container, chosen, note):
    assert choose_container(pod, container) == (chosen, note)


def test_a_pod_without_containers_is_refused():
    with pytest.raises(ExecError, match="^error: pod default/p does not have any containers$"):
        choose_container(_pod("p", containers=()), None)


@pytest.mark.parametrize("stdin, tty, terminal, result", [
    (False, False, True, (False, "")),
    (False, True, True, (False, "")),  # -t without -i: no terminal, silently, as kubectl
    (True, False, True, (False, "")),
    (True, True, True, (True, "")),
    (True, True, False, (False, NO_TTY_WARNING)),
])
def test_terminal_choice(stdin, tty, terminal, result):
    assert terminal_choice(stdin, tty, terminal) == result


# -- edgelet.cli.remotecommand ------------------------------------------------------------------------

def _status(**fields) -> bytes:
    return orjson.dumps({"metadata": {}, **fields})


@pytest.mark.parametrize("payload, result", [
    (_status(status="Success"), (0, "")),
    (_status(status="Failure", reason="NonZeroExitCode", message="command terminated with non-zero exit code: 3",
             details={"causes": [{"reason": "ExitCode", "message": "3"}]}),
     (3, "command terminated with exit code 3")),
    (_status(status="Failure", reason="InternalError", message="Internal error occurred: exec failed: no such file"),
     (1, "error: Internal error occurred: exec failed: no such file")),
    (_status(status="Failure", reason="NonZeroExitCode", details={"causes": []}),
     (1, "error: the command failed (no message)")),
    (b"", (1, "error: the session ended without the command's exit status")),
    (b"not json", (1, "error: not json")),
])
def test_exit_status(payload, result):
    assert exit_status(payload) == result


def test_header_block_lowercases_names_with_32_bit_lengths():
    assert header_block({"streamType": "stdin"}) == (
        struct.pack("!I", 1) + struct.pack("!I", 10) + b"streamtype" + struct.pack("!I", 5) + b"stdin")


def test_syn_streams_share_one_zlib_stream_each_block_flushed():
    compressor = zlib.compressobj()
    frames = FrameReader().feed(syn_stream(1, {"streamType": "error"}, compressor)
                                + syn_stream(3, {"streamType": "stdout"}, compressor))
    assert [(f.control, f.kind) for f in frames] == [(True, SYN_STREAM)] * 2
    inflate = zlib.decompressobj()
    blocks = []
    for frame in frames:
        stream_id, associated, priority, slot = struct.unpack_from("!IIBB", frame.payload)
        blocks.append((stream_id, inflate.decompress(frame.payload[10:])))
    assert blocks == [(1, header_block({"streamType": "error"})), (3, header_block({"streamType": "stdout"}))]


def test_frame_reader_takes_frames_in_pieces():
    wire = (data_frame(3, b"hello") + control_frame(PING, 0, b"\0\0\0\2")
            + control_frame(SYN_REPLY, FLAG_FIN, struct.pack("!I", 5) + b"\0\0")
            + data_frame(1, b"", fin=True) + control_frame(GOAWAY, 0, b"\0" * 8))
    reader, frames = FrameReader(), []
    for index in range(len(wire)):  # a byte at a time
        frames += reader.feed(wire[index:index + 1])
    assert frames == [Frame(False, 0, 3, 0, b"hello"), Frame(True, PING, 0, 0, b"\0\0\0\2"),
                      Frame(True, SYN_REPLY, 5, FLAG_FIN, struct.pack("!I", 5) + b"\0\0"),
                      Frame(False, 0, 1, FLAG_FIN, b""), Frame(True, GOAWAY, 0, 0, b"\0" * 8)]


@pytest.mark.parametrize("url, target", [
    ("http://127.0.0.1:34567/exec/AbC", ("127.0.0.1", 34567, "/exec/AbC")),
    ("http://[::1]:80/exec/x?a=b", ("::1", 80, "/exec/x?a=b")),
    ("http://localhost:1", ("localhost", 1, "/")),
])
def test_url_target(url, target):
    assert url_target(url) == target


@pytest.mark.parametrize("url", ["https://127.0.0.1:1/exec/x", "http://127.0.0.1/exec/x", "http://:1/x",
                                 "http://127.0.0.1:99999/x", "/exec/x"])
def test_url_target_refuses_what_is_not_plain_http_with_a_port(url):
    with pytest.raises(SessionError, match="is not http://HOST:PORT/"):
        url_target(url)
