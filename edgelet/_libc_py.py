"""The pure-Python twin of `edgelet._libc`: the same calls through ctypes, with the same signatures and errors.
Used where the extension is not built (EDGELET_NO_EXTENSIONS=1), and by the tests as its oracle."""

from __future__ import annotations

import ctypes

__all__ = ["HAVE_MALLOC_TRIM", "inotify_add_watch", "inotify_init1", "inotify_rm_watch", "malloc_trim", "mount",
           "umount2"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.inotify_init1.argtypes = (ctypes.c_int,)
_libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
_libc.inotify_rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
_trim = getattr(_libc, "malloc_trim", None)  # glibc's; musl has none
if _trim is not None:
    _trim.argtypes = (ctypes.c_size_t,)
    _trim.restype = ctypes.c_int

HAVE_MALLOC_TRIM = _trim is not None


def _check(result: int, call: str) -> int:
    if result < 0:
        raise OSError(ctypes.get_errno(), call)
    return result


def mount(source: bytes, target: bytes, fstype: bytes | None, flags: int, data: bytes | None) -> None:
    _check(_libc.mount(source, target, fstype, flags, data), "mount")


def umount2(target: bytes, flags: int) -> None:
    _check(_libc.umount2(target, flags), "umount2")


def inotify_init1(flags: int) -> int:
    return _check(_libc.inotify_init1(flags), "inotify_init1")


def inotify_add_watch(fd: int, path: bytes, mask: int) -> int:
    return _check(_libc.inotify_add_watch(fd, path, mask), "inotify_add_watch")


def inotify_rm_watch(fd: int, wd: int) -> None:
    _check(_libc.inotify_rm_watch(fd, wd), "inotify_rm_watch")


def malloc_trim() -> bool:
    return _trim is not None and bool(_trim(0))
