"""The PLEG on the real runtime: where it serves container events (containerd >= 1.7) they drive the relists and
nothing relists while nothing happens; where it does not (1.6) the periodic relist runs as ever. Either way a
container that starts or dies reaches the sync loop's queue."""

from __future__ import annotations

import asyncio

import pytest

from edgelet import core
from edgelet.pleg.generic import GenericPLEG
from tests.integration.cri_harness import start_labelled_pod

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def serves_container_events(runtime_version: str) -> bool:
    """containerd answers GetContainerEvents from 1.7 on."""
    major, minor = (int(part) for part in runtime_version.split(".")[:2])
    return (major, minor) >= (1, 7)


async def next_event_of(pleg: GenericPLEG, uid: str, kind: int, timeout: float = 30.0):
    async def wait():
        while True:
            event = await pleg.events.get()
            if event.pod_uid == uid and event.type == kind:
                return event

    return await asyncio.wait_for(wait(), timeout)


async def relists_over(pleg: GenericPLEG, seconds: float) -> int:
    before = pleg.relists
    await asyncio.sleep(seconds)
    return pleg.relists - before


async def test_container_changes_reach_the_queue_through_the_runtimes_own_path(cri, containerd):
    version = (await cri.version()).runtime_version
    pleg = GenericPLEG(cri, relist_period=1.0, evented_relist_period=3600.0)
    running = asyncio.create_task(pleg.run())
    try:
        await pleg.wait_first_relist()
        if serves_container_events(version):
            deadline = asyncio.get_running_loop().time() + 30
            while pleg.mode != "evented":
                assert asyncio.get_running_loop().time() < deadline, "the event stream never counted as live"
                await asyncio.sleep(0.1)
            assert await relists_over(pleg, 3.0) == 0, "relisted with nothing happening"
        else:
            assert await relists_over(pleg, 3.0) >= 1
            assert pleg.mode == "generic"

        uid, container_id = await start_labelled_pod(cri, containerd)
        await next_event_of(pleg, uid, core.CONTAINER_STARTED)
        await cri.stop_container(container_id, 0)
        await next_event_of(pleg, uid, core.CONTAINER_DIED)
        assert not pleg.get_status(uid).running_containers()
        if serves_container_events(version):
            assert pleg.mode == "evented"
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
