"""What each volume type does on disk: emptyDir directories and tmpfs mounts, hostPath type checks,
and the file-backed volumes (configMap, secret, downwardAPI, projected) written atomically.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.api.quantity import parse_quantity, to_int_ceil
from edgelet.api.resources import ResourceError, pod_memory_limit

from .atomic_writer import FileProjection, write_payload
from .errors import VolumeError
from .mountutil import MountInfo, bind_mount, is_mount_point, mount

log = logging.getLogger(__name__)

# The kubelet's plugin directory names under <pod>/volumes/.
PLUGIN_DIRS = {
    "emptyDir": "kubernetes.io~empty-dir",
    "configMap": "kubernetes.io~configmap",
    "secret": "kubernetes.io~secret",
    "downwardAPI": "kubernetes.io~downward-api",
    "projected": "kubernetes.io~projected",
    "local": "kubernetes.io~local-volume",
}
WRITTEN_KINDS = ("configMap", "secret", "downwardAPI", "projected")
# Kept in memory like the kubelet does (tmpfs), so secrets never reach the node's disk.
MEMORY_BACKED_KINDS = ("secret", "downwardAPI", "projected")
# The kubelet mounts these read-only whatever the volumeMount says.
READ_ONLY_KINDS = WRITTEN_KINDS

HOST_PATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                   "BlockDevice")
_HOST_PATH_CHECKS = {
    "Directory": (stat.S_ISDIR, "is not a directory"),
    "File": (stat.S_ISREG, "is not a file"),
    "Socket": (stat.S_ISSOCK, "is not a socket file"),
    "CharDevice": (stat.S_ISCHR, "is not a character device"),
    "BlockDevice": (stat.S_ISBLK, "is not a block device"),
}


# -- hostPath --------------------------------------------------------------------------------------

def _expect(path: str, path_type: str) -> None:
    is_kind, problem = _HOST_PATH_CHECKS[path_type]
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if not is_kind(mode):
        raise VolumeError(f"hostPath type check failed: {path} {problem}")


def check_host_path(path: str, path_type: str | None) -> None:
    """The kubelet's hostPath `type` check; the *OrCreate types create a missing path (never its parents
    for a file). Raises VolumeError naming the path."""
    path_type = path_type or ""
    if path_type not in HOST_PATH_TYPES:
        raise VolumeError(f"hostPath {path}: {path_type} is an invalid volume type")
    if not path_type:
        return
    try:
        if path_type == "DirectoryOrCreate" and not os.path.exists(path):
            os.makedirs(path, mode=0o755, exist_ok=True)
        elif path_type == "FileOrCreate" and not os.path.exists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as exc:
        raise VolumeError(f"hostPath type check failed: cannot create {path}: {exc.strerror}") from None
    _expect(path, {"DirectoryOrCreate": "Directory", "FileOrCreate": "File"}.get(path_type, path_type))


def host_path_error(path: Any) -> str | None:
    """Why a hostPath path is refused before any check (pure)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return f"hostPath path must be absolute, got {path!r}"
    if ".." in path.split("/"):
        return f"hostPath path must not contain '..': {path}"
    return None


# -- local PersistentVolumes -----------------------------------------------------------------------------

def setup_local_volume(target: str, path: str, *, read_only: bool, fs_group: int | None, change_policy: str | None,
                       mounts: list[MountInfo]) -> bool:
    """Bind-mounts a `local` PersistentVolume's directory on `target` (the pod's volume directory), read-only if the
    claim says so; on that first mount the fsGroup is given to the volume unless it is read-only (the kubelet's local
    plugin), and with fsGroupChangePolicy OnRootMismatch only when the root does not have it yet. True if mounted
    now; an existing mount is kept as it is."""
    if is_mount_point(target, mounts):
        return False
    if not os.path.isdir(path):
        raise VolumeError(f'path "{path}" does not exist' if not os.path.exists(path)
                          else f'path "{path}" is not a directory')
    _ensure_dir(target, 0o750)
    try:
        bind_mount(path, target, read_only=read_only)
    except OSError as exc:
        raise VolumeError(f"cannot mount {path}: {exc.strerror}") from None
    if fs_group is not None and not read_only and not (
            change_policy == "OnRootMismatch" and root_has_group(target, fs_group)):
        apply_fs_group(target, fs_group, readonly=False)
    return True


def root_has_group(root: str, gid: int) -> bool:
    """Whether a volume's root already has the group, its read-write bits and setgid (OnRootMismatch skips it)."""
    info = os.stat(root)
    return info.st_gid == gid and info.st_mode & (stat.S_ISGID | 0o060) == (stat.S_ISGID | 0o060)


def fs_group_change_policy(pod: Pod) -> str | None:
    return (podutil.spec(pod).get("securityContext") or {}).get("fsGroupChangePolicy")


# -- emptyDir and tmpfs ----------------------------------------------------------------------------

def memory_volume_size(pod: Pod, size_limit: Any, node_allocatable_memory: int | None) -> int | None:
    """Bytes for a memory-backed volume: node allocatable, lowered to the pod's memory limit and then
    to the volume's sizeLimit when those are smaller (the kubelet's calculateEmptyDirMemorySize)."""
    size = node_allocatable_memory
    try:
        pod_limit = pod_memory_limit(pod)
    except ResourceError as exc:
        raise VolumeError(str(exc)) from None
    for candidate in (pod_limit, _size_limit(size_limit)):
        if candidate is not None and candidate > 0 and (size is None or candidate <= size):
            size = candidate
    return size


def _size_limit(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return to_int_ceil(parse_quantity(value))
    except ValueError as exc:
        raise VolumeError(f"emptyDir.sizeLimit: {exc}") from None


def mount_tmpfs(path: str, size: int | None, mode: int | None = None) -> None:
    options = [f"size={size}"] if size else []
    if mode is not None:
        options.append(f"mode={mode:o}")
    mount("tmpfs", path, "tmpfs", 0, ",".join(options) or None)


def _ensure_dir(path: str, mode: int) -> bool:
    """Creates the volume directory with exact `mode`; True if it was created now."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path) or os.path.islink(path):
            raise VolumeError(f"{path} exists and is not a directory") from None
        return False
    os.chmod(path, mode)
    return True


def setup_empty_dir(path: str, source: dict[str, Any], size: int | None, fs_group: int | None,
                    mounts: list[MountInfo]) -> None:
    """A world-writable directory, or a tmpfs for `medium: Memory`, mounted once and kept."""
    medium = source.get("medium") or ""
    if medium not in ("", "Memory"):
        raise VolumeError(f"emptyDir medium {medium!r} is not supported")
    created = _ensure_dir(path, 0o777)
    if medium == "Memory" and not is_mount_point(path, mounts):
        try:
            mount_tmpfs(path, size)
        except OSError as exc:
            raise VolumeError(f"cannot mount tmpfs for emptyDir {os.path.basename(path)}: {exc.strerror}") from None
        created = True
    if created and fs_group is not None:
        apply_fs_group(path, fs_group, readonly=False)


def apply_fs_group(root: str, gid: int, *, readonly: bool) -> None:
    """Gives group `gid` access to everything below `root` (the kubelet's SetVolumeOwnership)."""
    mask = 0o440 if readonly else 0o660
    for directory, dirs, files in os.walk(root):
        for path in [directory] + [os.path.join(directory, name) for name in dirs + files]:
            info = os.lstat(path)
            os.lchown(path, -1, gid)
            if stat.S_ISLNK(info.st_mode):
                continue
            mode = stat.S_IMODE(info.st_mode) | mask
            if stat.S_ISDIR(info.st_mode):
                mode |= stat.S_ISGID | 0o110
            os.chmod(path, mode)


# -- file-backed volumes ---------------------------------------------------------------------------

_tmpfs_refused_logged = False


def setup_written_volume(path: str, payload: Mapping[str, FileProjection], *, memory_backed: bool,
                         size: int | None, fs_group: int | None, mounts: list[MountInfo]) -> bool:
    """Publishes `payload` in the volume directory; True if files changed.

    Memory-backed volumes get a tmpfs; where mounting is not permitted (no CAP_SYS_ADMIN) they stay on
    disk inside the pod directory, which only root can read (0750), and this is logged once.
    """
    global _tmpfs_refused_logged
    _ensure_dir(path, 0o755)
    if memory_backed and not is_mount_point(path, mounts):
        try:
            mount_tmpfs(path, size, 0o755)
        except PermissionError:
            if not _tmpfs_refused_logged:
                _tmpfs_refused_logged = True
                log.warning("cannot mount tmpfs (no permission): secrets are kept on disk under the "
                            "root-only pod directory")
        except OSError as exc:
            raise VolumeError(f"cannot mount tmpfs for volume {os.path.basename(path)}: {exc.strerror}") from None
    set_perms = None
    if fs_group is not None:
        def set_perms(data_dir: str) -> None:
            # The whole volume, as the kubelet's plugins do, not only the new files: the volume directory itself
            # gets the group (and setgid) too, and files written outside the timestamped directory are covered.
            apply_fs_group(path, fs_group, readonly=True)
    return write_payload(path, payload, set_perms=set_perms)


def fs_group(pod: Pod) -> int | None:
    value = (podutil.spec(pod).get("securityContext") or {}).get("fsGroup")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise VolumeError(f"spec.securityContext.fsGroup must be a non-negative integer, got {value!r}")
    return value
