# Snapshot, the relist that reuses unchanged records, and the generic PLEG event rules; included
# by _core.pyx after the item decoders and the index.

def _age(record):
    return (record[R_CREATED_AT], record[R_ID])


def newest_first(records):
    """Container or sandbox records, newest first: created_at, then id, descending (a total order, so
    every caller sees the same one)."""
    return sorted(records, key=_age, reverse=True)


cdef dict _by_pod_newest_first(list records):
    cdef dict by_pod = {}
    for record in newest_first(records):
        by_pod.setdefault(record[R_POD_UID], []).append(record)
    return by_pod


cdef list _checked(records, Py_ssize_t width, str what):
    cdef list out = []
    for key, record in dict(records).items():
        if not (isinstance(key, str) and isinstance(record, tuple) and len(record) == width and record[R_ID] == key):
            raise ValueError(f"{what}[{key!r}] must be a {width}-tuple whose first item is its str key")
        key.encode()  # an id that is no valid UTF-8 could never come from the runtime
        state, created_at = record[R_STATE], record[R_CREATED_AT]
        if not (isinstance(state, int) and isinstance(created_at, int)
                and -2**31 <= state < 2**31 and -2**63 <= created_at < 2**63):
            raise ValueError(f"{what}[{key!r}]: state must be an int32 and created_at an int64")
        out.append(record)
    return out


cdef class Snapshot:
    """What one relist saw: container and sandbox records keyed by id. Immutable once built."""

    cdef _Index _containers
    cdef _Index _sandboxes

    def __init__(self, containers, sandboxes):
        self._containers = _index_of(_checked(containers, CONTAINER_WIDTH, "containers"))
        self._sandboxes = _index_of(_checked(sandboxes, SANDBOX_WIDTH, "sandboxes"))

    @property
    def containers(self):
        """Read-only {container id: record}."""
        return self._containers.mapping()

    @property
    def sandboxes(self):
        """Read-only {sandbox id: record}."""
        return self._sandboxes.mapping()

    def pod_uids(self):
        """Every pod uid seen on a container or a sandbox."""
        return set(self._containers.pods()) | set(self._sandboxes.pods())

    def containers_of(self, pod_uid):
        """The pod's container records, newest first (created_at, then id, descending)."""
        return list(self._containers.pods().get(pod_uid, ()))

    def sandboxes_of(self, pod_uid):
        """The pod's sandbox records, newest first (created_at, then id, descending)."""
        return list(self._sandboxes.pods().get(pod_uid, ()))

    def __repr__(self):
        return f"Snapshot(containers={self._containers.live}, sandboxes={self._sandboxes.live})"


cdef inline int _pleg(int64_t state, bint sandbox) noexcept:
    # SANDBOX_READY 0 / NOTREADY 1; CONTAINER_RUNNING 1 / EXITED 2. CREATED, UNKNOWN and any
    # value this version does not know are "unknown" to the PLEG.
    if sandbox:
        return PLEG_RUNNING if state == 0 else PLEG_EXITED if state == 1 else PLEG_UNKNOWN
    return PLEG_RUNNING if state == 1 else PLEG_EXITED if state == 2 else PLEG_UNKNOWN


cdef int _emit(list events, object pod_uid, object id_, int before, int after) except -1:
    """The generic PLEG's event rules for one object whose plegState went from `before` to `after`."""
    if before == after:
        return 0
    if after == PLEG_RUNNING:
        events.append((pod_uid, CONTAINER_STARTED, id_))
    elif after == PLEG_EXITED:
        events.append((pod_uid, CONTAINER_DIED, id_))
    elif after == PLEG_UNKNOWN:
        events.append((pod_uid, CONTAINER_CHANGED, id_))
    else:
        if before != PLEG_EXITED:
            events.append((pod_uid, CONTAINER_DIED, id_))
        events.append((pod_uid, CONTAINER_REMOVED, id_))
    return 0


cdef class _Walk:
    """Walks the items of a list reply, raising ValueError naming the item and its offset.

    It reads one item ahead: the next item is scanned and hashed and, given an index, the slot it
    will probe is prefetched, so that cache miss overlaps the work on the current item.
    """

    cdef const unsigned char[::1] view
    cdef const unsigned char* base
    cdef const unsigned char* p
    cdef const unsigned char* end
    cdef bint sandbox
    cdef _Index lookahead
    cdef Py_ssize_t index         # of the current item
    cdef Span item
    cdef ItemKey key
    cdef uint64_t hash
    cdef bint has_next
    cdef Span next_item
    cdef ItemKey next_key
    cdef uint64_t next_hash

    def __cinit__(self, wire, bint sandbox, _Index lookahead):
        if wire is None:
            raise TypeError("a bytes-like object is required, not 'NoneType'")
        self.view = wire
        self.base = &self.view[0] if self.view.shape[0] else <const unsigned char*>b""
        self.p = self.base
        self.end = self.base + self.view.shape[0]
        self.sandbox = sandbox
        self.lookahead = lookahead
        self.index = -1
        self.has_next = self._read_ahead()

    cdef bint _read_ahead(self) except -1:
        cdef WireField f = _NO_FIELD
        cdef int err = 0
        cdef const unsigned char* start
        cdef const unsigned char* slot
        while self.p < self.end:
            start = self.p
            self.p = _next_field(self.p, self.end, &f, 0, &err)
            if self.p == NULL:
                self.fail(_WIRE_ERRORS[err], self.index + 1, start)
            if f.number != 1 or f.wire_type != WT_LEN:
                continue
            self.next_item = Span(f.data, f.size)
            if self.sandbox:
                err = _scan_item(self.next_item, S_STATE, S_CREATED_AT, &self.next_key)
            else:
                err = _scan_item(self.next_item, C_STATE, C_CREATED_AT, &self.next_key)
            if err:
                self.fail(_WIRE_ERRORS[err], self.index + 1, f.data)
            if self.lookahead is not None:
                self.next_hash = _id_hash(self.next_key.id.data, self.next_key.id.size)
                slot = <const unsigned char*>&self.lookahead.slots[self.next_hash & <uint64_t>self.lookahead.mask]
                _prefetch(slot)
                _prefetch(slot + sizeof(Slot) - 1)
            return True
        return False

    cdef bint next(self) except -1:
        """Move to the next item, whose id, state and created_at are read; False at the end."""
        if not self.has_next:
            return False
        self.index += 1
        self.item = self.next_item
        self.key = self.next_key
        self.hash = self.next_hash
        self.has_next = self._read_ahead()
        return True

    cdef str id_text(self):
        try:
            return _text(self.key.id.data, self.key.id.size, "id")
        except _Malformed as exc:
            self.fail(str(exc), self.index, self.item.data)

    cdef tuple decode(self, str id_):
        """The current item's full record; `id_` is its id as a str, when the caller has it."""
        try:
            if id_ is None:
                id_ = _text(self.key.id.data, self.key.id.size, "id")
            if self.sandbox:
                return _decode_sandbox(self.item, id_, self.key.state, self.key.created_at)
            return _decode_container(self.item, id_, self.key.state, self.key.created_at)
        except _Malformed as exc:
            self.fail(str(exc), self.index, self.item.data)

    cdef int fail(self, str reason, Py_ssize_t index, const unsigned char* at) except -1:
        kind = "ListPodSandboxResponse" if self.sandbox else "ListContainersResponse"
        item = "PodSandbox" if self.sandbox else "Container"
        raise ValueError(f"{kind}: {item} #{index} at byte {at - self.base}: {reason}")


cdef _Index _relist_kind(_Index old, wire, bint sandbox, list events):
    """Walk one list reply against the old index: emit the PLEG events, return the new index.

    An item whose id, state and created_at match the old index keeps its old record and is not
    decoded further. Duplicate ids: the last item wins; events follow first appearances.
    """
    cdef _Walk walk = _Walk(wire, sandbox, old)
    cdef Py_ssize_t capacity = old.capacity()
    cdef int32_t* first_seen = <int32_t*>PyMem_Calloc(capacity, sizeof(int32_t))  # seq + 1; 0: unseen
    cdef dict changed = {}        # old slot -> new record, for old ids whose state or created_at moved
    cdef dict fresh = {}          # id -> record, for ids the old index lacks
    cdef dict fresh_seq = {}      # id -> seq of its first appearance
    cdef Py_ssize_t seq = 0, matched = 0, slot, pos
    cdef Slot* old_slot
    cdef bint repeated, any_repeated = False
    cdef str id_
    cdef _Index index
    if first_seen == NULL:
        raise MemoryError()
    try:
        while walk.next():
            slot = _index_find(old, walk.key.id.data, walk.key.id.size, walk.hash)
            if slot >= 0:
                old_slot = &old.slots[slot]
                repeated = first_seen[slot] != 0
                if repeated:
                    any_repeated = True
                else:
                    first_seen[slot] = <int32_t>(seq + 1)
                    matched += 1
                if old_slot.state == walk.key.state and old_slot.created_at == walk.key.created_at:
                    if repeated:
                        changed.pop(slot, None)
                else:
                    changed[slot] = walk.decode((<tuple>old.records[old_slot.pos])[R_ID])
            else:
                id_ = walk.id_text()
                if id_ in fresh:
                    any_repeated = True
                else:
                    fresh_seq[id_] = seq
                fresh[id_] = walk.decode(id_)
            seq += 1

        # Events: changed and new ids in order of first appearance, then removed ids in old order.
        candidates = [(first_seen[s] - 1, s, r) for s, r in changed.items()]
        candidates += [(fresh_seq[i], -1, r) for i, r in fresh.items()]
        if (changed and fresh) or any_repeated:  # else both dicts are in first-appearance order
            candidates.sort()  # seqs are distinct, so records are never compared
        for _, slot, record in candidates:
            before = PLEG_NON_EXISTENT if slot < 0 else _pleg(old.slots[slot].state, sandbox)
            _emit(events, record[R_POD_UID], record[R_ID], before, _pleg(record[R_STATE], sandbox))
        if matched < old.live:
            for pos, record in enumerate(old.records):
                if record is not None and first_seen[old.slot_of[pos]] == 0:
                    _emit(events, record[R_POD_UID], record[R_ID], _pleg(record[R_STATE], sandbox), PLEG_NON_EXISTENT)

        if not changed and not fresh and matched == old.live:
            return old
        holes = len(old.records) - matched  # places of removed records the copy would keep
        if not _fits(old, len(old.records) + len(fresh)) or holes > matched + len(fresh):
            records = [
                changed.get(old.slot_of[pos], record)
                for pos, record in enumerate(old.records)
                if record is not None and first_seen[old.slot_of[pos]] != 0
            ]
            return _index_of(records + list(fresh.values()))
        index = _index_copy(old)
        for slot, record in changed.items():
            index.slots[slot].state = record[R_STATE]
            index.slots[slot].created_at = record[R_CREATED_AT]
            index.records[index.slots[slot].pos] = record
        if matched < old.live:
            for pos, record in enumerate(old.records):
                if record is not None and first_seen[old.slot_of[pos]] == 0:
                    _index_remove(index, index.slot_of[pos])
        for record in fresh.values():
            _index_append(index, <tuple>record)
        return index
    finally:
        PyMem_Free(first_seen)


def relist(Snapshot old, sandboxes_wire, containers_wire):
    """Parse ListPodSandbox and ListContainers replies; return the new snapshot and the PLEG events.

    Container events come first, then sandbox events; malformed wire bytes raise ValueError.
    """
    cdef Snapshot snapshot = Snapshot.__new__(Snapshot)
    cdef list events = []
    snapshot._containers = _relist_kind(
        old._containers if old is not None else _EMPTY_INDEX, containers_wire, False, events
    )
    snapshot._sandboxes = _relist_kind(
        old._sandboxes if old is not None else _EMPTY_INDEX, sandboxes_wire, True, events
    )
    return snapshot, events


cdef list _parse_all(wire, bint sandbox):
    cdef _Walk walk = _Walk(wire, sandbox, None)
    cdef list records = []
    while walk.next():
        records.append(walk.decode(None))
    return records


def parse_containers(wire):
    """All containers of a ListContainersResponse, fully decoded, in wire order."""
    return _parse_all(wire, False)


def parse_sandboxes(wire):
    """All sandboxes of a ListPodSandboxResponse, fully decoded, in wire order."""
    return _parse_all(wire, True)
