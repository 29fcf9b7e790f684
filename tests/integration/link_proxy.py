"""A slow, flaky link for tests: a TCP proxy on 127.0.0.1 in front of a loopback server (the test registry) that
limits the bytes per second flowing back to the client, counts them, and drops, cuts or stalls the link on
command.

It runs on an event loop of its own in a thread (`running_link`), so a test may block while it serves; its
controls are plain attribute writes, read by the pumps. All connections share one token bucket, as one modem link
would; `rate` None forwards at loopback speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

CHUNK = 16 * 1024


class Link:
    """Bytes served to clients (`served`), connections made (`connections`), drops made (`drops`), and the
    controls: `drop_at(n)` closes every connection once `n` bytes were served in all and keeps the link down (new
    connections are closed at once) until `up()`, unless told it is a blip; `stall()` (or `stall_at(n)` served
    bytes) forwards nothing further but keeps connections open, until `resume()`."""

    def __init__(self, upstream: tuple[str, int], rate: float | None = None):
        self.upstream = upstream
        self.rate = rate
        self.served = 0
        self.connections = 0
        self.address = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._next_send = 0.0
        self._drop_at: int | None = None
        self._stay_down = True
        self.drops = 0
        self._down = False
        self._stalled = False
        self._stall_at: int | None = None

    async def start(self) -> Link:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        return self

    async def close(self) -> None:
        self._drop_all()
        if self._server is not None:
            self._server.close()
        pumps = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if pumps:  # their connections are aborted: they end on their own
            await asyncio.wait(pumps, timeout=1)
        for task in pumps:  # one that does not (a stalled pump) is cancelled
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    def drop_at(self, served: int, *, stay_down: bool = True) -> None:
        """Cut every connection once `served` bytes went through; the link then stays down until `up()`, or
        with `stay_down=False` takes new connections at once (a blip: NAT rebinding, a modem's handover)."""
        self._drop_at, self._stay_down = served, stay_down

    def up(self) -> None:
        self._down = False

    @property
    def down(self) -> bool:
        return self._down

    def stall(self) -> None:
        self._stalled = True

    def stall_at(self, served: int) -> None:
        self._stall_at = served

    def resume(self) -> None:
        self._stalled = False

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self._down:
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, upstream_writer))
        try:
            await asyncio.gather(self._pump(client_reader, upstream_writer, counted=False),
                                 self._pump(upstream_reader, client_writer, counted=True))
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                self._writers.discard(writer)
                writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, counted: bool) -> None:
        while data := await reader.read(CHUNK):
            if not counted:
                writer.write(data)
            elif not await self._serve_bytes(data, writer):
                return
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    def _split(self, data: bytes, limit: int | None) -> tuple[bytes, bytes | None]:
        """`data` cut where `served` reaches `limit`: (all, None) when it does not."""
        if limit is None or self.served + len(data) < limit:
            return data, None
        cut = max(limit - self.served, 0)
        return data[:cut], data[cut:]

    async def _serve_bytes(self, data: bytes, writer: asyncio.StreamWriter) -> bool:
        """Sends `data` to the client at the link's pace; False once the link dropped."""
        head, rest = self._split(data, self._stall_at)
        if rest is not None:
            self._send(head, writer)
            self._stall_at, self._stalled, data = None, True, rest
        while self._stalled:
            await asyncio.sleep(0.05)
        head, rest = self._split(data, self._drop_at)
        if rest is not None:
            self._send(head, writer)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            self._drop_at, self._down = None, self._stay_down
            self.drops += 1
            self._drop_all()
            return False
        await self._pace(len(data))
        self._send(data, writer)
        return True

    def _send(self, data: bytes, writer: asyncio.StreamWriter) -> None:
        self.served += len(data)
        writer.write(data)

    async def _pace(self, size: int) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        start = max(now, self._next_send)
        self._next_send = start + size / self.rate
        await asyncio.sleep(self._next_send - now)


@contextlib.contextmanager
def running_link(upstream: str, rate: float | None = None) -> Iterator[Link]:
    """A Link to `upstream` ("127.0.0.1:PORT") serving from a thread until the block ends."""
    host, _, port = upstream.rpartition(":")
    link = Link((host, int(port)), rate)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="link-proxy", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(link.start(), loop).result(10)
        yield link
    finally:
        asyncio.run_coroutine_threadsafe(link.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
