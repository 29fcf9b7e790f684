# XXH64 after the public xxHash specification, in C-level Cython; included by _core.pyx.
# Lanes are read byte by byte so the result is the same on big-endian devices; compilers turn
# these reads into single loads on little-endian ones.

cdef extern from *:
    """
    #define EDGELET_XXH_P1 0x9E3779B185EBCA87ULL
    #define EDGELET_XXH_P2 0xC2B2AE3D27D4EB4FULL
    #define EDGELET_XXH_P3 0x165667B19E3779F9ULL
    #define EDGELET_XXH_P4 0x85EBCA77C2B2AE63ULL
    #define EDGELET_XXH_P5 0x27D4EB2F165667C5ULL
    """
    const uint64_t XXH_P1 "EDGELET_XXH_P1"
    const uint64_t XXH_P2 "EDGELET_XXH_P2"
    const uint64_t XXH_P3 "EDGELET_XXH_P3"
    const uint64_t XXH_P4 "EDGELET_XXH_P4"
    const uint64_t XXH_P5 "EDGELET_XXH_P5"


cdef inline uint64_t _rotl64(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t _le64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)
            | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40) | (<uint64_t>p[6] << 48)
            | (<uint64_t>p[7] << 56))


cdef inline uint64_t _le32(const unsigned char* p) noexcept nogil:
    return <uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)


cdef inline uint64_t _xxh_round(uint64_t acc, uint64_t lane) noexcept nogil:
    acc += lane * XXH_P2
    return _rotl64(acc, 31) * XXH_P1


cdef inline uint64_t _xxh_merge(uint64_t h, uint64_t acc) noexcept nogil:
    h ^= _xxh_round(0, acc)
    return h * XXH_P1 + XXH_P4


cdef inline uint64_t _xxh64(const unsigned char* p, Py_ssize_t n, uint64_t seed) noexcept nogil:
    cdef const unsigned char* end = p + n
    cdef const unsigned char* last_stripe
    cdef uint64_t h, v1, v2, v3, v4
    if n >= 32:
        v1 = seed + XXH_P1 + XXH_P2
        v2 = seed + XXH_P2
        v3 = seed
        v4 = seed - XXH_P1
        last_stripe = end - 32
        while p <= last_stripe:
            v1 = _xxh_round(v1, _le64(p))
            v2 = _xxh_round(v2, _le64(p + 8))
            v3 = _xxh_round(v3, _le64(p + 16))
            v4 = _xxh_round(v4, _le64(p + 24))
            p += 32
        h = _rotl64(v1, 1) + _rotl64(v2, 7) + _rotl64(v3, 12) + _rotl64(v4, 18)
        h = _xxh_merge(h, v1)
        h = _xxh_merge(h, v2)
        h = _xxh_merge(h, v3)
        h = _xxh_merge(h, v4)
    else:
        h = seed + XXH_P5
    h += <uint64_t>n
    while end - p >= 8:
        h ^= _xxh_round(0, _le64(p))
        h = _rotl64(h, 27) * XXH_P1 + XXH_P4
        p += 8
    if end - p >= 4:
        h ^= _le32(p) * XXH_P1
        h = _rotl64(h, 23) * XXH_P2 + XXH_P3
        p += 4
    while p < end:
        h ^= <uint64_t>p[0] * XXH_P5
        h = _rotl64(h, 11) * XXH_P1
        p += 1
    h ^= h >> 33
    h *= XXH_P2
    h ^= h >> 29
    h *= XXH_P3
    h ^= h >> 32
    return h
