"""A small blocking WebSocket client speaking the kubelet's `v4.channel.k8s.io` framing, for tests:
every binary message starts with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize)."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import struct


class UpgradeRefused(Exception):
    def __init__(self, status: int, head: bytes, body: bytes):
        super().__init__(f"upgrade refused with {status}: {body[:200]!r}")
        self.status = status
        self.head = head
        self.body = body


class ChannelSocket:
    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self._sock = sock
        self._buffer = bytearray(buffered)

    @classmethod
    def connect(cls, port: int, target: str, context: ssl.SSLContext, *, method: str = "GET",
                protocol: str = "v4.channel.k8s.io", headers: tuple[tuple[str, str], ...] = (),
                timeout: float = 20.0) -> ChannelSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: Upgrade",
                 "Upgrade: websocket", "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Key: {key}",
                 f"Sec-WebSocket-Protocol: {protocol}", *(f"{k}: {v}" for k, v in headers)]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split()[1]) if head else 0
        if status != 101:
            try:
                while chunk := sock.recv(65536):
                    rest += chunk
            except OSError:
                pass
            sock.close()
            raise UpgradeRefused(status, head, rest)
        return cls(sock, rest)

    def send(self, channel: int, data: bytes) -> None:
        payload = bytes([channel]) + data
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = struct.pack("!BB", 0x82, 0x80 | length)
        elif length < 65536:
            header = struct.pack("!BBH", 0x82, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x82, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._sock.sendall(header + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self._buffer += chunk
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def recv(self) -> tuple[int, bytes] | None:
        """The next data message as (channel, bytes); None once the server closed."""
        message = b""
        while True:
            try:
                first, second = self._read(2)
            except EOFError:
                return None
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == 8:
                return None
            if opcode in (9, 10):
                continue  # ping / pong: nothing for the test
            message += payload
            if first & 0x80:
                return (message[0], message[1:]) if message else (0, b"")

    def collect(self) -> dict[int, bytes]:
        """Everything until the server closes, joined per channel."""
        out: dict[int, bytes] = {}
        while (message := self.recv()) is not None:
            channel, data = message
            out[channel] = out.get(channel, b"") + data
        return out

    def close(self) -> None:
        self._sock.close()
