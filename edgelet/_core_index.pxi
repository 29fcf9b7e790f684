# The id -> record index a compiled Snapshot keeps for containers and for sandboxes; included by
# _core.pyx. Open addressing with linear probing over fixed-size slots that carry the id bytes,
# state and created_at inline: a relist recognises an unchanged item with one or two cache lines
# instead of hopping through a dict, a str, a tuple and an int. Indexes are immutable once a
# Snapshot holds them: a relist that changes nothing shares the old one, one that changes a
# little edits a copy.

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define EDGELET_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define EDGELET_PREFETCH(p) ((void)(p))
    #endif
    """
    void _prefetch "EDGELET_PREFETCH"(const void* p) noexcept nogil

cdef enum:
    INLINE_ID = 64  # container runtimes use 64 hex digits; longer ids compare the rest via the record
    MIN_CAPACITY = 8

ctypedef struct Slot:
    uint64_t hash                 # XXH64 of the id bytes, never 0; 0 marks an empty slot
    int64_t created_at
    int32_t state
    int32_t pos                   # the record's place in _Index.records
    Py_ssize_t id_size
    unsigned char id[INLINE_ID]


cdef inline uint64_t _id_hash(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = _xxh64(p, n, 0)
    return h if h else 1


cdef inline const unsigned char* _utf8_of(str text, Py_ssize_t* size) except NULL:
    # A compact ASCII str (every runtime id) hands out its own buffer; nothing is allocated.
    return <const unsigned char*>PyUnicode_AsUTF8AndSize(text, size)


cdef class _Index:
    """Records of one kind in snapshot order (None where one was removed), found by id bytes."""

    cdef Slot* slots
    cdef Py_ssize_t mask          # capacity - 1
    cdef Py_ssize_t* slot_of      # slot_of[pos]: the slot of records[pos]; capacity entries
    cdef list records
    cdef Py_ssize_t live          # records that are not None
    cdef object view              # lazily: read-only {id: record}
    cdef dict by_pod              # lazily: pod uid -> records, newest first

    def __dealloc__(self):
        PyMem_Free(self.slots)
        PyMem_Free(self.slot_of)

    cdef inline Py_ssize_t capacity(self) noexcept:
        return self.mask + 1

    cdef object mapping(self):
        if self.view is None:
            self.view = MappingProxyType({r[R_ID]: r for r in self.records if r is not None})
        return self.view

    cdef dict pods(self):
        if self.by_pod is None:
            self.by_pod = _by_pod_newest_first([r for r in self.records if r is not None])
        return self.by_pod


cdef _Index _index_with_capacity(Py_ssize_t capacity):
    cdef _Index index = _Index.__new__(_Index)
    index.slots = <Slot*>PyMem_Calloc(capacity, sizeof(Slot))
    index.slot_of = <Py_ssize_t*>PyMem_Malloc(capacity * sizeof(Py_ssize_t))
    if index.slots == NULL or index.slot_of == NULL:
        raise MemoryError()
    index.mask = capacity - 1
    index.records = []
    index.live = 0
    return index


cdef inline Py_ssize_t _capacity_for(Py_ssize_t count) noexcept:
    """The smallest power of two that keeps `count` records at most 3/4 full."""
    cdef Py_ssize_t capacity = MIN_CAPACITY
    while capacity * 3 < count * 4:
        capacity <<= 1
    return capacity


cdef inline bint _fits(_Index index, Py_ssize_t records) noexcept:
    return records * 4 <= index.capacity() * 3


cdef Py_ssize_t _index_find(_Index index, const unsigned char* id, Py_ssize_t size, uint64_t h) except -2:
    """The slot holding `id`, or -1."""
    cdef Py_ssize_t i = <Py_ssize_t>(h & <uint64_t>index.mask)
    cdef Slot* slot
    cdef const unsigned char* full
    cdef Py_ssize_t full_size
    while True:
        slot = &index.slots[i]
        if slot.hash == 0:
            return -1
        if slot.hash == h and slot.id_size == size and memcmp(slot.id, id, min(size, INLINE_ID)) == 0:
            if size <= INLINE_ID:
                return i
            full = _utf8_of(<str>(<tuple>index.records[slot.pos])[R_ID], &full_size)
            if memcmp(full + INLINE_ID, id + INLINE_ID, size - INLINE_ID) == 0:
                return i
        i = (i + 1) & index.mask


cdef int _index_append(_Index index, tuple record) except -1:
    """Add a record whose id is not in the index yet; the caller keeps the load at most 3/4."""
    cdef Py_ssize_t size
    cdef const unsigned char* id = _utf8_of(<str>record[R_ID], &size)
    cdef uint64_t h = _id_hash(id, size)
    cdef Py_ssize_t pos = len(index.records)
    cdef Py_ssize_t i = <Py_ssize_t>(h & <uint64_t>index.mask)
    cdef Slot* slot
    while index.slots[i].hash != 0:
        i = (i + 1) & index.mask
    slot = &index.slots[i]
    slot.hash = h
    slot.created_at = record[R_CREATED_AT]
    slot.state = record[R_STATE]
    slot.pos = <int32_t>pos
    slot.id_size = size
    memcpy(slot.id, id, min(size, INLINE_ID))
    index.slot_of[pos] = i
    index.records.append(record)
    index.live += 1
    return 0


cdef void _index_remove(_Index index, Py_ssize_t i) noexcept:
    """Empty slot i and leave None at its record's place (backward-shift deletion keeps every
    remaining id reachable from its home slot without tombstones)."""
    cdef Py_ssize_t j = i, home
    index.records[index.slots[i].pos] = None
    index.live -= 1
    while True:
        j = (j + 1) & index.mask
        if index.slots[j].hash == 0:
            break
        home = <Py_ssize_t>(index.slots[j].hash & <uint64_t>index.mask)
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            index.slots[i] = index.slots[j]
            index.slot_of[index.slots[i].pos] = i
            i = j
    index.slots[i].hash = 0


cdef _Index _index_of(list records):
    """A fresh index over records with distinct ids, in their order."""
    cdef _Index index = _index_with_capacity(_capacity_for(len(records)))
    for record in records:
        _index_append(index, <tuple>record)
    return index


cdef _Index _index_copy(_Index old):
    cdef _Index index = _index_with_capacity(old.capacity())
    memcpy(index.slots, old.slots, old.capacity() * sizeof(Slot))
    memcpy(index.slot_of, old.slot_of, len(old.records) * sizeof(Py_ssize_t))
    index.records = old.records[:]
    index.live = old.live
    return index


cdef _Index _EMPTY_INDEX = _index_with_capacity(MIN_CAPACITY)
