"""The API server pod source: list + watch the pods bound to this node and hand the full set to the merger.

Like the kubelet's reflector: list with `fieldSelector=spec.nodeName=<node>`, watch from the list's
resourceVersion with bookmarks, list again on 410 Gone, resume the watch after a broken stream, and
reconnect as the reflector does (0.8 s doubling to 30 s, each wait jittered up to twice that) so a fleet does
not return in a storm; a Lease renewed after failures ends that wait early (`reconnect_soon`).
Pods already known are kept while the API server is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from edgelet.api.limits import document_problem
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import ApiError, Gone, WatchStreamError
from edgelet.podconfig.validation import validate_object_meta
from edgelet.util.errors import cut_long_values
from edgelet.util.retry import Retrier

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"
Pod = dict[str, Any]

# A watch that ends this quickly without events counts as a failure, so a server that accepts and
# closes at once cannot make us spin.
_MIN_HEALTHY_WATCH_SECONDS = 1.0


def pod_problem(obj: Any, node_name: str) -> str | None:
    """Why an object from the API cannot be handed to the agent as a pod (None: it can)."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "has no metadata object"
    for field in ("name", "namespace", "uid"):
        if not isinstance(meta.get(field), str) or not meta[field]:
            return f"has no metadata.{field}"
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return "has no spec object"
    if spec.get("nodeName") != node_name:
        return f"is bound to node {spec.get('nodeName')!r}, not {node_name!r}"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return "has no spec.containers list"
    for index, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            return f"spec.containers[{index}] has no name"
    if "status" in obj and not isinstance(obj["status"], dict):
        return "has a status that is not an object"
    if problem := document_problem(obj):  # numbers beyond int64, absurd nesting: nothing later may meet them
        return f"has a bad field {problem[0]}: {problem[1]}"
    problems: list[tuple[str, str]] = []  # what every layer reads before admission must have its type
    validate_object_meta(meta, problems, namespaced=True)
    for path, grace in (("metadata.deletionGracePeriodSeconds", meta.get("deletionGracePeriodSeconds")),
                        ("spec.terminationGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"))):
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int) or grace < 0):
            problems.append((path, f"must be a non-negative integer, got {grace!r}"))
    if problems:
        return cut_long_values(f"has a bad field {problems[0][0]}: {problems[0][1]}")
    return None


def object_key(obj: Any) -> str | None:
    """`namespace/name`, or None when the object does not even have those."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def resource_version(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


class ObjectHandle(Protocol):
    """Where a list-and-watch source's objects go (a pod config source, the mirror splitter, the Services): the
    whole set at each change, and once that it is complete."""

    def set(self, objects: list[dict[str, Any]], /) -> None: ...

    def mark_ready(self) -> None: ...


class ApiServerSource:
    """Keeps the merger's "api" source equal to the pods the API server binds to `node_name`.

    The reflector itself serves other kinds too: a subclass names its `KIND`, `PATH`, `selector` and `problem`
    (edgelet.cluster.services lists and watches Services this way).
    """

    KIND = "pod"
    PATH = PODS_PATH

    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        handle: ObjectHandle,
        *,
        rng: random.Random | None = None,
        backoff_initial: float = 0.8,
        backoff_max: float = 30.0,
        debounce: float = 0.05,
        watch_timeout: tuple[float, float] = (300.0, 600.0),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.client = client
        self.node_name = node_name
        self.handle = handle
        self.connected = False
        self.last_sync = 0.0  # clock() of the last list or watch event (bookmarks included)
        self.resource_version = ""
        self._rng = rng or random.Random()
        self._debounce = debounce
        self._watch_timeout = watch_timeout
        self._sleep = sleep
        self._clock = clock
        self._pods: dict[str, Pod] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        self._retry = Retrier(f"API {self.KIND} source", initial=backoff_initial, maximum=backoff_max, rng=self._rng,
                              logger=log, spread="reflector")
        self._pausing: asyncio.Event | None = None  # set ends the backoff wait in progress
        self._cut_next_pause_until = 0.0  # monotonic: a pause starting before then lasts at most until then
        self._wake_timer: asyncio.TimerHandle | None = None

    @property
    def pods(self) -> list[Pod]:
        return list(self._pods.values())

    @property
    def selector(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node_name}"}

    def problem(self, obj: Any) -> str | None:
        """Why an object from the API is not handed on (None: it is)."""
        return pod_problem(obj, self.node_name)

    def keep(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What is kept of a good object (a pod whole)."""
        return obj

    async def run(self) -> None:
        relist = True
        try:
            while True:
                try:
                    if relist:
                        await self._list()
                        relist = False
                    healthy = await self._watch()
                    if healthy:
                        self._retry.succeeded()
                        continue
                    delay = self._retry.failed("the watch ended at once without events")
                except Gone as e:
                    log.info(f"API {self.KIND} watch: resourceVersion %s expired (%s); listing again",
                             self.resource_version, e.message)
                    relist = True
                    continue
                except WatchStreamError as e:
                    relist = True
                    delay = self._failed(e)
                except ApiError as e:
                    delay = self._failed(e)
                await self._pause(delay)
        finally:
            self.connected = False
            self._cancel_flush()
            if self._wake_timer is not None:
                self._wake_timer.cancel()

    def reconnect_soon(self, spread: float) -> None:
        """The API server answers again (the Lease was renewed after failures): end the reflector's backoff wait
        at a random point within `spread` seconds instead of after up to a minute. The random point keeps a
        fleet's re-lists spread: N nodes whose Leases come back together re-list at about N/spread per second."""
        if self.connected:
            return
        delay = self._rng.uniform(0, max(spread, 0.0))
        self._cut_next_pause_until = time.monotonic() + delay
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        self._wake_timer = asyncio.get_running_loop().call_later(delay, self._end_pause)
        log.info(f"API {self.KIND} source: the API server answers again; watching again within %.1fs", delay)

    def _end_pause(self) -> None:
        self._wake_timer = None
        if self._pausing is not None:
            self._pausing.set()

    async def _pause(self, delay: float) -> None:
        """The backoff wait. After `reconnect_soon` (also when it came just before the wait) it ends at the random
        point chosen there, sooner or later than the backoff would have: a node whose own backoff happened to
        end first must not re-list with the crowd the spread is there to thin out."""
        if (remaining := self._cut_next_pause_until - time.monotonic()) > 0:
            delay = remaining
        self._pausing = woken = asyncio.Event()
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
            if not woken.is_set() and self._cut_next_pause_until > time.monotonic():
                await woken.wait()  # chosen while this wait ran, after its end: its timer ends it
        finally:
            self._pausing = None
            sleeper.cancel()
            waker.cancel()

    async def _list(self) -> None:
        # As the kubelet's reflector: "0" first, then "not older than what we saw", both served from the apiserver's
        # watch cache. Without one, a fleet re-listing after an apiserver restart reads every pod from etcd per node.
        params = {**self.selector, "resourceVersion": self.resource_version or "0"}
        try:
            result = await self.client.list(self.PATH, params)
        except Gone:  # a server without a watch cache, compacted past that version: take its latest state
            result = await self.client.list(self.PATH, self.selector)
        pods: dict[str, Pod] = {}
        for obj in result.get("items") or []:
            key = object_key(obj)
            problem = self.problem(obj)
            if problem is not None or key is None:
                log.warning("API %s source: skipping %s %s: it %s", self.KIND, self.KIND, key or "<unnamed>",
                            problem or "has no metadata.name")
                continue
            pods[key] = self.keep(obj)
        self._pods = pods
        self.resource_version = resource_version(result) or ""
        self.connected = True
        self.last_sync = self._clock()
        self._retry.succeeded()
        self._flush_now()
        self.handle.mark_ready()

    async def _watch(self) -> bool:
        """Follow the watch until the server ends it; True when it was a healthy stream."""
        params = dict(self.selector)
        params["resourceVersion"] = self.resource_version
        params["allowWatchBookmarks"] = "true"
        params["timeoutSeconds"] = str(int(self._rng.uniform(*self._watch_timeout)))
        started = time.monotonic()
        events = 0
        async with contextlib.aclosing(self.client.watch(self.PATH, params)) as stream:
            async for event_type, obj in stream:
                events += 1
                self.connected = True
                self.last_sync = self._clock()
                self._apply(event_type, obj)
                if events == 1:
                    self._retry.succeeded()
        return events > 0 or time.monotonic() - started >= _MIN_HEALTHY_WATCH_SECONDS

    def _apply(self, event_type: str, obj: dict[str, Any]) -> None:
        rv = resource_version(obj)
        if event_type == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        key = object_key(obj)
        if rv:
            self.resource_version = rv
        if key is None:
            log.warning("API %s source: skipping a %s event for an object without metadata.name", self.KIND,
                        event_type)
            return
        if event_type == "DELETED":
            if self._pods.pop(key, None) is not None:
                self._schedule_flush()
            return
        problem = self.problem(obj)
        if problem is not None:
            # Keep the last good version (if any): a bad update must not stop a running pod.
            log.warning("API %s source: skipping %s of %s %s: it %s", self.KIND, event_type, self.KIND, key, problem)
            return
        self._pods[key] = self.keep(obj)
        self._schedule_flush()

    # -- handing the set to the merger; bursts of events become one set ----------------------------

    def _schedule_flush(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self._debounce, self._flush_now)

    def _cancel_flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _flush_now(self) -> None:
        self._cancel_flush()
        try:
            self.handle.set(list(self._pods.values()))
        except Exception:
            log.exception("API %s source: handing on %d objects failed", self.KIND, len(self._pods))

    # -- reconnecting ----------------------------------------------------------------------------

    def _failed(self, error: ApiError) -> float:
        self.connected = False
        return self._retry.failed(error, f"keeping {len(self._pods)} known {self.KIND}s")
