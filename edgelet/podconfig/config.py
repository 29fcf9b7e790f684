"""The pod config merger: each source sets its full pod list; changes come out as ADD/UPDATE/DELETE/REMOVE/RECONCILE."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edgelet.api import podutil
from edgelet.podconfig.defaults import now_rfc3339nano

log = logging.getLogger(__name__)

Pod = dict[str, Any]

# Annotations the agent itself writes; a difference in them is not a change of the pod.
_LOCAL_ANNOTATIONS = frozenset(
    {podutil.CONFIG_SOURCE_ANNOTATION, podutil.CONFIG_MIRROR_ANNOTATION, podutil.CONFIG_SEEN_ANNOTATION}
)


class Op(enum.Enum):
    ADD = "ADD"  # a uid the source did not have before
    UPDATE = "UPDATE"  # spec, labels, annotations or generation changed
    DELETE = "DELETE"  # the pod carries a deletionTimestamp: terminate gracefully
    REMOVE = "REMOVE"  # the source no longer lists the pod: stop it now
    RECONCILE = "RECONCILE"  # only the status differs: the agent re-asserts its own


# The kubelet's order: removals first (free resources and names), then additions, updates, deletes.
_OP_ORDER = (Op.REMOVE, Op.ADD, Op.UPDATE, Op.DELETE, Op.RECONCILE)


@dataclass(frozen=True, slots=True)
class PodUpdate:
    op: Op
    pods: list[Pod]
    source: str


@dataclass(slots=True)
class MergeResult:
    """What one `set` changed: the source's new pods by uid, the changes per op, and the pods refused."""

    state: dict[str, Pod]
    changes: dict[Op, list[Pod]] = field(default_factory=dict)
    rejected: list[tuple[Pod, str]] = field(default_factory=list)

    def updates(self, source: str) -> list[PodUpdate]:
        return [PodUpdate(op, self.changes[op], source) for op in _OP_ORDER if self.changes.get(op)]


def semantic_view(pod: Pod) -> tuple[Any, ...]:
    """The parts of a pod whose change is an UPDATE; status and the agent's own annotations excluded."""
    meta = podutil.meta(pod)
    annotations = {k: v for k, v in podutil.annotations(pod).items() if k not in _LOCAL_ANNOTATIONS}
    return (
        podutil.spec(pod),
        meta.get("labels") or {},
        annotations,
        meta.get("deletionTimestamp"),
        meta.get("deletionGracePeriodSeconds"),
        meta.get("generation"),
    )


def _annotated(pod: Pod, source: str, seen: str) -> Pod:
    """The pod carrying the source and first-seen annotations; the caller's dict stays untouched.

    A pod that already carries both (every static pod: its source wrote them) is returned as it is, so the
    source and the merger hold one copy of it, not two; pods are never modified once accepted.
    """
    annotations = podutil.annotations(pod)
    if (annotations.get(podutil.CONFIG_SOURCE_ANNOTATION) == source
            and annotations.get(podutil.CONFIG_SEEN_ANNOTATION) == seen):
        return pod
    meta = dict(podutil.meta(pod))
    annotations = dict(meta.get("annotations") or {})
    annotations[podutil.CONFIG_SOURCE_ANNOTATION] = source
    annotations[podutil.CONFIG_SEEN_ANNOTATION] = seen
    meta["annotations"] = annotations
    copy = dict(pod)
    copy["metadata"] = meta
    return copy


def merge_source(existing: dict[str, Pod], incoming: Iterable[Pod], source: str, *, now: str) -> MergeResult:
    """Compare a source's new full pod list with what it had before. Pure: inputs are never modified.

    Pods are keyed by uid; a pod without uid, or repeating a uid or a namespace/name already in this list,
    is rejected (the kubelet's duplicate check). Direct comparison of the semantic parts gives the same
    answer as comparing hashes of them without serializing every pod on every set.
    """
    result = MergeResult(state={})
    changes: dict[Op, list[Pod]] = {op: [] for op in _OP_ORDER}
    names: set[str] = set()
    # A pod the source already had keeps its name against a newcomer, wherever the newcomer is listed.
    for pod in sorted(incoming, key=lambda pod: podutil.uid(pod) not in existing):
        pod_uid = podutil.uid(pod)
        if not pod_uid:
            result.rejected.append((pod, "has no metadata.uid"))
            continue
        full_name = podutil.full_name(pod)
        if pod_uid in result.state or full_name in names:
            result.rejected.append((pod, f"duplicates pod {full_name} (uid {pod_uid}) of this source"))
            continue
        names.add(full_name)
        old = existing.get(pod_uid)
        if old is None:
            seen = podutil.annotations(pod).get(podutil.CONFIG_SEEN_ANNOTATION) or now
            new = _annotated(pod, source, seen)
            changes[Op.ADD].append(new)
        elif semantic_view(old) != semantic_view(pod):
            new = _annotated(pod, source, podutil.annotations(old).get(podutil.CONFIG_SEEN_ANNOTATION) or now)
            changes[Op.DELETE if podutil.deletion_requested(new) else Op.UPDATE].append(new)
        elif (old.get("status") or {}) != (pod.get("status") or {}):
            new = dict(old)
            new["status"] = pod.get("status") or {}
            changes[Op.RECONCILE].append(new)
        else:
            new = old
        result.state[pod_uid] = new
    changes[Op.REMOVE] = [pod for pod_uid, pod in existing.items() if pod_uid not in result.state]
    result.changes = {op: pods for op, pods in changes.items() if pods}
    return result


class SourceHandle:
    """One source's way into the merger; sources call it from the event loop's thread."""

    __slots__ = ("_config", "name")

    def __init__(self, config: PodConfig, name: str):
        self._config = config
        self.name = name

    def set(self, pods: Iterable[Pod]) -> None:
        """Replace this source's whole pod set (snapshot semantics) and queue the resulting changes."""
        self._config._set(self.name, pods)

    def mark_ready(self) -> None:
        """Say the source has delivered its first complete view (until then, nothing is orphaned)."""
        self._config._mark_ready(self.name)

    @property
    def ready(self) -> bool:
        return self.name in self._config._ready


class PodConfig:
    """Merges the sources (file, http, api) into one stream of `PodUpdate`s on `updates`."""

    def __init__(self) -> None:
        self.updates: asyncio.Queue[PodUpdate] = asyncio.Queue()
        self._pods: dict[str, dict[str, Pod]] = {}
        self._ready: set[str] = set()
        self.source_became_ready = asyncio.Event()  # set, and replaced by a new one, when a source becomes ready
        self._reported: dict[str, set[tuple[str, str]]] = {}

    def source(self, name: str) -> SourceHandle:
        """Register a source (idempotent); until it is marked ready, `all_sources_ready()` is False."""
        if name not in self._pods:
            self._pods[name] = {}
            self._reported[name] = set()
        return SourceHandle(self, name)

    def sources(self) -> list[str]:
        return list(self._pods)

    def get_pods(self) -> list[Pod]:
        """The merged current pods of every source, in source registration order."""
        return [pod for pods in self._pods.values() for pod in pods.values()]

    def all_sources_ready(self) -> bool:
        return self._ready.issuperset(self._pods)

    def _mark_ready(self, name: str) -> None:
        if name not in self._ready:
            log.info("pod source %s is ready", name)
            self._ready.add(name)
            became_ready, self.source_became_ready = self.source_became_ready, asyncio.Event()
            became_ready.set()

    def _set(self, name: str, pods: Iterable[Pod]) -> None:
        if name not in self._pods:
            raise KeyError(f"unknown pod source {name!r}")
        result = merge_source(self._pods[name], pods, name, now=now_rfc3339nano())
        self._pods[name] = result.state
        self._report(name, result.rejected)
        for update in result.updates(name):
            self.updates.put_nowait(update)

    def _report(self, name: str, rejected: list[tuple[Pod, str]]) -> None:
        """Warn once per rejected pod and reason; forget it when it stops being rejected."""
        current = {(podutil.full_name(pod), reason) for pod, reason in rejected}
        for full_name, reason in sorted(current - self._reported[name]):
            log.warning("pod source %s: ignoring pod %s: it %s", name, full_name, reason)
        self._reported[name] = current
