"""The start gate: at most its limit of starts in flight, pods under way served first, nothing lost to a cancel."""

from __future__ import annotations

import asyncio

import pytest

from edgelet.kuberuntime.startgate import StartGate


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Holder:
    """One call through the gate that holds its slot until released, recording when it got in."""

    def __init__(self, gate: StartGate, order: list[str], name: str, under_way: bool):
        self.release = asyncio.Event()
        self.task = asyncio.ensure_future(self._run(gate, order, name, under_way))

    async def _run(self, gate: StartGate, order: list[str], name: str, under_way: bool) -> None:
        async with gate.slot(under_way=under_way):
            order.append(name)
            await self.release.wait()


def test_no_more_than_the_limit_hold_at_once_and_a_pod_under_way_goes_first():
    async def scenario() -> list[str]:
        gate, order = StartGate(2), []
        first = [Holder(gate, order, f"sandbox-{i}", under_way=False) for i in range(2)]
        await settle()
        later = [Holder(gate, order, "sandbox-2", under_way=False), Holder(gate, order, "sandbox-3", under_way=False),
                 Holder(gate, order, "container-a", under_way=True), Holder(gate, order, "container-b", under_way=True)]
        await settle()
        assert order == ["sandbox-0", "sandbox-1"] and gate.waiting == 4  # the limit holds
        for holder in first + later:
            holder.release.set()
            await settle()
        await asyncio.gather(*(holder.task for holder in first + later))
        assert gate.waiting == 0
        return order

    # The containers queued after the sandboxes get the freed slots first, each line first come, first served.
    assert asyncio.run(scenario()) == ["sandbox-0", "sandbox-1", "container-a", "container-b", "sandbox-2", "sandbox-3"]


async def finish(gate: StartGate, order: list[str], *holders: Holder) -> None:
    """Lets `holders` through and out, then takes the gate's one slot: a slot lost to a cancel fails at 5 s."""
    for holder in holders:
        holder.release.set()
    async with asyncio.timeout(5):
        await asyncio.gather(*(holder.task for holder in holders))
        async with gate.slot(under_way=False):
            order.append("free")


@pytest.mark.parametrize("when", ["waiting", "handed the slot", "passed by"])
def test_a_cancelled_waiter_takes_no_slot_with_it(when):
    """Cancelled while in its line, the waiter leaves it. Cancelled as the slot was handed to it (the holder left,
    the waiter has not run yet), it passes the slot on. Cancelled just before a release (its turn is cancelled at
    once, its task runs later), the release skips it. Either way it ends cancelled and no slot is lost."""
    async def scenario() -> list[str]:
        gate, order = StartGate(1), []
        holder = Holder(gate, order, "held", under_way=False)
        await settle()
        cancelled = Holder(gate, order, "cancelled", under_way=True)
        after = Holder(gate, order, "after", under_way=False)
        await settle()
        if when == "handed the slot":
            holder.release.set()
            await asyncio.sleep(0)  # the holder leaves and hands its slot to the waiter, which has not run yet
            assert order == ["held"] and gate.waiting == 1
        elif when == "passed by":
            holder.release.set()  # the holder runs before the cancelled waiter's task does
        cancelled.task.cancel()
        await finish(gate, order, holder, after)
        assert cancelled.task.cancelled()
        return order

    assert asyncio.run(scenario()) == ["held", "after", "free"]


def test_a_gate_needs_a_slot():
    with pytest.raises(ValueError, match="at least one slot"):
        StartGate(0)
