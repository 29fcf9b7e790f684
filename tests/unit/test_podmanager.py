"""The pod manager: desired pods by uid, evicted pods until they are gone, refusals reported once."""

from __future__ import annotations

import pytest

from edgelet.pod.manager import PodManager


def pod(uid: str, version: str = "1") -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default", "resourceVersion": version}}


def test_desired_pods_by_uid():
    pods = PodManager()
    pods.set(pod("a"))
    pods.set(pod("b"))
    pods.update_if_known(pod("a", "2"))
    pods.update_if_known(pod("ghost"))  # a reconcile never adds a pod
    assert sorted(pods) == ["a", "b"] and "ghost" not in pods and len(pods) == 2
    assert pods.get("a")["metadata"]["resourceVersion"] == "2"
    snapshot = pods.pods()
    pods.remove("b")
    assert "b" in snapshot and pods.get("b") is None  # a reader's copy does not change under it


def test_active_pods_leave_out_evicted_and_terminating():
    pods = PodManager()
    for uid in "abc":
        pods.set(pod(uid))
    pods.mark_evicted("a", "Evicted", "The node was low on resource: memory.")
    active = pods.active_pods(is_terminating=lambda uid: uid == "b")
    assert [p["metadata"]["uid"] for p in active] == ["c"]
    assert pods.eviction("a") == ("Evicted", "The node was low on resource: memory.") and pods.is_evicted("a")


def test_eviction_outlives_removal_until_the_pod_is_gone():
    pods = PodManager()
    pods.set(pod("a"))
    pods.mark_evicted("a", "Evicted", "low memory")
    pods.remove("a")  # the source dropped it: its final status still says why it stopped
    assert pods.is_evicted("a")
    pods.forget("a")
    assert not pods.is_evicted("a") and pods.eviction("a") is None


# -- mirror pods ------------------------------------------------------------------------------------------

def static(uid: str, name: str = "web-node", namespace: str = "default") -> dict:
    return {"metadata": {"uid": uid, "name": name, "namespace": namespace,
                         "annotations": {"kubernetes.io/config.source": "file", "kubernetes.io/config.hash": uid}}}


def mirror(uid: str, name: str = "web-node", namespace: str = "default") -> dict:
    return {"metadata": {"uid": uid, "name": name, "namespace": namespace,
                         "annotations": {"kubernetes.io/config.mirror": "hash"}}}


def with_pods(desired: list[dict], mirrors: list[dict]) -> PodManager:
    pods = PodManager()
    for p in desired:
        pods.set(p)
    pods.set_mirror_pods(mirrors)
    return pods


@pytest.mark.parametrize("desired, mirrors, asked, found", [
    ([static("s1")], [mirror("m1")], static("s1"), "m1"),
    ([static("s1")], [mirror("m1")], static("s2"), "m1"),  # an edited static pod: same name, new uid
    ([static("s1")], [mirror("m1", namespace="kube-system")], static("s1"), None),  # the name includes the namespace
    ([static("s1")], [mirror("m1", name="other")], static("s1"), None),
    ([static("s1")], [], static("s1"), None),
    ([static("s1", namespace="")], [mirror("m1", namespace="default")], static("s1", namespace=""), "m1"),
])
def test_mirror_pod_by_pod_pairs_by_full_name(desired, mirrors, asked, found):
    got = with_pods(desired, mirrors).mirror_pod_by_pod(asked)
    assert (got["metadata"]["uid"] if got else None) == found


@pytest.mark.parametrize("desired, mirrors, asked, found", [
    ([static("s1"), pod("other")], [mirror("m1")], mirror("m1"), "s1"),
    ([pod("other")], [mirror("m1")], mirror("m1"), None),  # its static pod is not (or no longer) desired
    ([static("s1", namespace="kube-system")], [mirror("m1")], mirror("m1"), None),
])
def test_pod_by_mirror_pod_finds_the_desired_pod_of_the_same_full_name(desired, mirrors, asked, found):
    got = with_pods(desired, mirrors).pod_by_mirror_pod(asked)
    assert (got["metadata"]["uid"] if got else None) == found


@pytest.mark.parametrize("desired, mirrors, uid, translated", [
    ([static("s1")], [mirror("m1")], "m1", "s1"),  # a mirror's uid names its static pod
    ([static("s1")], [mirror("m1")], "s1", "s1"),  # the static pod's own uid is kept
    ([pod("a")], [], "a", "a"),  # an API pod is its own
    ([], [mirror("m1")], "m1", "m1"),  # a mirror whose static pod is gone: nothing to translate to
    ([static("s1")], [mirror("m1")], "unknown", "unknown"),
    ([static("s1")], [mirror("")], "", ""),  # no uid is never a mirror's
])
def test_translate_pod_uid(desired, mirrors, uid, translated):
    assert with_pods(desired, mirrors).translate_pod_uid(uid) == translated


def test_mirror_pods_are_replaced_by_a_listing_and_kept_up_to_date_by_their_writer():
    pods = PodManager()
    assert pods.set_mirror_pods([mirror("m1")]) is True
    assert pods.set_mirror_pods([mirror("m1")]) is False  # the same listing again changes nothing
    pods.add_mirror_pod(mirror("m2"))  # recreated under the same name before the source lists it
    assert [m["metadata"]["uid"] for m in pods.mirror_pods()] == ["m2"]
    pods.add_mirror_pod(mirror("m3", name="db-node"))
    pods.remove_mirror_pod(mirror("any-uid"))  # deleted by name: the API deletes what is under it
    assert [m["metadata"]["uid"] for m in pods.mirror_pods()] == ["m3"]
    assert pods.set_mirror_pods([]) is True and pods.mirror_pods() == []
    assert len(pods) == 0  # mirror pods are never desired pods
