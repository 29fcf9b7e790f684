"""The PLEG and the pod cache against the real runtime: a relist that began before a worker's inspection and
finishes after it cannot put back the older state it observed."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from edgelet.api import podutil
from edgelet.container.cache import InspectionError
from edgelet.container.runtime import ContainerState
from edgelet.pleg import generic as pleg_module
from edgelet.pleg.generic import GenericPLEG
from edgelet.util.errors import TemporaryError
from tests.integration.cri_harness import start_labelled_pod

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


class HeldStatusReplies:
    """The real runtime client, except that ContainerStatus replies wait for `release` before they return
    once `hold` is set: the reply is what the runtime said when asked, delivered late."""

    def __init__(self, client):
        self._client = client
        self.hold = False
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def container_status(self, container_id):
        reply = await self._client.container_status(container_id)
        if self.hold:
            self.hold = False
            self.asked.set()
            await self.release.wait()
        return reply


async def test_an_older_relist_cannot_replace_a_newer_inspection(cri, containerd):
    uid, container_id = await start_labelled_pod(cri, containerd)

    runtime = HeldStatusReplies(cri)
    pleg = GenericPLEG(runtime)
    runtime.hold = True
    relist = asyncio.ensure_future(pleg.relist())
    await asyncio.wait_for(runtime.asked.wait(), 10)  # the relist saw the container running

    await cri.stop_container(container_id, 0)
    inspected = await pleg.inspect_now(uid)  # a worker's inspection, after the stop
    assert inspected.latest_container("main").state == ContainerState.EXITED

    runtime.release.set()
    await asyncio.wait_for(relist, 10)
    assert pleg.get_status(uid).latest_container("main").state == ContainerState.EXITED
    # The next relist (observed after both) brings the cache up to date as usual.
    await pleg.relist()
    assert pleg.get_status(uid).latest_container("main").state == ContainerState.EXITED


async def test_the_cache_follows_the_runtime_after_the_wall_clock_stepped_back(cri, containerd, monkeypatch):
    uid, container_id = await start_labelled_pod(cri, containerd)
    pleg = GenericPLEG(cri)
    await pleg.relist()
    assert pleg.cache.get(uid).latest_container("main").state == ContainerState.RUNNING

    ten_years = 10 * 365 * 86400
    stepped_back = types.SimpleNamespace(time=lambda: time.time() - ten_years, monotonic=time.monotonic,
                                         perf_counter=time.perf_counter)
    monkeypatch.setattr(pleg_module, "time", stepped_back)  # an NTP step back, or a dead RTC battery
    await cri.stop_container(container_id, 0)
    await pleg.relist()
    assert pleg.cache.get(uid).latest_container("main").state == ContainerState.EXITED


class CountedStatusCalls:
    """The real runtime client, counting the status calls per object and the most in flight at once; the
    ContainerStatus calls of the containers in `fail_once` fail the first time."""

    def __init__(self, client, fail_once=()):
        self._client = client
        self.fail_once = set(fail_once)
        self.calls: dict[str, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def _counted(self, object_id, call):
        self.calls[object_id] = self.calls.get(object_id, 0) + 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)  # a runtime that takes its time: the relist must not wait for each reply
            return await call
        finally:
            self.in_flight -= 1

    async def pod_sandbox_status(self, sandbox_id):
        return await self._counted(sandbox_id, self._client.pod_sandbox_status(sandbox_id))

    async def container_status(self, container_id):
        if container_id in self.fail_once:
            self.fail_once.discard(container_id)
            raise TemporaryError("runtime busy")
        return await self._counted(container_id, self._client.container_status(container_id))


async def test_a_relist_inspects_changed_pods_side_by_side_each_once(cri, containerd):
    pods = [await start_labelled_pod(cri, containerd) for _ in range(4)]
    runtime = CountedStatusCalls(cri)
    pleg = GenericPLEG(runtime)
    await pleg.relist()
    for uid, container_id in pods:
        assert pleg.get_status(uid).latest_container("main").state == ContainerState.RUNNING
        assert runtime.calls[container_id] == 1
    assert len(runtime.calls) == 8  # one sandbox and one container per pod, nothing asked twice
    assert runtime.most_in_flight > 1


async def test_a_failed_inspection_is_stored_for_its_pod_and_retried_at_the_next_relist(cri, containerd):
    (broken_uid, broken_id), (good_uid, _) = [await start_labelled_pod(cri, containerd) for _ in range(2)]
    runtime = CountedStatusCalls(cri, fail_once={broken_id})
    pleg = GenericPLEG(runtime)
    before = time.monotonic()
    await pleg.relist()
    assert (await pleg.cache.get_newer_than(good_uid, before)).latest_container("main").state == ContainerState.RUNNING
    # The broken pod's worker gets the error at once (its sync fails and is retried), never a wait for ever.
    with pytest.raises(InspectionError, match="runtime busy"):
        await asyncio.wait_for(pleg.cache.get_newer_than(broken_uid, before), 5)
    events = await pleg.relist()  # nothing changed in the runtime, yet the broken pod is inspected again
    assert events == []
    assert pleg.cache.error(broken_uid) is None
    status = await asyncio.wait_for(pleg.cache.get_newer_than(broken_uid, before), 5)
    assert status.latest_container("main").state == ContainerState.RUNNING


async def test_the_sandbox_status_names_the_pod_source(cri, containerd):
    """The start-up clean-up reads each runtime pod's source from the cache, not from the runtime again."""
    file_uid, _ = await start_labelled_pod(cri, containerd, annotations={podutil.CONFIG_SOURCE_ANNOTATION: "file"})
    api_uid, _ = await start_labelled_pod(cri,
                                          containerd)  # no annotation: a pod of the API server, as the kubelet reads it
    pleg = GenericPLEG(cri)
    await pleg.relist()
    assert pleg.get_status(file_uid).sandboxes[0].source == "file"
    assert pleg.get_status(api_uid).sandboxes[0].source == "api"
