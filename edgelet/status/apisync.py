"""The API half of the status manager: pod statuses PATCHed to the API server (a static pod's to its mirror pod,
which edgelet/status/mirror.py makes in each pass) and the final delete of API pods the agent has terminated.

Like the kubelet's status manager, a status change marks its pod dirty, and a full resync every `resync`
seconds marks only pods whose last written status is not their current one or whose API copy (as the pod
watch last saw it) differs from it; both are compared in normal form (edgelet/status/apidiff.py), so an
idle node sends nothing. Each PATCH is a two-way strategic merge diff against the status the API last
returned (for a pod's first write, the watch's copy of it), with `metadata.uid` as a precondition. An
unreachable API server leaves pods dirty; they are re-sent with jittered backoff once it answers again. A
request the server forbids (403) is reported once per object and never holds up the others.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import ApiError, Conflict, NotFound, ServerError, Unauthorized
from edgelet.pod.manager import PodManager
from edgelet.status.apidiff import FieldPath, api_view, dropped_fields, normal_form, status_differs, status_patch
from edgelet.status.manager import StatusManager
from edgelet.status.mirror import Key, MirrorPods, mirror_is_current, pod_path, report_refusal
from edgelet.status.mirror import pod_key as _key
from edgelet.util.retry import Retrier
from edgelet.util.tasks import wait_set

log = logging.getLogger(__name__)

# The written hash of a status sent without all of it (a terminal phase held back): it matches no status.
HELD = -1
# Uids of deleted pods are kept to ignore late news about them; uids are never reused, so old ones can go.
_GONE_REMEMBERED = 4096

# -- the syncer -----------------------------------------------------------------------------------------


class StatusSyncer:
    """Keeps the API's pod statuses equal to the StatusManager's; `run()` is its loop."""

    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        status_manager: StatusManager,
        pod_manager: PodManager,
        mirrors: MirrorPods,
        *,
        resync: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        api_pod: Callable[[str], Pod | None] = lambda uid: None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        could_have_running_containers: Callable[[str], bool] = lambda uid: False,
    ):
        """`pod_manager` pairs static pods with their mirrors, which `mirrors` creates and deletes in each pass
        (a static pod's status goes to its mirror); `api_pod(uid)` is the API's copy of a pod as the pod source
        last saw it (checked at resync for changes made by others); `could_have_running_containers(uid)` says
        whether a pod's worker has not yet seen all its containers stop: until then its terminal phase waits."""
        self.client = client
        self.node_name = node_name
        self.status_manager = status_manager
        self.pod_manager = pod_manager
        self.mirrors = mirrors
        self.resync = resync
        self._writes: Counter[str] = Counter()  # status, delete (the mirror manager counts its own)
        self.last_success = 0.0  # clock() of the last pass that reached the API server
        self.last_error: ApiError | None = None
        self._clock = clock
        self._api_pod = api_pod
        self._could_run = could_have_running_containers
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._wake = asyncio.Event()
        self._dirty: set[str] = set()
        self._written: dict[str, tuple[str, int]] = {}  # pod uid -> (API uid written to, status hash)
        self._api_status: dict[str, tuple[str, dict[str, Any]]] = {}  # API uid -> (resourceVersion, status)
        self._gone: dict[str, None] = {}  # API uids deleted or replaced, oldest first: never written again
        self._status_refusals: dict[Key, str] = {}  # pods whose status the server refuses, and why
        self._unknown_fields: set[FieldPath] = set()  # status fields the server turned out not to store
        self._deletes: dict[str, Key] = {}  # pod uid -> (namespace, name) awaiting the final delete
        status_manager.add_listener(self._on_status)
        mirrors.add_listener(self)

    # -- inputs -------------------------------------------------------------------------------

    def _on_status(self, pod: Pod, version: int) -> None:
        self._dirty.add(podutil.uid(pod))
        self._wake.set()

    def mirrors_changed(self) -> None:
        self._wake.set()  # a static pod's status may have a mirror to go to now

    def mirror_created(self, mirror: Pod) -> None:
        self._remember(mirror)  # a new mirror's status is the base of its first patch

    def mirror_deleted(self, mirror: Pod) -> None:
        self._api_status.pop(podutil.uid(mirror), None)

    def pod_terminated(self, pod: Pod) -> None:
        """The agent stopped every container of `pod`: an API pod being deleted is now removed from the API
        (grace period 0, uid precondition), which is the kubelet's final delete."""
        if podutil.is_static(pod) or not podutil.deletion_requested(pod) or podutil.uid(pod) in self._gone:
            return  # not ours to delete, not being deleted, or already deleted (the pod's REMOVE ends here too)
        self._deletes[podutil.uid(pod)] = _key(pod)
        self._wake.set()

    @property
    def pending(self) -> int:
        """Statuses and deletes waiting for the API server."""
        return len(self._dirty) + len(self._deletes)

    @property
    def api_writes(self) -> int:
        return self._writes.total() + self.mirrors.writes.total()

    @property
    def writes(self) -> Counter[str]:
        """API writes by kind: status, mirror-create, mirror-delete, delete."""
        return self._writes + self.mirrors.writes

    @property
    def refusals(self) -> dict[str, str]:
        """`namespace/name` -> why the API server refuses our mirror pod or status for it."""
        refusals = {**self._status_refusals, **self.mirrors.refusals}
        return {f"{namespace}/{name}": why for (namespace, name), why in sorted(refusals.items())}

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        next_resync = self._clock()
        retry = Retrier("pod status sync", initial=self._backoff_initial, maximum=self._backoff_max,
                        rng=self._rng, logger=log)
        while True:
            if self._clock() >= next_resync:
                self.mark_resync()
                next_resync = self._clock() + self.resync
            try:
                await self.sync_once()
            except ApiError as e:  # unreachable, refused credentials, or an answer nobody expects
                self.last_error = e
                await self._sleep(retry.failed(e, f"{self.pending} updates wait for the API server"))
                continue
            retry.succeeded()
            self.last_error = None
            self.last_success = self._clock()
            await self._wait(min(next_resync, self.mirrors.next_retry()) - self._clock())

    async def _wait(self, timeout: float) -> None:
        if self._wake.is_set():
            self._wake.clear()
            return
        await wait_set(self._wake, max(timeout, 0.0))
        self._wake.clear()

    def mark_resync(self) -> None:
        """Marks dirty every pod whose last written status is not its current one, or whose API copy (as
        the watch last saw it) says something else (the kubelet's needsReconcile); forgets pods the
        StatusManager no longer has. Reads nothing from the API server."""
        known = self.status_manager.known_uids()
        for uid in [uid for uid in self._written if uid not in known]:
            self._forget(uid)
        self._dirty &= known
        if self._status_refusals:
            live = {_key(entry.pod) for uid in known if (entry := self.status_manager.get_entry(uid)) is not None}
            self._status_refusals = {key: why for key, why in self._status_refusals.items() if key in live}
        for uid in known:
            entry = self.status_manager.get_entry(uid)
            if entry is None:
                continue
            written = self._written.get(uid)
            if written is None or written[1] != entry.status_hash:
                self._dirty.add(uid)
                continue
            api_copy = self._api_copy(entry.pod)
            if api_copy is None or podutil.uid(api_copy) != written[0]:
                continue
            last = self._api_status.get(written[0])
            copy_rv = podutil.meta(api_copy).get("resourceVersion") or ""
            if last is not None and copy_rv == last[0]:
                continue  # the version we wrote or read last: nobody else has touched it
            if status_differs(api_copy.get("status"), entry.pod["status"], self._unknown_fields):
                # Someone else changed the status (or the watch lags our write): read it and correct it.
                self._api_status.pop(written[0], None)
                self._dirty.add(uid)
            else:
                self._api_status[written[0]] = (copy_rv, api_copy.get("status") or {})

    async def sync_once(self) -> None:
        """One pass: mirror pods, final deletes, then every dirty status. Raises the first ApiError that
        means the API server cannot be reached or refuses us; what was not done stays pending."""
        await self.mirrors.sync()
        await self._sync_deletes()
        self._mark_retargeted()
        for uid in sorted(self._dirty):
            self._dirty.discard(uid)
            try:
                await self._sync_status(uid)
            except (ServerError, Unauthorized):
                self._dirty.add(uid)
                raise

    # -- statuses -----------------------------------------------------------------------------

    def _target(self, pod: Pod) -> tuple[Key, str] | None:
        """Where a pod's status goes: the pod itself, or for a static pod its mirror (None until it exists)."""
        if not podutil.is_static(pod):
            return _key(pod), podutil.uid(pod)
        mirror = self.pod_manager.mirror_pod_by_pod(pod)
        if mirror is None or not mirror_is_current(pod, mirror):
            return None
        return _key(mirror), podutil.uid(mirror)

    def _api_copy(self, pod: Pod) -> Pod | None:
        if podutil.is_static(pod):
            return self.pod_manager.mirror_pod_by_pod(pod)
        return self._api_pod(podutil.uid(pod))

    def _mark_retargeted(self) -> None:
        """A static pod whose mirror was (re)created sends its status to the new mirror."""
        for uid in self.status_manager.known_uids():
            entry = self.status_manager.get_entry(uid)
            if entry is None or not podutil.is_static(entry.pod):
                continue
            target = self._target(entry.pod)
            written = self._written.get(uid)
            if target is not None and target[1] not in self._gone and (written is None or written[0] != target[1]):
                self._dirty.add(uid)

    async def _sync_status(self, uid: str) -> None:
        entry = self.status_manager.get_entry(uid)
        if entry is None:
            self._forget(uid)
            return
        target = self._target(entry.pod)
        if target is None or target[1] in self._gone:
            return  # a static pod without its mirror yet: sent once the mirror exists
        key, target_uid = target
        namespace, name = key
        status, status_hash = entry.pod.get("status") or {}, entry.status_hash
        path = pod_path(namespace, name)
        try:
            base = self._api_status.get(target_uid)
            if base is None and uid not in self._written:
                base = self._watched_base(entry.pod, target_uid)
            if base is None:
                current = await self.client.get(path)
                if podutil.uid(current) != target_uid:
                    raise Conflict(409, "Conflict", f"pod was replaced (uid {podutil.uid(current)})", method="GET",
                                   path=path)
                base = self._remember(current)
            unknown = self._unknown_fields
            sent = api_view(base[1], status, self._could_run(uid))
            if sent.get("phase") != status.get("phase"):
                status_hash = HELD  # what was held back is sent at a later pass, at the latest the next resync
            patch = status_patch(normal_form(base[1], unknown), normal_form(sent, unknown))
            if patch:
                result = await self.client.patch(f"{path}/status", {"metadata": {"uid": target_uid}, "status": patch})
                self._count("status")
                self._remember(result)
                self._learn_unknown_fields(patch, result.get("status"))
            self._status_refusals.pop(key, None)
        except (NotFound, Conflict) as e:
            log.info("pod %s/%s (uid %s) is gone from the API server or was replaced (%s); its status is no "
                     "longer sent", namespace, name, target_uid, e.reason)
            self._mark_gone(target_uid)
            self._api_status.pop(target_uid, None)
            return
        except ApiError as e:
            if isinstance(e, (ServerError, Unauthorized)):
                raise
            # The server refuses this status (403, 422...): sending it again cannot help; the next change may.
            report_refusal(self._status_refusals, key, "its status", e)
        self._written[uid] = (target_uid, status_hash)

    def _watched_base(self, pod: Pod, target_uid: str) -> tuple[str, dict[str, Any]] | None:
        """The first status this process writes for a pod is diffed against the copy the watch delivered (a
        new pod arrived with it moments ago; after a restart it is the listed state), not read again: one
        round trip less per pod start. A copy that later turns out stale is caught at resync, where a
        differing watch copy makes the status be read and corrected."""
        api_copy = self._api_copy(pod)
        if api_copy is None or podutil.uid(api_copy) != target_uid:
            return None
        return self._remember(api_copy)

    def _learn_unknown_fields(self, sent: dict[str, Any], returned: dict[str, Any] | None) -> None:
        """Status fields the server dropped from our patch are unknown to its version (hostIPs before 1.28):
        they are left out of every later comparison, or the status would never look written."""
        dropped = dropped_fields(sent, returned) - self._unknown_fields
        if dropped:
            self._unknown_fields |= dropped
            log.info("the API server does not store the pod status fields %s; they are no longer compared or sent",
                     ", ".join(sorted(".".join(path) for path in dropped)))

    def _mark_gone(self, uid: str) -> None:
        self._gone[uid] = None
        if len(self._gone) > _GONE_REMEMBERED:
            del self._gone[next(iter(self._gone))]

    def _remember(self, pod: Pod) -> tuple[str, dict[str, Any]]:
        base = (podutil.meta(pod).get("resourceVersion") or "", pod.get("status") or {})
        self._api_status[podutil.uid(pod)] = base
        return base

    def _forget(self, uid: str) -> None:
        self._dirty.discard(uid)
        written = self._written.pop(uid, None)
        if written is not None:
            self._api_status.pop(written[0], None)

    def _count(self, kind: str) -> None:
        self._writes[kind] += 1

    # -- final deletes --------------------------------------------------------------------------

    async def _sync_deletes(self) -> None:
        for uid, (namespace, name) in list(self._deletes.items()):
            try:
                await self.client.delete(pod_path(namespace, name), preconditions_uid=uid, grace_period=0)
                self._count("delete")
                log.info("pod %s/%s deleted from the API server", namespace, name)
            except (NotFound, Conflict):
                pass  # already gone, or replaced by a pod of the same name that is not ours to delete
            except ApiError as e:
                if isinstance(e, (ServerError, Unauthorized)):
                    raise
                log.warning("pod %s/%s: the API server refused its final delete: %s", namespace, name, e)
            del self._deletes[uid]
            self._mark_gone(uid)
            self._forget(uid)
