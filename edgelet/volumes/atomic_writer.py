"""Writes ConfigMap, Secret and downward API files the kubelet's AtomicWriter way, so a reader never sees
a half-updated volume: files go into a fresh `..<timestamp>` directory, the `..data` symlink is swapped
to it by rename, and each top-level key is a symlink through `..data`.
"""

from __future__ import annotations

import os
import posixpath
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import VolumeError
from .mountutil import remove_tree

DATA_DIR_NAME = "..data"
NEW_DATA_DIR_NAME = "..data_tmp"
MAX_PATH_LENGTH = 4096
MAX_FILE_NAME_LENGTH = 255


@dataclass(frozen=True, slots=True)
class FileProjection:
    """One file of a volume: its bytes, permission bits and, for a token file, the user that owns it."""

    data: bytes
    mode: int = 0o644
    owner: int | None = None


def path_error(path: str) -> str | None:
    """Why `path` cannot be a key path inside a volume, or None (the kubelet's validatePath)."""
    if not path:
        return "invalid path: must not be empty"
    if path.startswith("/"):
        return f"invalid path: must be relative path: {path}"
    if len(path) > MAX_PATH_LENGTH:
        return f"invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters"
    items = path.split("/")
    for item in items:
        if item == "..":
            return f"invalid path: must not contain '..': {path}"
        if len(item) > MAX_FILE_NAME_LENGTH:
            return f"invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
    if items[0].startswith("..") and len(items[0]) > 2:
        return f"invalid path: must not start with '..': {path}"
    return None


def clean_payload(payload: Mapping[str, FileProjection]) -> dict[str, FileProjection]:
    """The payload keyed by normalized paths; VolumeError on a path that could escape or collide."""
    cleaned: dict[str, FileProjection] = {}
    for path, projection in payload.items():
        if (error := path_error(path)) is not None:
            raise VolumeError(error)
        normalized = posixpath.normpath(path)
        if normalized == ".":
            raise VolumeError(f"invalid path: {path!r} names the volume itself")
        cleaned[normalized] = projection
    for path in cleaned:
        parent = posixpath.dirname(path)
        while parent:
            if parent in cleaned:
                raise VolumeError(f"invalid path: {path} is inside {parent}, which is a file")
            parent = posixpath.dirname(parent)
    return cleaned


def _current_data_dir(target_dir: str) -> str | None:
    """The timestamped directory `..data` points to, if it is a valid one."""
    try:
        name = os.readlink(os.path.join(target_dir, DATA_DIR_NAME))
    except OSError:
        return None
    if "/" in name or not name.startswith("..") or name in (DATA_DIR_NAME, NEW_DATA_DIR_NAME):
        return None
    try:
        info = os.lstat(os.path.join(target_dir, name))
    except OSError:
        return None
    return name if stat.S_ISDIR(info.st_mode) else None


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as stream:
        return stream.read()


def _payload_differs(payload: Mapping[str, FileProjection], data_dir: str) -> bool:
    # Content only, as the kubelet compares: modes are fixed per pod spec, and an fsGroup changes them.
    return any(_read(os.path.join(data_dir, path)) != projection.data for path, projection in payload.items())


def _paths_to_remove(payload: Mapping[str, FileProjection], data_dir: str) -> set[str]:
    """Paths of the old view that the new payload no longer has (files and now-empty directories)."""
    existing: set[str] = set()
    for root, dirs, files in os.walk(data_dir):
        relative = os.path.relpath(root, data_dir)
        for name in dirs + files:
            existing.add(name if relative == "." else f"{relative}/{name}")
    for path in payload:
        while path:
            existing.discard(path)
            path = posixpath.dirname(path)
    return existing


def _write_files(data_dir: str, payload: Mapping[str, FileProjection]) -> None:
    for path, projection in payload.items():
        full = os.path.join(data_dir, path)
        parent = os.path.dirname(full)
        if parent != data_dir:
            os.makedirs(parent, mode=0o755, exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, projection.data)
            if projection.owner is not None:
                os.fchown(fd, projection.owner, -1)
            os.fchmod(fd, projection.mode & 0o7777)  # exact bits, whatever the umask
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _ensure_user_visible(target_dir: str, payload: Mapping[str, FileProjection]) -> None:
    for top in {path.split("/", 1)[0] for path in payload}:
        link = os.path.join(target_dir, top)
        wanted = f"{DATA_DIR_NAME}/{top}"
        try:
            if os.readlink(link) == wanted:
                continue
            os.unlink(link)
        except FileNotFoundError:
            pass
        except OSError as exc:  # something that is not our symlink occupies the name
            raise VolumeError(f"cannot publish {top!r} in {target_dir}: {exc.strerror}") from None
        os.symlink(wanted, link)


def _remove_user_visible(target_dir: str, paths: set[str]) -> None:
    for path in paths:
        if "/" in path:
            continue  # nested paths vanish with the old timestamped directory
        link = os.path.join(target_dir, path)
        if os.path.islink(link):
            os.unlink(link)


def _remove_stale_data_dirs(target_dir: str, keep: str) -> None:
    for entry in os.scandir(target_dir):
        if (entry.name.startswith("..") and entry.name not in (keep, DATA_DIR_NAME)
                and entry.is_dir(follow_symlinks=False)):
            remove_tree(entry.path)


def _make_data_dir(target_dir: str, prefix: str) -> str:
    """A new, empty 0700 directory `<prefix><random>` in `target_dir`, as the kubelet's os.MkdirTemp makes it
    (tempfile.mkdtemp would do, but tempfile brings shutil, bz2 and lzma: 0.5 MiB the agent has no other use for)."""
    for _ in range(100):
        path = os.path.join(target_dir, prefix + secrets.token_hex(5))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{target_dir}: no free name for a new data directory")


def _timestamp(now: float) -> str:
    return time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime(now))


def write_payload(
    target_dir: str,
    payload: Mapping[str, FileProjection],
    *,
    set_perms: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.time,
) -> bool:
    """Makes `target_dir` show exactly `payload`; True if it had to write (False: already up to date).

    `set_perms(data_dir)` runs on the new files before they become visible (fsGroup ownership).
    Readers of the old view keep it intact until the `..data` swap; leftovers of an interrupted
    write (stale timestamped directories, `..data_tmp`) are removed.
    """
    payload = clean_payload(payload)
    old_name = _current_data_dir(target_dir)
    to_remove: set[str] = set()
    if old_name is not None:
        old_dir = os.path.join(target_dir, old_name)
        to_remove = _paths_to_remove(payload, old_dir)
        if not to_remove and not _payload_differs(payload, old_dir):
            _ensure_user_visible(target_dir, payload)
            _remove_stale_data_dirs(target_dir, keep=old_name)
            return False

    new_dir = _make_data_dir(target_dir, _timestamp(now()))
    new_name = os.path.basename(new_dir)
    tmp_link = os.path.join(target_dir, NEW_DATA_DIR_NAME)
    try:
        os.chmod(new_dir, 0o755)  # readers other than root must be able to traverse it
        _write_files(new_dir, payload)
        if set_perms is not None:
            set_perms(new_dir)
        if os.path.lexists(tmp_link):
            os.unlink(tmp_link)
        os.symlink(new_name, tmp_link)
        os.rename(tmp_link, os.path.join(target_dir, DATA_DIR_NAME))
    except OSError as exc:
        if os.path.lexists(tmp_link):
            os.unlink(tmp_link)
        remove_tree(new_dir)
        raise VolumeError(f"cannot write volume files in {target_dir}: {exc.strerror or exc}") from None
    _ensure_user_visible(target_dir, payload)
    _remove_user_visible(target_dir, to_remove)
    _remove_stale_data_dirs(target_dir, keep=new_name)
    return True
