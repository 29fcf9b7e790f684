"""Crash-safe, checksummed checkpoint files: a write is all or nothing, and a damaged file is set aside, never trusted.

Format: one ASCII header line, then the payload:

    EDGELET-CHECKPOINT 1 <kind> <payload length> sha256:<hex digest of the payload>\\n<payload>

A text header keeps `head -1` useful when debugging a device. SHA-256 because it is in the standard library
and checkpoints are small (kilobytes), so its cost is noise while it catches every torn write, truncation and
bit flip; CRC32C would need a dependency for a speed nobody needs here. The length field catches truncation
on its own, and every header field is checked, so a flipped bit anywhere is detected.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import logging
import os
import re
import secrets
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"EDGELET-CHECKPOINT"
FORMAT_VERSION = 1
SUFFIX = ".ckpt"
CORRUPT_DIR = "corrupt"
_TEMP_PREFIX = ".tmp-"
_KIND = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
_MAX_HEADER = 256
_HEADER = re.compile(
    rb"EDGELET-CHECKPOINT (?P<version>[0-9]{1,4}) (?P<kind>[a-z0-9][a-z0-9.-]{0,62}) "
    rb"(?P<length>[0-9]{1,15}) sha256:(?P<digest>[0-9a-f]{64})"
)


class CorruptCheckpoint(Exception):
    """What is wrong with a checkpoint's bytes; the store turns it into a warning, never into a crash."""


def encode(kind: str, payload: bytes) -> bytes:
    if not _KIND.fullmatch(kind):
        raise ValueError(f"checkpoint kind {kind!r} must be lower-case letters, digits, '.' or '-'")
    digest = hashlib.sha256(payload).hexdigest()
    header = f"{MAGIC.decode()} {FORMAT_VERSION} {kind} {len(payload)} sha256:{digest}\n".encode()
    return header + payload


def decode(data: bytes, kind: str) -> bytes:
    """The payload of a checkpoint of `kind`; CorruptCheckpoint says what is wrong otherwise."""
    if not data.startswith(MAGIC + b" "):
        raise CorruptCheckpoint("not an edgelet checkpoint (no header)")
    newline = data.find(b"\n", 0, _MAX_HEADER)
    if newline < 0:
        raise CorruptCheckpoint("header is truncated")
    header = _HEADER.fullmatch(data[:newline])
    if header is None:
        raise CorruptCheckpoint("header is malformed")
    if int(header["version"]) != FORMAT_VERSION:
        raise CorruptCheckpoint(f"unsupported format version {int(header['version'])}")
    if header["kind"].decode() != kind:
        raise CorruptCheckpoint(f"holds a {header['kind'].decode()!r} checkpoint, not {kind!r}")
    payload = data[newline + 1:]
    expected = int(header["length"])
    if len(payload) != expected:
        raise CorruptCheckpoint(f"payload is {len(payload)} bytes, header says {expected} (truncated or torn write)")
    if hashlib.sha256(payload).hexdigest().encode() != header["digest"]:
        raise CorruptCheckpoint("checksum mismatch")
    return payload


def _stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def key_to_filename(key: str) -> str:
    """A reversible, safe file name: anything but letters, digits, '_' and '-' is percent-encoded,
    so no key can climb out of the directory, hide as a dot-file or clash with the corrupt/ directory."""
    if not isinstance(key, str) or not key:
        raise ValueError("checkpoint key must be a non-empty string")
    name = urllib.parse.quote(key, safe="-_").replace(".", "%2E").replace("~", "%7E") + SUFFIX
    if len(name.encode()) > 255:
        raise ValueError(f"checkpoint key is too long for a file name: {key[:40]!r}...")
    return name


def filename_to_key(name: str) -> str | None:
    """The key a file name stands for; None for names this module would never have written."""
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    key = urllib.parse.unquote(name[: -len(SUFFIX)])
    try:
        return key if key and key_to_filename(key) == name else None
    except ValueError:
        return None


def replace_file(target: str | os.PathLike[str], data: bytes, *, temp: str | os.PathLike[str], mode: int,
                 exclusive: bool = True, durable: bool = True, sync_parent: bool = True) -> None:
    """Write `data` to `temp`, fsync it, rename it over `target` and fsync the directory: after a crash or a
    failed write (ENOSPC) at any point, `target` holds the old bytes or the new ones, never a part. An
    `exclusive` temp name must not exist yet; otherwise a leftover of an earlier crash is overwritten.
    `sync_parent=False` leaves the directory's fsync to the caller, who makes several renames in it durable
    with one (`sync_directory`). `durable=False` skips both fsyncs, for a file the agent checks and rewrites
    before every use (a display snapshot, a pod's hosts file): a failed write still leaves no temp behind and
    never a part in `target` while the system stays up, but a power cut may leave the old bytes, or an empty
    file, where the new ones were meant to be."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(temp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the exact mode, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    if durable and sync_parent:
        sync_directory(os.path.dirname(os.fspath(target)))


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or unlink in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """Keyed checkpoints of one kind in one directory (give every kind its own directory).

    Blocking I/O: from asyncio code call it through `asyncio.to_thread`. Write errors (disk full, read-only
    file system) raise OSError so the caller knows the state was not persisted; damaged files never raise.
    """

    def __init__(self, directory: str | os.PathLike[str], *, kind: str, mode: int = 0o600, reader: bool = False):
        """`reader`: another process (the CLI) looking at the agent's store: it neither creates, cleans up nor
        moves anything, so it can never remove a temp file the agent is writing."""
        if not _KIND.fullmatch(kind):
            raise ValueError(f"checkpoint kind {kind!r} must be lower-case letters, digits, '.' or '-'")
        self.directory = Path(directory)
        self.kind = kind
        self.mode = mode
        self.reader = reader
        self._unmovable: set[tuple[str, str]] = set()
        if reader:
            return
        if self.directory.exists() and not self.directory.is_dir():
            self._move_non_directory_aside()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._remove_leftover_temp_files()

    def _move_non_directory_aside(self) -> None:
        """A file where the store's directory belongs is damage too: kept beside it, never fatal."""
        destination = self.directory.with_name(f"{self.directory.name}.{CORRUPT_DIR}-{_stamp()}")
        os.replace(self.directory, destination)
        log.warning("checkpoint directory %s was not a directory; moved it to %s and started empty",
                    self.directory, destination)

    def _path(self, key: str) -> str:
        # A str, not a Path: pathlib (3.11) interns every part of a path it parses, and each write's unique
        # temp name would churn the interpreter's interned-string table until it doubles (~1 MiB).
        return os.path.join(self.directory, key_to_filename(key))

    def write(self, key: str, payload: bytes) -> None:
        """Replace `key` atomically: after a crash at any point, a read returns the old or the new payload."""
        self._replace(key, payload, sync_parent=True)

    def write_many(self, changes: Mapping[str, bytes | None]) -> None:
        """Writes each key's payload (deletes a key whose payload is None) with one fsync of the directory for
        them all, where `write` and `delete` take one each: every payload is fsynced before its rename, so
        after a crash at any point each key reads as its old or its new payload, and when this returns all of
        them are durable. On an OSError part-way the keys before it are written (not yet durable), the rest
        untouched: write the batch again."""
        renamed = False
        for key, payload in changes.items():
            if payload is None:
                renamed |= self._unlink(key)
            else:
                self._replace(key, payload, sync_parent=False)
                renamed = True
        if renamed:
            self._sync_directory()

    def _replace(self, key: str, payload: bytes, *, sync_parent: bool) -> None:
        filename = key_to_filename(key)
        target = os.path.join(self.directory, filename)
        temp = os.path.join(self.directory, f"{_TEMP_PREFIX}{secrets.token_hex(6)}-{filename}")
        replace_file(target, encode(self.kind, payload), temp=temp, mode=self.mode, sync_parent=sync_parent)

    def read(self, key: str) -> bytes | None:
        """The payload of `key`, or None when it is absent or was damaged (then it is moved to corrupt/)."""
        return self._read_path(self._path(key))

    def set_aside(self, key: str, problem: str) -> None:
        """For a payload whose checksum is fine but whose content the caller cannot use (say, `null` where a pod
        belongs): moved to corrupt/ with one warning, exactly like byte damage, and never read again."""
        self._set_aside(self._path(key), problem)

    def _checkpoint_names(self) -> list[str]:
        try:
            return sorted(name for name in os.listdir(self.directory) if name.endswith(SUFFIX))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def keys(self) -> list[str]:
        return [key for key in map(filename_to_key, self._checkpoint_names()) if key is not None]

    def delete(self, key: str) -> None:
        if self._unlink(key):
            self._sync_directory()

    def _unlink(self, key: str) -> bool:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            return False
        return True

    def load_all(self) -> dict[str, bytes]:
        """Every intact checkpoint; damaged ones are set aside and left out."""
        result = {}
        for name in self._checkpoint_names():
            key = filename_to_key(name)
            if key is None:
                self._set_aside(os.path.join(self.directory, name), "file name is not an encoded checkpoint key")
                continue
            payload = self._read_path(os.path.join(self.directory, name))
            if payload is not None:
                result[key] = payload
        return result

    def _read_path(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            self._set_aside(path, "is a directory, not a checkpoint file")
            return None
        try:
            return decode(data, self.kind)
        except CorruptCheckpoint as problem:
            self._set_aside(path, str(problem))
            return None

    def _set_aside(self, path: str | Path, problem: str) -> None:
        """Move a damaged file into corrupt/ with a timestamp, keeping it for a post-mortem, and warn once."""
        if self.reader:
            return  # the agent owning the store sets it aside
        path = Path(path)
        corrupt_dir = self.directory / CORRUPT_DIR
        destination = corrupt_dir / f"{path.name}.{_stamp()}"
        try:
            corrupt_dir.mkdir(mode=0o700, exist_ok=True)
            os.replace(path, destination)
            self._sync_directory()
        except OSError as exc:
            # Cannot move it (read-only file system?): deleting would lose evidence, so leave it, say so once.
            if exc.errno != errno.ENOENT and (path.name, problem) not in self._unmovable:
                self._unmovable.add((path.name, problem))
                log.warning("checkpoint %s is damaged (%s) and could not be set aside: %s", path, problem, exc)
            return
        log.warning("checkpoint %s is damaged (%s); moved it to %s and ignored it", path, problem, destination)

    def _remove_leftover_temp_files(self) -> None:
        """Temp files are what a crash during write leaves behind; the rename never happened, so they are junk."""
        for name in os.listdir(self.directory):
            if name.startswith(_TEMP_PREFIX):
                try:
                    os.unlink(self.directory / name)
                    log.info("removed unfinished checkpoint write %s", self.directory / name)
                except OSError as exc:
                    log.warning("cannot remove unfinished checkpoint write %s: %s", self.directory / name, exc)

    def _sync_directory(self) -> None:
        sync_directory(self.directory)
