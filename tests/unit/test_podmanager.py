"""The pod manager: desired pods by uid, evicted pods until they are gone, refusals reported once."""

from __future__ import annotations

from edgelet.podmanager import PodManager


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


def test_rejection_is_reported_once_until_the_source_removes_the_pod():
    pods = PodManager()
    assert pods.reject("r") is True
    assert pods.reject("r") is False
    pods.remove("r")
    assert pods.reject("r") is True
