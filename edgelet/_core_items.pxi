# Decoding one Container or PodSandbox from its wire bytes; included by _core.pyx.
# `_scan_item` reads only what a relist needs to recognise an unchanged item; the decoders build
# the full record for new or changed ones.

class _Malformed(ValueError):
    """Raised inside the parser; relist re-raises it as a ValueError naming the item and offset."""


cdef str _text(const unsigned char* p, Py_ssize_t n, str what):
    if n == 0:
        return ""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        raise _Malformed(f"{what} is not valid UTF-8") from None


cdef inline int _fail(int err, str what) except -1:
    raise _Malformed(f"{what}: {_WIRE_ERRORS[err]}")


cdef int64_t _atoi(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Go's strconv.Atoi as the kubelet reads restartCount: [+-]digits within int64, else 0."""
    cdef Py_ssize_t i = 0
    cdef bint negative = False
    cdef uint64_t value = 0, limit, digit
    if n > 0 and (p[0] == c'+' or p[0] == c'-'):
        negative = p[0] == c'-'
        i = 1
    if i == n:
        return 0
    limit = (<uint64_t>1 << 63) if negative else (<uint64_t>1 << 63) - 1
    while i < n:
        if p[i] < c'0' or p[i] > c'9':
            return 0
        digit = p[i] - c'0'
        if value > (limit - digit) // 10:
            return 0
        value = value * 10 + digit
        i += 1
    return -<int64_t>(value - 1) - 1 if negative and value else <int64_t>value


ctypedef struct Span:
    const unsigned char* data
    Py_ssize_t size

cdef Span _NO_SPAN = Span(<const unsigned char*>"", 0)
cdef WireField _NO_FIELD = WireField(0, 0, 0, NULL, 0)


cdef inline int _read_entry(Span entry, Span* key, Span* value, bint* kept) noexcept nogil:
    """A map<string, string> entry; a missing key or value stays empty, as protobuf has it.

    An entry holding any other field is not kept: the protobuf runtime (upb) files such an entry
    among the parent's unknown fields instead of the map.
    """
    cdef const unsigned char* p = entry.data
    cdef const unsigned char* end = entry.data + entry.size
    cdef WireField f = _NO_FIELD
    cdef int err = 0
    key[0] = _NO_SPAN
    value[0] = _NO_SPAN
    kept[0] = True
    while p < end:
        p = _next_field(p, end, &f, 2, &err)
        if p == NULL:
            return err
        if f.wire_type == WT_LEN and f.number == ENTRY_KEY:
            key.data, key.size = f.data, f.size
        elif f.wire_type == WT_LEN and f.number == ENTRY_VALUE:
            value.data, value.size = f.data, f.size
        else:
            kept[0] = False
    return WIRE_OK


ctypedef struct ItemKey:
    Span id
    int32_t state
    int64_t created_at


cdef inline int _scan_item(Span item, uint32_t state_field, uint32_t created_field, ItemKey* key) noexcept nogil:
    """Walk an item's top-level fields for the id, state and created_at only, validating framing."""
    cdef const unsigned char* p = item.data
    cdef const unsigned char* end = item.data + item.size
    cdef WireField f = _NO_FIELD
    cdef int err = 0
    key.id = _NO_SPAN
    key.state = 0
    key.created_at = 0
    while p < end:
        p = _next_field(p, end, &f, 1, &err)
        if p == NULL:
            return err
        if f.wire_type == WT_LEN:
            if f.number == F_ID:
                key.id.data, key.id.size = f.data, f.size
        elif f.wire_type == WT_VARINT:
            if f.number == state_field:
                key.state = <int32_t><uint32_t>f.value
            elif f.number == created_field:
                key.created_at = <int64_t>f.value
    return WIRE_OK


cdef tuple _decode_container(Span item, str id_, int32_t state, int64_t created_at):
    """The container record of a new or changed item; the caller has read id, state and created_at."""
    cdef const unsigned char* p = item.data
    cdef const unsigned char* end = item.data + item.size
    cdef const unsigned char* q
    cdef WireField f = _NO_FIELD, g = _NO_FIELD
    cdef int err = 0
    cdef Span sandbox_id = _NO_SPAN, name = _NO_SPAN, pod_uid = _NO_SPAN, hash_ = _NO_SPAN
    cdef Span restart_count = _NO_SPAN, key = _NO_SPAN, value = _NO_SPAN
    cdef uint32_t attempt = 0
    cdef bint kept
    while p < end:
        p = _next_field(p, end, &f, 1, &err)
        if p == NULL:  # cannot happen after _scan_item checked the framing; kept as a guard
            _fail(err, "Container")
        if f.wire_type != WT_LEN:
            continue
        if f.number == C_SANDBOX_ID:
            sandbox_id.data, sandbox_id.size = f.data, f.size
        elif f.number == C_METADATA:  # repeated occurrences merge, field by field
            q = f.data
            while q < f.data + f.size:
                q = _next_field(q, f.data + f.size, &g, 2, &err)
                if q == NULL:
                    _fail(err, "Container.metadata")
                if g.number == CM_NAME and g.wire_type == WT_LEN:
                    name.data, name.size = g.data, g.size
                elif g.number == CM_ATTEMPT and g.wire_type == WT_VARINT:
                    attempt = <uint32_t>g.value
        elif f.number == C_LABELS or f.number == C_ANNOTATIONS:
            err = _read_entry(Span(f.data, f.size), &key, &value, &kept)
            if err:
                _fail(err, "Container.labels" if f.number == C_LABELS else "Container.annotations")
            if not kept:
                continue
            if f.number == C_LABELS:
                if _bytes_equal(key.data, key.size, _POD_UID_LABEL):
                    pod_uid = value
            elif _bytes_equal(key.data, key.size, _HASH_ANNOTATION):
                hash_ = value
            elif _bytes_equal(key.data, key.size, _RESTART_COUNT_ANNOTATION):
                restart_count = value
    # Decoded only to refuse bad UTF-8 as protobuf does; the count itself is read from the bytes.
    _text(restart_count.data, restart_count.size, "Container restartCount annotation")
    return (
        id_,
        _text(pod_uid.data, pod_uid.size, "Container pod uid label"),
        _text(sandbox_id.data, sandbox_id.size, "Container.pod_sandbox_id"),
        _text(name.data, name.size, "Container.metadata.name"),
        state,
        created_at,
        attempt,
        _text(hash_.data, hash_.size, "Container hash annotation"),
        _atoi(restart_count.data, restart_count.size),
    )


cdef tuple _decode_sandbox(Span item, str id_, int32_t state, int64_t created_at):
    """The sandbox record of a new or changed item; the caller has read id, state and created_at."""
    cdef const unsigned char* p = item.data
    cdef const unsigned char* end = item.data + item.size
    cdef const unsigned char* q
    cdef WireField f = _NO_FIELD, g = _NO_FIELD
    cdef int err = 0
    cdef Span name = _NO_SPAN, uid = _NO_SPAN, namespace = _NO_SPAN
    cdef uint32_t attempt = 0
    while p < end:
        p = _next_field(p, end, &f, 1, &err)
        if p == NULL:  # cannot happen after _scan_item checked the framing; kept as a guard
            _fail(err, "PodSandbox")
        if f.wire_type != WT_LEN or f.number != S_METADATA:
            continue
        q = f.data
        while q < f.data + f.size:
            q = _next_field(q, f.data + f.size, &g, 2, &err)
            if q == NULL:
                _fail(err, "PodSandbox.metadata")
            if g.wire_type == WT_VARINT:
                if g.number == SM_ATTEMPT:
                    attempt = <uint32_t>g.value
            elif g.wire_type == WT_LEN:
                if g.number == SM_NAME:
                    name.data, name.size = g.data, g.size
                elif g.number == SM_UID:
                    uid.data, uid.size = g.data, g.size
                elif g.number == SM_NAMESPACE:
                    namespace.data, namespace.size = g.data, g.size
    return (
        id_,
        _text(uid.data, uid.size, "PodSandbox.metadata.uid"),
        _text(name.data, name.size, "PodSandbox.metadata.name"),
        _text(namespace.data, namespace.size, "PodSandbox.metadata.namespace"),
        state,
        created_at,
        attempt,
    )
