"""The pod cache's ordering rule: a status observed earlier never replaces one observed later."""

from __future__ import annotations

import asyncio

import pytest

from edgelet.container.cache import InspectionError, PodCache
from edgelet.container.runtime import PodRuntimeStatus


def status(uid: str, observed_at: float, name: str = "") -> PodRuntimeStatus:
    return PodRuntimeStatus(uid=uid, name=name, timestamp=observed_at)


@pytest.mark.parametrize("writes, kept", [
    ([(10.0, "a")], "a"),
    ([(10.0, "a"), (11.0, "b")], "b"),
    ([(11.0, "b"), (10.0, "a")], "b"),  # the late write of an earlier observation loses
    ([(10.0, "a"), (10.0, "b")], "b"),  # the same moment: the last write is as fresh, it wins
])
def test_only_newer_or_equal_observations_replace(writes, kept):
    cache = PodCache()
    for observed_at, name in writes:
        cache.set(status("u", observed_at, name))
    assert cache.get("u").name == kept


def test_unknown_pods_read_as_empty_and_delete_respects_later_sightings():
    cache = PodCache()
    assert cache.get("nope") == PodRuntimeStatus(uid="nope")
    cache.set(status("u", 20.0, "seen"))
    cache.delete("u", observed_at=15.0)  # a relist that began before the pod was seen
    assert cache.get("u").name == "seen"
    cache.delete("u", observed_at=25.0)
    assert cache.uids() == []


@pytest.mark.parametrize("entry, global_time, minimum, newer", [
    (None, 0.0, 5.0, False),
    (10.0, 0.0, 5.0, True),
    (10.0, 0.0, 10.0, False),
    (None, 12.0, 10.0, True),  # a later relist that saw no change proves the status still holds
    (3.0, 4.0, 5.0, False),
])
def test_newer_than(entry, global_time, minimum, newer):
    cache = PodCache()
    if entry is not None:
        cache.set(status("u", entry))
    cache.update_time(global_time)
    assert cache.is_newer_than("u", minimum) is newer


async def test_get_newer_than_waits_for_a_later_observation():
    cache = PodCache()
    cache.set(status("u", 10.0, "old"))
    waiter = asyncio.ensure_future(cache.get_newer_than("u", 10.0))
    await asyncio.sleep(0)
    cache.set(status("u", 9.0, "stale"))
    await asyncio.sleep(0)
    assert not waiter.done()
    cache.set(status("u", 11.0, "new"))
    assert (await asyncio.wait_for(waiter, 1)).name == "new"
    waiter = asyncio.ensure_future(cache.get_newer_than("u", 11.0))
    await asyncio.sleep(0)
    cache.update_time(12.0)
    assert (await asyncio.wait_for(waiter, 1)).name == "new"


async def test_a_failed_inspection_is_an_observation_its_reader_gets_at_once():
    """The kubelet's cache stores the error: the pod's worker fails its sync (and retries) instead of waiting for
    ever, its termination goes on with the last status seen, and the other pods are not held back."""
    cache = PodCache()
    cache.set(status("broken", 10.0, "old"))
    cache.set(status("fine", 10.0, "old"))
    assert cache.set_error("broken", "rpc error: deadline exceeded", 12.0)
    cache.update_time(12.0)
    assert cache.is_newer_than("fine", 11.0) and cache.is_newer_than("broken", 11.0)
    assert (await asyncio.wait_for(cache.get_newer_than("fine", 11.0), 1)).name == "old"
    with pytest.raises(InspectionError) as failed:
        await asyncio.wait_for(cache.get_newer_than("broken", 11.0), 1)
    assert "deadline exceeded" in str(failed.value) and failed.value.last_known.name == "old"
    assert cache.get("broken").name == "old" and cache.error("broken") == "rpc error: deadline exceeded"
    assert not cache.set_error("broken", "late", 11.0)  # an error observed before the stored one loses
    cache.set(status("broken", 14.0, "inspected"))  # the next relist's inspection succeeded
    assert cache.error("broken") is None
    assert (await asyncio.wait_for(cache.get_newer_than("broken", 13.0), 1)).name == "inspected"
    assert not cache.set_error("broken", "stale", 13.0)  # nor does an error observed before a success


async def test_a_reader_waiting_for_a_pod_gets_the_error_of_its_next_inspection():
    cache = PodCache()
    cache.set(status("u", 10.0, "old"))
    waiter = asyncio.ensure_future(cache.get_newer_than("u", 10.0))
    await asyncio.sleep(0)
    assert not waiter.done()
    cache.set_error("u", "connection refused", 11.0)
    with pytest.raises(InspectionError):
        await asyncio.wait_for(waiter, 1)


async def test_a_reader_asks_the_writer_to_vouch_before_it_waits():
    """An event-driven writer that knows the cache holds as of now answers a waiting reader at once; while it
    does not know (an event pending, a relist under way), the reader waits for the next observation."""
    vouched: list[float | None] = [None]
    cache = PodCache(vouch=lambda: vouched[0])
    cache.set(status("u", 10.0, "cached"))
    waiter = asyncio.ensure_future(cache.get_newer_than("u", 12.0))
    await asyncio.sleep(0)
    assert not waiter.done()
    cache.update_time(11.0)  # not new enough, and the writer cannot vouch: the reader waits on
    await asyncio.sleep(0)
    assert not waiter.done()
    vouched[0] = 12.0  # vouching for the very moment asked about is not newer
    cache.update_time(11.5)
    await asyncio.sleep(0)
    assert not waiter.done()
    vouched[0] = 13.0
    cache.update_time(11.6)  # any change wakes the reader, which asks again
    assert (await asyncio.wait_for(waiter, 1)).name == "cached"
    assert cache.is_newer_than("other", 12.5)  # what was vouched for holds for every pod
    assert (await asyncio.wait_for(cache.get_newer_than("u", 12.9), 1)).name == "cached"
