"""Compiled hot path of edgelet: XXH64, the container and status hashes, and the PLEG relist straight
from raw CRI wire bytes. Import `edgelet.core`, never this module; `_core_py` is its reference twin."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from types import MappingProxyType

import orjson

from edgelet.container import labels

include "_core_xxh64.pxi"  # XXH64 over a pointer and a length
include "_core_wire.pxi"   # protobuf wire reading, bounded by the buffer's end

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
cdef bytes _CONTAINER_HASH_PREFIX = b"edgelet.container/v%d\x00" % HASH_VERSION

cdef enum EventType:
    EV_STARTED = 0
    EV_DIED = 1
    EV_REMOVED = 2
    EV_POD_SYNC = 3
    EV_CHANGED = 4

CONTAINER_STARTED = EV_STARTED
CONTAINER_DIED = EV_DIED
CONTAINER_REMOVED = EV_REMOVED
POD_SYNC = EV_POD_SYNC
CONTAINER_CHANGED = EV_CHANGED

CONTAINER_RECORD_FIELDS = (
    "id", "pod_uid", "sandbox_id", "name", "state", "created_at", "attempt", "hash", "restart_count",
)
SANDBOX_RECORD_FIELDS = ("id", "pod_uid", "name", "namespace", "state", "created_at", "attempt")

# The fields by name where the relist reads them, at the places both kinds share; and each kind's width.
cdef enum:
    R_ID = 0
    R_POD_UID = 1
    R_STATE = 4
    R_CREATED_AT = 5
    CONTAINER_WIDTH = 9
    SANDBOX_WIDTH = 7

# The kubelet's plegState of a runtime object.
cdef enum PlegState:
    PLEG_RUNNING
    PLEG_EXITED
    PLEG_UNKNOWN
    PLEG_NON_EXISTENT

# Wire field numbers (runtime.v1): Container, PodSandbox, their metadata, and map entries.
cdef enum:
    F_ID = 1
    C_SANDBOX_ID = 2
    C_METADATA = 3
    C_STATE = 6
    C_CREATED_AT = 7
    C_LABELS = 8
    C_ANNOTATIONS = 9
    CM_NAME = 1
    CM_ATTEMPT = 2
    S_METADATA = 2
    S_STATE = 3
    S_CREATED_AT = 4
    SM_NAME = 1
    SM_UID = 2
    SM_NAMESPACE = 3
    SM_ATTEMPT = 4
    ENTRY_KEY = 1
    ENTRY_VALUE = 2

cdef bytes _POD_UID_LABEL = labels.POD_UID.encode()
cdef bytes _HASH_ANNOTATION = labels.CONTAINER_HASH.encode()
cdef bytes _RESTART_COUNT_ANNOTATION = labels.CONTAINER_RESTART_COUNT.encode()

# ---------------------------------------------------------------------------------------------
# Hashes

def xxh64(data, seed=0):
    """XXH64 of `data` (any C-contiguous bytes-like object) as an unsigned 64-bit int."""
    cdef const unsigned char[::1] view
    cdef const unsigned char* p
    cdef Py_ssize_t n
    cdef uint64_t h
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError("seed must be in range [0, 2**64)")
    cdef uint64_t c_seed = seed
    if type(data) is bytes:
        p = <const unsigned char*>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
    else:
        view = memoryview(data).cast("B")
        n = view.shape[0]
        p = &view[0] if n else <const unsigned char*>b""
    if n < 65536:
        return _xxh64(p, n, c_seed)
    with nogil:  # large inputs only: releasing the GIL costs more than hashing a small one
        h = _xxh64(p, n, c_seed)
    return h


def container_hash(str name not None, str image not None):
    """The container hash the kubelet (since 1.31) derives from name and image, as 16 hex digits.

    A change in it makes the agent restart the container, so the encoding is versioned (HASH_VERSION).
    """
    if "\x00" in name or "\x00" in image:
        raise ValueError("container name and image must not contain NUL characters")
    cdef bytes data = b"".join((_CONTAINER_HASH_PREFIX, name.encode(), b"\x00", image.encode()))
    return "%016x" % _xxh64(<const unsigned char*>PyBytes_AS_STRING(data), len(data), 0)


def status_hash(status):
    """XXH64 of the status serialized with sorted keys: equal dicts hash equal whatever their order."""
    cdef bytes data = orjson.dumps(status, option=orjson.OPT_SORT_KEYS)
    return _xxh64(<const unsigned char*>PyBytes_AS_STRING(data), len(data), 0)


# The relist, bottom up: one item off the wire, the id index a Snapshot keeps, the relist itself.
include "_core_items.pxi"
include "_core_index.pxi"
include "_core_relist.pxi"
