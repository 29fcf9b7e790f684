"""A slow runtime and a container the runtime will not create, through a real agent on the real containerd.

The agent talks to containerd through a CRI proxy (cri_proxy.py) that forwards every call and can hold chosen
replies back past the agent's request timeout while containerd carries the call out, as a busy machine does. A
healthy sandbox must never be replaced for a container's sake, and no container may be started twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import pytest

from edgelet.cri import RuntimeTimeout
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, container_state, is_running
from tests.integration.cri_harness import container_config, runtime_objects, sandbox_config
from tests.integration.cri_proxy import CRIProxy

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

# The agent stops waiting after REQUEST_TIMEOUT; the proxy hands the reply over HELD seconds after the call.
REQUEST_TIMEOUT = 2
HELD = 3.5


@pytest.fixture
def proxy(tmp_path, containerd):
    with CRIProxy(tmp_path / "cri-proxy.sock", containerd.endpoint) as running:
        yield running


@pytest.fixture
def agent(tmp_path, proxy):
    process = AgentProcess(tmp_path / "agent", proxy.endpoint, request_timeout=f"{REQUEST_TIMEOUT}s")
    yield process
    process.close()


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


def sandbox_ids(containerd, uid: str) -> list[str]:
    return sorted(sandbox.id for sandbox in runtime_objects(containerd.endpoint, uid)[0])


def test_slow_creates_and_starts_keep_the_sandbox_and_start_the_container_once(agent, proxy, containerd):
    proxy.hold("CreateContainer", HELD)
    proxy.hold("StartContainer", HELD)
    agent.start()
    agent.write_manifest("slow.yaml", busybox_manifest("slow", "exec sleep 3600"))
    pod = wait_for(lambda: (p := agent.pod("slow")) and is_running(p) and p, 60, what="slow Running")
    uid = pod["metadata"]["uid"]
    first = sandbox_ids(containerd, uid)

    time.sleep(3 * HELD)  # what a confused agent would do next: replace, remove, create and start again
    sandboxes, containers = runtime_objects(containerd.endpoint, uid)
    assert sorted(s.id for s in sandboxes) == first and len(first) == 1
    assert sandboxes[0].state == pb.SANDBOX_READY
    assert [(c.metadata.name, c.metadata.attempt, c.state) for c in containers] == [("main", 0, pb.CONTAINER_RUNNING)]
    assert (proxy.calls("RunPodSandbox"), proxy.calls("CreateContainer"), proxy.calls("StartContainer")) == (1, 1, 1)
    status = container_state(agent.pod("slow"))
    assert status["restartCount"] == 0 and "running" in status["state"], status
    assert "still being created" in agent.log_text()


@pytest.fixture
def private_mount(tmp_path):
    """A directory that is a mount point of its own with private propagation: containerd refuses to create a
    container that wants host-to-container propagation from it ("not a shared or slave mount")."""
    path = tmp_path / "private"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], check=True)
    try:
        subprocess.run(["mount", "--make-private", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def refused_pod(name: str, host_dir) -> str:
    """A pod (as JSON, which is YAML) whose container wants host-to-container propagation from `host_dir`."""
    container = {"name": "main", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
                 "command": ["sleep", "3600"],
                 "volumeMounts": [{"name": "private", "mountPath": "/private", "mountPropagation": "HostToContainer"}]}
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [container],
                 "volumes": [{"name": "private", "hostPath": {"path": str(host_dir)}}]},
    })


def test_a_container_the_runtime_refuses_to_create_keeps_its_sandbox_and_backs_off(agent, proxy, containerd,
                                                                                     private_mount):
    agent.start()
    agent.write_manifest("refused.yaml", refused_pod("refused", private_mount))

    def refused():
        pod = agent.pod("refused")
        waiting = (container_state(pod).get("state") or {}).get("waiting") or {} if pod else {}
        return pod if waiting.get("reason") == "CreateContainerError" else None

    pod = wait_for(refused, 60, what="refused shows CreateContainerError")
    uid = pod["metadata"]["uid"]
    message = container_state(pod)["state"]["waiting"]["message"]
    assert "not a shared or slave mount" in message, message
    first = sandbox_ids(containerd, uid)
    creates = proxy.calls("CreateContainer")

    time.sleep(8)  # four times the 2 s in which an agent replaced such a pod's sandbox
    assert sandbox_ids(containerd, uid) == first and len(first) == 1
    assert runtime_objects(containerd.endpoint, uid)[0][0].state == pb.SANDBOX_READY
    # The kubelet's back-off: one try in 10 to 15 s, not one per sync.
    assert proxy.calls("CreateContainer") - creates <= 1
    pod = agent.pod("refused")
    assert container_state(pod)["state"]["waiting"]["reason"] == "CreateContainerError"
    assert pod["status"]["phase"] == "Pending"


def sandbox_pid(containerd, sandbox_id: str) -> int:
    async def fetch():
        async with RuntimeClient(containerd.endpoint) as client:
            return json.loads((await client.pod_sandbox_status(sandbox_id, verbose=True)).info["info"])["pid"]

    return asyncio.run(fetch())


def test_a_new_sandbox_counts_restarts_on_from_the_one_it_replaces(agent, proxy, containerd):
    """The runtime names a container after its restart count: a new sandbox's container counting from 0 again
    clashed with the old sandbox's ("name is reserved") and was taken for a create still under way."""
    agent.start()
    agent.write_manifest("phoenix.yaml", busybox_manifest("phoenix", "exec sleep 3600"))
    pod = wait_for(lambda: (p := agent.pod("phoenix")) and is_running(p) and p, 60, what="phoenix Running")
    uid = pod["metadata"]["uid"]
    (old,) = sandbox_ids(containerd, uid)
    creates = proxy.calls("CreateContainer")
    os.kill(sandbox_pid(containerd, old), signal.SIGKILL)  # the sandbox dies: the pod gets a new one

    def running_in_new_sandbox():
        sandboxes, containers = runtime_objects(containerd.endpoint, uid)
        ready = [s.id for s in sandboxes if s.state == pb.SANDBOX_READY and s.id != old]
        return [c for c in containers if ready and c.pod_sandbox_id == ready[0] and c.state == pb.CONTAINER_RUNNING]

    (container,) = wait_for(running_in_new_sandbox, 60, what="phoenix running in a new sandbox")
    assert container.metadata.attempt == 1
    assert proxy.calls("CreateContainer") - creates == 1
    assert "still being created" not in agent.log_text()


def test_a_sandbox_start_slower_than_the_request_timeout_is_waited_for(agent, proxy, containerd):
    """RunPodSandbox is waited for twice the request timeout, as the kubelet does: a reply later than the timeout
    but within that is no failure, and the pod gets one sandbox."""
    proxy.hold("RunPodSandbox", 1.5 * REQUEST_TIMEOUT)
    agent.start()
    agent.write_manifest("late.yaml", busybox_manifest("late", "exec sleep 3600"))
    pod = wait_for(lambda: (p := agent.pod("late")) and is_running(p) and p, 60, what="late Running")
    time.sleep(2)
    sandboxes, containers = runtime_objects(containerd.endpoint, pod["metadata"]["uid"])
    assert [s.state for s in sandboxes] == [pb.SANDBOX_READY]
    assert [(c.metadata.attempt, c.state) for c in containers] == [(0, pb.CONTAINER_RUNNING)]
    assert "DEADLINE_EXCEEDED" not in agent.log_text()
