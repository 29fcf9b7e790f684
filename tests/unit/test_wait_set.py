"""`tasks.wait_set`, the timed wait on an event that the agent's loops make every tick."""

from __future__ import annotations

import asyncio

import pytest

from edgelet.util.tasks import wait_set


async def test_an_event_already_set_is_answered_without_waiting():
    event = asyncio.Event()
    event.set()
    assert await wait_set(event, 0) is True


async def test_an_event_set_during_the_wait_ends_it():
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await asyncio.wait_for(wait_set(event, 60), 5) is True


@pytest.mark.parametrize("timeout", [0, 0.01, -1])
async def test_a_timeout_without_the_event_says_false(timeout):
    assert await wait_set(asyncio.Event(), timeout) is False


async def test_a_cancellation_as_the_event_is_set_is_not_lost():
    # Python 3.11's wait_for could return the event's result and drop a cancellation arriving at that moment:
    # a loop cancelled at shutdown would then run on.
    event = asyncio.Event()
    waiter = asyncio.ensure_future(wait_set(event, 60))
    await asyncio.sleep(0)
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_cancellation_while_waiting_is_a_cancellation_not_a_timeout():
    waiter = asyncio.ensure_future(wait_set(asyncio.Event(), 60))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
