"""A CRI proxy for tests: forwards every call to a real runtime, and can hold chosen replies back (a slow runtime).

A held call has already reached the runtime, which carries it out unhurried: the proxy forwards it with the
caller's deadline, as the runtime would see it, and does not cancel it when the caller stops waiting, as a busy
containerd finishes a create its client stopped waiting for. Only the reply comes late, or never (the caller
gave up first). The proxy runs on
an event loop in a thread of its own, so a test driving an agent process can keep its plain, blocking style.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from grpc import aio

# The one server-streaming CRI call the agent makes; every other call is unary.
_STREAMING = frozenset({"/runtime.v1.RuntimeService/GetContainerEvents"})


class CRIProxy:
    """`with CRIProxy(socket, upstream) as proxy:` serves `proxy.endpoint`; `proxy.hold(method, seconds)` delays
    the replies of `method` ("CreateContainer") from then on; `proxy.calls(method)` counts the calls seen."""

    def __init__(self, socket: Path, upstream: str):
        self.endpoint = f"unix://{socket}"
        self._upstream = upstream
        self._holds: dict[str, float] = {}
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cri-proxy", daemon=True)
        self._server: aio.Server | None = None
        self._channel: aio.Channel | None = None
        self._pending: set[asyncio.Future] = set()

    def hold(self, method: str, seconds: float) -> None:
        with self._lock:
            self._holds[method] = seconds

    def calls(self, method: str) -> int:
        with self._lock:
            return self._calls.get(method, 0)

    def _held(self, path: str) -> float:
        method = path.rsplit("/", 1)[-1]
        with self._lock:
            self._calls[method] = self._calls.get(method, 0) + 1
            return self._holds.get(method, 0.0)

    def __enter__(self) -> CRIProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._channel = aio.insecure_channel(self._upstream)
        self._server = aio.server()
        self._server.add_generic_rpc_handlers((_Forwarder(self),))
        self._server.add_insecure_port(self.endpoint)
        await self._server.start()

    async def _stop(self) -> None:
        await self._server.stop(grace=0)
        if self._pending:  # calls the runtime is still carrying out: let them end before the channel closes
            await asyncio.wait(list(self._pending), timeout=20)
        await self._channel.close()

    async def unary(self, path: str, request: bytes, context: aio.ServicerContext) -> bytes:
        delay = self._held(path)
        began = time.monotonic()
        # Shielded: a caller that stops waiting leaves the runtime to finish the call (within the caller's deadline).
        call = asyncio.ensure_future(self._channel.unary_unary(path)(request, timeout=context.time_remaining()))
        self._pending.add(call)
        call.add_done_callback(self._pending.discard)
        try:
            reply = await asyncio.shield(call)
        except aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        await asyncio.sleep(max(delay - (time.monotonic() - began), 0.0))
        return reply

    async def stream(self, path: str, request: bytes, context: aio.ServicerContext) -> AsyncIterator[bytes]:
        self._held(path)
        call = self._channel.unary_stream(path)(request)
        try:
            async for message in call:
                yield message
        except aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        finally:
            call.cancel()


class _Forwarder(grpc.GenericRpcHandler):
    """Every method, its request and reply as bytes (no decoding: the proxy needs none)."""

    def __init__(self, proxy: CRIProxy):
        self._proxy = proxy

    def service(self, details: grpc.HandlerCallDetails):
        path = details.method
        if path in _STREAMING:
            async def stream(request, context):
                async for message in self._proxy.stream(path, request, context):
                    yield message
            return grpc.unary_stream_rpc_method_handler(stream)

        async def unary(request, context):
            return await self._proxy.unary(path, request, context)
        return grpc.unary_unary_rpc_method_handler(unary)
