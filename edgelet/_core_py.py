"""Pure-Python twin of `edgelet._core`: the typed reference for XXH64, the container and status hashes,
and the PLEG relist. Import `edgelet.core`, never this module: the selector decides which twin runs."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar

import orjson
from google.protobuf.message import DecodeError

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb

__all__ = [
    "HASH_VERSION",
    "xxh64",
    "container_hash",
    "status_hash",
    "Snapshot",
    "relist",
    "parse_containers",
    "parse_sandboxes",
    "newest_first",
    "CONTAINER_STARTED",
    "CONTAINER_DIED",
    "CONTAINER_REMOVED",
    "POD_SYNC",
    "CONTAINER_CHANGED",
    "CONTAINER_RECORD_FIELDS",
    "SANDBOX_RECORD_FIELDS",
]

# Bumping it changes every container hash, which restarts every container on upgrade.
HASH_VERSION = 1
_CONTAINER_HASH_PREFIX = b"edgelet.container/v%d\x00" % HASH_VERSION

# PLEG event types: (pod_uid, event_type, id) tuples carry these.
CONTAINER_STARTED = 0
CONTAINER_DIED = 1
CONTAINER_REMOVED = 2
POD_SYNC = 3
CONTAINER_CHANGED = 4

# Record layouts; a record is a plain tuple so the compiled relist can reuse it as is.
ContainerRecord = tuple[str, str, str, str, int, int, int, str, int]
SandboxRecord = tuple[str, str, str, str, int, int, int]
RecordT = TypeVar("RecordT", ContainerRecord, SandboxRecord)
CONTAINER_RECORD_FIELDS = (
    "id", "pod_uid", "sandbox_id", "name", "state", "created_at", "attempt", "hash", "restart_count",
)  # fmt: skip
SANDBOX_RECORD_FIELDS = ("id", "pod_uid", "name", "namespace", "state", "created_at", "attempt")
# The fields by name where the relist reads them, at the places both kinds share; and each kind's width.
_ID: Final = 0
_POD_UID: Final = 1
_STATE: Final = 4
_CREATED_AT: Final = 5
_CONTAINER_WIDTH, _SANDBOX_WIDTH = 9, 7

# The kubelet's plegState of a runtime object.
_RUNNING, _EXITED, _UNKNOWN, _NON_EXISTENT = range(4)
_CONTAINER_PLEG: dict[int, int] = {pb.CONTAINER_RUNNING: _RUNNING, pb.CONTAINER_EXITED: _EXITED}
_SANDBOX_PLEG: dict[int, int] = {pb.SANDBOX_READY: _RUNNING, pb.SANDBOX_NOTREADY: _EXITED}

# ---------------------------------------------------------------------------------------------
# XXH64, after the public xxHash specification.

_MASK = 0xFFFFFFFFFFFFFFFF
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
_STRIPE = struct.Struct("<4Q")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _MASK, 31) * _P1) & _MASK


def _merge(h: int, acc: int) -> int:
    return ((h ^ _round(0, acc)) * _P1 + _P4) & _MASK


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of `data` (any C-contiguous bytes-like object) as an unsigned 64-bit int."""
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed <= _MASK:
        raise ValueError("seed must be in range [0, 2**64)")
    buf = memoryview(data).cast("B")
    n = len(buf)
    p = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed
        v4 = (seed - _P1) & _MASK
        while p + 32 <= n:
            l1, l2, l3, l4 = _STRIPE.unpack_from(buf, p)
            v1, v2, v3, v4 = _round(v1, l1), _round(v2, l2), _round(v3, l3), _round(v4, l4)
            p += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while p + 8 <= n:
        h ^= _round(0, int.from_bytes(buf[p : p + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        p += 8
    if p + 4 <= n:
        h ^= (int.from_bytes(buf[p : p + 4], "little") * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        p += 4
    while p < n:
        h ^= (buf[p] * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h


def container_hash(name: str, image: str) -> str:
    """The container hash the kubelet (since 1.31) derives from name and image, as 16 hex digits.

    A change in it makes the agent restart the container, so the encoding is versioned (HASH_VERSION).
    """
    if "\x00" in name or "\x00" in image:
        raise ValueError("container name and image must not contain NUL characters")
    data = b"".join((_CONTAINER_HASH_PREFIX, name.encode(), b"\x00", image.encode()))
    return format(xxh64(data), "016x")


def status_hash(status: dict) -> int:
    """XXH64 of the status serialized with sorted keys: equal dicts hash equal whatever their order."""
    return xxh64(orjson.dumps(status, option=orjson.OPT_SORT_KEYS))


# ---------------------------------------------------------------------------------------------
# Relist: CRI list replies -> Snapshot + PLEG events.

_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _restart_count(value: str) -> int:
    """The kubelet's strconv.Atoi reading of the restartCount annotation; 0 when it is not a number."""
    if _ATOI.fullmatch(value) is None:
        return 0
    count = int(value)
    return count if _INT64_MIN <= count <= _INT64_MAX else 0


def _container_record(c: Any) -> ContainerRecord:
    return (
        c.id,
        c.labels.get(labels.POD_UID, ""),
        c.pod_sandbox_id,
        c.metadata.name,
        c.state,
        c.created_at,
        c.metadata.attempt,
        c.annotations.get(labels.CONTAINER_HASH, ""),
        _restart_count(c.annotations.get(labels.CONTAINER_RESTART_COUNT, "")),
    )


def _sandbox_record(s: Any) -> SandboxRecord:
    m = s.metadata
    return (s.id, m.uid, m.name, m.namespace, s.state, s.created_at, m.attempt)


def _decode(message_type: Any, wire: bytes) -> Any:
    try:
        return message_type.FromString(wire if isinstance(wire, bytes) else memoryview(wire).tobytes())
    except DecodeError as exc:
        raise ValueError(f"{message_type.DESCRIPTOR.name}: malformed wire bytes: {exc}") from None


def parse_containers(wire: bytes) -> list[ContainerRecord]:
    """All containers of a ListContainersResponse, fully decoded, in wire order."""
    return [_container_record(c) for c in _decode(pb.ListContainersResponse, wire).containers]


def parse_sandboxes(wire: bytes) -> list[SandboxRecord]:
    """All sandboxes of a ListPodSandboxResponse, fully decoded, in wire order."""
    return [_sandbox_record(s) for s in _decode(pb.ListPodSandboxResponse, wire).items]


def newest_first(records: Iterable[RecordT]) -> list[RecordT]:
    """Container or sandbox records, newest first: created_at, then id, descending (a total order, so
    every caller sees the same one)."""
    return sorted(records, key=lambda r: (r[_CREATED_AT], r[_ID]), reverse=True)


def _by_pod_newest_first(records: Iterable[tuple]) -> dict[str, list[tuple]]:
    by_pod: dict[str, list[tuple]] = {}
    for record in newest_first(records):
        by_pod.setdefault(record[_POD_UID], []).append(record)
    return by_pod


def _checked(records: Mapping[str, tuple], width: int, what: str) -> dict[str, tuple]:
    out = dict(records)
    for key, record in out.items():
        if not (isinstance(key, str) and isinstance(record, tuple) and len(record) == width and record[_ID] == key):
            raise ValueError(f"{what}[{key!r}] must be a {width}-tuple whose first item is its str key")
        key.encode()  # an id that is no valid UTF-8 could never come from the runtime
        state, created_at = record[_STATE], record[_CREATED_AT]
        if not (
            isinstance(state, int)
            and isinstance(created_at, int)
            and -(2**31) <= state < 2**31
            and _INT64_MIN <= created_at <= _INT64_MAX
        ):
            raise ValueError(f"{what}[{key!r}]: state must be an int32 and created_at an int64")
    return out


class Snapshot:
    """What one relist saw: container and sandbox records keyed by id. Immutable once built."""

    __slots__ = ("_containers", "_sandboxes", "_containers_view", "_sandboxes_view", "_by_pod")

    def __init__(self, containers: Mapping[str, tuple], sandboxes: Mapping[str, tuple]) -> None:
        self._set(_checked(containers, _CONTAINER_WIDTH, "containers"),
                  _checked(sandboxes, _SANDBOX_WIDTH, "sandboxes"))

    @classmethod
    def _make(cls, containers: dict[str, tuple], sandboxes: dict[str, tuple]) -> Snapshot:
        snapshot = cls.__new__(cls)
        snapshot._set(containers, sandboxes)
        return snapshot

    def _set(self, containers: dict[str, tuple], sandboxes: dict[str, tuple]) -> None:
        self._containers = containers
        self._sandboxes = sandboxes
        self._containers_view = MappingProxyType(containers)
        self._sandboxes_view = MappingProxyType(sandboxes)
        self._by_pod: tuple[dict, dict] | None = None

    @property
    def containers(self) -> Mapping[str, ContainerRecord]:
        return self._containers_view

    @property
    def sandboxes(self) -> Mapping[str, SandboxRecord]:
        return self._sandboxes_view

    def pod_uids(self) -> set[str]:
        """Every pod uid seen on a container or a sandbox."""
        return {r[_POD_UID] for r in self._containers.values()} | {r[_POD_UID] for r in self._sandboxes.values()}

    def _index(self) -> tuple[dict, dict]:
        if self._by_pod is None:
            self._by_pod = (_by_pod_newest_first(self._containers.values()),
                            _by_pod_newest_first(self._sandboxes.values()))
        return self._by_pod

    def containers_of(self, pod_uid: str) -> list[ContainerRecord]:
        """The pod's container records, newest first (created_at, then id, descending)."""
        return list(self._index()[0].get(pod_uid, ()))

    def sandboxes_of(self, pod_uid: str) -> list[SandboxRecord]:
        """The pod's sandbox records, newest first (created_at, then id, descending)."""
        return list(self._index()[1].get(pod_uid, ()))

    def __repr__(self) -> str:
        return f"Snapshot(containers={len(self._containers)}, sandboxes={len(self._sandboxes)})"


def _same(previous: tuple, item: Any) -> bool:
    return previous[_STATE] == item.state and previous[_CREATED_AT] == item.created_at


def _emit(events: list, pod_uid: str, id_: str, old: int, new: int) -> None:
    """The generic PLEG's event rules for one object whose plegState went from `old` to `new`."""
    if old == new:
        return
    if new == _RUNNING:
        events.append((pod_uid, CONTAINER_STARTED, id_))
    elif new == _EXITED:
        events.append((pod_uid, CONTAINER_DIED, id_))
    elif new == _UNKNOWN:
        events.append((pod_uid, CONTAINER_CHANGED, id_))
    else:
        if old != _EXITED:
            events.append((pod_uid, CONTAINER_DIED, id_))
        events.append((pod_uid, CONTAINER_REMOVED, id_))


def _relist_kind(
    old: dict[str, tuple], items: Any, make: Any, pleg: dict[int, int], events: list
) -> dict[str, tuple]:
    """Diff one list reply against the old records: emit the PLEG events, return the new records.

    An item whose id, state and created_at match an old record keeps that record object. With
    duplicate ids the last item wins and events follow first appearances. The new mapping keeps
    surviving ids in their old order and appends new ids in list order.
    """
    seen: dict[str, tuple] = {}  # old id -> its record now
    fresh: dict[str, tuple] = {}  # id the old records lack -> record
    first_seen: dict[str, int] = {}
    for seq, item in enumerate(items):
        id_ = item.id
        first_seen.setdefault(id_, seq)
        previous = old.get(id_)
        if previous is None:
            fresh[id_] = make(item)
        else:
            seen[id_] = previous if _same(previous, item) else make(item)
    touched = [id_ for id_, record in seen.items() if record is not old[id_]] + list(fresh)
    for id_ in sorted(touched, key=first_seen.__getitem__):
        previous = old.get(id_)
        before = _NON_EXISTENT if previous is None else pleg.get(previous[_STATE], _UNKNOWN)
        record = seen[id_] if previous is not None else fresh[id_]
        _emit(events, record[_POD_UID], id_, before, pleg.get(record[_STATE], _UNKNOWN))
    for id_, previous in old.items():
        if id_ not in seen:
            _emit(events, previous[_POD_UID], id_, pleg.get(previous[_STATE], _UNKNOWN), _NON_EXISTENT)
    if not touched and len(seen) == len(old):
        return old  # snapshots are immutable, so an unchanged mapping is shared
    new = {id_: seen[id_] for id_ in old if id_ in seen}
    new.update(fresh)
    return new


def relist(
    old: Snapshot | None, sandboxes_wire: bytes, containers_wire: bytes
) -> tuple[Snapshot, list[tuple[str, int, str]]]:
    """Parse ListPodSandbox and ListContainers replies; return the new snapshot and the PLEG events.

    Container events come first, then sandbox events; malformed wire bytes raise ValueError.
    """
    if old is not None and not isinstance(old, Snapshot):
        raise TypeError(f"old must be a Snapshot or None, not {type(old).__name__}")
    old_containers = old._containers if old is not None else {}
    old_sandboxes = old._sandboxes if old is not None else {}
    containers = _decode(pb.ListContainersResponse, containers_wire).containers
    sandboxes = _decode(pb.ListPodSandboxResponse, sandboxes_wire).items
    events: list[tuple[str, int, str]] = []
    new_containers = _relist_kind(old_containers, containers, _container_record, _CONTAINER_PLEG, events)
    new_sandboxes = _relist_kind(old_sandboxes, sandboxes, _sandbox_record, _SANDBOX_PLEG, events)
    return Snapshot._make(new_containers, new_sandboxes), events
