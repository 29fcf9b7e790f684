"""A stopped container's termination message, read as the kubelet reads it: the end of the file at its
terminationMessagePath, or, under FallbackToLogsOnError for a container that failed and left that file empty,
the end of its log. The PLEG reads it once, when it first sees the container exited.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

# The kubelet's limits (pkg/kubelet/container/runtime.go).
MAX_MESSAGE_BYTES = 4 * 1024  # of the message file, its end kept
MAX_LOG_MESSAGE_BYTES = 2 * 1024  # of a message taken from the log, its end kept
MAX_LOG_MESSAGE_LINES = 80  # log lines a message taken from the log looks at
MAX_POD_MESSAGE_BYTES = 12 * 1024  # of all of a pod's messages in its status, shared evenly by its containers

FALLBACK_TO_LOGS = "FallbackToLogsOnError"
# The log lines holding the last MAX_LOG_MESSAGE_BYTES of text, or the last MAX_LOG_MESSAGE_LINES lines, lie
# within this much of the log's end: a CRI line adds about 40 bytes of time stamp and tags to its text.
_LOG_READ_BYTES = 32 * 1024


def message_host_path(mounts: Iterable[tuple[str, str]], container_path: str) -> str | None:
    """The host file mounted at `container_path`, from (container path, host path) pairs; None if none is."""
    for mounted_at, host_path in mounts:
        if mounted_at == container_path:
            return host_path
    return None


def log_tail_text(raw: bytes, *, lines: int = MAX_LOG_MESSAGE_LINES, limit: int = MAX_LOG_MESSAGE_BYTES) -> str:
    """The text of the last `lines` CRI log lines in `raw` (its first line may be cut: it is dropped unless
    `raw` is the whole log), its last `limit` bytes. A full line's text ends with a newline, a partial one's
    does not (a process that ended without one); lines in no CRI format are skipped, as the kubelet skips them."""
    texts = []
    for line in raw.splitlines()[-lines:]:
        parts = line.split(b" ", 3)
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or parts[2][:1] not in (b"F", b"P"):
            continue
        text = parts[3] if len(parts) > 3 else b""
        texts.append(text if parts[2][:1] == b"P" else text + b"\n")
    return b"".join(texts)[-limit:].decode("utf-8", "replace")


def read_end(path: str, limit: int) -> tuple[bytes, bool]:
    """The last `limit` bytes of a file, and whether that is all of it. OSError as open and read raise it."""
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if size > limit:
            stream.seek(size - limit)
        return stream.read(limit), size <= limit


def read_log_tail(log_path: str) -> str:
    try:
        raw, whole = read_end(log_path, _LOG_READ_BYTES)
    except OSError as exc:
        return f"Error on reading termination message from logs: {exc}"
    if not whole:
        raw = raw.partition(b"\n")[2]  # the first line was cut by the read
    return log_tail_text(raw)


def termination_message(mounts: Iterable[tuple[str, str]], message_path: str, policy: str, exit_code: int,
                        log_path: str) -> str:
    """What the container left as its termination message (I/O: the message file, maybe the log)."""
    fallback = policy == FALLBACK_TO_LOGS and exit_code != 0
    host_path = message_host_path(mounts, message_path) if message_path else None
    if host_path is not None:
        try:
            data, _ = read_end(host_path, MAX_MESSAGE_BYTES)
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            return f"Error on reading termination log {host_path}: {exc}"
        if data:
            return data.decode("utf-8", "replace")
    if fallback and log_path:
        return read_log_tail(log_path)
    return ""


def joined_message(runtime_message: str, termination: str) -> str:
    """The runtime's own message (an OOM kill, say), then the container's, as the kubelet joins them."""
    if not termination:
        return runtime_message
    return f"{runtime_message}: {termination}" if runtime_message else termination


def trim_pod_messages(statuses: Iterable[dict], containers: int) -> None:
    """Cuts each terminated state's message to the pod's share per container (the kubelet's normalizeStatus)."""
    budget = MAX_POD_MESSAGE_BYTES // max(containers, 1)
    for status in statuses:
        for key in ("state", "lastState"):
            terminated = (status.get(key) or {}).get("terminated")
            if terminated and len(terminated.get("message") or "") > budget:
                terminated["message"] = terminated["message"][:budget]
