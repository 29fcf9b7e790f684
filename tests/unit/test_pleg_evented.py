"""When the PLEG relists: on each batch of the runtime's container events while their stream is live, every period
while it is not (lost, not yet subscribed, or never served), and the queue it hands the sync loop, one entry a pod.

The runtime here is a double of the CRI client's list calls and event stream (the real one is in
tests/integration/test_pleg_events.py); periods are a few milliseconds, and the tests wait for what they count.
"""

from __future__ import annotations

import asyncio

import pytest

from edgelet import core
from edgelet.cri import CRIError, RuntimeUnavailable
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.pleg import generic as pleg_module
from edgelet.pleg.generic import GenericPLEG, PodEventQueue, PodLifecycleEvent
from tests.helpers import eventually

PERIOD = 0.01
TIMEOUT = 10.0  # for what the loop should see within a few periods; generous on a busy machine


class EventRuntime:
    """Lists what `sandboxes` holds; the event stream yields what `send()` puts in until `break_stream()` ends
    it with `error`."""

    def __init__(self, *, serves_events: bool = True):
        self.serves_events = serves_events
        self.sandboxes: list[pb.PodSandbox] = []
        self.lists = 0
        self.streams_opened = 0
        self._events: asyncio.Queue = asyncio.Queue()

    async def list_pod_sandbox_raw(self, filter=None) -> bytes:
        self.lists += 1
        return pb.ListPodSandboxResponse(items=self.sandboxes).SerializeToString()

    async def list_containers_raw(self, filter=None) -> bytes:
        return b""

    async def pod_sandbox_status(self, sandbox_id: str, *, verbose: bool = False) -> pb.PodSandboxStatusResponse:
        item = next(s for s in self.sandboxes if s.id == sandbox_id)
        return pb.PodSandboxStatusResponse(status=pb.PodSandboxStatus(
            id=item.id, metadata=item.metadata, state=item.state, created_at=item.created_at))

    async def container_events(self):
        self.streams_opened += 1
        if not self.serves_events:
            raise CRIError("get_container_events", "UNIMPLEMENTED", "method GetContainerEvents not implemented")
        while True:
            event = await self._events.get()
            if isinstance(event, Exception):
                raise event
            yield event

    def add_pod(self, uid: str) -> None:
        self.sandboxes.append(pb.PodSandbox(
            id=f"sandbox-{uid}", metadata=pb.PodSandboxMetadata(name=uid, uid=uid, namespace="default"),
            state=pb.SANDBOX_READY, created_at=len(self.sandboxes) + 1, labels={"io.kubernetes.pod.uid": uid}))

    def send(self) -> None:
        self._events.put_nowait(b"")

    def break_stream(self) -> None:
        self._events.put_nowait(RuntimeUnavailable("unix:///run/test.sock", "get_container_events", "UNAVAILABLE",
                                                   "socket closed"))


async def quiet_lists(runtime: EventRuntime, periods: int = 20) -> int:
    """The lists made while `periods` relist periods pass."""
    before = runtime.lists
    await asyncio.sleep(periods * PERIOD)
    return runtime.lists - before


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(pleg_module, "SUBSCRIBE_GRACE", 3 * PERIOD)
    monkeypatch.setattr(pleg_module, "EVENT_BATCH_DELAY", 0.0)


@pytest.fixture
async def running():
    tasks = []

    def start(pleg: GenericPLEG) -> GenericPLEG:
        tasks.append(asyncio.create_task(pleg.run()))
        return pleg

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_with_live_events_the_pleg_relists_only_when_they_come(short_grace, running):
    runtime = EventRuntime()
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented_relist_period=3600))
    await eventually(lambda: pleg.mode == "evented", TIMEOUT, PERIOD, "the stream counts as live")
    assert await quiet_lists(runtime) == 0

    runtime.add_pod("u1")
    runtime.send()
    await eventually(lambda: not pleg.events.empty(), TIMEOUT, PERIOD, "the event's relist saw the new pod")
    assert pleg.events.get_nowait().pod_uid == "u1"
    assert pleg.runtime_pod_uids() == {"u1"}
    assert pleg.get_status("u1").sandboxes[0].id == "sandbox-u1"


async def test_quiet_periods_vouch_for_the_cache_without_a_relist(short_grace, running):
    runtime = EventRuntime()
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented_relist_period=3600))
    await eventually(lambda: pleg.mode == "evented", TIMEOUT, PERIOD, "the stream counts as live")
    lists = runtime.lists
    asked_at = asyncio.get_running_loop().time()
    # A worker waiting for a status newer than now gets one although nothing relists.
    await asyncio.wait_for(pleg.cache.get_newer_than("some-pod", asked_at), timeout=10)
    assert runtime.lists == lists
    assert pleg.healthy()[0]


async def test_a_waiting_worker_is_answered_at_once_while_the_stream_is_quiet(short_grace, running, monkeypatch):
    """The cache is vouched for on demand, not only at the quiet period's tick; not while an event is pending."""
    monkeypatch.setattr(pleg_module, "CACHE_REFRESH_PERIOD", 3600.0)
    runtime = EventRuntime()
    runtime.add_pod("u1")
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented_relist_period=3600))
    await eventually(lambda: pleg.mode == "evented", TIMEOUT, PERIOD, "the stream counts as live")
    lists = runtime.lists
    clock = asyncio.get_running_loop().time
    status = await asyncio.wait_for(pleg.cache.get_newer_than("u1", clock()), timeout=1)
    assert status.sandboxes[0].id == "sandbox-u1" and runtime.lists == lists

    pleg._wake.set()  # an event has come and its relist has not run yet: the cache cannot be vouched for
    assert pleg._vouch_now() is None
    pleg._wake.clear()
    assert pleg._vouch_now() is not None
    await eventually(lambda: runtime.lists > lists, TIMEOUT, PERIOD,
                     "the woken loop relisted")  # before the fixture cancels it


async def test_a_lost_stream_brings_back_the_periodic_relist_until_it_is_live_again(short_grace, running):
    runtime = EventRuntime()
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented_relist_period=3600))
    await eventually(lambda: pleg.mode == "evented", TIMEOUT, PERIOD, "the stream counts as live")
    runtime.break_stream()
    await eventually(lambda: pleg.mode == "generic", TIMEOUT, PERIOD, "the lost stream is noticed")
    runtime.add_pod("u2")  # changed while no stream could say so: the periodic relist finds it
    await eventually(lambda: pleg.runtime_pod_uids() == {"u2"}, TIMEOUT, PERIOD, "the periodic relist saw the pod")
    await eventually(lambda: runtime.streams_opened >= 2 and pleg.mode == "evented", TIMEOUT, PERIOD,
                     "the stream is live again")
    assert await quiet_lists(runtime) == 0


async def test_a_runtime_without_events_is_relisted_every_period(short_grace, running):
    runtime = EventRuntime(serves_events=False)
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD))
    await eventually(lambda: runtime.lists >= 5, TIMEOUT, PERIOD, "periodic relists")
    assert pleg.mode == "generic"
    assert runtime.streams_opened == 1  # UNIMPLEMENTED is final: the stream is not asked for again
    assert await quiet_lists(runtime) > 0


async def test_evented_off_never_opens_the_stream(short_grace, running):
    runtime = EventRuntime()
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented=False))
    await eventually(lambda: runtime.lists >= 5, TIMEOUT, PERIOD, "periodic relists")
    assert runtime.streams_opened == 0 and pleg.mode == "generic"


async def test_the_evented_relist_period_still_relists(short_grace, running):
    runtime = EventRuntime()
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented_relist_period=5 * PERIOD))
    await eventually(lambda: pleg.mode == "evented", TIMEOUT, PERIOD, "the stream counts as live")
    lists = runtime.lists
    await eventually(lambda: runtime.lists >= lists + 3, TIMEOUT, PERIOD, "relists every evented_relist_period")


# -- the queue -----------------------------------------------------------------------------------------------


def event(uid: str, kind: int = core.CONTAINER_STARTED) -> PodLifecycleEvent:
    return PodLifecycleEvent(uid, kind, f"c-{uid}")


def test_the_queue_holds_one_event_a_pod_in_first_come_order():
    queue = PodEventQueue()
    for _ in range(1000):
        for uid in ("a", "b", "c"):
            queue.put_nowait(event(uid))
    assert queue.qsize() == 3
    assert [queue.get_nowait().pod_uid for _ in range(3)] == ["a", "b", "c"]
    assert queue.empty() and queue.coalesced == 2997


@pytest.mark.parametrize("first, second, kept", [
    (core.CONTAINER_REMOVED, core.CONTAINER_DIED, core.CONTAINER_DIED),  # a sync-worthy event is not folded away
    (core.CONTAINER_DIED, core.CONTAINER_REMOVED, core.CONTAINER_DIED),
    (core.CONTAINER_STARTED, core.CONTAINER_DIED, core.CONTAINER_STARTED),  # either says "sync the pod"
    (core.CONTAINER_REMOVED, core.CONTAINER_REMOVED, core.CONTAINER_REMOVED),
])
def test_a_pending_event_that_would_not_sync_gives_way(first, second, kept):
    queue = PodEventQueue()
    queue.put_nowait(event("a", first))
    queue.put_nowait(event("a", second))
    assert queue.get_nowait().type == kept


async def test_get_waits_for_the_next_event_and_a_cancelled_get_loses_none():
    queue = PodEventQueue()
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    waiting.cancel()
    queue.put_nowait(event("a"))
    assert (await asyncio.wait_for(queue.get(), timeout=5)).pod_uid == "a"
    with pytest.raises(asyncio.QueueEmpty):
        queue.get_nowait()


async def test_a_stream_of_events_is_relisted_at_most_every_event_relist_interval(short_grace, running):
    """A burst of pod starts sends events without pause: the relists they cause are spaced."""
    runtime = EventRuntime()
    pleg = running(GenericPLEG(runtime, relist_period=PERIOD, evented_relist_period=3600))
    await eventually(lambda: pleg.mode == "evented", TIMEOUT, PERIOD, "the stream counts as live")
    loop = asyncio.get_running_loop()
    lists, started = runtime.lists, loop.time()
    while loop.time() - started < 1.0:
        runtime.send()
        await asyncio.sleep(0.01)
    relists = runtime.lists - lists
    assert pleg_module.EVENT_RELIST_INTERVAL == 0.25
    assert 2 <= relists <= 5, f"{relists} relists for 100 events in 1 s"
