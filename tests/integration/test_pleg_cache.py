"""The PLEG and the pod cache against the real runtime: a relist that began before a worker's inspection and
finishes after it cannot put back the older state it observed."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from edgelet import pleg as pleg_module
from edgelet.kuberuntime.types import ContainerState
from edgelet.pleg import GenericPLEG

from tests.integration.test_cri_client import container_config, sandbox_config

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


async def start_pod(cri, containerd) -> tuple[str, str]:
    """A running pod of one container labelled with its pod's uid, as the agent labels them: (uid, id)."""
    config = sandbox_config(containerd)
    sandbox_id = await cri.run_pod_sandbox(config)
    container = container_config(containerd)
    container.labels["io.kubernetes.pod.uid"] = config.metadata.uid
    container_id = await cri.create_container(sandbox_id, container, config)
    await cri.start_container(container_id)
    return config.metadata.uid, container_id


async def test_an_older_relist_cannot_replace_a_newer_inspection(cri, containerd):
    uid, container_id = await start_pod(cri, containerd)

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
    uid, container_id = await start_pod(cri, containerd)
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
