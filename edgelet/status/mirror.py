"""Mirror pods (the kubelet's pod/mirror_client.go and its part of the pod sync): one in the API for each static
pod, replaced when the static pod's hash changes, deleted when the static pod is gone. Fed by the API pod source
through `set_mirror_pods`, paired by the pod manager, driven by the status syncer's loop."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import AlreadyExists, ApiError, Conflict, NotFound, ServerError, Unauthorized
from edgelet.pod.manager import PodManager
from edgelet.util.backoff import Backoff

log = logging.getLogger(__name__)

# Metadata the API server assigns or refuses on create.
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                    "generation", "managedFields", "selfLink", "ownerReferences")
# How long a mirror pod we created counts as existing before the pod watch has shown it (the watch
# normally does within a second; a mirror deleted before it ever showed up is recreated after this).
_MIRROR_SEEN_GRACE = 10.0

# A refused mirror pod (namespace missing, forbidden, name taken) is tried again after 1 s doubling up to the
# kubelet's pod resync period.
MIRROR_RETRY_INITIAL = 1.0
MIRROR_RETRY_MAX = 60.0

Key = tuple[str, str]  # (namespace, name)


# -- pure parts ----------------------------------------------------------------------------------------


def mirror_pod(static_pod: Pod, node_name: str, node_uid: str) -> Pod:
    """The mirror of a static pod: its metadata and spec without what the API server assigns, the
    `kubernetes.io/config.mirror` annotation holding the static pod's hash, owned by this Node."""
    meta = {k: v for k, v in podutil.meta(static_pod).items() if k not in _SERVER_METADATA}
    annotations = dict(meta.get("annotations") or {})
    annotations[podutil.CONFIG_MIRROR_ANNOTATION] = config_hash(static_pod)
    meta["annotations"] = annotations
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                                "controller": True}]
    spec = dict(podutil.spec(static_pod))
    spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def config_hash(pod: Pod) -> str:
    """The static pod's content hash (its uid when the source did not set one)."""
    return podutil.annotations(pod).get(podutil.CONFIG_HASH_ANNOTATION) or podutil.uid(pod)


def split_mirror_pods(pods: Iterable[Pod]) -> tuple[list[Pod], list[Pod]]:
    """(regular pods, mirror pods): mirror pods stand for static pods and must never be run themselves."""
    regular: list[Pod] = []
    mirrors: list[Pod] = []
    for pod in pods:
        (mirrors if podutil.is_mirror(pod) else regular).append(pod)
    return regular, mirrors


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace or 'default'}/pods/{name}"


def pod_key(pod: Pod) -> Key:
    return podutil.namespace(pod) or "default", podutil.name(pod)


def mirror_is_current(static_pod: Pod, mirror: Pod | None) -> bool:
    """The mirror stands for this version of the static pod (the kubelet's IsMirrorPodOf)."""
    return (mirror is not None
            and podutil.annotations(mirror).get(podutil.CONFIG_MIRROR_ANNOTATION) == config_hash(static_pod))


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    """What one pass does: (key, static pod, stale mirror to delete first or None) to create, then orphans."""

    create: list[tuple[Key, Pod, Pod | None]]
    orphans: list[tuple[Key, Pod]]


def plan_mirrors(static: dict[Key, Pod], mirrors: Iterable[Pod], mirror_of: Callable[[Pod], Pod | None],
                 in_backoff: Callable[[Key, str], bool], static_sources_ready: bool) -> MirrorPlan:
    """Which mirror pods to create and delete: a static pod without a current mirror (none, being deleted, or of
    another hash) gets one unless its refusal is in backoff; a mirror without a static pod is deleted, but only
    once every static source has listed (a pod not listed yet is not gone)."""
    create: list[tuple[Key, Pod, Pod | None]] = []
    for key, pod in static.items():
        mirror = mirror_of(pod)
        if mirror is not None and not podutil.deletion_requested(mirror) and mirror_is_current(pod, mirror):
            continue
        if in_backoff(key, config_hash(pod)):
            continue
        create.append((key, pod, mirror))
    orphans = [(key, mirror) for mirror in mirrors if (key := pod_key(mirror)) not in static] \
        if static_sources_ready else []
    return MirrorPlan(create, orphans)


def report_refusal(refusals: dict[Key, str], key: Key, what: str, error: ApiError) -> None:
    """One warning per object and reason, however often the server repeats it."""
    why = f"{error.status} {error.reason}: {error.message}"
    if refusals.get(key) != why:
        log.warning("pod %s/%s: the API server refuses %s (%s); other pods are not affected", *key, what, why)
    else:
        log.debug("pod %s/%s: %s still refused (%s)", *key, what, why)
    refusals[key] = why


# -- the manager -----------------------------------------------------------------------------------------


class MirrorListener(Protocol):
    """Who must know of mirror changes: the status syncer (it writes static pods' statuses to their mirrors)."""

    def mirrors_changed(self) -> None: ...

    def mirror_created(self, mirror: Pod) -> None: ...

    def mirror_deleted(self, mirror: Pod) -> None: ...


class StaticPods(Protocol):
    """The pods that need mirror pods (the pod config's, `edgelet.podconfig.config.PodConfig`)."""

    def static_pods(self) -> Iterable[Pod]:
        """The static pods the node runs."""

    def static_pods_ready(self) -> bool:
        """Whether their sources have listed them (orphan mirrors are deleted only then)."""


class _NoStaticPods:
    """A node without static pods (a hollow node of `edgelet simulate`)."""

    @staticmethod
    def static_pods() -> Iterable[Pod]:
        return ()

    @staticmethod
    def static_pods_ready() -> bool:
        return True


NO_STATIC_PODS: StaticPods = _NoStaticPods()


class MirrorPods:
    """Creates and deletes the mirror pods; `sync()` is one pass, run by the status syncer's loop."""

    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        pod_manager: PodManager,
        *,
        clock: Callable[[], float] = time.monotonic,
        static: StaticPods = NO_STATIC_PODS,
        node_uid: Callable[[], str] = lambda: "",
    ):
        """`pod_manager` holds the mirror pods (this creates and deletes them; the pod source lists them);
        `static` the static pods that need mirrors, `node_uid()` the Node's uid for the mirror pods' owner
        reference (mirrors wait until it is known)."""
        self.client = client
        self.node_name = node_name
        self.pod_manager = pod_manager
        self.writes: Counter[str] = Counter()  # API writes by kind: mirror-create, mirror-delete
        self._clock = clock
        self._static = static
        self._node_uid = node_uid
        self._listeners: list[MirrorListener] = []
        self._listed = False  # no mirror is created before the existing ones are known
        self._created: dict[Key, tuple[Pod, float]] = {}  # mirrors we created that the watch has not shown yet
        self._retry = Backoff(MIRROR_RETRY_INITIAL, MIRROR_RETRY_MAX, clock=clock)
        self._owner = ""  # the Node uid the refusals were met with: a new Node retries them at once
        self._refusals: dict[Key, str] = {}  # static pods whose mirror the server refuses, and why

    def add_listener(self, listener: MirrorListener) -> None:
        self._listeners.append(listener)

    # -- inputs -------------------------------------------------------------------------------

    def set_mirror_pods(self, mirrors: Iterable[Pod]) -> None:
        """The mirror pods bound to this node, as the API pod source lists them: the pod manager gets them,
        with the mirrors created here that the listing does not show yet."""
        now = self._clock()
        self._listed = True
        seen = {pod_key(pod): pod for pod in mirrors}
        for key, (created, created_at) in list(self._created.items()):
            uid = podutil.uid(created)
            if (key in seen and podutil.uid(seen[key]) == uid) or now - created_at > _MIRROR_SEEN_GRACE:
                del self._created[key]
            elif (ours := self.pod_manager.mirror_pod_by_pod(created)) is not None and podutil.uid(ours) == uid:
                seen[key] = ours  # newer than the watch's view
        if self.pod_manager.set_mirror_pods(seen.values()):
            for listener in self._listeners:
                listener.mirrors_changed()

    @property
    def refusals(self) -> dict[Key, str]:
        """(namespace, name) of static pods whose mirror the API server refuses -> why."""
        return dict(self._refusals)

    def next_retry(self) -> float:
        """clock() when the next refused mirror pod may be tried (infinity when none waits)."""
        if not self._refusals:
            return float("inf")
        waits = [wait for pod in self._static.static_pods() if (key := pod_key(pod)) in self._refusals
                 and (wait := self._retry.remaining((key, config_hash(pod)))) > 0]
        return self._clock() + min(waits) if waits else float("inf")

    # -- one pass -------------------------------------------------------------------------------

    async def sync(self) -> None:
        """Creates, replaces and deletes mirror pods. Raises the first ApiError that means the API server cannot
        be reached or refuses us; a refused mirror is retried after a growing delay."""
        node_uid = self._node_uid()
        if not node_uid or not self._listed:
            return  # a mirror pod needs its owner (the registered Node), and the API's list of mirrors
        if node_uid != self._owner:
            self._owner = node_uid  # a re-registered Node: what it was refused may be accepted now
            self._retry = Backoff(MIRROR_RETRY_INITIAL, MIRROR_RETRY_MAX, clock=self._clock)
        static = {pod_key(pod): pod for pod in self._static.static_pods()}
        for key in [key for key in self._refusals if key not in static]:
            del self._refusals[key]
        self._retry.gc()  # delays of static pods long gone or edited
        plan = plan_mirrors(static, self.pod_manager.mirror_pods(), self.pod_manager.mirror_pod_by_pod,
                            lambda key, wanted_hash: self._retry.in_backoff((key, wanted_hash)),
                            self._static.static_pods_ready())
        for key, pod, stale in plan.create:
            if stale is not None:
                await self._delete(key, stale)
            await self._create(key, pod, node_uid)
        for key, mirror in plan.orphans:
            await self._delete(key, mirror)

    async def _create(self, key: Key, pod: Pod, node_uid: str) -> None:
        namespace, name = key
        wanted_hash = config_hash(pod)
        action = "created"
        try:
            created = await self.client.create(f"/api/v1/namespaces/{namespace}/pods",
                                               mirror_pod(pod, self.node_name, node_uid))
            self.writes["mirror-create"] += 1
        except AlreadyExists:
            try:
                existing = await self.client.get(pod_path(namespace, name))
            except NotFound:
                return  # deleted in between: the next pass creates it
            if not podutil.is_mirror(existing):
                self._refuse(key, wanted_hash, ApiError(409, "AlreadyExists", "an API pod of that name exists"))
                return
            created, action = existing, "adopted"  # ours from before; replaced next pass if its hash is stale
        except ApiError as e:
            if isinstance(e, (ServerError, Unauthorized)):
                raise
            self._refuse(key, wanted_hash, e)
            return
        self._retry.reset((key, wanted_hash))
        self._refusals.pop(key, None)
        self.pod_manager.add_mirror_pod(created)
        self._created[key] = (created, self._clock())
        for listener in self._listeners:
            listener.mirror_created(created)
        log.info("%s mirror pod %s/%s for static pod %s", action, namespace, name, podutil.uid(pod))

    def _refuse(self, key: Key, wanted_hash: str, error: ApiError) -> None:
        """The static pod runs all the same; its mirror is tried again after a growing delay (the namespace
        may be created, the Node re-registered, a pod of that name deleted)."""
        delay = self._retry.next((key, wanted_hash))
        report_refusal(self._refusals, key, f"its mirror pod (status kept locally; next try in {delay:.0f}s)", error)

    async def _delete(self, key: Key, mirror: Pod) -> None:
        try:
            await self.client.delete(pod_path(*key), preconditions_uid=podutil.uid(mirror), grace_period=0)
            self.writes["mirror-delete"] += 1
            log.info("deleted mirror pod %s/%s", *key)
        except (NotFound, Conflict):
            pass
        except ApiError as e:
            if isinstance(e, (ServerError, Unauthorized)):
                raise
            log.warning("cannot delete the mirror pod %s/%s: %s", *key, e)
        self.pod_manager.remove_mirror_pod(mirror)
        self._created.pop(key, None)
        for listener in self._listeners:
            listener.mirror_deleted(mirror)
