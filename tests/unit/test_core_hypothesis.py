"""Property tests for the hot path: the compiled and pure twins agree on random CRI list replies
(shuffled fields, unknown fields, duplicate ids, random old snapshots), both match what the
protobuf library decodes, and the hashes match the `xxhash` package."""

from __future__ import annotations

import importlib
import os
import re

import orjson
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgelet import _core_py
from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb

if os.environ.get("EDGELET_NO_EXTENSIONS") == "1":
    pytest.skip("EDGELET_NO_EXTENSIONS=1: pure-Python run, no twin to compare", allow_module_level=True)

COMPILED = importlib.import_module("edgelet._core")
PURE = _core_py
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# Hashes


@FAST
@given(data=st.binary(max_size=200), seed=st.integers(0, 2**64 - 1))
def test_xxh64_matches_the_xxhash_package(data, seed):
    assert COMPILED.xxh64(data, seed) == PURE.xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # what UTF-8 can carry


@FAST
@given(name=TEXT.filter(lambda s: "\x00" not in s), image=TEXT.filter(lambda s: "\x00" not in s))
def test_container_hash_agrees(name, image):
    encoding = b"edgelet.container/v1\x00" + name.encode() + b"\x00" + image.encode()
    expected = f"{xxhash.xxh64_intdigest(encoding):016x}"
    assert COMPILED.container_hash(name, image) == PURE.container_hash(name, image) == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@FAST
@given(status=st.dictionaries(TEXT, JSON, max_size=5))
def test_status_hash_agrees(status):
    expected = xxhash.xxh64_intdigest(orjson.dumps(status, option=orjson.OPT_SORT_KEYS))
    assert COMPILED.status_hash(status) == PURE.status_hash(status) == expected


# ---------------------------------------------------------------------------------------------
# Random list replies, built with the protobuf library and then shuffled on the wire

# A small id pool makes duplicates and overlaps with the old snapshot common.
IDS = ["a" * 64, "b" * 64, "0123456789abcdef" * 4, "short", "", "é-id", "x" * 64 + "long", "x" * 64 + "lonh"]
KEYS = [labels.POD_UID, labels.POD_NAME, labels.CONTAINER_NAME, "app"]
ANNOTATION_KEYS = [labels.CONTAINER_HASH, labels.CONTAINER_RESTART_COUNT, "other"]
RESTART_VALUES = st.sampled_from(["0", "3", "-1", "+2", " 4", "x", "9223372036854775808"]) | TEXT
STATES = st.sampled_from([0, 1, 2, 3]) | st.integers(-(2**31), 2**31 - 1)
TIMES = st.sampled_from([0, 1, 2]) | st.integers(-(2**63), 2**63 - 1)


@st.composite
def containers(draw):
    c = pb.Container(id=draw(st.sampled_from(IDS)), state=draw(STATES), created_at=draw(TIMES))
    c.pod_sandbox_id = draw(TEXT)
    if draw(st.booleans()):
        c.metadata.name, c.metadata.attempt = draw(TEXT), draw(st.integers(0, 2**32 - 1))
    c.image.image = draw(TEXT)
    c.labels.update(draw(st.dictionaries(st.sampled_from(KEYS) | TEXT, TEXT, max_size=4)))
    c.annotations.update(draw(st.dictionaries(st.sampled_from(ANNOTATION_KEYS), RESTART_VALUES, max_size=3)))
    return c


@st.composite
def sandboxes(draw):
    s = pb.PodSandbox(id=draw(st.sampled_from(IDS)), state=draw(STATES), created_at=draw(TIMES))
    if draw(st.booleans()):
        s.metadata.name, s.metadata.uid = draw(TEXT), draw(TEXT)
        s.metadata.namespace, s.metadata.attempt = draw(TEXT), draw(st.integers(0, 2**32 - 1))
    s.labels.update(draw(st.dictionaries(TEXT, TEXT, max_size=2)))
    return s


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def split_fields(buf: bytes) -> list[tuple[int, int, bytes]]:
    """(number, wire type, raw bytes) of each field of a well-formed message (no groups)."""
    fields, i = [], 0
    while i < len(buf):
        start = i
        key, i = _read_varint(buf, i)
        wire_type = key & 7
        if wire_type == 0:
            _, i = _read_varint(buf, i)
        elif wire_type == 2:
            size, i = _read_varint(buf, i)
            i += size
        else:
            i += 8 if wire_type == 1 else 4
        fields.append((key >> 3, wire_type, buf[start:i]))
    return fields


def _payload(raw: bytes) -> bytes:
    _, i = _read_varint(raw, 0)
    _, i = _read_varint(raw, i)
    return raw[i:]


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


@st.composite
def unknown_field(draw, known: frozenset):
    """A field the message does not define: a new number, or a known number with another wire type."""
    number = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 11, 19, 100, 2**29 - 1]))
    wire_type = draw(st.sampled_from([w for w in (0, 1, 2, 3, 5) if (number, w) not in known]))
    tag = _varint(number << 3 | wire_type)
    if wire_type == 0:
        return tag + _varint(draw(st.integers(0, 2**64 - 1)))
    if wire_type == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire_type == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wire_type == 2:
        payload = draw(st.binary(max_size=8) | st.lists(st.integers(0, 2**35), max_size=3).map(
            lambda ns: b"".join(map(_varint, ns))  # a packed repeated scalar
        ))
        return tag + _varint(len(payload)) + payload
    inner = _varint(7 << 3) + _varint(draw(st.integers(0, 300)))  # a group holding a varint
    return tag + inner + _varint(number << 3 | 4)


CONTAINER_FIELDS = frozenset({(1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 0), (7, 0), (8, 2), (9, 2), (10, 2)})
SANDBOX_FIELDS = frozenset({(1, 2), (2, 2), (3, 0), (4, 0), (5, 2), (6, 2), (7, 2)})
METADATA_FIELDS = {False: frozenset({(1, 2), (2, 0)}), True: frozenset({(1, 2), (2, 2), (3, 2), (4, 0)})}
LIST_FIELDS = frozenset({(1, 2)})


def _with_noise(draw, raw_fields: list[bytes], known: frozenset, shuffle: bool) -> bytes:
    """The fields, shuffled if asked, with unknown fields at random places between them."""
    out = list(draw(st.permutations(raw_fields))) if shuffle else list(raw_fields)
    for noise in draw(st.lists(unknown_field(known), max_size=2)):
        out.insert(draw(st.integers(0, len(out))), noise)
    return b"".join(out)


def _scramble(draw, raw_fields: list[bytes], known: frozenset) -> bytes:
    return _with_noise(draw, raw_fields, known, shuffle=True)


@st.composite
def scrambled_item(draw, message, sandbox: bool) -> bytes:
    raw = []
    for number, wire_type, field in split_fields(message.SerializeToString()):
        if wire_type == 2 and number == (2 if sandbox else 3):  # metadata: scramble inside too
            inner = [f for _, _, f in split_fields(_payload(field))]
            field = _len_field(number, _scramble(draw, inner, METADATA_FIELDS[sandbox]))
        elif wire_type == 2 and not sandbox and number in (8, 9) and draw(st.booleans()):
            inner = [f for _, _, f in split_fields(_payload(field))]
            field = _len_field(number, b"".join(reversed(inner)))  # value before key
        raw.append(field)
    return _len_field(1, _scramble(draw, raw, SANDBOX_FIELDS if sandbox else CONTAINER_FIELDS))


@st.composite
def replies(draw, strategy, sandbox: bool, max_size: int = 6):
    messages = draw(st.lists(strategy, max_size=max_size))
    wire = _with_noise(draw, [draw(scrambled_item(m, sandbox)) for m in messages], LIST_FIELDS, shuffle=False)
    return messages, wire


def _atoi(value: str) -> int:
    if re.fullmatch(r"[+-]?[0-9]+", value) is None or not -(2**63) <= int(value) < 2**63:
        return 0
    return int(value)


def expected_container(c: pb.Container) -> tuple:
    restart = _atoi(c.annotations.get(labels.CONTAINER_RESTART_COUNT, ""))
    hash_ = c.annotations.get(labels.CONTAINER_HASH, "")
    pod_uid = c.labels.get(labels.POD_UID, "")
    return (c.id, pod_uid, c.pod_sandbox_id, c.metadata.name, c.state, c.created_at, c.metadata.attempt, hash_, restart)


def expected_sandbox(s: pb.PodSandbox) -> tuple:
    m = s.metadata
    return (s.id, m.uid, m.name, m.namespace, s.state, s.created_at, m.attempt)


@FAST
@given(reply=replies(containers(), sandbox=False))
def test_parse_containers_matches_protobuf(reply):
    messages, wire = reply
    expected = [expected_container(c) for c in messages]
    assert COMPILED.parse_containers(wire) == PURE.parse_containers(wire) == expected


@FAST
@given(reply=replies(sandboxes(), sandbox=True))
def test_parse_sandboxes_matches_protobuf(reply):
    messages, wire = reply
    expected = [expected_sandbox(s) for s in messages]
    assert COMPILED.parse_sandboxes(wire) == PURE.parse_sandboxes(wire) == expected


@FAST
@given(creply=replies(containers(), sandbox=False), sreply=replies(sandboxes(), sandbox=True))
def test_newest_first_agrees_and_is_the_snapshots_order(creply, sreply):
    for parse, wire in ((PURE.parse_containers, creply[1]), (PURE.parse_sandboxes, sreply[1])):
        records = parse(wire)  # duplicate ids included: equal keys keep their input order in both
        assert COMPILED.newest_first(records) == PURE.newest_first(records)
    snapshot, _ = COMPILED.relist(None, sreply[1], creply[1])
    for uid in snapshot.pod_uids():
        assert [r for r in COMPILED.newest_first(snapshot.containers.values())
                if r[1] == uid] == snapshot.containers_of(uid)
        assert [r for r in PURE.newest_first(snapshot.sandboxes.values()) if r[1] == uid] == snapshot.sandboxes_of(uid)


@st.composite
def old_records(draw, fresh: list[tuple], width: int) -> dict[str, tuple]:
    """Old records: some with a new item's id, state and created_at but stale other fields (to be
    reused as they are), some with a new item's id in another state, some gone since."""
    records = {}
    for record in fresh:
        kind = draw(st.sampled_from(["same key", "other state", "absent"]))
        if kind == "same key":
            records[record[0]] = record[:1] + ("stale",) * 3 + record[4:6] + record[6 : width]
        elif kind == "other state":
            records[record[0]] = record[:4] + ((record[4] + 1) % 2**31, record[5]) + record[6:width]
    for id_ in draw(st.lists(st.sampled_from(IDS), max_size=3)):
        if id_ not in records:
            records[id_] = (id_, "gone-pod") + ("",) * 2 + (draw(STATES), 0) + (0, "", 0)[: width - 6]
    return dict(draw(st.permutations(list(records.items()))))


def _same_snapshot(a, b) -> None:
    assert list(a.containers.items()) == list(b.containers.items())
    assert list(a.sandboxes.items()) == list(b.sandboxes.items())
    assert a.pod_uids() == b.pod_uids()
    for uid in a.pod_uids():
        assert a.containers_of(uid) == b.containers_of(uid)
        assert a.sandboxes_of(uid) == b.sandboxes_of(uid)


@FAST
@given(data=st.data())
def test_relist_agrees_against_a_random_old_snapshot(data):
    containers_msgs, containers_wire = data.draw(replies(containers(), sandbox=False))
    sandbox_msgs, sandboxes_wire = data.draw(replies(sandboxes(), sandbox=True))
    old_containers = data.draw(old_records([expected_container(c) for c in containers_msgs], 9))
    old_sandboxes = data.draw(old_records([expected_sandbox(s) for s in sandbox_msgs], 7))
    compiled_old = COMPILED.Snapshot(old_containers, old_sandboxes)
    pure_old = PURE.Snapshot(old_containers, old_sandboxes)

    compiled, compiled_events = COMPILED.relist(compiled_old, sandboxes_wire, containers_wire)
    pure, pure_events = PURE.relist(pure_old, sandboxes_wire, containers_wire)
    assert compiled_events == pure_events
    _same_snapshot(compiled, pure)
    for new, old in ((compiled.containers, old_containers), (compiled.sandboxes, old_sandboxes)):
        for id_, record in new.items():
            if id_ in old and old[id_][4:6] == record[4:6]:
                assert record is old[id_]  # reused, stale fields and all

    # And one relist further, from the snapshots each twin produced.
    later_containers, later_wire = data.draw(replies(containers(), sandbox=False))
    compiled_next, compiled_events = COMPILED.relist(compiled, b"", later_wire)
    pure_next, pure_events = PURE.relist(pure, b"", later_wire)
    assert compiled_events == pure_events
    _same_snapshot(compiled_next, pure_next)


@settings(max_examples=80, deadline=None)
@given(reply=replies(containers(), sandbox=False, max_size=3), data=st.data())
def test_damaged_wire_is_rejected_or_parsed_alike(reply, data):
    _, original = reply
    wire = original
    damage = data.draw(st.sampled_from(["truncate", "flip", "insert"]))
    at = data.draw(st.integers(0, max(len(wire) - 1, 0)))
    if damage == "truncate":
        wire = wire[:at]
    elif damage == "flip" and wire:
        wire = wire[:at] + bytes([wire[at] ^ data.draw(st.integers(1, 255))]) + wire[at + 1 :]
    else:
        wire = wire[:at] + data.draw(st.binary(min_size=1, max_size=3)) + wire[at:]
    outcomes = []
    for impl in (COMPILED, PURE):
        try:
            outcomes.append(impl.parse_containers(wire))
        except ValueError:
            outcomes.append(ValueError)
    compiled, pure = outcomes
    # The compiled path never decodes fields it does not keep (an image, other labels), so it may
    # accept what the protobuf library refuses; it never refuses what the library accepts.
    if compiled is ValueError:
        assert pure is ValueError
    elif pure is not ValueError:
        assert compiled == pure
    # Against the snapshot of the intact reply, items that kept id, state and created_at are not
    # decoded at all: the damage may pass unseen, but it never raises anything but ValueError.
    for impl in (COMPILED, PURE):
        before, _ = impl.relist(None, b"", original)
        try:
            impl.relist(before, b"", wire)
        except ValueError:
            pass


POOL = [f"{i:064x}" for i in range(60)]


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(st.dictionaries(st.sampled_from(POOL), st.sampled_from([0, 1, 2, 3]), max_size=60), max_size=6))
def test_relist_chains_agree(steps):
    """Growing, shrinking and churning lists walk every way a snapshot's index is rebuilt or edited."""
    compiled = pure = None
    for listed in steps:
        wire = pb.ListContainersResponse(
            containers=[pb.Container(id=id_, state=state, created_at=state // 3) for id_, state in listed.items()]
        ).SerializeToString()
        compiled, compiled_events = COMPILED.relist(compiled, b"", wire)
        pure, pure_events = PURE.relist(pure, b"", wire)
        assert compiled_events == pure_events
        assert list(compiled.containers.items()) == list(pure.containers.items())
