"""The ConfigMaps, Secrets and PersistentVolumeClaims this node's API pods reference, and the PersistentVolumes bound
to those claims: fetched into the ObjectStore (source "api") and kept in crash-safe checkpoints, so a restart without
network still has what its pods mount and read (a claim's directory included).

Each referenced object is read with a GET: when a new pod references it, again every `refresh` seconds, and
whenever a pod about to use it finds it missing (`fetch_missing`): an object created just before its pod is
read then, and only the API server's NotFound makes it absent.
A watch per object (the kubelet's default strategy) needs one long-lived stream per object, which over
HTTP/1.1 is one connection each; a list+watch per namespace would pull every Secret of the namespace
onto the device and is not allowed to nodes by the API server's node authorizer. GETs need one pooled
connection and only the rights a node has, at the price of changes arriving within `refresh`, about
as late as the kubelet's own periodic volume resync shows them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from edgelet.api import podutil
from edgelet.api.objectstore import (
    CLAIM,
    CLUSTER_SCOPED,
    CONFIGMAP,
    SECRET,
    VOLUME,
    InvalidObjectError,
    Key,
    ObjectStore,
    bound_volume,
    referenced_objects,
    references,
    validate_object,
    with_bound_volumes,
)
from edgelet.api.podutil import Pod
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import ApiError, NotFound, ServerError
from edgelet.util.checkpoint import CheckpointStore
from edgelet.util.retry import Retrier
from edgelet.util.tasks import wait_set

log = logging.getLogger(__name__)

OBJECT_KIND = "object"
# A claim a pod waits for (absent or not bound yet) is read again this often: the pod starts soon after its binding,
# at one GET per waiting claim and period (the kubelet's volume manager reads it again every 100 ms).
PENDING_CLAIM_POLL = 2.0
SOURCE = "api"
_PLURAL = {CONFIGMAP: "configmaps", SECRET: "secrets", CLAIM: "persistentvolumeclaims", VOLUME: "persistentvolumes"}


# -- pure parts ----------------------------------------------------------------------------------------


def object_path(key: Key) -> str:
    kind, namespace, name = key
    if kind in CLUSTER_SCOPED:
        return f"/api/v1/{_PLURAL[kind]}/{name}"
    return f"/api/v1/namespaces/{namespace}/{_PLURAL[kind]}/{name}"


def checkpoint_key(key: Key) -> str:
    return "/".join(key)


def _from_checkpoint_key(text: str) -> Key | None:
    parts = text.split("/")
    if len(parts) != 3 or parts[0] not in _PLURAL or not parts[2]:
        return None
    return (parts[0], parts[1], parts[2]) if bool(parts[1]) != (parts[0] in CLUSTER_SCOPED) else None


def cleaned(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as kept: without managedFields (bookkeeping of the server, often larger than the data)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


# -- the syncer -----------------------------------------------------------------------------------------


class ObjectSyncer:
    """Fetches what the pods reference into `store` and persists it under `directory` (mode 0600)."""

    def __init__(
        self,
        client: ApiClient,
        store: ObjectStore,
        directory: str,
        *,
        refresh: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        backoff_initial: float = 0.8,
        backoff_max: float = 30.0,
    ):
        self.client = client
        self.store = store
        self.refresh = refresh
        self.fetches = 0
        self.disk_writes = 0
        # Secrets land here: files 0600 and the directory 0700, root only.
        self._disk = CheckpointStore(directory, kind=OBJECT_KIND, mode=0o600)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._wanted: set[Key] | None = None  # None until a pod set is known: nothing is forgotten before
        self._objects: dict[Key, dict[str, Any]] = {}
        self._on_disk: dict[Key, bytes] = {}
        self._attempted: set[Key] = set()  # read (found, absent or refused) since this process started
        # Read, but not yet in the store: they count as attempted only once committed, so `ensure` never lets a
        # pod start between the GET of its object and the store holding it.
        self._read: set[Key] = set()
        self._refused: set[Key] = set()
        self._failures = 0
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._committing = asyncio.Lock()  # the loop's round and a pod's fetch_missing both commit

    def load(self) -> int:
        """Takes the objects persisted by earlier runs into the store (blocking; call once at start)."""
        for text, payload in self._disk.load_all().items():
            key = _from_checkpoint_key(text)
            try:
                obj = orjson.loads(payload)
                if key is None or validate_object(obj) != key:
                    raise InvalidObjectError("does not hold the object its name says")
            except (orjson.JSONDecodeError, InvalidObjectError) as e:
                # Valid checksum, unusable content: set aside like byte damage; it is fetched again.
                self._disk.set_aside(text, f"unusable content: {e}")
                continue
            self._objects[key] = obj
            self._on_disk[key] = payload
        self.store.replace_all(SOURCE, self._objects.values())
        if self._objects:
            log.info("loaded %d API objects (ConfigMaps, Secrets, claims, volumes) from the offline cache",
                     len(self._objects))
        return len(self._objects)

    def set_pods(self, pods: Iterable[Pod]) -> None:
        """The node's current API pods; objects they stop referencing are forgotten at the next round."""
        wanted = references(pods)
        if wanted != self._wanted:
            self._wanted = wanted
            self._wake.set()

    async def ensure(self, pods: Iterable[Pod], timeout: float) -> None:
        """Sets the pods and waits (at most `timeout`) until everything they reference has been read once,
        or the API server failed to answer: pods then start without a wasted attempt on a missing object."""
        pods = list(pods)
        self.set_pods(pods)
        referenced = references(pods)
        failures = self._failures
        deadline = self._clock() + timeout
        # A claim's volume is needed once the claim is read bound: the set grows as claims arrive.
        while self._bound(referenced) - self._attempted and self._failures == failures:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            if not await wait_set(self._progress, remaining):
                return

    async def run(self) -> None:
        next_refresh = self._clock() + self.refresh
        retry = Retrier("ConfigMap/Secret sync", initial=self._backoff_initial, maximum=self._backoff_max,
                        rng=self._rng, logger=log, spread="reflector")
        while True:
            full = self._clock() >= next_refresh
            # Cleared before the round, not after it: pods set while its GETs run must wake the next one.
            self._wake.clear()
            try:
                await self.refresh_once(full=full)
            except ApiError as e:
                self._failures += 1
                self._signal_progress()
                await self._sleep(retry.failed(e, f"keeping {len(self._objects)} cached objects"))
                continue
            retry.succeeded()
            if full:
                next_refresh = self._clock() + self.refresh
            wait = max(next_refresh - self._clock(), 0.0)
            if self._waiting_claims():
                wait = min(wait, PENDING_CLAIM_POLL)
            await wait_set(self._wake, wait)

    async def refresh_once(self, *, full: bool = True) -> None:
        """Reads the wanted objects (all of them, or only those never read), forgets unwanted ones and
        persists what changed. Raises ServerError when the API server cannot be reached."""
        if self._wanted is None:
            return
        wanted = set(self._wanted)
        try:
            for key in sorted(wanted if full else (wanted - self._attempted) | self._waiting_claims()):
                await self._fetch(key)
            # Then the volumes of the claims as just read (a claim may have been bound or rebound meanwhile).
            volumes = self._bound(wanted) - wanted
            for key in sorted(volumes if full else volumes - self._attempted):
                await self._fetch(key)
        finally:
            await self._commit(wanted)

    async def fetch_missing(self, pod: Pod) -> None:
        """GETs each object `pod` references that the store does not hold, before its volumes and containers are
        made: one created just before the pod, or after an earlier read found it absent, is used at once (the
        kubelet's GET on a cache miss). Nothing is asked when all are there. An unreachable API server leaves them
        missing; the pod's sync reports that and is retried."""
        if podutil.is_static(pod):  # its objects come from files beside it, not from the API
            return
        # A claim not yet bound is read again too: the pod waits for its binding, as the kubelet does.
        referenced = referenced_objects(pod)
        missing = [key for key in sorted(referenced) if self._lacking(key)]
        volumes: list[Key] = []
        try:
            for key in missing:
                await self._fetch(key)
            volumes = [key for key in sorted(self._bound(referenced) - referenced) if self._lacking(key)]
            for key in volumes:
                await self._fetch(key)
        except ServerError as e:
            log.info("cannot read what pod %s references: %s", podutil.full_name(pod), e)
        if not missing and not volumes:
            return
        known = self._wanted if self._wanted is not None else set(self._objects)
        await self._commit(known | set(missing))

    def _waiting_claims(self) -> set[Key]:
        """Claims pods reference that are absent or not bound yet."""
        return {key for key in self._wanted or () if key[0] == CLAIM and bound_volume(self._objects.get(key)) is None}

    def _lacking(self, key: Key) -> bool:
        obj = self.store.get(*key)
        return obj is None or (key[0] == CLAIM and bound_volume(obj) is None)

    def _bound(self, keys: Iterable[Key]) -> set[Key]:
        """`keys` and the volumes of the claims among them, as read so far."""
        return with_bound_volumes(keys, self._objects.get)

    async def _fetch(self, key: Key) -> None:
        try:
            obj = cleaned(await self.client.get(object_path(key)))
            self.fetches += 1
            if validate_object(obj) != key:
                raise InvalidObjectError(f"the API server answered another object for {checkpoint_key(key)}")
        except NotFound:
            self._objects.pop(key, None)  # pods that need it fail until it exists; optional refs are fine
        except InvalidObjectError as e:
            log.warning("%s: %s; keeping the last good version", checkpoint_key(key), e)
        except ServerError:
            raise
        except ApiError as e:  # 403 from the node authorizer, 401...: report once, keep what we have
            if key not in self._refused:
                self._refused.add(key)
                log.warning("cannot read %s %s/%s: %s", *key, e)
        else:
            self._refused.discard(key)
            self._objects[key] = obj
        self._read.add(key)

    async def _commit(self, wanted: set[Key]) -> None:
        async with self._committing:
            await self._commit_now(wanted)

    async def _commit_now(self, wanted: set[Key]) -> None:
        wanted = self._bound(wanted)
        for key in [key for key in self._objects if key not in wanted]:
            del self._objects[key]
        # The store first: pods waiting in `ensure` go on as soon as what was read is there, not after the disk.
        self.store.replace_all(SOURCE, self._objects.values())
        self._attempted |= self._read
        self._read.clear()
        self._attempted &= wanted
        self._signal_progress()
        writes = {key: orjson.dumps(obj) for key, obj in self._objects.items()}
        writes = {key: payload for key, payload in writes.items() if self._on_disk.get(key) != payload}
        removals = [key for key in self._on_disk if key not in self._objects]
        if writes or removals:
            try:
                await asyncio.to_thread(self._persist, writes, removals)
            except OSError as e:  # disk full, read-only: the objects still serve the running pods
                log.warning("cannot persist ConfigMaps/Secrets for offline restarts: %s", e)

    def _persist(self, writes: dict[Key, bytes], removals: list[Key]) -> None:
        for key, payload in writes.items():
            self._disk.write(checkpoint_key(key), payload)
            self._on_disk[key] = payload
            self.disk_writes += 1
        for key in removals:
            self._disk.delete(checkpoint_key(key))
            self._on_disk.pop(key, None)

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    @property
    def cached(self) -> int:
        return len(self._objects)
