"""A node whose pod network is not set up yet (no CNI config: CRI Status says NetworkReady=false): host-network
pods run, pods on the pod network wait with the kubelet's NetworkNotReady event and start once the network is
there; and the node's pod CIDR reaches the runtime through UpdateRuntimeConfig."""

from __future__ import annotations

import pytest

from edgelet.cri.client import RuntimeClient
from tests.conftest import private_containerd
from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, is_running

pytestmark = pytest.mark.containerd


@pytest.fixture
def bare_network_runtime(containerd, tmp_path_factory):
    """A containerd of its own whose CNI config the test takes away and gives back."""
    with private_containerd(tmp_path_factory.mktemp("containerd-net")) as instance:
        yield instance


def test_pods_on_the_pod_network_wait_for_it_and_host_network_pods_run(bare_network_runtime, tmp_path):
    conflist = bare_network_runtime.state_dir / "cni" / "10-edgelet.conflist"
    kept = conflist.read_bytes()
    conflist.unlink()
    agent = AgentProcess(tmp_path / "agent", bare_network_runtime.endpoint)
    agent.write_manifest("cni.yaml", busybox_manifest("cni", "sleep 3600", host_network=True))
    agent.write_manifest("web.yaml", busybox_manifest("web", "sleep 3600", host_network=False))
    agent.start()
    try:
        wait_for(lambda: is_running(agent.pod("cni")), 60, 0.5, "the host-network pod to run")
        events = wait_for(lambda: "NetworkNotReady" in (text := agent.cli("get", "events").stdout) and text,
                          30, 0.5, "the NetworkNotReady event")
        assert "network is not ready: container runtime network not ready: NetworkReady=false" in events
        assert (agent.pod("web") or {}).get("status", {}).get("phase") == "Pending"
        assert "container runtime network not ready" in agent.log_text()
        conflist.write_bytes(kept)  # the CNI DaemonSet writes its config (containerd takes no file renamed in)
        wait_for(lambda: is_running(agent.pod("web")), 60, 0.5, "the pod-network pod to run")
    finally:
        agent.close()


async def test_the_pod_cidr_reaches_the_runtime(containerd):
    async with RuntimeClient(containerd.endpoint, timeout=30.0) as runtime:
        await runtime.update_pod_cidr("10.244.7.0/24")
    log = (containerd.state_dir / "containerd.log").read_text(errors="replace")
    assert "10.244.7.0/24" in log or "No cni config template is specified" in log
