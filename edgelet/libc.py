"""mount(2), umount2(2), inotify(7) and malloc_trim(3): the compiled `edgelet._libc` by default, its ctypes twin
`edgelet._libc_py` when EDGELET_NO_EXTENSIONS=1 (as edgelet.core chooses)."""

from __future__ import annotations

import os

# Read here as edgelet.core reads it, not imported from there: the C library calls (util/, volumes/) would
# otherwise load the PLEG's hot path and tie those packages to the runtime's in a circle.
if os.environ.get("EDGELET_NO_EXTENSIONS") == "1":
    from edgelet import _libc_py as _impl
else:
    try:
        from edgelet import _libc as _impl  # type: ignore[no-redef, attr-defined]  # compiled: typed by its twin
    except ImportError as exc:
        raise ImportError(
            "edgelet._libc (the compiled C library calls) is not built: run "
            "`python setup.py build_ext --inplace` or install the package, "
            "or set EDGELET_NO_EXTENSIONS=1 to make them through ctypes"
        ) from exc

HAVE_MALLOC_TRIM: bool = _impl.HAVE_MALLOC_TRIM
mount = _impl.mount
umount2 = _impl.umount2
inotify_init1 = _impl.inotify_init1
inotify_add_watch = _impl.inotify_add_watch
inotify_rm_watch = _impl.inotify_rm_watch
malloc_trim = _impl.malloc_trim

__all__ = list(_impl.__all__)
