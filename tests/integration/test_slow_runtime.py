"""A slow runtime and a container the runtime will not create, through a real agent on the real containerd.

The agent talks to containerd through a CRI proxy (cri_proxy.py) that forwards every call and can hold chosen
replies back past the agent's request timeout while containerd carries the call out, as a busy machine does. A
healthy sandbox must never be replaced for a container's sake, and no container may be started twice.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from edgelet.cri import RuntimeTimeout
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from tests.integration.cri_proxy import CRIProxy
from tests.integration.test_cri_client import container_config, sandbox_config

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

# The proxy hands a held reply over HELD seconds after the call.
HELD = 3.5


@pytest.fixture
def proxy(tmp_path, containerd):
    with CRIProxy(tmp_path / "cri-proxy.sock", containerd.endpoint) as running:
        yield running


async def test_a_call_past_the_timeout_runs_on_in_the_runtime(proxy, containerd):
    """The client stops waiting after its timeout (RuntimeTimeout) but gives the runtime time to finish: the
    container it asked for is made."""
    proxy.hold("CreateContainer", HELD)
    async with RuntimeClient(proxy.endpoint, timeout=0.5) as client:
        config = sandbox_config(containerd)
        sandbox_id = await client.run_pod_sandbox(config)
        began = time.monotonic()
        with pytest.raises(RuntimeTimeout):
            await client.create_container(sandbox_id, container_config(containerd), config)
        assert time.monotonic() - began < HELD - 1
        for _ in range(50):
            if containers := await client.list_containers(pb.ContainerFilter(pod_sandbox_id=sandbox_id)):
                break
            await asyncio.sleep(0.1)
        assert [c.state for c in containers] == [pb.CONTAINER_CREATED]
