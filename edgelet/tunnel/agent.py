"""The konnectivity agent inside edgelet: a Connect stream to each konnectivity-server instance over mTLS with
the node's own client certificate, and each dial the server forwards spliced to the node's kubelet API."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from edgelet.config import TunnelConfig
from edgelet.metrics import registry as metrics
from edgelet.tunnel import konnectivity_pb2 as pb
from edgelet.tunnel.policy import (
    AGENT_ID,
    AGENT_IDENTIFIERS,
    SERVER_COUNT,
    SERVER_ID,
    Destinations,
    describe_stream_error,
    stream_slots,
)
from edgelet.tunnel.splice import TlsSplice, tls_context
from edgelet.util.retry import Retrier
from edgelet.util.tasks import wait_set

log = logging.getLogger(__name__)

CONNECT_METHOD = "/AgentService/Connect"
# konnectivity-agent's dial timeout.
DIAL_TIMEOUT = 5.0
# How long the stream waits for the server's headers before the attempt counts as failed.
CONNECT_TIMEOUT = 15.0
# One read from a local connection becomes one DATA packet. Each packet waits for its write to complete, so
# larger packets carry more per round: 256 KiB moved 1.5-2.5 times the bytes of 64 KiB through konnectivity-server.
READ_CHUNK = 256 * 1024
# A local connection that takes no bytes for this long while its buffer is full is closed: it would hold up
# the whole stream (all connections share it).
STALLED_WRITE = 30.0
# A ping a minute finds a stream a cut link left dead (konnectivity-server lets agents ping every 30 s).
CHANNEL_OPTIONS = (("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000),
                   ("grpc.max_receive_message_length", 16 * 1024 * 1024))

TlsMaterial = tuple[bytes, bytes, bytes]  # CA, client key, client certificate (PEM)


class StreamFailed(Exception):
    """A Connect stream could not be opened (or was refused)."""


class SplicedChannel:
    """A cleartext gRPC channel to a TlsSplice; closing it closes the splice (and its TLS connection) too."""

    def __init__(self, channel: grpc.aio.Channel, splice: TlsSplice):
        self._channel = channel
        self.splice = splice

    def stream_stream(self, *args, **kwargs):
        return self._channel.stream_stream(*args, **kwargs)

    async def close(self) -> None:
        try:
            await self._channel.close()
        finally:
            await self.splice.close()


def _packet_dial_response(random_id: int, *, connect_id: int = 0, error: str = "") -> pb.Packet:
    return pb.Packet(type=pb.DIAL_RSP,
                     dialResponse=pb.DialResponse(random=random_id, connectID=connect_id, error=error))


def _packet_close_response(connect_id: int, error: str = "") -> pb.Packet:
    return pb.Packet(type=pb.CLOSE_RSP, closeResponse=pb.CloseResponse(connectID=connect_id, error=error))


@dataclass(slots=True)
class Connection:
    """One spliced dial: a local TCP connection and the stream that carries it."""

    connect_id: int
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    last_active: float = field(default_factory=time.monotonic)
    closed: bool = False
    pump: asyncio.Task | None = None


class ServerStream:
    """One Connect stream to one konnectivity-server instance and the connections it carries."""

    def __init__(self, tunnel: Tunnel, address: str, channel: SplicedChannel, call, server_id: str):
        self.tunnel = tunnel
        self.address = address
        self.server_id = server_id
        self.connections: dict[int, Connection] = {}
        self._channel = channel
        self._call = call
        self._pending: dict[int, asyncio.Task] = {}  # dials in progress by the dialer's random id
        self._send_lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def send(self, packet: pb.Packet) -> None:
        # A write cancelled half-way cancels the whole call in grpc.aio (every connection on the stream): a
        # cancelled sender leaves its write to finish on its own.
        await asyncio.shield(self._write(packet))

    async def _write(self, packet: pb.Packet) -> None:
        async with self._send_lock:  # grpc.aio allows one write at a time
            await self._call.write(packet)

    async def serve(self) -> str:
        """Handles the server's packets until the stream ends; returns why it ended."""
        sweeper = asyncio.create_task(self._sweep_idle(), name=f"tunnel-idle:{self.address}")
        try:
            while True:
                packet = await self._call.read()
                if packet is grpc.aio.EOF:
                    return "the server closed the stream"
                await self._handle(packet)
        except grpc.aio.AioRpcError as e:
            # A cut TLS connection reaches gRPC as a closed socket: the splice knows what happened.
            return self._channel.splice.last_error or f"{e.code().name}: {e.details()}"
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as e:  # a write after the call ended
            return f"the stream ended ({e})"
        finally:
            sweeper.cancel()
            for task in list(self._pending.values()):
                task.cancel()
            for conn in list(self.connections.values()):
                await self._close(conn, notify=False)
            await self._channel.close()

    async def _handle(self, packet: pb.Packet) -> None:
        kind = packet.type
        if kind == pb.DIAL_REQ:
            self._dial(packet.dialRequest)
        elif kind == pb.DATA:
            data = packet.data
            conn = self.connections.get(data.connectID)
            if conn is None:
                await self.send(_packet_close_response(data.connectID, "unrecognized connectID"))
            else:
                await self._deliver(conn, data.data)
        elif kind == pb.CLOSE_REQ:
            connect_id = packet.closeRequest.connectID
            conn = self.connections.get(connect_id)
            if conn is None:
                await self.send(_packet_close_response(connect_id, "Unknown connectID"))
            else:
                await self._close(conn)
        elif kind == pb.DIAL_CLS:
            task = self._pending.pop(packet.closeDial.random, None)
            if task is not None:
                task.cancel()  # the dialer gave up: nothing to answer
        else:
            log.debug("tunnel %s: ignoring a packet of type %d", self.address, kind)

    # -- dials ---------------------------------------------------------------------------------------

    def _dial(self, request: pb.DialRequest) -> None:
        tunnel = self.tunnel
        target = tunnel.destinations.target(request.address) if request.protocol in ("", "tcp") else None
        if target is None:
            tunnel.refuse(request.address, "destination")
            self._reply_later(_packet_dial_response(
                request.random, error=f"edgelet: {request.protocol or 'tcp'} {request.address} may not be dialled "
                                      "through this node's tunnel (only its kubelet API and [cluster.tunnel] "
                                      "allowed_destinations)"))
            return
        if tunnel.open_connections() + len(self._pending) >= tunnel.config.max_connections:
            tunnel.refuse(request.address, "limit")
            self._reply_later(_packet_dial_response(
                request.random, error=f"edgelet: {tunnel.config.max_connections} tunnel connections open already"))
            return
        task = asyncio.create_task(self._connect(request, target), name=f"tunnel-dial:{request.random}")
        self._pending[request.random] = task
        task.add_done_callback(lambda _: self._pending.pop(request.random, None))

    def _reply_later(self, packet: pb.Packet) -> None:
        task = asyncio.create_task(self._send_quietly(packet))
        self.tunnel.keep(task)

    async def _send_quietly(self, packet: pb.Packet) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            await self.send(packet)

    async def _connect(self, request: pb.DialRequest, target: tuple[str, int]) -> None:
        try:
            async with asyncio.timeout(DIAL_TIMEOUT):
                reader, writer = await asyncio.open_connection(*target)
        except (OSError, TimeoutError) as e:
            metrics.tunnel_dials.labels("failed").inc()
            log.info("tunnel: dial %s (%s:%d) failed: %s", request.address, *target, e or "timeout")
            await self._send_quietly(_packet_dial_response(request.random,
                                                           error=f"dial {request.address}: {e or 'timeout'}"))
            return
        # Connected: a DIAL_CLS from now on comes too late to cancel this (the connection would be left behind).
        self._pending.pop(request.random, None)
        writer.transport.set_write_buffer_limits(high=self.tunnel.config.connection_buffer)
        conn = Connection(next(self._ids), request.address, reader, writer)
        self.connections[conn.connect_id] = conn
        self.tunnel.changed()
        metrics.tunnel_dials.labels("spliced").inc()
        try:
            await self.send(_packet_dial_response(request.random, connect_id=conn.connect_id))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            await self._close(conn, notify=False)
            return
        conn.pump = asyncio.create_task(self._pump(conn), name=f"tunnel-conn:{conn.connect_id}")

    # -- bytes -----------------------------------------------------------------------------------------

    async def _deliver(self, conn: Connection, data: bytes) -> None:
        """Server -> local. Waits while the connection's buffer is full: the stream is held up rather than
        the bytes queued without bound (konnectivity-agent blocks its stream the same way)."""
        if conn.closed:
            return
        conn.last_active = time.monotonic()
        metrics.tunnel_bytes.labels("from_server").inc(len(data))
        try:
            conn.writer.write(data)
            if conn.writer.transport.get_write_buffer_size() > self.tunnel.config.connection_buffer:
                async with asyncio.timeout(STALLED_WRITE):
                    await conn.writer.drain()
        except (OSError, TimeoutError, RuntimeError) as e:
            log.info("tunnel: connection %d to %s: write failed (%s); closing it", conn.connect_id, conn.address,
                     e or "stalled")
            await self._close(conn)

    async def _pump(self, conn: Connection) -> None:
        """Local -> server, one DATA packet per read; the stream's flow control paces it."""
        try:
            while data := await conn.reader.read(READ_CHUNK):
                conn.last_active = time.monotonic()
                metrics.tunnel_bytes.labels("to_server").inc(len(data))
                await self.send(pb.Packet(type=pb.DATA, data=pb.Data(connectID=conn.connect_id, data=data)))
        except (OSError, grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass
        finally:
            await self._close(conn)

    async def _close(self, conn: Connection, *, notify: bool = True) -> None:
        """Closes the local side once and, as konnectivity-agent does, tells the server with CLOSE_RSP."""
        if conn.closed:
            return
        conn.closed = True
        self.connections.pop(conn.connect_id, None)
        self.tunnel.changed()
        conn.writer.close()  # the pump reads the end of it and stops: never cancelled in the middle of a write
        if notify:
            await self._send_quietly(_packet_close_response(conn.connect_id))

    async def _sweep_idle(self) -> None:
        timeout = self.tunnel.config.idle_timeout
        while True:
            await asyncio.sleep(min(max(timeout / 4, 0.05), 60.0))
            now = time.monotonic()
            for conn in [c for c in self.connections.values() if now - c.last_active > timeout]:
                log.info("tunnel: closing connection %d to %s: idle for %.0fs", conn.connect_id, conn.address,
                         now - conn.last_active)
                await self._close(conn)


@dataclass(slots=True)
class SlotState:
    address: str
    server_id: str = ""
    connected_since: float = 0.0
    last_error: str = ""
    certificate_refused: bool = False


class Tunnel:
    """Keeps one stream per konnectivity-server instance (per configured address, and as many as the servers
    announce in serverCount), each reconnecting with jittered backoff; `reconnect_now()` cuts the waits short."""

    def __init__(self, config: TunnelConfig, *, node_name: str, identifiers: str, destinations: Destinations,
                 credentials: Callable[[], TlsMaterial], on_change: Callable[[], None] = lambda: None,
                 rng: random.Random | None = None):
        self.config = config
        self.agent_id = node_name
        self.identifiers = identifiers
        self.destinations = destinations
        self.refused = 0
        self._credentials = credentials
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._streams: dict[str, ServerStream] = {}  # by server id
        self._slots: list[SlotState] = []
        self._slot_tasks: list[asyncio.Task] = []
        self._announced = 0
        self._wake = asyncio.Event()
        self._background: set[asyncio.Task] = set()
        self._refused_logged: set[str] = set()

    async def run(self) -> None:
        try:
            self._grow(len(self.config.servers))
            await asyncio.Event().wait()
        finally:
            for task in self._slot_tasks:
                task.cancel()
            await asyncio.gather(*self._slot_tasks, return_exceptions=True)

    def _grow(self, wanted: int) -> None:
        servers = self.config.servers
        while len(self._slot_tasks) < wanted:
            index = len(self._slot_tasks)
            self._slots.append(SlotState(servers[index % len(servers)]))
            self._slot_tasks.append(asyncio.create_task(self._keep_stream(index), name=f"tunnel-slot:{index}"))

    def reconnect_now(self) -> None:
        """The link is back (the Lease was renewed after failures): every stream waiting out its backoff
        dials again now."""
        if any(not slot.server_id for slot in self._slots):
            log.info("tunnel: the API server is reachable again; reconnecting to konnectivity-server now")
        self._wake.set()
        self._wake = asyncio.Event()

    async def _wait(self, delay: float) -> None:
        await wait_set(self._wake, delay)

    async def _keep_stream(self, index: int) -> None:
        slot = self._slots[index]
        retry = Retrier(f"konnectivity tunnel to {slot.address}", initial=1.0, maximum=30.0, rng=self._rng,
                        logger=log, spread="reflector")
        while True:
            try:
                stream = await self._open(slot.address)
            except StreamFailed as e:
                message = describe_stream_error(str(e))
                slot.last_error, slot.certificate_refused = message, "client certificate" in message
                self.changed()
                # A refusal may follow other failures (a reset that lost the server's alert): it gets its line.
                kind = "client certificate" if slot.certificate_refused else None
                await self._wait(retry.failed(message, kind=kind))
                continue
            if stream.server_id in self._streams:
                # A load balancer led this slot to a server another slot holds already: konnectivity-agent drops it.
                await stream._channel.close()
                log.debug("tunnel: %s led to server %s again; trying later", slot.address, stream.server_id)
                await self._wait(retry.failed(f"already connected to server {stream.server_id}", level=logging.DEBUG))
                continue
            self._streams[stream.server_id] = stream
            slot.server_id, slot.connected_since, slot.last_error = stream.server_id, time.time(), ""
            slot.certificate_refused = False
            if not retry.succeeded():
                log.info("tunnel: connected to konnectivity-server %s at %s", stream.server_id, slot.address)
            self.changed()
            try:
                ended = await stream.serve()
            except Exception as e:
                log.exception("tunnel: the stream to server %s failed", stream.server_id)
                ended = f"{type(e).__name__}: {e}"
            finally:
                self._streams.pop(stream.server_id, None)
                slot.server_id, slot.connected_since = "", 0.0
                self.changed()
            slot.last_error = f"stream ended: {ended}"
            await self._wait(retry.failed(f"the stream to server {stream.server_id} ended ({ended})"))

    async def _open(self, address: str) -> ServerStream:
        try:
            ca, key, cert = self._credentials()
        except Exception as e:  # noqa: BLE001 - unreadable credentials are this attempt's failure, retried
            raise StreamFailed(f"no client certificate to connect with: {e}") from None
        try:
            context = tls_context(ca, key, cert)
        except (ssl.SSLError, ValueError) as e:
            raise StreamFailed(f"the client certificate, its key or the CA is not usable: {e}") from None
        splice = TlsSplice(address, context, connect_timeout=CONNECT_TIMEOUT)
        await splice.start()
        channel = SplicedChannel(grpc.aio.insecure_channel(splice.target, options=CHANNEL_OPTIONS), splice)
        connect = channel.stream_stream(CONNECT_METHOD, request_serializer=pb.Packet.SerializeToString,
                                        response_deserializer=pb.Packet.FromString)
        call = connect(metadata=((AGENT_ID, self.agent_id), (AGENT_IDENTIFIERS, self.identifiers)))
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                headers = await call.initial_metadata()
            values = dict(headers or ())
            if SERVER_ID not in values:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    code = await call.code()
                raise StreamFailed(splice.last_error or f"{code.name}: {await call.details()}")
        except TimeoutError:
            await channel.close()
            raise StreamFailed(splice.last_error or f"no answer within {CONNECT_TIMEOUT:.0f}s") from None
        except grpc.aio.AioRpcError as e:
            await channel.close()
            raise StreamFailed(splice.last_error or f"{e.code().name}: {e.details()}") from None
        except StreamFailed:
            await channel.close()
            raise
        try:
            announced = int(values.get(SERVER_COUNT, "1"))
        except ValueError:
            announced = 1
        if announced != self._announced:
            self._announced = announced
            self._grow(stream_slots(len(self.config.servers), announced))
        return ServerStream(self, address, channel, call, str(values[SERVER_ID]))

    # -- what the streams report -------------------------------------------------------------------------

    def refuse(self, address: str, reason: str) -> None:
        self.refused += 1
        metrics.tunnel_dials_refused.labels(reason).inc()
        if address not in self._refused_logged and len(self._refused_logged) < 100:
            self._refused_logged.add(address)
            log.warning("tunnel: refused a dial to %s (%s); further refusals for it are only counted", address,
                        "not this node's kubelet API nor an allowed destination" if reason == "destination"
                        else f"{self.config.max_connections} connections open")
        self.changed()

    def keep(self, task: asyncio.Task) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def open_connections(self) -> int:
        return sum(len(stream.connections) for stream in self._streams.values())

    def changed(self) -> None:
        metrics.tunnel_streams.set(len(self._streams))
        metrics.tunnel_connections.set(self.open_connections())
        self._on_change()

    def snapshot(self) -> dict:
        """The tunnel's state as `edgelet describe node` shows it (also written under root_dir)."""
        return {
            "agentID": self.agent_id,
            "agentIdentifiers": self.identifiers,
            "serverCount": self._announced,
            "streams": [{"address": s.address, "serverID": s.server_id, "connectedSince": s.connected_since,
                         "lastError": s.last_error} for s in self._slots],
            "connections": self.open_connections(),
            "dialsRefused": self.refused,
        }

    def health(self) -> tuple[bool, str]:
        """The "tunnel" check. Being cut off is a state the node rides through; a refused client certificate
        on every stream is an operator's to fix, so it fails the check."""
        connected = [s for s in self._slots if s.server_id]
        wanted = len(self._slots)
        refused = f"; {self.refused} dials refused" if self.refused else ""
        if connected:
            servers = ", ".join(f"{s.server_id} at {s.address}" for s in connected)
            return True, (f"{len(connected)}/{wanted} konnectivity streams ({servers}); "
                          f"{self.open_connections()} connections{refused}")
        errors = "; ".join(sorted({f"{s.address}: {s.last_error}" for s in self._slots if s.last_error}))
        if self._slots and all(s.certificate_refused for s in self._slots):
            return False, errors
        return True, f"no konnectivity stream yet ({errors or 'connecting'}){refused}"
