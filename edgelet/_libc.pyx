"""The C library calls the agent makes that Python's os module lacks: mount(2), umount2(2), inotify(7) and
glibc's malloc_trim(3), compiled. ctypes makes the same calls at 0.3-0.4 MiB of RSS (libffi, `_ctypes` and its
Python layer) for these six functions; `edgelet/_libc_py.py` is that ctypes version, used where this extension
is not built (EDGELET_NO_EXTENSIONS=1), and the tests run both (tests/unit/test_libc.py)."""

from libc.errno cimport errno

cdef extern from "<sys/mount.h>" nogil:
    int c_mount "mount"(const char *source, const char *target, const char *fstype, unsigned long flags,
                        const void *data)
    int c_umount2 "umount2"(const char *target, int flags)

cdef extern from "<sys/inotify.h>" nogil:
    int c_inotify_init1 "inotify_init1"(int flags)
    int c_inotify_add_watch "inotify_add_watch"(int fd, const char *path, unsigned int mask)
    int c_inotify_rm_watch "inotify_rm_watch"(int fd, int wd)

cdef extern from *:
    """
    #include <malloc.h>
    #ifdef __GLIBC__
    #define EDGELET_HAVE_MALLOC_TRIM 1
    static int edgelet_malloc_trim(void) { return malloc_trim(0); }
    #else
    #define EDGELET_HAVE_MALLOC_TRIM 0
    static int edgelet_malloc_trim(void) { return 0; }
    #endif
    """
    int EDGELET_HAVE_MALLOC_TRIM
    int edgelet_malloc_trim() nogil

__all__ = ["HAVE_MALLOC_TRIM", "inotify_add_watch", "inotify_init1", "inotify_rm_watch", "malloc_trim", "mount",
           "umount2"]

HAVE_MALLOC_TRIM = bool(EDGELET_HAVE_MALLOC_TRIM)  # glibc's; musl has none


def mount(bytes source not None, bytes target not None, bytes fstype, unsigned long flags, bytes data) -> None:
    """mount(2) (`fstype` and `data` bytes or None); OSError with the errno."""
    cdef const char *c_fstype = NULL
    cdef const char *c_data = NULL
    if fstype is not None:
        c_fstype = fstype
    if data is not None:
        c_data = data
    cdef const char *c_source = source
    cdef const char *c_target = target
    cdef int result, code
    with nogil:
        result = c_mount(c_source, c_target, c_fstype, flags, c_data)
        code = errno
    if result != 0:
        raise OSError(code, "mount")


def umount2(bytes target not None, int flags) -> None:
    """umount2(2); OSError with the errno."""
    cdef const char *c_target = target
    cdef int result, code
    with nogil:
        result = c_umount2(c_target, flags)
        code = errno
    if result != 0:
        raise OSError(code, "umount2")


def inotify_init1(int flags) -> int:
    """A new inotify descriptor; OSError with the errno."""
    cdef int fd = c_inotify_init1(flags)
    if fd < 0:
        raise OSError(errno, "inotify_init1")
    return fd


def inotify_add_watch(int fd, bytes path not None, unsigned int mask) -> int:
    """The watch descriptor of `path`; OSError with the errno."""
    cdef int wd = c_inotify_add_watch(fd, path, mask)
    if wd < 0:
        raise OSError(errno, "inotify_add_watch")
    return wd


def inotify_rm_watch(int fd, int wd) -> None:
    """Removes a watch; OSError with the errno (EINVAL for one the kernel already dropped)."""
    if c_inotify_rm_watch(fd, wd) != 0:
        raise OSError(errno, "inotify_rm_watch")


def malloc_trim() -> bool:
    """malloc_trim(0): whether memory went back to the system (always False without glibc)."""
    cdef int released
    with nogil:
        released = edgelet_malloc_trim()
    return released != 0
