"""/containerLogs: a container's CRI log files (rotated ones first) read with the PodLogOptions of the query.

Selecting lines (since, tail, timestamps, byte limit) is pure; following tails the live file and
reopens it when rotation replaced it, until the container stops or the client goes.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from edgelet.containerlogs import LogLine, parse_line

from .paths import LogOptions, parse_rfc3339_ns

_FOLLOW_POLL = 0.2
_READ_CHUNK = 256 * 1024


@dataclass(frozen=True, slots=True)
class Entry:
    """One logical log line: the partial pieces joined, stamped with the first piece's time."""

    timestamp: str
    text: bytes  # with its newline


class LineJoiner:
    """Joins P (partial) lines with the F line ending them, per stream, across reads and files."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[str, bytes]] = {}

    def feed(self, lines: Iterable[LogLine]) -> Iterator[Entry]:
        for line in lines:
            started, text = self._pending.pop(line.stream, (line.timestamp, b""))
            if line.partial:
                self._pending[line.stream] = (started, text + line.text)
            else:
                yield Entry(started, text + line.text + b"\n")


def _since_filter(entries: Iterable[Entry], since_ns: int | None) -> Iterator[Entry]:
    if since_ns is None:
        yield from entries
        return
    for entry in entries:
        try:
            if parse_rfc3339_ns(entry.timestamp) >= since_ns:
                yield entry
        except ValueError:
            continue


def select(entries: Iterable[Entry], options: LogOptions) -> Iterable[Entry]:
    """The entries a non-following read returns before the byte limit: since first, then the tail."""
    chosen = _since_filter(entries, options.since_ns)
    if options.tail_lines is not None:
        return collections.deque(chosen, maxlen=options.tail_lines)
    return chosen


def render(entry: Entry, timestamps: bool) -> bytes:
    return entry.timestamp.encode() + b" " + entry.text if timestamps else entry.text


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
    lines = (parse_line(raw) for raw in handle)
    return joiner.feed(line for line in lines if line is not None)


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
            handles.append(open(path, "rb"))
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
                parsed = (parse_line(raw) for raw in complete)
                entries = _since_filter(joiner.feed(line for line in parsed if line is not None), options.since_ns)
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
