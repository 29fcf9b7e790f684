"""The API sink against the API server double over real HTTP: events POSTed, repeats PATCHed, events kept
while the server is down and sent when it is back, stale ones dropped, a refused event not stopping others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from edgelet.events import NORMAL, WARNING, EventRecorder, node_ref, pod_ref
from edgelet.events.apisink import ApiEventSink
from edgelet.kubeapi import ApiClient
from edgelet.metrics import registry as metrics
from tests.kubeapi_double import ApiServerDouble

POD = {"metadata": {"name": "web", "namespace": "default", "uid": "u-1"}, "spec": {"containers": [{"name": "main"}]}}


class Clock:
    def __init__(self) -> None:
        self.now = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as double:
        yield double


@pytest.fixture
async def client(api: ApiServerDouble) -> AsyncIterator[ApiClient]:
    async with ApiClient(api.url, timeout=2.0, connect_timeout=0.5) as c:
        yield c


@pytest.fixture
async def wiring(client: ApiClient):
    clock = Clock()
    recorder = EventRecorder("edge-1", None, clock=clock)
    sink = ApiEventSink(client, clock=clock, backoff_initial=0.05, backoff_max=0.2)
    recorder.add_sink(sink)
    tasks = [asyncio.create_task(recorder.run()), asyncio.create_task(sink.run())]
    yield recorder, sink, clock
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def until(predicate, timeout: float = 10.0):
    for _ in range(int(timeout / 0.02)):
        result = await asyncio.to_thread(predicate)
        if result:
            return result
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


def stored_events(api: ApiServerDouble) -> dict[str, dict]:
    return {e["reason"]: e for e in api.list("events", namespace="default")}


async def test_events_are_posted_and_repeats_patched(api, wiring):
    recorder, sink, clock = wiring
    recorder.event(node_ref("edge-1"), NORMAL, "Starting", "Starting kubelet.")
    recorder.event(pod_ref(POD, "main"), WARNING, "BackOff", "Back-off restarting failed container")
    await until(lambda: len(stored_events(api)) == 2)
    for _ in range(3):
        clock.now += 10
        recorder.event(pod_ref(POD, "main"), WARNING, "BackOff", "Back-off restarting failed container")
        await until(lambda: stored_events(api)["BackOff"]["count"] >= 2)
    await until(lambda: stored_events(api)["BackOff"]["count"] == 4)
    backoff = stored_events(api)["BackOff"]
    assert backoff["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert backoff["source"] == {"component": "kubelet", "host": "edge-1"}
    assert backoff["lastTimestamp"] > backoff["firstTimestamp"]
    starting = stored_events(api)["Starting"]
    assert starting["involvedObject"] == {"kind": "Node", "name": "edge-1", "uid": "edge-1"}
    writes = [(r.method, r.path) for r in api.requests if "/events" in r.path]
    methods = [m for m, _ in writes]
    assert methods.count("POST") == 2 and methods.count("PATCH") >= 1


async def test_events_wait_for_the_server_and_fresh_ones_are_sent(api, wiring):
    recorder, sink, clock = wiring
    api.go_down()
    recorder.event(pod_ref(POD, "main"), WARNING, "Failed", "Error: ErrImagePull")  # will be stale
    clock.now += 3000
    recorder.event(pod_ref(POD, "main"), NORMAL, "Pulling", 'Pulling image "x"')
    for _ in range(5):  # a crash loop while offline: one event with its count
        clock.now += 10
        recorder.event(pod_ref(POD, "main"), WARNING, "BackOff", "Back-off restarting failed container")
    await until(lambda: sink.pending == 3)
    await asyncio.sleep(0.3)  # a few refused attempts
    stale_before = metrics.events_dropped.labels("stale").value
    clock.now += 700  # the first event is now more than an hour old
    api.come_up()
    await until(lambda: sink.pending == 0 and len(stored_events(api)) == 2)
    events = stored_events(api)
    assert set(events) == {"Pulling", "BackOff"} and events["BackOff"]["count"] == 5
    assert metrics.events_dropped.labels("stale").value - stale_before == 1


async def test_a_full_buffer_drops_the_oldest(client, api):
    clock = Clock()
    sink = ApiEventSink(client, buffer_size=3, clock=clock)
    recorder = EventRecorder("edge-1", None, clock=clock)
    recorder.add_sink(sink)
    before = metrics.events_dropped.labels("buffer_full").value
    for i in range(5):
        recorder.event(pod_ref(POD), NORMAL, f"R{i}", "m")
    recorder.drain()
    assert sink.pending == 3
    assert metrics.events_dropped.labels("buffer_full").value - before == 2
    task = asyncio.create_task(sink.run())
    await until(lambda: sink.pending == 0 and len(stored_events(api)) == 3)
    task.cancel()
    assert set(stored_events(api)) == {"R2", "R3", "R4"}


async def test_a_refused_event_does_not_stop_the_others(api, wiring):
    recorder, sink, clock = wiring
    api.fail_next(1, 403, path_prefix="/api/v1/namespaces/default/events", method="POST")
    recorder.event(pod_ref(POD), WARNING, "Forbidden1", "refused")
    recorder.event(pod_ref(POD), NORMAL, "Fine", "accepted")
    await until(lambda: "Fine" in stored_events(api))
    assert "Forbidden1" not in stored_events(api)


async def test_a_patch_of_a_deleted_event_creates_it_again(api, wiring):
    recorder, sink, clock = wiring
    recorder.event(pod_ref(POD), NORMAL, "Pulled", "already present")
    await until(lambda: "Pulled" in stored_events(api))
    api.delete("events", stored_events(api)["Pulled"]["metadata"]["name"], namespace="default")
    clock.now += 5
    recorder.event(pod_ref(POD), NORMAL, "Pulled", "already present")
    await until(lambda: "Pulled" in stored_events(api))
    assert stored_events(api)["Pulled"]["count"] == 2
