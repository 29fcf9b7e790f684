"""The hot path behind `edgelet.core`: hashes, CRI wire parsing and PLEG events, every test run
against both the compiled `_core` and the pure `_core_py` through the `core` fixture."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import xxhash

from edgelet import _core_py
from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb

REPO_ROOT = Path(__file__).resolve().parents[2]
# An explicit pure-Python run (no build) skips the compiled variants; otherwise they must load.
NO_EXTENSIONS = os.environ.get("EDGELET_NO_EXTENSIONS") == "1"
compiled_only = pytest.mark.skipif(NO_EXTENSIONS, reason="EDGELET_NO_EXTENSIONS=1: pure-Python run")

CREATED, RUNNING, EXITED, UNKNOWN = (
    pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING, pb.CONTAINER_EXITED, pb.CONTAINER_UNKNOWN,
)  # fmt: skip
READY, NOTREADY = pb.SANDBOX_READY, pb.SANDBOX_NOTREADY
STARTED, DIED, REMOVED, CHANGED = 0, 1, 2, 4
GONE = None  # "not listed" in the event tables


@pytest.fixture(params=[pytest.param("compiled", marks=compiled_only), "pure"])
def core(request):
    """Each implementation in turn. A missing build fails here: the guard tests say why."""
    if request.param == "compiled":
        return importlib.import_module("edgelet._core")
    return _core_py


# ---------------------------------------------------------------------------------------------
# Builders: protobuf messages for the common case, raw wire bytes for the odd ones.


def container(id_: str, state: int = RUNNING, *, pod_uid: str = "uid-1", created_at: int = 1_000, **kw) -> pb.Container:
    c = pb.Container(
        id=id_,
        pod_sandbox_id=kw.get("sandbox_id", "sb-1"),
        metadata=pb.ContainerMetadata(name=kw.get("name", "app"), attempt=kw.get("attempt", 0)),
        image=pb.ImageSpec(image="docker.io/library/busybox:1.36"),
        image_ref="sha256:" + "0" * 64,
        state=state,
        created_at=created_at,
    )
    c.labels.update({labels.POD_UID: pod_uid, labels.POD_NAME: "web", labels.CONTAINER_NAME: "app"})
    c.annotations.update({labels.CONTAINER_HASH: kw.get("hash", "5d4a786d5c5d16ab")})
    if "restart" in kw:
        c.annotations[labels.CONTAINER_RESTART_COUNT] = kw["restart"]
    return c


def sandbox(id_: str, state: int = READY, *, pod_uid: str = "uid-1", created_at: int = 500, **kw) -> pb.PodSandbox:
    return pb.PodSandbox(
        id=id_,
        metadata=pb.PodSandboxMetadata(
            name=kw.get("name", "web"),
            uid=pod_uid,
            namespace=kw.get("namespace", "default"),
            attempt=kw.get("attempt", 0),
        ),
        state=state,
        created_at=created_at,
        labels={labels.POD_UID: pod_uid},
    )


def cwire(*containers: pb.Container) -> bytes:
    return pb.ListContainersResponse(containers=containers).SerializeToString()


def swire(*sandboxes: pb.PodSandbox) -> bytes:
    return pb.ListPodSandboxResponse(items=sandboxes).SerializeToString()


def varint(n: int) -> bytes:
    n &= 2**64 - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def vi(field: int, n: int) -> bytes:
    return tag(field, 0) + varint(n)


def ld(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return tag(field, 2) + varint(len(data)) + data


def entry(key: str | None, value: str | None) -> bytes:
    return (ld(1, key) if key is not None else b"") + (ld(2, value) if value is not None else b"")


def items(*payloads: bytes) -> bytes:
    """A list reply (field 1 repeated) around raw item payloads."""
    return b"".join(ld(1, p) for p in payloads)


# ---------------------------------------------------------------------------------------------
# The selector


def _import_core(env_switch: str | None, prelude: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EDGELET_NO_EXTENSIONS"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if env_switch is not None:
        env["EDGELET_NO_EXTENSIONS"] = env_switch
    code = prelude + "import edgelet.core as c; print(c.IS_COMPILED, c.relist.__module__)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@compiled_only
def test_selector_loads_the_compiled_core_by_default():
    result = _import_core(None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "edgelet._core"]


def test_selector_loads_the_pure_twin_with_the_switch():
    result = _import_core("1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "edgelet._core_py"]


def test_selector_fails_loudly_when_the_compiled_core_is_missing():
    result = _import_core(None, prelude="import sys; sys.modules['edgelet._core'] = None; ")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "EDGELET_NO_EXTENSIONS=1" in result.stderr and "build_ext" in result.stderr


def test_both_twins_export_the_same_api(core):
    assert sorted(core.__all__) == sorted(_core_py.__all__)
    for name in ("CONTAINER_STARTED", "CONTAINER_DIED", "CONTAINER_REMOVED", "POD_SYNC", "CONTAINER_CHANGED"):
        assert getattr(core, name) == getattr(_core_py, name)
    assert (core.CONTAINER_STARTED, core.CONTAINER_DIED, core.CONTAINER_REMOVED) == (0, 1, 2)
    assert (core.POD_SYNC, core.CONTAINER_CHANGED) == (3, 4)
    assert core.CONTAINER_RECORD_FIELDS == _core_py.CONTAINER_RECORD_FIELDS
    assert core.SANDBOX_RECORD_FIELDS == _core_py.SANDBOX_RECORD_FIELDS


# ---------------------------------------------------------------------------------------------
# Hashes

XXH64_GOLDEN = [
    (b"", 0, 0xEF46DB3751D8E999),
    (b"a", 0, 0xD24EC4F1A98C6E5B),
    (b"abc", 0, 0x44BC2CF5AD770999),
    (b"abcd", 0, 0xDE0327B0D25D92CC),
    (b"0123456789abcdef0123456789abcde", 0, 0x1FDFC63FEBACFDE7),
    (b"0123456789abcdef0123456789abcdef", 0, 0x642A94958E71E6C5),
    (b"0123456789abcdef0123456789abcdef!", 0, 0x8AFFF4DAAC4E677E),
    (bytes(range(100)), 0, 0x6AC1E58032166597),
    (b"abc", 1, 0xBEA9CA8199328908),
    (b"", 2**64 - 1, 0x298F4C84B24F5380),
]


@pytest.mark.parametrize(("data", "seed", "expected"), XXH64_GOLDEN)
def test_xxh64_golden_values(core, data, seed, expected):
    assert core.xxh64(data, seed) == expected


def test_xxh64_matches_the_reference_at_every_length_and_lane_boundary(core):
    data = bytes((i * 131 + 7) % 256 for i in range(300))
    for seed in (0, 1, 0x9E3779B185EBCA87, 2**64 - 1):
        for n in range(len(data) + 1):
            assert core.xxh64(data[:n], seed) == xxhash.xxh64_intdigest(data[:n], seed), (n, seed)


def test_xxh64_of_a_large_input(core):
    data = bytes(range(256)) * 1024  # 256 KiB: the compiled core releases the GIL here
    assert core.xxh64(data) == xxhash.xxh64_intdigest(data)


def test_xxh64_accepts_any_bytes_like(core):
    assert core.xxh64(bytearray(b"abc")) == core.xxh64(memoryview(b"xabc")[1:]) == 0x44BC2CF5AD770999


@pytest.mark.parametrize(
    ("data", "seed", "error"),
    [
        (b"x", -1, ValueError),
        (b"x", 2**64, ValueError),
        (b"x", "0", TypeError),
        ("text", 0, TypeError),
    ],
)
def test_xxh64_rejects_bad_arguments(core, data, seed, error):
    with pytest.raises(error):
        core.xxh64(data, seed)


CONTAINER_HASH_GOLDEN = [
    ("nginx", "nginx:1.25", "5d4a786d5c5d16ab"),
    ("main", "docker.io/library/busybox:1.36", "268f51b176438399"),
    ("sidecar", "registry.local:5000/team/app@sha256:" + "ab" * 32, "809b0f44d6a1806e"),
    ("", "", "2af0b3f71c874e61"),
    ("ü-app", "bild:1", "b8fd9a78de4ce716"),
]


@pytest.mark.parametrize(("name", "image", "expected"), CONTAINER_HASH_GOLDEN)
def test_container_hash_golden_values(core, name, image, expected):
    # A changed value here restarts every container on upgrade: bump HASH_VERSION instead.
    assert core.HASH_VERSION == 1
    assert core.container_hash(name, image) == expected


def test_container_hash_is_xxh64_of_the_versioned_encoding(core):
    encoding = b"edgelet.container/v1\x00" + "ü-app".encode() + b"\x00" + b"bild:1"
    assert core.container_hash("ü-app", "bild:1") == f"{xxhash.xxh64_intdigest(encoding):016x}"


def test_container_hash_separates_name_from_image(core):
    assert core.container_hash("ab", "c") != core.container_hash("a", "bc")
    assert core.container_hash("a", "b") != core.container_hash("b", "a")


@pytest.mark.parametrize(("name", "image"), [("a\x00b", "img"), ("a", "img\x00")])
def test_container_hash_rejects_nul(core, name, image):
    with pytest.raises(ValueError, match="NUL"):
        core.container_hash(name, image)


STATUS_HASH_GOLDEN = [
    ({}, 0x2E1472B57AF294D1),
    ({"phase": "Running"}, 0x4F9653C31059179A),
    (
        {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.7"},
        0x66FE2B0AD5A7CCAB,
    ),
    ({"b": 1, "a": {"d": [1, 2.5, None, True], "c": "x"}}, 0xF055B51496B37815),
]


@pytest.mark.parametrize(("status", "expected"), STATUS_HASH_GOLDEN)
def test_status_hash_golden_values(core, status, expected):
    assert core.status_hash(status) == expected
    assert expected == xxhash.xxh64_intdigest(orjson.dumps(status, option=orjson.OPT_SORT_KEYS))


def test_status_hash_ignores_key_order_but_not_values(core):
    a = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    b = {"conditions": [{"status": "True", "type": "Ready"}], "phase": "Running"}
    assert core.status_hash(a) == core.status_hash(b)
    assert core.status_hash(a) != core.status_hash({**a, "phase": "Pending"})


# ---------------------------------------------------------------------------------------------
# Parsing list replies


def test_parse_containers_reads_every_record_field(core):
    c = container(
        "c1", EXITED, pod_uid="u-9", name="web", created_at=42, attempt=3, hash="00ff", restart="4", sandbox_id="s1"
    )
    assert core.parse_containers(cwire(c)) == [("c1", "u-9", "s1", "web", EXITED, 42, 3, "00ff", 4)]


def test_parse_sandboxes_reads_every_record_field(core):
    s = sandbox("s1", NOTREADY, pod_uid="u-9", name="web", namespace="prod", created_at=-5, attempt=2)
    assert core.parse_sandboxes(swire(s)) == [("s1", "u-9", "web", "prod", NOTREADY, -5, 2)]


def test_parse_keeps_wire_order_and_duplicates(core):
    wire = cwire(container("b"), container("a"), container("b", EXITED))
    assert [(r[0], r[4]) for r in core.parse_containers(wire)] == [("b", RUNNING), ("a", RUNNING), ("b", EXITED)]


def test_parse_of_empty_replies_and_empty_items(core):
    assert core.parse_containers(b"") == [] and core.parse_sandboxes(b"") == []
    assert core.parse_containers(items(b"")) == [("", "", "", "", 0, 0, 0, "", 0)]
    assert core.parse_sandboxes(items(b"")) == [("", "", "", "", 0, 0, 0)]


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (None, 0),
        ("", 0),
        ("0", 0),
        ("7", 7),
        ("007", 7),
        ("+3", 3),
        ("-2", -2),
        ("x", 0),
        (" 1", 0),
        ("1 ", 0),
        ("1_0", 0),
        ("+", 0),
        ("٣", 0),  # a non-ASCII digit: Go's Atoi refuses it
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", 0),
        ("-9223372036854775808", -(2**63)),
        ("-9223372036854775809", 0),
        ("99999999999999999999999", 0),
    ],
)
def test_restart_count_reads_like_the_kubelet(core, annotation, expected):
    c = container("c1") if annotation is None else container("c1", restart=annotation)
    assert core.parse_containers(cwire(c))[0][8] == expected


CONTAINER_FIELDS = {
    "id": ld(1, "c1"),
    "sandbox": ld(2, "s1"),
    "metadata": ld(3, ld(1, "web") + vi(2, 3)),
    "image": ld(4, ld(1, "busybox")),
    "state": vi(6, EXITED),
    "created": vi(7, 42),
    "uid": ld(8, entry(labels.POD_UID, "u-1")),
    "other_label": ld(8, entry("app", "web")),
    "hash": ld(9, entry(labels.CONTAINER_HASH, "abc")),
    "restart": ld(9, entry(labels.CONTAINER_RESTART_COUNT, "2")),
}
FULL_RECORD = ("c1", "u-1", "s1", "web", EXITED, 42, 3, "abc", 2)
UNKNOWN_FIELDS = [
    vi(50, 2**64 - 1),  # varint, 10 bytes
    tag(51, 1) + b"\x01" * 8,  # fixed64
    ld(52, b"\xff\xfe not utf-8"),  # unknown bytes are never decoded
    tag(53, 5) + b"\x01" * 4,  # fixed32
    tag(54, 3) + vi(1, 5) + tag(55, 3) + tag(55, 4) + tag(54, 4),  # nested groups
    ld(56, varint(1) + varint(300) + varint(2**40)),  # a packed repeated scalar
    tag(57, 0) + varint(1),
    vi(1, 5),  # a known field with another wire type is unknown: id stays
    ld(6, b"\x01"),  # state sent as a packed varint list: not the singular field
    tag(536870911, 0) + b"\x00",  # the largest field number
]


def test_unknown_fields_of_every_wire_type_are_skipped(core):
    payload = b"".join(CONTAINER_FIELDS.values())
    metadata = ld(3, b"".join(UNKNOWN_FIELDS) + ld(1, "web") + vi(2, 3))
    noisy = b"".join(UNKNOWN_FIELDS) + payload.replace(CONTAINER_FIELDS["metadata"], metadata)
    wire = b"".join(UNKNOWN_FIELDS) + items(noisy) + b"".join(UNKNOWN_FIELDS)
    assert core.parse_containers(wire) == [FULL_RECORD]


@pytest.mark.parametrize("unknown", UNKNOWN_FIELDS)
def test_a_map_entry_with_an_unknown_field_is_not_a_map_entry(core, unknown):
    # The protobuf runtime files such an entry among the container's unknown fields.
    payload = ld(8, unknown + entry(labels.POD_UID, "u-1")) + ld(9, entry(labels.CONTAINER_HASH, "h") + unknown)
    assert core.parse_containers(items(payload))[0][1::6] == ("", "")


def test_fields_in_any_order(core):
    payload = b"".join(reversed(list(CONTAINER_FIELDS.values())))
    assert core.parse_containers(items(payload)) == [FULL_RECORD]


def test_repeated_singular_fields_last_one_wins_and_messages_merge(core):
    payload = b"".join(CONTAINER_FIELDS.values()) + ld(1, "c2") + vi(6, RUNNING) + ld(3, vi(2, 9))
    assert core.parse_containers(items(payload)) == [("c2", "u-1", "s1", "web", RUNNING, 42, 9, "abc", 2)]


def test_map_entries_in_any_shape(core):
    payload = (
        ld(8, entry(labels.POD_UID, "first"))
        + ld(8, ld(2, "later") + ld(1, labels.POD_UID))  # value before key
        + ld(8, entry(None, "no key"))
        + ld(9, entry(labels.CONTAINER_HASH, None))  # no value: ""
        + ld(9, ld(1, "x") + ld(1, labels.CONTAINER_RESTART_COUNT) + ld(2, "5"))  # the last key wins
    )
    assert core.parse_containers(items(payload)) == [("", "later", "", "", 0, 0, 0, "", 5)]


def test_integer_fields_wrap_like_protobuf(core):
    payload = vi(6, 2**32 + 1) + vi(7, -1) + ld(3, vi(2, 2**32 + 7))  # int32, int64, uint32
    assert core.parse_containers(items(payload))[0][4:7] == (1, -1, 7)
    assert core.parse_containers(items(vi(6, 2**31)))[0][4] == -(2**31)
    assert core.parse_sandboxes(items(vi(3, -3)))[0][4] == -3


def test_varints_of_ten_bytes_drop_bits_past_64_and_lengths_may_be_non_minimal(core):
    assert core.parse_containers(items(tag(7, 0) + b"\xff" * 9 + b"\x7f"))[0][5] == -1
    assert core.parse_containers(tag(1, 2) + b"\x84\x80\x80\x80\x00" + ld(1, "ab"))[0][0] == "ab"


MALFORMED = {
    "truncated item length": b"\x0a",
    "item longer than the reply": b"\x0a\x05ab",
    "truncated varint": items(b"\x38\xff\xff"),
    "varint over 10 bytes": items(b"\x38" + b"\xff" * 10 + b"\x01"),
    "tag over 5 bytes": b"\x8a\x80\x80\x80\x80\x00\x00",
    "tag over 32 bits": items(b"\xf8\xff\xff\xff\x7f\x00"),
    "field number 0": items(b"\x00\x01"),
    "wire type 6": items(b"\x0e"),
    "wire type 7": b"\x0f",
    "end group without start": items(tag(3, 4)),
    "mismatched end group": items(tag(11, 3) + tag(12, 4)),
    "unterminated group": items(tag(11, 3) + vi(1, 1)),
    "groups 101 deep": items(tag(11, 3) * 101 + tag(11, 4) * 101),
    "truncated fixed64": items(tag(11, 1) + b"\x01\x02"),
    "truncated fixed32": tag(11, 5) + b"\x01",
    "truncated metadata": items(ld(3, b"\x0a\x05ab")),
    "truncated label entry": items(ld(8, b"\x0a\x09io.k")),
    "bad group in annotation": items(ld(9, tag(3, 4))),
    "id not UTF-8": items(ld(1, b"\xff")),
    "id with a UTF-16 surrogate": items(ld(1, b"\xed\xa0\x80")),
    "name not UTF-8": items(ld(3, ld(1, b"\xc3"))),
    "pod uid label not UTF-8": items(ld(8, entry(labels.POD_UID, None) + ld(2, b"\x80"))),
    "hash annotation not UTF-8": items(ld(9, entry(labels.CONTAINER_HASH, None) + ld(2, b"\xfe"))),
}


@pytest.mark.parametrize("wire", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_container_replies_raise_value_error(core, wire):
    with pytest.raises(ValueError, match="ListContainersResponse"):
        core.parse_containers(wire)
    with pytest.raises(ValueError, match="ListContainersResponse"):
        core.relist(None, b"", wire)


@pytest.mark.parametrize(
    "wire",
    [b"\x0a\x03\x0a\x01", items(ld(2, ld(2, b"\xff"))), items(ld(2, vi(4, 1)[:-1] + b"\x80")), items(tag(3, 4))],
    ids=["truncated", "uid not UTF-8", "truncated attempt", "end group"],
)
def test_malformed_sandbox_replies_raise_value_error(core, wire):
    with pytest.raises(ValueError, match="ListPodSandboxResponse"):
        core.parse_sandboxes(wire)
    with pytest.raises(ValueError, match="ListPodSandboxResponse"):
        core.relist(None, wire, b"")


@pytest.mark.parametrize("wire", ["text", None, 5])
def test_wire_must_be_bytes_like(core, wire):
    with pytest.raises(TypeError):
        core.parse_containers(wire)
    with pytest.raises(TypeError):
        core.relist(None, b"", wire)


def test_wire_may_be_any_bytes_like(core):
    wire = cwire(container("c1"))
    expected = core.parse_containers(wire)
    assert core.parse_containers(bytearray(wire)) == core.parse_containers(memoryview(wire)) == expected


def test_every_truncation_parses_or_raises_value_error(core):
    wire = cwire(container("c1", restart="3"), container("c2", EXITED))
    for n in range(len(wire)):
        try:
            core.parse_containers(wire[:n])
        except ValueError:
            pass


def test_the_error_names_the_item_and_its_offset(core):
    wire = cwire(container("ok")) + items(ld(1, b"\xff"))
    with pytest.raises(ValueError, match="ListContainersResponse") as info:
        core.parse_containers(wire)
    if core is not _core_py:  # the protobuf library does not say where
        assert "Container #1" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Relist events: the kubelet's generic PLEG rules, every old/new state pair


CONTAINER_TRANSITIONS = [
    (GONE, CREATED, [CHANGED]),
    (GONE, RUNNING, [STARTED]),
    (GONE, EXITED, [DIED]),
    (GONE, UNKNOWN, [CHANGED]),
    (CREATED, CREATED, []),
    (CREATED, RUNNING, [STARTED]),
    (CREATED, EXITED, [DIED]),
    (CREATED, UNKNOWN, []),  # both are "unknown" to the PLEG
    (CREATED, GONE, [DIED, REMOVED]),
    (RUNNING, CREATED, [CHANGED]),
    (RUNNING, RUNNING, []),
    (RUNNING, EXITED, [DIED]),
    (RUNNING, UNKNOWN, [CHANGED]),
    (RUNNING, GONE, [DIED, REMOVED]),
    (EXITED, CREATED, [CHANGED]),
    (EXITED, RUNNING, [STARTED]),
    (EXITED, EXITED, []),
    (EXITED, UNKNOWN, [CHANGED]),
    (EXITED, GONE, [REMOVED]),
    (UNKNOWN, CREATED, []),
    (UNKNOWN, RUNNING, [STARTED]),
    (UNKNOWN, EXITED, [DIED]),
    (UNKNOWN, UNKNOWN, []),
    (UNKNOWN, GONE, [DIED, REMOVED]),
    (RUNNING, 9, [CHANGED]),  # a state this version does not know is "unknown"
]


@pytest.mark.parametrize(("before", "after", "expected"), CONTAINER_TRANSITIONS)
def test_container_events(core, before, after, expected):
    listed = cwire(container("c1", before)) if before is not GONE else b""
    old, _ = core.relist(None, b"", listed)
    new_wire = cwire(container("c1", after, created_at=1_000)) if after is not GONE else b""
    snapshot, events = core.relist(old, b"", new_wire)
    assert events == [("uid-1", e, "c1") for e in expected]
    assert ("c1" in snapshot.containers) == (after is not GONE)


SANDBOX_TRANSITIONS = [
    (GONE, READY, [STARTED]),
    (GONE, NOTREADY, [DIED]),
    (GONE, 7, [CHANGED]),
    (READY, READY, []),
    (READY, NOTREADY, [DIED]),
    (READY, 7, [CHANGED]),
    (READY, GONE, [DIED, REMOVED]),
    (NOTREADY, READY, [STARTED]),
    (NOTREADY, NOTREADY, []),
    (NOTREADY, GONE, [REMOVED]),
    (7, READY, [STARTED]),
    (7, GONE, [DIED, REMOVED]),
]


@pytest.mark.parametrize(("before", "after", "expected"), SANDBOX_TRANSITIONS)
def test_sandbox_events(core, before, after, expected):
    old, _ = core.relist(None, swire(sandbox("s1", before)) if before is not GONE else b"", b"")
    snapshot, events = core.relist(old, swire(sandbox("s1", after)) if after is not GONE else b"", b"")
    assert events == [("uid-1", e, "s1") for e in expected]
    assert ("s1" in snapshot.sandboxes) == (after is not GONE)


def test_events_follow_list_order_then_removed_in_old_order_containers_first(core):
    old, events = core.relist(
        None,
        swire(sandbox("s-a", pod_uid="a"), sandbox("s-b", pod_uid="b")),
        cwire(container("r1", pod_uid="a"), container("r2", pod_uid="b"), container("r3", pod_uid="c")),
    )
    assert [e[2] for e in events] == ["r1", "r2", "r3", "s-a", "s-b"]
    _, events = core.relist(
        old,
        swire(sandbox("s-b", NOTREADY, pod_uid="b")),
        cwire(container("n1", pod_uid="d"), container("r2", EXITED, pod_uid="b"), container("n0", pod_uid="e")),
    )
    assert events == [
        ("d", STARTED, "n1"),
        ("b", DIED, "r2"),
        ("e", STARTED, "n0"),
        ("a", DIED, "r1"),
        ("a", REMOVED, "r1"),
        ("c", DIED, "r3"),
        ("c", REMOVED, "r3"),
        ("b", DIED, "s-b"),
        ("a", DIED, "s-a"),
        ("a", REMOVED, "s-a"),
    ]


def test_duplicate_ids_last_one_wins_and_events_keep_the_first_place(core):
    old, _ = core.relist(None, b"", cwire(container("x"), container("y")))
    snapshot, events = core.relist(old, b"", cwire(container("y", EXITED), container("x"), container("y", RUNNING)))
    assert events == []  # y's last listing is unchanged
    assert snapshot.containers["y"] is old.containers["y"]
    listed = [container("y"), container("n"), container("x", EXITED), container("y", UNKNOWN), container("n", EXITED)]
    snapshot, events = core.relist(old, b"", cwire(*listed))
    assert events == [("uid-1", CHANGED, "y"), ("uid-1", DIED, "n"), ("uid-1", DIED, "x")]
    assert snapshot.containers["n"][4] == EXITED


def test_unchanged_items_keep_their_old_record_object(core):
    old, _ = core.relist(None, swire(sandbox("s1")), cwire(container("c1", restart="1"), container("c2")))
    snapshot, events = core.relist(old, swire(sandbox("s1")), cwire(container("c2"), container("c1", restart="1")))
    assert events == []
    assert snapshot.containers["c1"] is old.containers["c1"]
    assert snapshot.sandboxes["s1"] is old.sandboxes["s1"]


def test_the_reuse_key_is_id_state_and_created_at(core):
    # CRI objects never change labels or names in place, so a listing with the same id, state
    # and created_at reuses the record without decoding the rest.
    old, _ = core.relist(None, b"", cwire(container("c1", name="app", restart="1")))
    same_key, _ = core.relist(old, b"", cwire(container("c1", name="renamed", restart="5")))
    assert same_key.containers["c1"][3] == "app"
    new_created, events = core.relist(old, b"", cwire(container("c1", created_at=2_000, name="renamed", restart="5")))
    assert events == []  # same plegState: no event, but a fresh record
    assert new_created.containers["c1"][3:] == ("renamed", RUNNING, 2_000, 0, "5d4a786d5c5d16ab", 5)


def test_snapshot_order_keeps_survivors_in_place_and_appends_new_ids(core):
    old, _ = core.relist(None, b"", cwire(container("a"), container("b"), container("c")))
    snapshot, _ = core.relist(old, b"", cwire(container("d"), container("c", EXITED), container("a")))
    assert list(snapshot.containers) == ["a", "c", "d"]
    then, events = core.relist(snapshot, b"", cwire(container("d")))
    assert [e[2] for e in events] == ["a", "a", "c"]
    assert list(then.containers) == ["d"]


def test_a_long_relist_chain_keeps_matching_a_fresh_parse(core):
    snapshot = None
    for step in range(60):
        listed = [container(f"{i:064x}", (i * step) % 4, created_at=i) for i in range(step % 23, 40 - step % 7)]
        snapshot, _ = core.relist(snapshot, b"", cwire(*listed))
        assert dict(snapshot.containers) == {r[0]: r for r in core.parse_containers(cwire(*listed))}


def test_ids_longer_than_64_bytes(core):
    long_a, long_b = "x" * 64 + "a", "x" * 64 + "b"
    old, _ = core.relist(None, b"", cwire(container(long_a), container(long_b)))
    snapshot, events = core.relist(old, b"", cwire(container(long_b, EXITED), container(long_a)))
    assert events == [("uid-1", DIED, long_b)]
    assert snapshot.containers[long_a] is old.containers[long_a]


# ---------------------------------------------------------------------------------------------
# Snapshot


def test_snapshot_groups_by_pod_newest_first(core):
    snapshot, _ = core.relist(
        None,
        swire(sandbox("s-old", NOTREADY, created_at=1), sandbox("s-new", created_at=9), sandbox("s-x", pod_uid="x")),
        cwire(
            container("c-b", created_at=5),
            container("c-a", created_at=5),
            container("c-new", created_at=8),
            container("c-x", pod_uid="x"),
            container("no-uid", pod_uid=""),
        ),
    )
    assert [r[0] for r in snapshot.containers_of("uid-1")] == ["c-new", "c-b", "c-a"]
    assert [r[0] for r in snapshot.sandboxes_of("uid-1")] == ["s-new", "s-old"]
    assert snapshot.containers_of("nobody") == [] and snapshot.sandboxes_of("nobody") == []
    assert snapshot.pod_uids() == {"uid-1", "x", ""}


def crecord(id_: str, created_at: int, pod_uid: str = "uid-1") -> tuple:
    return (id_, pod_uid, "sb-1", "app", RUNNING, created_at, 0, "5d4a786d5c5d16ab", 0)


def srecord(id_: str, created_at: int, pod_uid: str = "uid-1") -> tuple:
    return (id_, pod_uid, "web", "default", READY, created_at, 0)


@pytest.mark.parametrize("records, order", [
    ([], []),
    ([crecord("a", 1), crecord("b", 3), crecord("c", 2)], ["b", "c", "a"]),
    ([crecord("a", 5), crecord("c", 5), crecord("b", 5)], ["c", "b", "a"]),  # a tie goes to the higher id
    ([crecord("x", -(2**63)), crecord("y", 2**63 - 1), crecord("z", 0)], ["y", "z", "x"]),
    ([srecord("s-old", 1), srecord("s-b", 9), srecord("s-a", 9)], ["s-b", "s-a", "s-old"]),
    ([crecord("same", 1, "uid-1"), crecord("same", 2, "uid-2")], ["same", "same"]),  # pods are not grouped
])
def test_newest_first_orders_by_created_at_then_id_descending(core, records, order):
    assert [r[0] for r in core.newest_first(records)] == order
    assert core.newest_first(iter(records)) == core.newest_first(list(reversed(records)))  # any iterable, any order


def test_newest_first_is_the_order_of_the_snapshot(core):
    """inspect_now sorts what it lists itself; a relist's snapshot must hand out the same order."""
    containers = cwire(container("c-b", created_at=5), container("c-a", created_at=5), container("c-new", created_at=8))
    sandboxes = swire(sandbox("s-2", created_at=1), sandbox("s-1", created_at=1), sandbox("s-3", created_at=0))
    snapshot, _ = core.relist(None, sandboxes, containers)
    assert core.newest_first(core.parse_containers(containers)) == snapshot.containers_of("uid-1")
    assert core.newest_first(core.parse_sandboxes(sandboxes)) == snapshot.sandboxes_of("uid-1")


def test_snapshot_views_are_read_only(core):
    snapshot, _ = core.relist(None, b"", cwire(container("c1")))
    with pytest.raises(TypeError):
        snapshot.containers["c2"] = snapshot.containers["c1"]
    snapshot.containers_of("uid-1").clear()  # a copy: the snapshot keeps its records
    assert len(snapshot.containers_of("uid-1")) == 1


def test_snapshot_built_from_records_relists_like_a_parsed_one(core):
    record = ("c1", "uid-1", "sb-1", "app", RUNNING, 1_000, 0, "5d4a786d5c5d16ab", 0)
    old = core.Snapshot({"c1": record}, {"s1": ("s1", "uid-1", "web", "default", READY, 500, 0)})
    snapshot, events = core.relist(old, swire(sandbox("s1")), cwire(container("c1"), container("c2")))
    assert events == [("uid-1", STARTED, "c2")]
    assert snapshot.containers["c1"] is record
    assert repr(snapshot) == "Snapshot(containers=2, sandboxes=1)"


@pytest.mark.parametrize(
    "containers",
    [
        {"c1": ("c1",)},
        {"c1": ("other", "u", "s", "n", 1, 1, 0, "h", 0)},
        {"c1": ["c1", "u", "s", "n", 1, 1, 0, "h", 0]},
        {"c1": ("c1", "u", "s", "n", "1", 1, 0, "h", 0)},
        {"c1": ("c1", "u", "s", "n", 2**31, 1, 0, "h", 0)},
        {"c1": ("c1", "u", "s", "n", 1, 2**63, 0, "h", 0)},
        {1: (1, "u", "s", "n", 1, 1, 0, "h", 0)},
    ],
)
def test_snapshot_rejects_malformed_records(core, containers):
    with pytest.raises(ValueError):
        core.Snapshot(containers, {})


def test_relist_rejects_a_snapshot_of_the_other_twin(core):
    other = _core_py if core is not _core_py else importlib.import_module("edgelet._core")
    with pytest.raises(TypeError):
        core.relist(other.Snapshot({}, {}), b"", b"")
