"""The evented PLEG's source: the runtime's container event stream (CRI GetContainerEvents), followed for as long
as it lasts and opened again with backoff when lost; every event only says "relist soon".

The events themselves are not read: the relist that each batch of them triggers sees the whole runtime through the
one diff the periodic relist uses, so an event that arrives garbled, out of order or not at all costs nothing but a
later relist.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from edgelet.cri import CRIError
from edgelet.cri.client import RuntimeClient
from edgelet.util.backoff import JitteredBackoff
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

# A stream broken by a restarting runtime is opened again after these delays (jittered, doubling).
RECONNECT_INITIAL = 0.5
RECONNECT_MAXIMUM = 10.0


class ContainerEventStream:
    """Follows the stream; `on_event()` on every event, `on_change()` whenever the stream opens, breaks or turns
    out unsupported. `opened_at` is when the current stream was asked for (None while there is none); `events_seen`
    counts the events of the current stream."""

    def __init__(self, runtime: RuntimeClient, on_event: Callable[[], None], on_change: Callable[[], None], *,
                 clock: Callable[[], float] = time.monotonic, backoff: JitteredBackoff | None = None):
        self._runtime = runtime
        self._on_event = on_event
        self._on_change = on_change
        self._clock = clock
        self._backoff = backoff or JitteredBackoff(RECONNECT_INITIAL, RECONNECT_MAXIMUM)
        self.opened_at: float | None = None
        self.events_seen = 0
        self.unsupported = False  # the runtime serves no events (containerd < 1.7): nothing to follow, ever
        self.last_error = ""

    async def run(self) -> None:
        failures = 0
        while True:
            self.opened_at = self._clock()
            self.events_seen = 0
            self._on_change()
            try:
                async for _ in self._runtime.container_events():
                    if not self.events_seen:
                        self._backoff.reset()
                        if failures:
                            log.info("PLEG: the runtime's container events flow again")
                        failures = 0
                    self.events_seen += 1
                    self._on_event()
                reason = "the runtime ended the container event stream"
            except CRIError as exc:
                if exc.code == "UNIMPLEMENTED":
                    self._close()
                    self.unsupported = True
                    log.info("PLEG: the runtime serves no container events (%s); relisting periodically", exc.details)
                    self._on_change()
                    return
                reason = str(exc)
            except EdgeletError as exc:
                reason = str(exc)
            if self.opened_at is not None and self._clock() - self.opened_at > RECONNECT_MAXIMUM:
                self._backoff.reset()  # a stream that lasted was a success, however quiet
            self._close()
            self.last_error = reason
            delay = self._backoff.next()
            failures += 1
            if failures == 1:
                log.warning("PLEG: container events lost (%s); relisting every period until they are back, "
                            "reconnecting in %.1fs", reason, delay)
            self._on_change()
            await asyncio.sleep(delay)

    def _close(self) -> None:
        self.opened_at = None
        self.events_seen = 0
