"""The housekeeping pass's heap trim: when it is due, and that glibc's malloc_trim is reached and gives memory back."""

from __future__ import annotations

import ctypes

import pytest

from edgelet.util.heaptrim import TRIM_INTERVAL, HeapTrimmer, libc_malloc_trim, trim_due


@pytest.mark.parametrize("now, next_trim, due", [
    (0.0, float("-inf"), True),  # the first pass trims
    (10.0, 40.0, False),
    (40.0, 40.0, True),
    (41.0, 40.0, True),
])
def test_trim_due(now, next_trim, due):
    assert trim_due(now, next_trim) is due


def test_the_trimmer_trims_at_most_once_an_interval():
    calls = []
    trimmer = HeapTrimmer(lambda: calls.append(1) or True, interval=30.0)
    ran = [trimmer.maybe_trim(t) for t in (100.0, 102.0, 129.9, 130.0, 131.0, 160.0)]
    assert ran == [True, False, False, True, False, True]
    assert len(calls) == 3


def test_without_malloc_trim_the_trimmer_does_nothing():
    assert HeapTrimmer(None).maybe_trim(0.0) is False


def test_the_default_interval_is_longer_than_a_housekeeping_pass():
    assert TRIM_INTERVAL > 2.0  # [sync] housekeeping_interval's default


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_malloc_trim_gives_freed_heap_back():
    """Chunks under the mmap threshold live in the heap; freed below a chunk still in use, free() cannot
    shrink the heap and only a trim returns their pages."""
    trim = libc_malloc_trim()
    assert trim is not None  # the agent's platforms are glibc
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    chunks = [libc.malloc(60_000) for _ in range(300)]  # 18 MB
    fence = libc.malloc(60_000)
    for chunk in chunks:
        ctypes.memset(chunk, 1, 60_000)  # resident
    for chunk in chunks:
        libc.free(chunk)
    before = _rss_kib()
    assert trim() is True
    assert before - _rss_kib() > 12_000
    libc.free(fence)
