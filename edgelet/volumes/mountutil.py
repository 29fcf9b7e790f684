"""mount(2) and umount2(2) (edgelet.libc), the mount table of /proc/self/mountinfo, and a directory removal
that never follows symlinks nor crosses into another filesystem.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass

from edgelet import libc

from .errors import VolumeError

MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2); raises OSError with the errno."""
    try:
        libc.mount(os.fsencode(source), os.fsencode(target), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None)
    except OSError as e:
        raise OSError(e.errno, f"mount {source} on {target}: {os.strerror(e.errno or 0)}", target) from None


def bind_mount(source: str, target: str, *, read_only: bool = False) -> None:
    """Bind-mounts `source` on `target`, then makes that mount read-only if asked (a bind mount takes the flag
    only on a remount); raises OSError."""
    mount(source, target, None, MS_BIND)
    if read_only:
        try:
            mount(source, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        except OSError:
            unmount(target)
            raise


def unmount(target: str, flags: int = UMOUNT_NOFOLLOW) -> None:
    """umount2(2), by default refusing to follow a symlink at the mount point; raises OSError."""
    try:
        libc.umount2(os.fsencode(target), flags)
    except OSError as e:
        raise OSError(e.errno, f"unmount {target}: {os.strerror(e.errno or 0)}", target) from None


@dataclass(frozen=True, slots=True)
class MountInfo:
    mount_point: str
    fstype: str
    source: str
    super_options: str


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as three-digit octal escapes.
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """The entries of a /proc/<pid>/mountinfo text (pure)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            mounts.append(MountInfo(
                mount_point=_unescape(fields[4]),
                fstype=fields[separator + 1],
                source=_unescape(fields[separator + 2]),
                super_options=fields[separator + 3] if len(fields) > separator + 3 else "",
            ))
        except (ValueError, IndexError):
            continue  # not a mount line; the kernel's format has no other kind, so ignore it
    return mounts


def read_mounts() -> list[MountInfo]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as stream:
        return parse_mountinfo(stream.read())


def mounts_under(root: str, mounts: list[MountInfo] | None = None) -> list[MountInfo]:
    """Mounts strictly below `root` (a resolved path), deepest first, so they can be unmounted in order."""
    prefix = root.rstrip("/") + "/"
    found = [m for m in (read_mounts() if mounts is None else mounts) if m.mount_point.startswith(prefix)]
    return sorted(found, key=lambda m: m.mount_point.count("/"), reverse=True)


def is_mount_point(path: str, mounts: list[MountInfo] | None = None) -> bool:
    """Whether something is mounted exactly at `path` (a resolved path); bind mounts included."""
    return any(m.mount_point == path for m in (read_mounts() if mounts is None else mounts))


def unmount_all_under(root: str) -> None:
    """Unmounts everything below `root`, deepest first, stacked mounts included; VolumeError if one stays."""
    for _ in range(8):  # a mount point may carry stacked mounts; each pass removes one layer
        remaining = mounts_under(root)
        if not remaining:
            return
        for entry in remaining:
            try:
                unmount(entry.mount_point)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT):  # already gone
                    raise VolumeError(f"cannot unmount {entry.mount_point}: {exc.strerror}") from None
    remaining = mounts_under(root)
    if remaining:
        raise VolumeError(f"cannot unmount {remaining[0].mount_point}: still mounted")


def remove_tree(path: str) -> None:
    """Removes `path` and everything below it without following symlinks or entering another filesystem.

    Raises VolumeError (leaving the rest in place) where something else is mounted: deleting through a
    leftover bind mount would delete host data.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _remove_contents(fd, info.st_dev, path)
    finally:
        os.close(fd)
    os.rmdir(path)


def _remove_contents(dir_fd: int, device: int, where: str) -> None:
    with os.scandir(dir_fd) as entries:
        names = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
    for name, info in names:
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            continue
        if info.st_dev != device:
            raise VolumeError(f"refusing to remove {where}/{name}: another filesystem is mounted there")
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            _remove_contents(child, device, f"{where}/{name}")
        finally:
            os.close(child)
        os.rmdir(name, dir_fd=dir_fd)
