"""Fixtures for tests against the session's private containerd: a connected CRI client and a clean runtime.

Opt a module into a runtime emptied before and after each test with
`pytestmark = pytest.mark.usefixtures("clean_runtime")`.
"""

from __future__ import annotations

import pytest

from edgelet.cri.client import RuntimeClient
from tests.integration.agent_harness import AgentProcess
from tests.runtime_cleanup import empty_runtime


@pytest.fixture
async def cri(containerd):
    """A RuntimeClient connected to the session's containerd, closed after the test."""
    async with RuntimeClient(containerd.endpoint, timeout=60.0) as client:
        yield client


@pytest.fixture
async def clean_runtime(cri):
    """An empty runtime for the test, emptied again afterwards whatever the test left."""
    await empty_runtime(cri)
    yield
    await empty_runtime(cri)


@pytest.fixture
def agent(tmp_path, containerd):
    """An agent process on the session's containerd with its own state under tmp_path, stopped afterwards."""
    process = AgentProcess(tmp_path, containerd.endpoint).start()
    yield process
    process.close()
