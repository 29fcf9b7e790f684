"""Named, guarded long-running tasks: a crash is logged at once, fails the group's health, and shutdown cancels
them in one place.

A task that dies is never restarted quietly: the agent reports it on /healthz, stops feeding the systemd
watchdog and exits non-zero, so the service manager starts a whole agent again (the kubelet dies on a panic
the same way). A half-dead agent that answers "ok" while no pod is ever synced is the failure to avoid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

log = logging.getLogger(__name__)


async def wait_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Waits at most `timeout` seconds for `event`; True when it is set.

    `asyncio.timeout`, not `asyncio.wait_for`: Python 3.11's wait_for runs the wait in a task of its own each
    time, and a cancellation that arrives as the wait ends is lost (gh-86296), which keeps a cancelled loop
    running. The loops of the agent wait this way every tick.
    """
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class TaskGroup:
    def __init__(self, on_crash: Callable[[str, BaseException], None] | None = None) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self.crashed: dict[str, BaseException] = {}
        self._on_crash = on_crash

    def start(self, name: str, coro: Coroutine) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._on_done)
        self._tasks[name] = task
        return task

    def _on_done(self, task: asyncio.Task) -> None:
        self._tasks.pop(task.get_name(), None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.crashed[task.get_name()] = exc
            log.error("task %s crashed: %r", task.get_name(), exc, exc_info=exc)
            if self._on_crash is not None:
                self._on_crash(task.get_name(), exc)

    def health(self) -> tuple[bool, str]:
        """The /healthz check: failing as soon as any task of the group crashed."""
        if not self.crashed:
            return True, "ok"
        return False, "; ".join(f"task {name} crashed: {exc!r}"[:300] for name, exc in sorted(self.crashed.items()))

    def names(self) -> list[str]:
        return sorted(self._tasks)

    async def cancel_all(self, grace: float) -> None:
        """Cancels every task and waits up to `grace` seconds for them to finish their clean-up."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            log.warning("task %s did not stop within %.0fs", task.get_name(), grace)
