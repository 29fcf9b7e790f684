"""/containerLogs: a container's CRI log files (rotated ones first) read with the PodLogOptions of the query.

Lines, messages and their selection (since, tail, timestamps) are `edgelet.logs.reader`'s, shared with
`edgelet logs`; here: the byte limit, batching for the event loop, and following the live file (reopened
when rotation replaced it) until the container stops or the client goes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import IO

from edgelet.logs.reader import LineJoiner, render, select, since_filter
from edgelet.logs.rotation import open_log_file

from .paths import LogOptions

_FOLLOW_POLL = 0.2
_READ_CHUNK = 256 * 1024


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
                handles.append(open(path, "rb") if path == live else open_log_file(path))
            except FileNotFoundError:
                if path == live:
                    raise
                continue  # rotated away since it was listed: its lines are gone
        # Without follow, the log is read to its end: a last line no F line finished is sent as it is.
        read = joiner.feed if options.follow else joiner.read_all
        entries = read(line for handle in handles for line in handle)
        batch = bytearray()
        for entry in select(entries, since_ns=options.since_ns, tail=options.tail_lines):
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
                entries = since_filter(joiner.feed(complete), options.since_ns)
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
                out = b"".join(limit.take(render(entry, options.timestamps))
                               for entry in since_filter(joiner.flush(), options.since_ns))
                if out:
                    yield out  # the container ended on a line it never finished
                return
            await asyncio.sleep(_FOLLOW_POLL)
    finally:
        if own is not None:
            own.close()
