"""subPath mounts that cannot escape their volume, the kubelet's way: the path is checked, opened one
component at a time without following symlinks, and the opened file is bind-mounted under the pod
directory, so a container swapping a directory for a symlink later changes nothing.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Mapping

from edgelet.api.env import expand

from .errors import VolumeError
from .mountutil import MS_BIND, MountInfo, is_mount_point, mount

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def subpath_error(subpath: str) -> str | None:
    """Why a subPath is refused before touching the disk (absolute, or backing out with '..')."""
    if subpath.startswith("/"):
        return f"error SubPath `{subpath}` must not be an absolute path"
    if ".." in subpath.split("/"):
        return f"unable to provision SubPath `{subpath}`: must not contain '..'"
    return None


def expand_subpath_expr(expression: str, env: Mapping[str, str]) -> str:
    """A subPathExpr with `$(VAR)` taken from the container's environment; every variable must be set."""
    missing: set[str] = set()

    def lookup(name: str) -> str:
        value = env.get(name, "")
        if not value:
            missing.add(name)
        return value

    expanded = expand(expression, lookup)
    if missing:
        raise VolumeError(f"missing value for {', '.join(sorted(missing))}")
    return expanded


def is_within(path: str, base: str) -> bool:
    """Whether the resolved `path` is `base` or below it."""
    return path == base or path.startswith(base.rstrip("/") + "/")


def _segments(relative: str) -> list[str]:
    relative = posixpath.normpath(relative)
    if relative.startswith("/") or relative == ".." or relative.startswith("../"):
        raise OSError(errno.EXDEV, "path leads outside its volume", relative)
    return [] if relative == "." else relative.split("/")


def _open_below(base: str, relative: str, final_flags: int) -> int:
    """Opens `base/relative` component by component; any symlink on the way is an error."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        parts = _segments(relative)
        for index, part in enumerate(parts):
            flags = final_flags if index == len(parts) - 1 else _DIR_FLAGS
            child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, "unexpected symlink", part)
        return fd
    except BaseException:
        os.close(fd)
        raise


def safe_make_dir(volume_path: str, subpath: str, mode: int) -> None:
    """Creates the missing directories of `subpath` inside the volume with `mode`, never outside it."""
    base = os.path.realpath(volume_path)
    parts = _segments(subpath)
    existing = len(parts)
    while existing and not os.path.lexists(os.path.join(volume_path, *parts[:existing])):
        existing -= 1
    resolved = os.path.realpath(os.path.join(volume_path, *parts[:existing]))
    if not is_within(resolved, base):
        raise VolumeError(f"subPath `{subpath}` leads outside its volume")
    fd = _open_below(base, os.path.relpath(resolved, base), _DIR_FLAGS)
    try:
        for part in parts[existing:]:
            try:
                os.mkdir(part, mode, dir_fd=fd)
            except FileExistsError:
                pass  # created meanwhile; opening it below still refuses a symlink
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            os.fchmod(fd, mode)  # exact bits, whatever the umask
    finally:
        os.close(fd)


def _prepare_target(target: str, is_dir: bool) -> None:
    os.makedirs(os.path.dirname(target), mode=0o750, exist_ok=True)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode) != is_dir:
        (os.rmdir if stat.S_ISDIR(info.st_mode) else os.unlink)(target)
        info = None
    if info is None:
        if is_dir:
            os.mkdir(target, 0o750)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640))


def prepare_safe_subpath(volume_path: str, subpath: str, target: str, mounts: list[MountInfo]) -> str:
    """Bind-mounts `volume_path/subpath` on `target` (reused when already mounted); returns `target`.

    A missing subpath is created as a directory with the volume root's mode, as the kubelet does.
    Raises VolumeError when the path leads outside the volume or through a symlink race.
    """
    if (error := subpath_error(subpath)) is not None:
        raise VolumeError(error)
    full = os.path.join(volume_path, subpath)
    try:
        if not os.path.exists(full):
            safe_make_dir(volume_path, subpath, stat.S_IMODE(os.stat(volume_path).st_mode))
        base = os.path.realpath(volume_path)
        resolved = os.path.realpath(full)
        if not is_within(resolved, base):
            raise VolumeError(f"subPath `{subpath}` leads outside its volume")
        if is_mount_point(target, mounts):
            return target
        fd = _open_below(base, os.path.relpath(resolved, base), _PATH_FLAGS)
        try:
            _prepare_target(target, stat.S_ISDIR(os.fstat(fd).st_mode))
            mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        finally:
            os.close(fd)
    except OSError as exc:
        raise VolumeError(f"cannot prepare subPath `{subpath}`: {exc.strerror or exc}") from None
    return target
