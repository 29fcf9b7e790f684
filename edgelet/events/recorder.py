"""The event recorder components call: `event(ref, type, reason, message)` only enqueues, so pod work never
waits for events; `run()` drains the queue, correlates, writes the local log and hands events to the
API sink (cluster mode).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from edgelet.metrics import registry as metrics

from .correlator import Correlation, EventCorrelator
from .locallog import EventLog
from .model import ObjectRef, make_event

log = logging.getLogger(__name__)

# The broadcaster queue of client-go is 1000 deep and drops when full; so does this one.
QUEUE_SIZE = 1000


class Sink(Protocol):
    def accept(self, items: list[Correlation]) -> None:
        """Takes correlated events without waiting (the API sink buffers them)."""


class Recorder(Protocol):
    def event(self, ref: ObjectRef, event_type: str, reason: str, message: str) -> None: ...


class DiscardEvents:
    """The recorder of a component built without one (tests, tools)."""

    def event(self, ref: ObjectRef, event_type: str, reason: str, message: str) -> None:
        pass


NO_EVENTS = DiscardEvents()


class EventRecorder:
    def __init__(self, host: str, event_log: EventLog | None, *, clock: Callable[[], float] = time.time,
                 correlator: EventCorrelator | None = None, queue_size: int = QUEUE_SIZE):
        self.host = host
        self._log = event_log
        self._clock = clock
        self._correlator = correlator or EventCorrelator(clock=clock)
        self._queue: deque = deque()
        self._queue_size = queue_size
        self._wake = asyncio.Event()
        self._sinks: list[Sink] = []
        self._last = 0.0

    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def event(self, ref: ObjectRef, event_type: str, reason: str, message: str) -> None:
        """Records an event; never blocks, never raises. Dropped (and counted) when the queue is full."""
        if len(self._queue) >= self._queue_size:
            metrics.events_dropped.labels("queue_full").inc()
            return
        # Names are `<object>.<nanoseconds>`: two events in one clock tick must not share one.
        self._last = now = max(self._clock(), self._last + 1e-6)
        self._queue.append(make_event(ref, event_type, reason, message, host=self.host, now=now))
        self._wake.set()

    def drain(self) -> list[Correlation]:
        """Correlates what is queued and gives it to the sinks; returns what the local log must get."""
        batch: list[Correlation] = []
        while self._queue:
            correlated = self._correlator.correlate(self._queue.popleft())
            if correlated is not None:
                batch.append(correlated)
        for sink in self._sinks:
            sink.accept(batch)
        return batch

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._write_log(self.drain())
        finally:
            if self._log is not None:
                self._append(self.drain())  # what came in during shutdown

    async def _write_log(self, batch: list[Correlation]) -> None:
        if batch and self._log is not None:
            await asyncio.to_thread(self._append, batch)

    def _append(self, batch: list[Correlation]) -> None:
        if self._log is None:
            return
        try:
            self._log.append(item.event for item in batch)
        except OSError as exc:  # a full or read-only disk costs the local copy, never the agent
            log.warning("writing the event log %s failed: %s", self._log.path, exc)
