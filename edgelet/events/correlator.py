"""client-go's EventCorrelator, pure: aggregation of similar events, counting of identical ones, and the
per-object spam filter. The clock is injected; nothing here does I/O.

- Similar events (same source, object, type and reason; any message): after `max_similar` distinct
  messages within `similar_window` they are folded into one "(combined from similar events): ..." event.
- Identical events (the same message too) become one event whose count grows: a PATCH, not a new event.
- Spam filter: a token bucket per source + object, `spam_burst` tokens refilled one per `spam_refill` s.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from edgelet.api.kubetime import format_time

from .model import Event, event_name

COMBINED_PREFIX = "(combined from similar events): "
CACHE_ENTRIES = 4096  # client-go's maxLruCacheEntries

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, size: int):
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True, slots=True)
class Correlation:
    """What to send: the event as it stands, and whether it updates one already sent (a PATCH)."""

    event: Event
    is_update: bool


def repeat_patch(event: Event) -> dict:
    """client-go's patch of a repeated event: only what changes."""
    return {"count": event["count"], "lastTimestamp": event["lastTimestamp"], "message": event["message"]}


def _object_key(event: Event) -> tuple:
    source, obj = event["source"], event["involvedObject"]
    return (source.get("component"), source.get("host"), obj.get("kind"), obj.get("namespace"), obj.get("name"),
            obj.get("uid"), obj.get("apiVersion"))


def spam_key(event: Event) -> tuple:
    return _object_key(event)


def aggregate_key(event: Event) -> tuple:
    return (*_object_key(event), event["type"], event["reason"], event.get("reportingComponent"),
            event.get("reportingInstance"))


def event_key(event: Event) -> tuple:
    return (*_object_key(event), event["involvedObject"].get("fieldPath"), event["type"], event["reason"],
            event["message"])


@dataclass(slots=True)
class _Similar:
    # client-go's localKeys set; a tuple of at most `max_similar` - 1 messages is a fifth of an empty set's
    # size, and most objects only ever see one message per reason.
    messages: tuple[str, ...]
    last_seen: float


@dataclass(slots=True)
class _Observed:
    name: str
    count: int
    first_timestamp: str


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class EventCorrelator:
    def __init__(self, *, clock: Callable[[], float] = time.time, max_similar: int = 10,
                 similar_window: float = 600.0, spam_burst: int = 25, spam_refill: float = 300.0,
                 cache_entries: int = CACHE_ENTRIES):
        self._clock = clock
        self._max_similar = max_similar
        self._similar_window = similar_window
        self._burst = spam_burst
        self._refill = spam_refill
        self._similar: LRU[tuple, _Similar] = LRU(cache_entries)
        self._observed: LRU[tuple, _Observed] = LRU(cache_entries)
        self._buckets: LRU[tuple, _Bucket] = LRU(cache_entries)

    def correlate(self, event: Event) -> Correlation | None:
        """The event to send, or None when the spam filter drops it. `event` is not modified."""
        now = self._clock()
        aggregated, key = self._aggregate(event, now)
        observed = self._observe(aggregated, key)
        if not self._allow(spam_key(observed.event), now):
            return None
        return observed

    def _aggregate(self, event: Event, now: float) -> tuple[Event, tuple]:
        key = aggregate_key(event)
        record = self._similar.get(key)
        if record is None or now - record.last_seen > self._similar_window:
            record = _Similar((), now)
        if event["message"] not in record.messages:
            record.messages += (event["message"],)
        record.last_seen = now
        self._similar.put(key, record)
        if len(record.messages) < self._max_similar:
            return event, event_key(event)
        record.messages = record.messages[:-1]  # client-go's PopAny: the set stays just under the limit
        stamp = format_time(now)
        combined = {**event,
                    "metadata": {**event["metadata"], "name": event_name(event["involvedObject"].get("name", ""), now)},
                    "message": COMBINED_PREFIX + event["message"], "count": 1,
                    "firstTimestamp": stamp, "lastTimestamp": stamp}
        return combined, key

    def _observe(self, event: Event, key: tuple) -> Correlation:
        last = self._observed.get(key)
        if last is None:
            self._observed.put(key, _Observed(event["metadata"]["name"], event["count"], event["firstTimestamp"]))
            return Correlation(event, is_update=False)
        last.count += 1
        repeated = {**event, "metadata": {**event["metadata"], "name": last.name}, "count": last.count,
                    "firstTimestamp": last.first_timestamp}
        return Correlation(repeated, is_update=True)

    def _allow(self, key: tuple, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self._burst), now)
        else:
            bucket.tokens = min(float(self._burst), bucket.tokens + (now - bucket.at) / self._refill)
            bucket.at = now
        self._buckets.put(key, bucket)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
