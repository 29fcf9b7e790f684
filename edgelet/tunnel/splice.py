"""The Connect stream's TLS, made with Python's `ssl` instead of gRPC's.

The stream's gRPC channel speaks cleartext HTTP/2 to a socket of this process; each connection gRPC makes
there is spliced to one TLS connection to konnectivity-server, made with `ssl` (ALPN h2, the node's client
certificate, the server verified by name or address). gRPC's own TLS (`grpc.ssl_channel_credentials`) would
bring about 2.3 MiB of its C core's TLS code into the agent for the tunnel alone (a second channel over mTLS
added 2.36 MiB RSS, a cleartext one 0.06 MiB, side by side), while `ssl` is loaded anyway: asyncio imports
it and the API client speaks TLS with it.

The socket is in the abstract namespace under a random name, and only a connection from this very process
(SO_PEERCRED) is spliced: no other process can borrow the node's client certificate through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import ssl
import struct

from edgelet.tunnel.policy import split_host_port

log = logging.getLogger(__name__)

# One read from either side is at most this much: the stream's DATA packets are up to 256 KiB each.
READ_CHUNK = 256 * 1024
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def tls_context(ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> ssl.SSLContext:
    """A client context that verifies konnectivity-server by `ca_pem` and offers the node's certificate; raises
    ssl.SSLError or ValueError for material OpenSSL cannot use."""
    from edgelet.kubeapi.kubeconfig import pem_path  # cluster mode has it loaded already

    context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    with pem_path(cert_pem) as cert_file, pem_path(key_pem) as key_file:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])  # gRPC servers refuse TLS without it
    return context


class TlsSplice:
    """A private cleartext endpoint for one gRPC channel; every connection to it goes on over TLS to `address`."""

    def __init__(self, address: str, context: ssl.SSLContext, *, connect_timeout: float):
        parsed = split_host_port(address)  # the config's checks let no other form through
        if parsed is None:
            raise ValueError(f"not host:port: {address!r}")
        self._host, self._port = parsed
        self._context = context
        self._connect_timeout = connect_timeout
        self._name = f"edgelet-tunnel-{os.getpid()}-{os.urandom(8).hex()}"
        self._server: asyncio.AbstractServer | None = None
        self._pairs: set[asyncio.Task] = set()
        self.last_error = ""  # why the last TLS connection failed or ended, for the stream's error

    @property
    def target(self) -> str:
        """The gRPC target of the endpoint."""
        return f"unix-abstract:{self._name}"

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path="\0" + self._name, limit=READ_CHUNK)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._pairs):
            task.cancel()
        await asyncio.gather(*self._pairs, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None:  # asyncio runs each connection's callback as a task of its own
            raise RuntimeError("a connection handled outside a task")
        self._pairs.add(task)
        try:
            await self._splice(reader, writer)
        finally:
            self._pairs.discard(task)
            writer.close()

    async def _splice(self, local_reader: asyncio.StreamReader, local_writer: asyncio.StreamWriter) -> None:
        sock = local_writer.get_extra_info("socket")
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if pid != os.getpid():
            log.warning("tunnel: refused a connection to the TLS splice from process %d", pid)
            return
        try:
            async with asyncio.timeout(self._connect_timeout):
                remote_reader, remote_writer = await asyncio.open_connection(
                    self._host, self._port, ssl=self._context, server_hostname=self._host, limit=READ_CHUNK)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            self.last_error = _describe(e) or f"no TLS connection within {self._connect_timeout:.0f}s"
            return
        self.last_error = ""
        try:
            outward = asyncio.create_task(_pump(local_reader, remote_writer))
            inward = asyncio.create_task(_pump(remote_reader, local_writer))
            try:
                done, _ = await asyncio.wait((outward, inward), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in (outward, inward):
                    pump.cancel()
                await asyncio.gather(outward, inward, return_exceptions=True)
            for pump in done:
                if not pump.cancelled() and (error := pump.exception()) is not None:
                    self.last_error = _describe(error)
                    break
            else:
                if inward in done and inward.result() == 0:
                    # A TLS 1.3 server checks the client's certificate after the client's handshake is over: one
                    # that refuses it without an alert just closes.
                    self.last_error = "TLS: the server closed the connection before its first byte"
        finally:
            remote_writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await remote_writer.wait_closed()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Copies until end of file and returns the bytes copied; a full peer holds the reads (drain), so nothing
    queues without bound."""
    copied = 0
    while data := await reader.read(READ_CHUNK):
        writer.write(data)
        await writer.drain()
        copied += len(data)
    return copied


def _describe(error: BaseException) -> str:
    """The failure in OpenSSL's words (what describe_stream_error recognises), without the source location."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {error.verify_message}"
    if isinstance(error, ssl.SSLError):
        return "TLS: " + re.sub(r" \(_ssl\.c:\d+\)$", "", str(error))
    if isinstance(error, OSError):
        return f"connect: {error.strerror or error}"
    return str(error)
