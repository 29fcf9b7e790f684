"""The status manager: no write for an unchanged status, versions, write-behind, removal, reload."""

from __future__ import annotations

import asyncio

from edgelet.status.manager import StatusManager, read_pod_list


def pod(uid="u1", name="web", **meta):
    return {"metadata": {"uid": uid, "name": name, "namespace": "default", **meta},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}


RUNNING = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
PENDING = {"phase": "Pending"}


def test_identical_status_is_not_written_again(tmp_path):
    manager = StatusManager(str(tmp_path))
    assert manager.set_pod_status(pod(), PENDING) is True
    assert manager.set_pod_status(pod(), dict(PENDING)) is False
    assert manager.set_pod_status(pod(), RUNNING) is True
    assert manager.get_entry("u1").version == 2
    manager.flush()
    assert manager.disk_writes == 1  # the two changes coalesced into one write
    assert manager.set_pod_status(pod(), RUNNING) is False
    manager.flush()
    assert manager.disk_writes == 1


def test_changed_metadata_is_written_even_with_the_same_status(tmp_path):
    manager = StatusManager(str(tmp_path))
    manager.set_pod_status(pod(), RUNNING)
    assert manager.set_pod_status(pod(labels={"a": "b"}), RUNNING) is True


def test_a_restart_seeing_the_pod_anew_writes_nothing(tmp_path):
    """config.seen is new at every start of the agent; it alone is no reason to rewrite a checkpoint."""
    manager = StatusManager(str(tmp_path))
    seen = "kubernetes.io/config.seen"
    manager.set_pod_status(pod(annotations={seen: "2026-01-01T00:00:00.000000Z", "a": "1"}), RUNNING)
    manager.flush()
    restarted = StatusManager(str(tmp_path))
    restarted.load()
    assert restarted.set_pod_status(pod(annotations={seen: "2026-01-02T00:00:00.000000Z", "a": "1"}), RUNNING) is False
    assert restarted.set_pod_status(pod(annotations={seen: "2026-01-02T00:00:00.000000Z", "a": "2"}), RUNNING) is True
    assert restarted.set_pod_status(pod(annotations={"a": "2"}), RUNNING) is False


def test_a_status_read_back_shares_the_live_pods_spec_once_it_is_the_same(tmp_path):
    """After a restart each stored status held a second copy of its pod's spec for as long as the status did not
    change; the entry takes the live pod's spec as soon as a sync finds the two equal."""
    manager = StatusManager(str(tmp_path))
    manager.set_pod_status(pod(), RUNNING)
    manager.set_pod_status(pod("u2"), RUNNING)
    manager.flush()
    restarted = StatusManager(str(tmp_path))
    restarted.load()
    live, edited = pod(), pod("u2")
    edited["spec"]["containers"][0]["image"] = "busybox:2"
    assert restarted.set_pod_status(live, RUNNING) is False
    assert restarted.get_entry("u1").pod["spec"] is live["spec"]
    assert restarted.set_pod_status(edited, RUNNING) is False  # the status alone decides what is written
    assert restarted.get_entry("u2").pod["spec"]["containers"][0]["image"] == "busybox:1"  # as on disk
    restarted.flush()
    assert restarted.disk_writes == 0


def test_listeners_hear_each_change_with_its_version(tmp_path):
    manager = StatusManager(str(tmp_path))
    heard = []
    manager.add_listener(lambda stored, version: heard.append((stored["status"]["phase"], version)))
    manager.set_pod_status(pod(), PENDING)
    manager.set_pod_status(pod(), PENDING)
    manager.set_pod_status(pod(), RUNNING)
    assert heard == [("Pending", 1), ("Running", 2)]


async def test_writer_persists_in_the_background_and_survives_reload(tmp_path):
    manager = StatusManager(str(tmp_path))
    writer = asyncio.create_task(manager.run())
    manager.set_pod_status(pod("u1", "a"), RUNNING)
    manager.set_pod_status(pod("u2", "b"), PENDING)
    for _ in range(100):
        if manager.disk_writes == 2:
            break
        await asyncio.sleep(0.01)
    assert manager.disk_writes == 2
    listed = read_pod_list(str(tmp_path))
    assert listed["kind"] == "PodList"
    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in listed["items"]] == [
        ("a", "Running"), ("b", "Pending")]

    manager.remove("u2")
    writer.cancel()  # cancelling flushes what is pending
    await asyncio.gather(writer, return_exceptions=True)
    assert [p["metadata"]["name"] for p in read_pod_list(str(tmp_path))["items"]] == ["a"]

    reloaded = StatusManager(str(tmp_path))
    reloaded.load()
    assert reloaded.get_status("u1") == RUNNING
    assert reloaded.set_pod_status(pod("u1", "a"), RUNNING) is False  # hash carried over: no rewrite


def test_a_deleted_pod_carries_its_deletion_timestamp_until_it_is_removed(tmp_path):
    manager = StatusManager(str(tmp_path))
    manager.set_pod_status(pod(), RUNNING)
    manager.mark_deleted("u1", at="2026-01-01T00:00:00Z", grace=30)
    manager.mark_deleted("u1", at="2026-01-01T00:09:00Z", grace=1)  # the first deletion stands
    manager.mark_deleted("unknown", at="2026-01-01T00:00:00Z", grace=1)
    manager.flush()
    (stored,) = read_pod_list(str(tmp_path))["items"]
    assert stored["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:00Z"
    assert stored["metadata"]["deletionGracePeriodSeconds"] == 30
    assert stored["status"]["phase"] == "Running"
