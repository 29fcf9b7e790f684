"""Posts events to the API server (cluster mode): POST new events, strategic-merge PATCH repeated ones.

While the API server is unreachable events wait in a bounded buffer, one entry per event (repeats
update the entry, so a crash loop offline is one event with a count); the oldest entry goes when it
is full. On reconnect, only events seen within `freshness` are sent: the API server deletes events
an hour after their last update (--event-ttl 1h), so older ones would only show history the cluster
has already dropped. An event the server refuses (403, 404, 409, 422) is dropped alone; the rest go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from edgelet.api.kubetime import parse_time
from edgelet.metrics import registry as metrics
from edgelet.util.retry import Retrier

from ..kubeapi.client import ApiClient
from ..kubeapi.errors import ApiError, NotFound, ServerError
from .correlator import Correlation, repeat_patch
from .model import EVENT_TTL, Event

log = logging.getLogger(__name__)

BUFFER_SIZE = 1000


@dataclass(slots=True)
class _Pending:
    event: Event
    create: bool  # never sent: POST it; else PATCH count, lastTimestamp and message


def events_path(namespace: str, name: str = "") -> str:
    path = f"/api/v1/namespaces/{namespace}/events"
    return f"{path}/{name}" if name else path


class ApiEventSink:
    def __init__(self, client: ApiClient, *, buffer_size: int = BUFFER_SIZE, freshness: float = EVENT_TTL,
                 clock: Callable[[], float] = time.time, backoff_initial: float = 0.8, backoff_max: float = 30.0):
        self._client = client
        self._buffer_size = buffer_size
        self._freshness = freshness
        self._clock = clock
        # INFO, not WARNING: events are best effort, and the loops that matter say the API server is away.
        self._retry = Retrier("events", initial=backoff_initial, maximum=backoff_max, logger=log, level=logging.INFO)
        self._pending: OrderedDict[tuple[str, str], _Pending] = OrderedDict()
        self._wake = asyncio.Event()
        self.sent = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def accept(self, items: list[Correlation]) -> None:
        for item in items:
            meta = item.event["metadata"]
            key = (meta["namespace"], meta["name"])
            waiting = self._pending.get(key)
            # A repeat of an event not sent yet replaces it, still to be created if it never was.
            self._pending[key] = _Pending(item.event,
                                          create=not item.is_update or (waiting is not None and waiting.create))
            while len(self._pending) > self._buffer_size:
                self._pending.popitem(last=False)
                metrics.events_dropped.labels("buffer_full").inc()
        if items:
            self._wake.set()

    async def run(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            key, item = self._pending.popitem(last=False)
            if self._clock() - _last_seen(item.event) > self._freshness:
                metrics.events_dropped.labels("stale").inc()
                continue
            try:
                await self._send(item)
            except ServerError as exc:  # unreachable or overloaded: keep it, try again later
                self._requeue(key, item)
                await asyncio.sleep(self._retry.failed(exc, f"{len(self._pending)} events wait for the API server"))
                continue
            except ApiError as exc:
                metrics.events_dropped.labels("rejected").inc()
                log.debug("event %s/%s refused: %s", *key, exc)
            else:
                self.sent += 1
            self._retry.succeeded()

    def _requeue(self, key: tuple[str, str], item: _Pending) -> None:
        newer = self._pending.get(key)
        if newer is None:
            self._pending[key] = item
        elif item.create:
            newer.create = True
        self._pending.move_to_end(key, last=False)

    async def _send(self, item: _Pending) -> None:
        event = item.event
        meta = event["metadata"]
        if not item.create:
            try:
                await self._client.patch(events_path(meta["namespace"], meta["name"]),
                                         repeat_patch(event))
                return
            except NotFound:  # deleted by the server's TTL or never created: create it, as client-go does
                pass
        await self._client.create(events_path(meta["namespace"]), event)


def _last_seen(event: Event) -> float:
    try:
        return parse_time(event["lastTimestamp"])
    except (KeyError, TypeError, ValueError):
        return 0.0
