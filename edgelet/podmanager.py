"""The pod manager (the kubelet's pod/pod_manager.go): the one owner of the desired pods by uid, of the pods
the node stopped for good (evicted) and of the pods admission refused.

Everyone else asks it; nothing else keeps its own list of desired pods. Mirror pods of static pods are not
desired pods: the API source hands them to the status syncer, which keeps the static <-> mirror mapping.
"""

from __future__ import annotations

from typing import Callable, Iterator

from .podutil import Pod, uid as pod_uid


class PodManager:
    def __init__(self) -> None:
        self._pods: dict[str, Pod] = {}
        # uid -> (reason, message) of the final status of a pod the node stopped for good, until it is gone.
        self._evicted: dict[str, tuple[str, str]] = {}
        self._rejected: set[str] = set()  # refused at admission: reported once, never run

    # -- desired pods -----------------------------------------------------------------------------

    def get(self, uid: str) -> Pod | None:
        return self._pods.get(uid)

    def set(self, pod: Pod) -> None:
        """Adds or updates a desired pod."""
        self._pods[pod_uid(pod)] = pod

    def update_if_known(self, pod: Pod) -> None:
        """A newer copy of a pod already desired (a status-only change from the source)."""
        uid = pod_uid(pod)
        if uid in self._pods:
            self._pods[uid] = pod

    def remove(self, uid: str) -> None:
        """The pod is no longer desired (its source removed it); its eviction record stays until it is gone."""
        self._pods.pop(uid, None)
        self._rejected.discard(uid)

    def forget(self, uid: str) -> None:
        """The pod is gone from the node: nothing about it is kept."""
        self._pods.pop(uid, None)
        self._evicted.pop(uid, None)
        self._rejected.discard(uid)

    def uids(self) -> list[str]:
        return list(self._pods)

    def pods(self) -> dict[str, Pod]:
        """A copy of the desired pods by uid (readers in other tasks must not see it change under them)."""
        return dict(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._pods))

    def active_pods(self, is_terminating: Callable[[str], bool]) -> list[Pod]:
        """Pods that hold resources: neither evicted nor terminating (the kubelet's GetActivePods)."""
        return [pod for uid, pod in self._pods.items() if uid not in self._evicted and not is_terminating(uid)]

    # -- evicted and rejected ---------------------------------------------------------------------

    def mark_evicted(self, uid: str, reason: str, message: str) -> None:
        """The node stopped the pod for good: it never runs again and its final status says why."""
        self._evicted[uid] = (reason, message)

    def eviction(self, uid: str) -> tuple[str, str] | None:
        """(reason, message) when the pod was evicted, else None."""
        return self._evicted.get(uid)

    def is_evicted(self, uid: str) -> bool:
        return uid in self._evicted

    def reject(self, uid: str) -> bool:
        """Records that admission refused the pod; True the first time (the refusal is reported once)."""
        if uid in self._rejected:
            return False
        self._rejected.add(uid)
        return True
