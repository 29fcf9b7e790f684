"""The hot path everything imports: the compiled `edgelet._core` by default, its pure-Python twin
`edgelet._core_py` when EDGELET_NO_EXTENSIONS=1 (read once, at import)."""

from __future__ import annotations

import os

NO_EXTENSIONS = os.environ.get("EDGELET_NO_EXTENSIONS") == "1"

if NO_EXTENSIONS:
    from edgelet import _core_py as _impl
else:
    try:
        from edgelet import _core as _impl  # type: ignore[no-redef, attr-defined]  # compiled: typed by its twin
    except ImportError as exc:
        raise ImportError(
            "edgelet._core (the compiled hot path) is not built: run "
            "`python setup.py build_ext --inplace` or install the package, "
            "or set EDGELET_NO_EXTENSIONS=1 to run the pure-Python twin"
        ) from exc

IS_COMPILED: bool = not NO_EXTENSIONS

HASH_VERSION = _impl.HASH_VERSION
xxh64 = _impl.xxh64
container_hash = _impl.container_hash
status_hash = _impl.status_hash

Snapshot = _impl.Snapshot
relist = _impl.relist
parse_containers = _impl.parse_containers
parse_sandboxes = _impl.parse_sandboxes
newest_first = _impl.newest_first

CONTAINER_STARTED = _impl.CONTAINER_STARTED
CONTAINER_DIED = _impl.CONTAINER_DIED
CONTAINER_REMOVED = _impl.CONTAINER_REMOVED
POD_SYNC = _impl.POD_SYNC
CONTAINER_CHANGED = _impl.CONTAINER_CHANGED
CONTAINER_RECORD_FIELDS = _impl.CONTAINER_RECORD_FIELDS
SANDBOX_RECORD_FIELDS = _impl.SANDBOX_RECORD_FIELDS

__all__ = ["IS_COMPILED", *_impl.__all__]
