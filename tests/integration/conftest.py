"""Fixtures for tests against the session's private containerd: a connected CRI client and a clean runtime.

Opt a module into a runtime emptied before and after each test with
`pytestmark = pytest.mark.usefixtures("clean_runtime")`.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from edgelet.cri import CRIError
from edgelet.cri.client import RuntimeClient
from tests.integration.agent_harness import AgentProcess


# A container whose StartContainer is still running in the runtime (its caller, an agent the test stopped, went
# away mid-start) cannot be removed until that start ends: containerd 2.1 took about 6 s under load.
STARTING_WAIT = 60.0


async def remove_container(client: RuntimeClient, container_id: str) -> None:
    """Removes the container, waiting up to STARTING_WAIT for a start still running in the runtime to end."""
    deadline = time.monotonic() + STARTING_WAIT
    while True:
        try:
            return await client.remove_container(container_id)
        except CRIError as exc:
            if "in starting state" not in exc.details or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def remove_everything(client: RuntimeClient) -> None:
    """Stops and removes every sandbox and container the runtime has (removal kills what still runs)."""
    for container in await client.list_containers():
        await remove_container(client, container.id)
    for sandbox in await client.list_pod_sandbox():
        await client.stop_pod_sandbox(sandbox.id)
        await client.remove_pod_sandbox(sandbox.id)


@pytest.fixture
async def cri(containerd):
    """A RuntimeClient connected to the session's containerd, closed after the test."""
    async with RuntimeClient(containerd.endpoint, timeout=60.0) as client:
        yield client


@pytest.fixture
async def clean_runtime(cri):
    """An empty runtime for the test, emptied again afterwards whatever the test left."""
    await remove_everything(cri)
    yield
    await remove_everything(cri)
    assert not await cri.list_pod_sandbox(), "sandboxes survived the cleanup"


@pytest.fixture
def agent(tmp_path, containerd):
    """An agent process on the session's containerd with its own state under tmp_path, stopped afterwards."""
    process = AgentProcess(tmp_path, containerd.endpoint).start()
    yield process
    process.close()
