"""Emptying a private containerd between tests and benchmark rounds: every sandbox and container (or one pod's)
stopped, removed, and checked gone.

The integration and e2e fixtures, the chaos harness and `make bench` all use this one helper, so the runtime's
refusals are handled in one place:
- containerd 2.x does not remove a container whose task still runs ("cannot delete running task"), where 1.6
  stopped it first: each container is stopped before it is removed;
- a container whose StartContainer is still under way cannot be removed until that start ends. An agent stopped
  or killed mid-start leaves one behind: containerd 2.1 held it "in starting state" for about 6 s under load.
  Such failures, and a runtime that is restarting, are retried until the deadline.
"""

from __future__ import annotations

import asyncio
import time

from edgelet.cri import RuntimeCallError
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient

# How long a start left running in the runtime, or a runtime coming back, may keep the runtime from being emptied.
EMPTY_WAIT = 60.0
RETRY_DELAY = 0.2


async def empty_runtime(client: RuntimeClient, *, selector: dict[str, str] | None = None, parallel: int = 8,
                        timeout: float = EMPTY_WAIT) -> None:
    """Stops and removes every sandbox and container the runtime has (with `selector`, those whose labels match
    it), `parallel` calls at a time, until a listing shows none; raises the last failure once `timeout` is over."""
    gate = asyncio.Semaphore(parallel)
    sandbox_filter = pb.PodSandboxFilter(label_selector=selector) if selector else None
    container_filter = pb.ContainerFilter(label_selector=selector) if selector else None

    async def each(call, ids) -> None:
        """`call(id)` for every id, `parallel` at a time; every call ends before the first failure is raised, so a
        retry never runs beside calls of the pass before."""
        async def one(item: str) -> None:
            async with gate:
                await call(item)

        results = await asyncio.gather(*map(one, ids), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise failures[0]

    async def remove_container(container_id: str) -> None:
        await client.stop_container(container_id, 0)
        await client.remove_container(container_id)

    deadline = time.monotonic() + timeout
    while True:
        try:
            sandboxes = await client.list_pod_sandbox(sandbox_filter)
            containers = await client.list_containers(container_filter)
            if not sandboxes and not containers:
                return
            if time.monotonic() > deadline:  # say, an agent still running that starts them again
                raise TimeoutError(f"{len(sandboxes)} sandboxes and {len(containers)} containers still there "
                                   f"after {timeout:.0f}s")
            # Sandboxes stopped first: their containers stop with them, and nothing restarts meanwhile.
            await each(client.stop_pod_sandbox, [s.id for s in sandboxes])
            await each(remove_container, [c.id for c in containers])
            await each(client.remove_pod_sandbox, [s.id for s in sandboxes])
        except RuntimeCallError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(RETRY_DELAY)


def empty_runtime_at(endpoint: str, **options) -> None:
    """empty_runtime() for callers without an event loop of their own: one client to `endpoint`, closed after."""

    async def empty() -> None:
        async with RuntimeClient(endpoint, timeout=60.0) as client:
            await empty_runtime(client, **options)

    asyncio.run(empty())
