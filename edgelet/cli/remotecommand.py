"""The client side of an exec session at the runtime's streaming URL, as kubectl speaks it to a kubelet: an HTTP
upgrade to SPDY/3.1, then one stream per channel (error, stdin, stdout, stderr, resize) of `v4.channel.k8s.io`.

SPDY rather than WebSocket: only SPDY can end stdin (a half-close) while the output keeps flowing, which
`cmd < file` needs, and the runtimes' WebSocket protocols before v5 lack. Frames are built and read by pure
functions; `ExecSession` does the socket work, with a thread for stdin and one for writing.
"""

from __future__ import annotations

import os
import queue
import socket
import struct
import threading
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

PROTOCOL = "v4.channel.k8s.io"
SPDY_VERSION = 3
_CHUNK = 32 * 1024
_MAX_HEAD = 64 * 1024

# Control frame types (SPDY/3).
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01


class SessionError(Exception):
    """The streaming server refused the upgrade or broke the protocol; the message says what it answered."""


# -- frames ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Frame:
    control: bool
    kind: int  # the control frame's type; 0 for data
    stream_id: int  # data frames; SYN_REPLY and RST_STREAM carry theirs in the payload (decoded here)
    flags: int
    payload: bytes


def header_block(headers: dict[str, str]) -> bytes:
    """SPDY/3's name/value block before compression: counts and lengths as 32-bit integers, names lowercase."""
    out = [struct.pack("!I", len(headers))]
    for name, value in headers.items():
        raw_name, raw_value = name.lower().encode(), value.encode()
        out += [struct.pack("!I", len(raw_name)), raw_name, struct.pack("!I", len(raw_value)), raw_value]
    return b"".join(out)


def syn_stream(stream_id: int, headers: dict[str, str], compressor) -> bytes:
    """A SYN_STREAM; `compressor` is the session's one zlib stream (each block ends with a sync flush). Sent
    without SPDY's preset dictionary, which a zlib stream may leave out: the receiver only needs it when the
    stream's header asks for it."""
    block = compressor.compress(header_block(headers)) + compressor.flush(zlib.Z_SYNC_FLUSH)
    payload = struct.pack("!IIBB", stream_id, 0, 0, 0) + block
    return control_frame(SYN_STREAM, 0, payload)


def control_frame(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack("!HHI", 0x8000 | SPDY_VERSION, kind, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, payload: bytes, *, fin: bool = False) -> bytes:
    return struct.pack("!II", stream_id & 0x7FFFFFFF, ((FLAG_FIN if fin else 0) << 24) | len(payload)) + payload


class FrameReader:
    """Frames out of the bytes as they arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            first, second = struct.unpack_from("!II", self._buffer)
            length = second & 0xFFFFFF
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8:8 + length])
            del self._buffer[:8 + length]
            flags = second >> 24
            if first & 0x80000000:
                kind = first & 0xFFFF
                stream_id = 0
                if kind in (SYN_REPLY, RST_STREAM, WINDOW_UPDATE, HEADERS) and len(payload) >= 4:
                    stream_id = struct.unpack_from("!I", payload)[0] & 0x7FFFFFFF
                frames.append(Frame(True, kind, stream_id, flags, payload))
            else:
                frames.append(Frame(False, 0, first & 0x7FFFFFFF, flags, payload))
        return frames


def url_target(url: str) -> tuple[str, int, str]:
    """(host, port, path?query) of the streaming URL CRI gave; only plain HTTP, as runtimes serve it locally."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise SessionError(f"the runtime's streaming URL {url!r} is not http://HOST:PORT/...")
    return parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def upgrade_request(target: str, netloc: str) -> bytes:
    lines = [f"POST {target} HTTP/1.1", f"Host: {netloc}", "Connection: Upgrade", "Upgrade: SPDY/3.1",
             f"X-Stream-Protocol-Version: {PROTOCOL}", "Content-Length: 0"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def exit_status(error_stream: bytes) -> tuple[int, str]:
    """(exit code, what to say on stderr) from the status the server writes on the error stream at the end:
    kubectl's "command terminated with exit code N" for a non-zero exit, the server's message for a failure."""
    if not error_stream.strip():
        return 1, "error: the session ended without the command's exit status"
    try:
        status = orjson.loads(error_stream)
    except orjson.JSONDecodeError:
        return 1, f"error: {error_stream.decode(errors='replace').strip()}"
    if status.get("status") == "Success":
        return 0, ""
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
                code = int(cause["message"])
                return code, f"command terminated with exit code {code}"
    return 1, f"error: {status.get('message') or 'the command failed (no message)'}"


def resize_message(columns: int, rows: int) -> bytes:
    return orjson.dumps({"Width": columns, "Height": rows})


# -- the session ----------------------------------------------------------------------------------

def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ExecSession:
    """One upgraded connection with its streams. `open()` upgrades and creates the streams; `run()` copies until
    the command ended and returns the error stream's status bytes."""

    def __init__(self, sock: socket.socket, buffered: bytes, *, stdin: bool, stderr: bool, tty: bool):
        self._sock = sock
        self._reader = FrameReader()
        self._early = buffered
        self._outgoing: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()  # put() is safe in a signal handler
        compressor = zlib.compressobj()
        # The order client-go creates them in; the server waits for exactly the streams the request named.
        wanted = ["error"] + (["stdin"] if stdin else []) + ["stdout"] + (["stderr"] if stderr else []) + (
            ["resize"] if tty else [])
        self.streams = {kind: 1 + 2 * index for index, kind in enumerate(wanted)}  # a client's ids are odd
        sock.sendall(b"".join(syn_stream(sid, {"streamType": kind}, compressor) for kind, sid in self.streams.items()))

    @classmethod
    def open(cls, host: str, port: int, target: str, *, stdin: bool, stderr: bool, tty: bool,
             timeout: float = 10.0) -> ExecSession:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as err:
            raise SessionError(f"cannot reach the runtime's streaming server at {host}:{port}: {err}") from None
        try:
            sock.sendall(upgrade_request(target, f"{host}:{port}"))
            head, rest = _read_head(sock)
            status_line = head.split(b"\r\n", 1)[0].split(b" ", 2)
            if len(status_line) < 2 or status_line[1] != b"101":
                body = rest + _read_rest(sock)
                raise SessionError(body.decode(errors="replace").strip() or head.split(b"\r\n", 1)[0].decode())
            sock.settimeout(None)
            return cls(sock, rest, stdin=stdin, stderr=stderr, tty=tty)
        except BaseException:
            sock.close()
            raise

    def resize(self, columns: int, rows: int) -> None:
        """Queues a terminal size (callable from a signal handler)."""
        if "resize" in self.streams:
            self._outgoing.put(data_frame(self.streams["resize"], resize_message(columns, rows)))

    def run(self, stdin_fd: int | None, stdout_fd: int, stderr_fd: int) -> bytes:
        writer = threading.Thread(target=self._send_loop, name="exec-send", daemon=True)
        writer.start()
        if stdin_fd is not None and "stdin" in self.streams:
            threading.Thread(target=self._stdin_loop, args=(stdin_fd,), name="exec-stdin", daemon=True).start()
        outputs = {self.streams["stdout"]: stdout_fd}
        if "stderr" in self.streams:
            outputs[self.streams["stderr"]] = stderr_fd
        error_id = self.streams["error"]
        pending = {error_id, *outputs}
        status = bytearray()
        data, self._early = self._early, b""
        try:
            while pending:
                if not data:
                    try:
                        data = self._sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        break  # the server closed: every stream ended with it
                for frame in self._reader.feed(data):
                    if frame.control:
                        if frame.kind == PING:
                            self._outgoing.put(control_frame(PING, 0, frame.payload))
                        elif frame.kind == GOAWAY:
                            pending.clear()  # sent once the command ended and its output was written
                        elif frame.kind == RST_STREAM or (frame.kind == SYN_REPLY and frame.flags & FLAG_FIN):
                            pending.discard(frame.stream_id)
                        continue
                    if frame.stream_id == error_id:
                        status += frame.payload
                    elif frame.stream_id in outputs and frame.payload:
                        _write_all(outputs[frame.stream_id], frame.payload)
                    if frame.flags & FLAG_FIN:
                        pending.discard(frame.stream_id)
                data = b""
        finally:
            self._outgoing.put(None)
            self._sock.close()
        return bytes(status)

    def _send_loop(self) -> None:
        while (frame := self._outgoing.get()) is not None:
            try:
                self._sock.sendall(frame)
            except OSError:
                return

    def _stdin_loop(self, fd: int) -> None:
        stream = self.streams["stdin"]
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError:
                chunk = b""
            self._outgoing.put(data_frame(stream, chunk, fin=not chunk))
            if not chunk:
                return


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise SessionError("the runtime's streaming server closed the connection without answering")
        data += chunk
        if len(data) > _MAX_HEAD:
            raise SessionError("the runtime's streaming server's answer has no end of headers")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _read_rest(sock: socket.socket) -> bytes:
    out = b""
    try:
        while len(out) < _MAX_HEAD and (chunk := sock.recv(65536)):
            out += chunk
    except OSError:
        pass
    return out

