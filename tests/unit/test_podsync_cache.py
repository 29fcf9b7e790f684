"""What a pod worker asks of the runtime: it acts on a cached status newer than its last action, and
terminating a pod inspects it once (after the kill), not three times."""

from __future__ import annotations

import asyncio
import time

import pytest

from edgelet.container.cache import PodCache
from edgelet.container.runtime import PodRuntimeStatus, SandboxState, SandboxStatus
from edgelet.kubelet.podsync import PodSyncer
from edgelet.kuberuntime.manager import SyncResult
from edgelet.pod.manager import PodManager
from edgelet.pod.workers import PodSyncStatus
from edgelet.util.errors import EdgeletError

POD = {"metadata": {"uid": "u", "name": "web", "namespace": "default", "deletionTimestamp": "2024-01-01T00:00:00Z"},
       "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def relisted(name: str) -> PodRuntimeStatus:
    """A pod with its sandbox, as a relist stores it now."""
    sandbox = SandboxStatus(id="s", name="web", namespace="default", uid="u", attempt=0, state=SandboxState.READY,
                            created_at=1)
    return PodRuntimeStatus(uid="u", name=name, sandboxes=[sandbox], timestamp=time.monotonic())


class Pleg:
    """The PLEG's reading side over a real pod cache; inspections are counted and stored as the PLEG does."""

    def __init__(self):
        self.cache = PodCache()
        self.inspections = 0

    def get_status(self, uid):
        return self.cache.get(uid)

    async def inspect_now(self, uid):
        self.inspections += 1
        self.cache.set(relisted(f"inspection {self.inspections}"))
        return self.cache.get(uid)


class RuntimeManager:
    def __init__(self):
        self.seen: list[tuple[str, str]] = []  # (call, name of the status it was given)
        self.results: list[SyncResult | Exception] = []  # what the next syncs return or raise (then: no change)

    async def sync_pod(self, pod, status, **_):
        self.seen.append(("sync", status.name))
        result = self.results.pop(0) if self.results else SyncResult()
        if isinstance(result, Exception):
            raise result
        return result

    async def kill_pod(self, pod, status, grace):
        self.seen.append(("kill", status.name))

    async def remove_pod(self, status):
        self.seen.append(("remove", status.name))

    def resize_view(self, pod):
        return None  # no resizer: the status carries no resources


class Prober:
    def __getattr__(self, name):
        return lambda *args: {} if name in ("readiness", "started") else set()


class Status:
    def __init__(self):
        self.published = []

    def get_status(self, uid):
        return None

    def set_pod_status(self, pod, status):
        self.published.append(status)

    def force_update(self, uid):
        pass

    def remove(self, uid):
        pass


class Volumes:
    async def teardown_pod(self, uid):
        pass


def make_syncer():
    pleg, runtime_manager, pods = Pleg(), RuntimeManager(), PodManager()
    syncer = PodSyncer(pod_manager=pods, pleg=pleg, runtime_manager=runtime_manager, prober=Prober(),
                       status=Status(), volumes=Volumes(), node_ip="10.0.0.1")
    return syncer, pleg, runtime_manager, pods


async def test_terminating_a_pod_inspects_it_once():
    syncer, pleg, runtime_manager, pods = make_syncer()
    record = PodSyncStatus(POD)
    pods.set(POD)
    pleg.cache.set(relisted("relist"))
    await syncer.terminate_pod(record, None)
    assert await syncer.on_terminated(record) is True
    assert pleg.inspections == 1
    # The kill used the relist's view; the removal what the inspection after the kill saw.
    assert runtime_manager.seen == [("kill", "relist"), ("remove", "inspection 1")]
    assert "u" not in pods


async def test_the_next_sync_waits_for_a_status_newer_than_the_last_action():
    syncer, pleg, runtime_manager, pods = make_syncer()
    record = PodSyncStatus(POD)
    pods.set(POD)
    pleg.cache.set(relisted("relist 1"))
    runtime_manager.results.append(SyncResult(started=["main"]))
    await syncer.sync_pod(record)  # it started a container: it inspects after acting, to publish at once
    await asyncio.wait_for(syncer.sync_pod(record), 1)  # that inspection is newer than the action: no wait
    assert runtime_manager.seen == [("sync", "relist 1"), ("sync", "inspection 1")] and pleg.inspections == 1
    third = asyncio.ensure_future(syncer.sync_pod(record))
    await asyncio.sleep(0.01)
    assert not third.done()  # nothing in the cache was observed after the second sync acted
    pleg.cache.set(relisted("relist 2"))
    await asyncio.wait_for(third, 1)
    assert runtime_manager.seen[-1] == ("sync", "relist 2") and pleg.inspections == 1


async def test_the_sync_after_one_that_failed_half_way_asks_the_runtime():
    syncer, pleg, runtime_manager, pods = make_syncer()
    record = PodSyncStatus(POD)
    pods.set(POD)
    pleg.cache.set(relisted("relist"))
    pleg.cache.update_time(time.monotonic() + 3600)  # the cache vouched for as if the PLEG had seen it all
    runtime_manager.results.append(EdgeletError("StartContainer failed"))
    with pytest.raises(EdgeletError):
        await syncer.sync_pod(record)  # it may have created a container before it failed: no view in the cache has it
    await asyncio.wait_for(syncer.sync_pod(record), 1)
    await asyncio.wait_for(syncer.sync_pod(record), 1)
    assert runtime_manager.seen == [("sync", "relist"), ("sync", "inspection 1"), ("sync", "inspection 1")]


WAITING = {"main": ("ImagePullBackOff", "Back-off pulling image")}


@pytest.mark.parametrize(("result", "sandboxes", "inspections"), [
    (SyncResult(), True, 0),  # a running pod adopted after a restart: the relist's status is current
    (SyncResult(started=["main"]), True, 1),  # what it started is in no relist yet
    (SyncResult(stopped=True), True, 1),  # nor what it stopped: the runtime's events for it may still be on the way
    (SyncResult(waiting_reasons=WAITING), True, 1),  # a new waiting reason is published at once
    (SyncResult(), False, 1),  # no sandbox in the cache (yet)
])
async def test_the_first_sync_inspects_only_when_it_changed_something(result, sandboxes, inspections):
    syncer, pleg, runtime_manager, pods = make_syncer()
    record = PodSyncStatus(POD)
    pods.set(POD)
    status = relisted("relist")
    if not sandboxes:
        status.sandboxes.clear()
    pleg.cache.set(status)
    runtime_manager.results.append(result)
    await syncer.sync_pod(record)
    assert pleg.inspections == inspections
    assert len(syncer._status.published) == 1
