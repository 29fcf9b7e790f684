"""Linux inotify (edgelet.libc): a non-blocking descriptor, watches, and a pure parser of the event records."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from edgelet import libc

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000

# inotify_init1 takes the O_ flags' values; they differ on a few architectures, so ask the os module.
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_HEADER = struct.Struct("=iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024


class InotifyUnavailable(OSError):
    """The kernel or libc offers no inotify here, or the per-user instance limit is reached."""


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    wd: int
    mask: int
    cookie: int
    name: str  # the entry inside a watched directory; "" for events about the watched path itself


def parse_events(buffer: bytes) -> list[InotifyEvent]:
    """Decode the records one read() returned; a record cut short (never expected) ends the list."""
    events = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        wd, mask, cookie, length = _HEADER.unpack_from(buffer, offset)
        start = offset + _HEADER.size
        if start + length > len(buffer):
            break
        raw_name = buffer[start:start + length].split(b"\0", 1)[0]
        events.append(InotifyEvent(wd, mask, cookie, os.fsdecode(raw_name)))
        offset = start + length
    return events


class Inotify:
    """One inotify instance; close it (or use `with`) to release the descriptor and its watches."""

    def __init__(self) -> None:
        try:
            self._fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except OSError as e:
            raise InotifyUnavailable(e.errno, f"inotify_init1: {os.strerror(e.errno or 0)}") from None
        self._loop: asyncio.AbstractEventLoop | None = None

    def fileno(self) -> int:
        return self._fd

    def add_watch(self, path: str, mask: int) -> int:
        try:
            return libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        except OSError as e:
            raise OSError(e.errno, os.strerror(e.errno or 0), path) from None

    def rm_watch(self, wd: int) -> None:
        """Remove a watch; one the kernel already dropped (its path was deleted) is not an error."""
        with contextlib.suppress(OSError):
            libc.inotify_rm_watch(self._fd, wd)

    def read(self) -> list[InotifyEvent]:
        """Every event queued now; an empty list when none is pending."""
        events: list[InotifyEvent] = []
        while True:
            try:
                buffer = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return events
            if not buffer:
                return events
            events.extend(parse_events(buffer))

    def attach(self, loop: asyncio.AbstractEventLoop, on_events: Callable[[list[InotifyEvent]], None]) -> None:
        """Deliver events to `on_events` from the loop whenever the descriptor becomes readable."""
        self.detach()
        self._loop = loop
        loop.add_reader(self._fd, lambda: on_events(self.read()))

    def detach(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None

    def close(self) -> None:
        if self._fd >= 0:
            self.detach()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
