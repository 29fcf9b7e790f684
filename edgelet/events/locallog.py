"""The node's own event log under root_dir: the events the cluster gets, kept on disk for `edgelet describe`
and `edgelet get events`, whether or not a cluster is configured or reachable.

An append-only JSON-lines file, one line per observation (a repeated event appears again with its
higher count; readers keep the newest line per event name). When the file holds `max_events` lines
or `max_bytes`, it becomes `events.log.1` (replacing the older one) and a new file starts, so the
newest `max_events` observations are always on disk. No fsync: a crash may lose the last lines or
leave one torn line, which readers skip with one warning.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

import orjson

from .model import Event

log = logging.getLogger(__name__)

FILE_NAME = "events.log"
MAX_EVENTS = 1000
MAX_BYTES = 1 << 20


def event_log_dir(root_dir: str) -> str:
    return os.path.join(root_dir, "events")


class EventLog:
    """Appends batches of events; call `append` off the event loop (it writes to disk). A lock keeps a
    shutdown's last batch from interleaving with one still being written by a worker thread."""

    def __init__(self, directory: str, *, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES):
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._lines: int | None = None  # lines in the current file, counted on first use
        self._lock = threading.Lock()

    def append(self, events: Iterable[Event]) -> None:
        data = b"".join(orjson.dumps(event) + b"\n" for event in events)
        if not data:
            return
        with self._lock:
            if self._lines is None:
                self._lines = self._prepare()
            with open(self.path, "ab", opener=_private) as handle:
                handle.write(data)
                size = handle.tell()
            self._lines += data.count(b"\n")
            if self._lines >= self._max_events or size >= self._max_bytes:
                os.replace(self.path, self.path + ".1")
                self._lines = 0

    def _prepare(self) -> int:
        """Creates the directory; ends a line torn by a crash so the next one stays readable."""
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return 0
        if data and not data.endswith(b"\n"):
            with open(self.path, "ab") as handle:
                handle.write(b"\n")
            data += b"\n"
        return data.count(b"\n")


def _private(path: str, flags: int) -> int:
    """Readable by root only, like the pod statuses: messages quote specs and runtime errors."""
    return os.open(path, flags, 0o600)


def read_events(directory: str, *, max_events: int = MAX_EVENTS) -> list[Event]:
    """The newest observation of each event, oldest first, at most `max_events` of them."""
    latest: dict[tuple[str, str], Event] = {}
    skipped = 0
    for path in (os.path.join(directory, FILE_NAME + ".1"), os.path.join(directory, FILE_NAME)):
        try:
            with open(path, "rb") as handle:
                lines = handle.read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            event = _decode(line)
            if event is None:
                skipped += bool(line.strip())
                continue
            meta = event["metadata"]
            key = (meta.get("namespace", ""), meta.get("name", ""))
            latest.pop(key, None)  # re-inserted last: the order is that of the newest observation
            latest[key] = event
    if skipped:
        log.warning("skipped %d unreadable lines in the event log under %s", skipped, directory)
    return list(latest.values())[-max_events:]


def _decode(line: bytes) -> Event | None:
    try:
        event: Any = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("metadata"), dict) \
            or not isinstance(event.get("involvedObject"), dict):
        return None
    return event
