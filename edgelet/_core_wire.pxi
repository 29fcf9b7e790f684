# Protocol-buffers wire reading over raw pointers, for the compiled relist; included by _core.pyx.
# It accepts and rejects exactly what the protobuf runtime (upb) does for the framing it walks:
# tags and lengths of at most 5 bytes, varints of at most 10 (bits past 64 dropped), field 0 and
# wire types 6/7 rejected, groups skipped with matching end tags, 100 levels of nesting at most.
# Every read is bounded by `end`; a failure returns NULL and leaves a WireError in `err`.

cdef enum WireType:
    WT_VARINT = 0
    WT_I64 = 1
    WT_LEN = 2
    WT_SGROUP = 3
    WT_EGROUP = 4
    WT_I32 = 5

cdef enum WireError:
    WIRE_OK = 0
    WIRE_TRUNCATED = 1
    WIRE_VARINT_TOO_LONG = 2
    WIRE_BAD_TAG = 3
    WIRE_BAD_WIRE_TYPE = 4
    WIRE_BAD_END_GROUP = 5
    WIRE_TOO_DEEP = 6

cdef enum:
    MAX_DEPTH = 100

_WIRE_ERRORS = {
    WIRE_TRUNCATED: "truncated (a field runs past the end of its message)",
    WIRE_VARINT_TOO_LONG: "varint too long (over 10 bytes, or over 5 in a tag or a length)",
    WIRE_BAD_TAG: "bad field tag (field number 0 or tag over 32 bits)",
    WIRE_BAD_WIRE_TYPE: "invalid wire type 6 or 7",
    WIRE_BAD_END_GROUP: "end-group tag without its matching start",
    WIRE_TOO_DEEP: "groups nested more than 100 deep",
}

ctypedef struct WireField:
    uint32_t number
    int wire_type
    uint64_t value                 # VARINT, I64 and I32 payloads
    const unsigned char* data      # LEN payload
    Py_ssize_t size


cdef inline const unsigned char* _read_varint(
    const unsigned char* p, const unsigned char* end, uint64_t* out, int max_bytes, int* err
) noexcept nogil:
    cdef uint64_t result = 0
    cdef unsigned char byte
    cdef int shift = 0
    if p < end and p[0] < 0x80:
        out[0] = p[0]
        return p + 1
    while shift < 7 * max_bytes:
        if p >= end:
            err[0] = WIRE_TRUNCATED
            return NULL
        byte = p[0]
        p += 1
        result |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            out[0] = result
            return p
        shift += 7
    err[0] = WIRE_VARINT_TOO_LONG
    return NULL


cdef inline const unsigned char* _read_tag(
    const unsigned char* p, const unsigned char* end, uint32_t* number, int* wire_type, int* err
) noexcept nogil:
    cdef uint64_t tag
    p = _read_varint(p, end, &tag, 5, err)
    if p == NULL:
        return NULL
    if tag > 0xFFFFFFFFULL or tag < 8:
        err[0] = WIRE_BAD_TAG
        return NULL
    number[0] = <uint32_t>(tag >> 3)
    wire_type[0] = <int>(tag & 7)
    return p


cdef inline const unsigned char* _read_payload(
    const unsigned char* p, const unsigned char* end, WireField* f, int* err
) noexcept nogil:
    """The payload of a VARINT, I64, LEN or I32 field; anything else is an error."""
    cdef uint64_t size
    if f.wire_type == WT_VARINT:
        return _read_varint(p, end, &f.value, 10, err)
    if f.wire_type == WT_LEN:
        p = _read_varint(p, end, &size, 5, err)
        if p == NULL:
            return NULL
        if size > <uint64_t>(end - p):
            err[0] = WIRE_TRUNCATED
            return NULL
        f.data = p
        f.size = <Py_ssize_t>size
        return p + size
    if f.wire_type == WT_I64 or f.wire_type == WT_I32:
        size = 8 if f.wire_type == WT_I64 else 4
        if <uint64_t>(end - p) < size:
            err[0] = WIRE_TRUNCATED
            return NULL
        f.value = _le64(p) if size == 8 else _le32(p)
        return p + size
    err[0] = WIRE_BAD_END_GROUP if f.wire_type == WT_EGROUP else WIRE_BAD_WIRE_TYPE
    return NULL


cdef const unsigned char* _skip_group(
    const unsigned char* p, const unsigned char* end, uint32_t number, int depth, int* err
) noexcept nogil:
    """Skip a group whose start tag (field `number`) was just read at nesting `depth`."""
    cdef uint32_t open_groups[MAX_DEPTH + 1]
    cdef int top = 0
    cdef WireField f
    if depth >= MAX_DEPTH:
        err[0] = WIRE_TOO_DEEP
        return NULL
    open_groups[0] = number
    while True:
        p = _read_tag(p, end, &f.number, &f.wire_type, err)
        if p == NULL:
            return NULL
        if f.wire_type == WT_EGROUP:
            if f.number != open_groups[top]:
                err[0] = WIRE_BAD_END_GROUP
                return NULL
            if top == 0:
                return p
            top -= 1
        elif f.wire_type == WT_SGROUP:
            if depth + top + 1 >= MAX_DEPTH:
                err[0] = WIRE_TOO_DEEP
                return NULL
            top += 1
            open_groups[top] = f.number
        else:
            p = _read_payload(p, end, &f, err)
            if p == NULL:
                return NULL


cdef inline const unsigned char* _next_field(
    const unsigned char* p, const unsigned char* end, WireField* f, int depth, int* err
) noexcept nogil:
    """Read one field of a message at nesting `depth`; a group comes back skipped (WT_SGROUP)."""
    p = _read_tag(p, end, &f.number, &f.wire_type, err)
    if p == NULL:
        return NULL
    if f.wire_type == WT_SGROUP:
        return _skip_group(p, end, f.number, depth, err)
    return _read_payload(p, end, f, err)


cdef inline bint _bytes_equal(const unsigned char* p, Py_ssize_t n, bytes expected) noexcept:
    return n == len(expected) and memcmp(p, <const char*>expected, n) == 0
