"""The pod manager (the kubelet's pod/pod_manager.go): the one owner of the desired pods by uid and of the mirror
pods standing for static pods in the API. Where a pod is in its life, and why the node stopped it for good, is the
pod workers' record of it.

Everyone else asks it; nothing else keeps its own list of desired pods or mirror pods. A mirror pod is never a
desired pod: it is paired with the static pod of the same full name (`name_namespace`), as the kubelet pairs them.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator

from edgelet.api.podutil import Pod, full_name
from edgelet.api.podutil import uid as pod_uid


class PodManager:
    def __init__(self) -> None:
        self._pods: dict[str, Pod] = {}
        self._mirrors: dict[str, Pod] = {}  # full name -> the mirror pod in the API

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
        """The pod is no longer desired (its source removed it, or it is gone from the node)."""
        self._pods.pop(uid, None)

    def uids(self) -> list[str]:
        return list(self._pods)

    def uid_set(self) -> builtins.set[str]:
        return set(self._pods)

    def pods(self) -> dict[str, Pod]:
        """A copy of the desired pods by uid (readers in other tasks must not see it change under them)."""
        return dict(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._pods))

    def active_pods(self, is_active: Callable[[str], bool]) -> list[Pod]:
        """The desired pods that hold resources, as `is_active(uid)` (the pod workers') tells (the kubelet's
        GetActivePods)."""
        return [pod for uid, pod in self._pods.items() if is_active(uid)]

    # -- mirror pods (the kubelet's GetMirrorPodByPod, GetPodByMirrorPod, TranslatePodUID) ---------------

    def set_mirror_pods(self, mirrors: Iterable[Pod]) -> bool:
        """Replaces the mirror pods (the API's, as the pod source lists them); True when that changed them."""
        by_name = {full_name(mirror): mirror for mirror in mirrors}
        if by_name == self._mirrors:
            return False
        self._mirrors = by_name
        return True

    def add_mirror_pod(self, mirror: Pod) -> None:
        """A mirror pod this node created (or adopted) before the pod source lists it."""
        self._mirrors[full_name(mirror)] = mirror

    def remove_mirror_pod(self, mirror: Pod) -> None:
        """The mirror pod of that full name was deleted from the API."""
        self._mirrors.pop(full_name(mirror), None)

    def mirror_pods(self) -> list[Pod]:
        return list(self._mirrors.values())

    def mirror_pod_by_pod(self, pod: Pod) -> Pod | None:
        """The mirror pod standing for `pod` (a static pod) in the API, if there is one."""
        return self._mirrors.get(full_name(pod))

    def pod_by_mirror_pod(self, mirror: Pod) -> Pod | None:
        """The desired pod a mirror pod stands for, if the node has it."""
        name = full_name(mirror)
        # A scan rather than an index by name: an edited static pod briefly has two uids under one name, and
        # a node holds about a hundred pods.
        return next((pod for pod in self._pods.values() if full_name(pod) == name), None)

    def translate_pod_uid(self, uid: str) -> str:
        """The uid of the static pod a mirror pod's uid stands for; any other uid unchanged. Clients know a
        static pod only by its mirror's uid, the runtime only by the static pod's."""
        mirror = next((mirror for mirror in self._mirrors.values() if pod_uid(mirror) == uid), None) if uid else None
        pod = self.pod_by_mirror_pod(mirror) if mirror is not None else None
        return pod_uid(pod) if pod is not None else uid
