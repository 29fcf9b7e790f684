"""How many sandbox and container starts are in flight at once, and which waiting one goes next.

A semaphore whose waiters go in two lines: the calls of pods that already have their sandbox (create and start a
container) before new sandboxes. With one first-come line, a burst of pods runs every RunPodSandbox before any
container starts, so the first pod runs only when the last sandbox is made; with a line for pods already under
way, each pod goes on to its containers as soon as its sandbox is there, as a runtime driven pod by pod would,
and pods run one after another through the burst.
"""

from __future__ import annotations

import asyncio
from collections import deque


class StartGate:
    """At most `limit` holders at once. `slot(under_way=True)` waits in the line that is served first."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"a start gate needs at least one slot, not {limit}")
        self._free = limit
        self._lines: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    def slot(self, *, under_way: bool) -> _Slot:
        """`async with gate.slot(under_way=...)`: held for the block."""
        return _Slot(self, under_way)

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines)

    async def _acquire(self, under_way: bool) -> None:
        if self._free and not self.waiting:
            self._free -= 1
            return
        line = self._lines[0 if under_way else 1]
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # the slot was handed over as the wait was cancelled: the next one takes it
            elif turn in line:  # not when a release already skipped the cancelled turn and took it out
                line.remove(turn)
            raise

    def _release(self) -> None:
        for line in self._lines:
            while line:
                turn = line.popleft()
                if not turn.done():
                    turn.set_result(None)  # the slot passes straight on: nobody can take it in between
                    return
        self._free += 1


class _Slot:
    __slots__ = ("_gate", "_under_way")

    def __init__(self, gate: StartGate, under_way: bool):
        self._gate = gate
        self._under_way = under_way

    async def __aenter__(self) -> None:
        await self._gate._acquire(self._under_way)

    async def __aexit__(self, *exc_info: object) -> None:
        self._gate._release()
