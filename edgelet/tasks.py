"""Named, guarded long-running tasks: a crash is logged at once, and shutdown cancels them in one place."""

from __future__ import annotations

import asyncio
import logging
from typing import Coroutine

log = logging.getLogger(__name__)


class TaskGroup:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self.crashed: dict[str, BaseException] = {}

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
