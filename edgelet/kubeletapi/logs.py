"""/containerLogs: a container's CRI log files (rotated ones first) read with the PodLogOptions of the query.

Selecting lines (since, tail, timestamps, byte limit) is pure; following tails the live file and
reopens it when rotation replaced it, until the container stops or the client goes.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import IO

from .paths import LogOptions, parse_rfc3339_ns

_FOLLOW_POLL = 0.2
_READ_CHUNK = 256 * 1024


# One logical log line: (time stamp of its first piece, text with its newline). Plain tuples: a 10 MiB
# log is 80,000 of them, and every object layer shows in `kubectl logs` time.
Entry = tuple[bytes, bytes]


def split_line(raw: bytes) -> tuple[bytes, bytes, bool, bytes] | None:
    """(time stamp, stream, partial, text) of a CRI log line `<time> <stream> <F|P>[:tags] <text>`; None if not one."""
    parts = raw.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or parts[2][:1] not in (b"F", b"P"):
        return None
    return parts[0], parts[1], parts[2][:1] == b"P", parts[3] if len(parts) > 3 else b""


class LineJoiner:
    """Joins P (partial) lines with the F line ending them, per stream, across reads and files."""

    def __init__(self) -> None:
        self._pending: dict[bytes, tuple[bytes, bytes]] = {}

    def feed(self, raws: Iterable[bytes]) -> Iterator[Entry]:
        pending = self._pending
        for raw in raws:
            line = split_line(raw)
            if line is None:
                continue
            stamp, stream, partial, text = line
            if pending and stream in pending:
                stamp, before = pending.pop(stream)
                text = before + text
            if partial:
                pending[stream] = (stamp, text)
            else:
                yield stamp, text + b"\n"


def _since_filter(entries: Iterable[Entry], since_ns: int | None) -> Iterator[Entry]:
    """Entries stamped at or after since_ns. The runtime writes in time order, so checking stops at
    the first entry that passes."""
    iterator = iter(entries)
    if since_ns is not None:
        for entry in iterator:
            try:
                if parse_rfc3339_ns(entry[0].decode()) >= since_ns:
                    yield entry
                    break
            except ValueError:
                continue
    yield from iterator


def select(entries: Iterable[Entry], options: LogOptions) -> Iterable[Entry]:
    """The entries a non-following read returns before the byte limit: since first, then the tail."""
    chosen = _since_filter(entries, options.since_ns)
    if options.tail_lines is not None:
        return collections.deque(chosen, maxlen=options.tail_lines)
    return chosen


def render(entry: Entry, timestamps: bool) -> bytes:
    return entry[0] + b" " + entry[1] if timestamps else entry[1]


class ByteLimit:
    """Cuts output at limitBytes (mid-line, as the kubelet does); None means no limit."""

    def __init__(self, limit: int | None) -> None:
        self.remaining = limit

    @property
    def exhausted(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def take(self, data: bytes) -> bytes:
        if self.remaining is None:
            return data
        data = data[: max(self.remaining, 0)]
        self.remaining -= len(data)
        return data


def _entries_of(handle: IO[bytes], joiner: LineJoiner) -> Iterator[Entry]:
    return joiner.feed(handle)


async def read_logs(
    files: list[str], options: LogOptions, *, still_running: Callable[[], bool],
    closed: Callable[[], bool] = lambda: False, batch_bytes: int = 64 * 1024,
) -> AsyncIterator[bytes]:
    """The response body in chunks of about batch_bytes; with follow, goes on while the container runs."""
    limit = ByteLimit(options.limit_bytes)
    joiner = LineJoiner()
    live = files[-1]
    handles = []
    try:
        for path in files:
            try:
                handles.append(open(path, "rb"))
            except FileNotFoundError:
                if path == live:
                    raise
                continue  # rotated away since it was listed: its lines are gone
        entries = (entry for handle in handles for entry in _entries_of(handle, joiner))
        batch = bytearray()
        for entry in select(entries, options):
            batch += limit.take(render(entry, options.timestamps))
            if len(batch) >= batch_bytes or limit.exhausted:
                yield bytes(batch)
                batch.clear()
                await asyncio.sleep(0)  # a 10 MiB log must not hold the loop for the whole read
            if limit.exhausted:
                return
        if batch:
            yield bytes(batch)
        if not options.follow:
            return
        async for chunk in _follow(live, handles[-1], joiner, options, limit, still_running, closed):
            yield chunk
    finally:
        for handle in handles:
            handle.close()


async def _follow(path: str, handle: IO[bytes], joiner: LineJoiner, options: LogOptions, limit: ByteLimit,
                  still_running: Callable[[], bool], closed: Callable[[], bool]) -> AsyncIterator[bytes]:
    buffer = b""
    inode = os.fstat(handle.fileno()).st_ino
    own = None  # a handle this function opened after rotation, closed here
    drained = False
    try:
        while not limit.exhausted and not closed():
            chunk = handle.read(_READ_CHUNK)
            if chunk:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                entries = _since_filter(joiner.feed(complete), options.since_ns)
                out = b"".join(limit.take(render(entry, options.timestamps)) for entry in entries)
                if out:
                    yield out
                continue
            try:
                rotated = os.stat(path).st_ino != inode
            except FileNotFoundError:
                rotated = False
            if rotated and not drained:
                drained = True  # one more read of the renamed file: the runtime may have written on before reopening
                continue
            if rotated:
                if own is not None:
                    own.close()
                handle = own = open(path, "rb")
                inode = os.fstat(handle.fileno()).st_ino
                drained = False
                continue
            if not still_running():
                return
            await asyncio.sleep(_FOLLOW_POLL)
    finally:
        if own is not None:
            own.close()
