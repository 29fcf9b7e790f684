"""RuntimeClient against a real private containerd: lifecycle, listing (decoded and raw), exec, images, errors."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import statistics
import time

import pytest

from edgelet.cri import CRIError, NotFound, RuntimeUnavailable
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from edgelet.metrics import registry as metrics
from tests.integration.cri_harness import container_config, sandbox_config, start_pod
from tests.runtime_cleanup import empty_runtime
from tests.scrape import sample_value

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def sample(name: str, operation: str) -> float:
    return sample_value(metrics.REGISTRY, name, {"operation_type": operation}) or 0.0


async def test_version_and_status(cri, containerd):
    version = await cri.version()
    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == "v1"

    conditions = {c.type: c.status for c in (await cri.status()).status.conditions}
    # 1.7 and later add a condition of their own (a config with deprecated keys turns it false); only the first
    # two say whether pods can run, as the kubelet reads them.
    extra = {"ContainerdHasNoDeprecationWarnings": True} if containerd.release != "1.6" else {}
    assert conditions == {"RuntimeReady": True, "NetworkReady": True, **extra}


async def test_host_network_pod_lifecycle(cri, containerd):
    sandbox_id, container_id, config = await start_pod(cri, containerd)

    sandbox = (await cri.pod_sandbox_status(sandbox_id)).status
    assert sandbox.state == pb.SANDBOX_READY
    assert sandbox.metadata == config.metadata
    assert sandbox.linux.namespaces.options.network == pb.NODE

    status = await cri.container_status(container_id)
    assert status.state == pb.CONTAINER_RUNNING
    assert status.metadata.name == "main"
    assert status.started_at > 0 and status.finished_at == 0
    assert status.image.image and status.image_ref
    assert status.labels["io.kubernetes.container.name"] == "main"
    assert status.annotations["io.kubernetes.container.restartCount"] == "0"
    assert status.log_path == f"{config.log_directory}/main/0.log"

    [listed] = await cri.list_containers(pb.ContainerFilter(pod_sandbox_id=sandbox_id))
    assert (listed.id, listed.state, listed.pod_sandbox_id) == (container_id, pb.CONTAINER_RUNNING, sandbox_id)

    await cri.stop_container(container_id, 0)
    stopped = await cri.container_status(container_id)
    assert stopped.state == pb.CONTAINER_EXITED
    assert stopped.finished_at >= stopped.started_at
    assert stopped.exit_code == 137  # sleep as PID 1 ignores SIGTERM; timeout 0 means SIGKILL at once

    await cri.remove_container(container_id)
    await cri.stop_pod_sandbox(sandbox_id)
    assert (await cri.pod_sandbox_status(sandbox_id)).status.state == pb.SANDBOX_NOTREADY
    await cri.remove_pod_sandbox(sandbox_id)
    assert await cri.list_pod_sandbox() == []
    assert await cri.list_containers() == []


async def test_exited_container_reports_exit_code_and_log(cri, containerd):
    config = sandbox_config(containerd)
    sandbox_id = await cri.run_pod_sandbox(config)
    command = ("sh", "-c", "echo hello; echo oops >&2; exit 3")
    container_id = await cri.create_container(sandbox_id, container_config(containerd, "job", command), config)
    await cri.start_container(container_id)

    for _ in range(100):
        status = await cri.container_status(container_id)
        if status.state == pb.CONTAINER_EXITED:
            break
        await asyncio.sleep(0.05)
    assert status.state == pb.CONTAINER_EXITED
    assert status.exit_code == 3
    assert status.reason == "Error"

    # CRI log format: <RFC3339Nano> <stream> <F|P> <text>
    lines = [line.split(" ", 3) for line in open(status.log_path).read().splitlines()]
    assert sorted((stream, tag, text) for _, stream, tag, text in lines) == [
        ("stderr", "F", "oops"),
        ("stdout", "F", "hello"),
    ]


async def test_list_raw_bytes_decode_to_the_same_lists(cri, containerd):
    pods = [await start_pod(cri, containerd, labels={"suite": "raw"}) for _ in range(3)]

    sandboxes = await cri.list_pod_sandbox()
    raw_sandboxes = pb.ListPodSandboxResponse.FromString(await cri.list_pod_sandbox_raw()).items
    assert sorted(sandboxes, key=lambda s: s.id) == sorted(raw_sandboxes, key=lambda s: s.id)
    assert {s.id for s in sandboxes} == {sandbox_id for sandbox_id, _, _ in pods}

    containers = await cri.list_containers()
    raw_containers = pb.ListContainersResponse.FromString(await cri.list_containers_raw()).containers
    assert sorted(containers, key=lambda c: c.id) == sorted(raw_containers, key=lambda c: c.id)
    assert {c.id for c in containers} == {container_id for _, container_id, _ in pods}

    running = pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))
    raw_running = await cri.list_containers_raw(running)
    assert len(pb.ListContainersResponse.FromString(raw_running).containers) == 3

    [selected] = await cri.list_pod_sandbox(
        pb.PodSandboxFilter(label_selector={"io.kubernetes.pod.uid": pods[1][2].metadata.uid})
    )
    assert selected.id == pods[1][0]


async def test_exec_sync(cri, containerd):
    _, container_id, _ = await start_pod(cri, containerd)
    exit_code, stdout, stderr = await cri.exec_sync(container_id, ["sh", "-c", "echo out; echo err >&2; exit 7"], 5)
    assert (exit_code, stdout, stderr) == (7, b"out\n", b"err\n")


async def test_update_resources_and_reopen_log(cri, containerd):
    _, container_id, _ = await start_pod(cri, containerd)
    limit = 64 * 1024 * 1024
    await cri.update_container_resources(container_id, pb.LinuxContainerResources(memory_limit_in_bytes=limit))
    files = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    exit_code, stdout, _ = await cri.exec_sync(container_id, ["sh", "-c", files], 5)
    assert (exit_code, int(stdout)) == (0, limit)

    # Log rotation's part: the file moved aside, the runtime opens a new one at the same path.
    log_path = (await cri.container_status(container_id)).log_path
    os.rename(log_path, f"{log_path}.1")
    await cri.reopen_container_log(container_id)
    assert os.path.exists(log_path) and os.path.exists(f"{log_path}.1")


async def test_pod_network_sandbox_gets_an_address_on_the_bridge(cri, containerd):
    sandbox_id, container_id, _ = await start_pod(cri, containerd, host_network=False)
    network = (await cri.pod_sandbox_status(sandbox_id)).status.network
    address = ipaddress.ip_address(network.ip)
    assert address in ipaddress.ip_network(containerd.pod_subnet)

    exit_code, stdout, _ = await cri.exec_sync(container_id, ["ip", "-4", "-o", "addr", "show", "eth0"], 5)
    assert exit_code == 0 and f"inet {address}/" in stdout.decode()


async def test_deletes_are_idempotent(cri, containerd):
    sandbox_id, container_id, _ = await start_pod(cri, containerd)
    for _ in range(2):
        await cri.stop_container(container_id, 0)
        await cri.remove_container(container_id)
        await cri.stop_pod_sandbox(sandbox_id)
        await cri.remove_pod_sandbox(sandbox_id)
    gone = "0" * 64
    await cri.stop_container(gone, 0)
    await cri.remove_container(gone)
    await cri.stop_pod_sandbox(gone)
    await cri.remove_pod_sandbox(gone)
    await cri.remove_image("docker.io/library/never-pulled:1")
    assert sandbox_id not in {s.id for s in await cri.list_pod_sandbox()}
    assert container_id not in {c.id for c in await cri.list_containers()}


async def test_a_start_whose_caller_is_cancelled_runs_on_and_close_waits_for_it(cri, containerd):
    """Cancelling the caller of StartContainer or RunPodSandbox leaves the call running in the runtime: a cancelled
    request context can leave containerd 2.x a task it made but can neither start nor delete. Each caller here is
    cancelled a few milliseconds into its call, some on a client closed right after; every sandbox and container
    must end up running and be removable."""
    config = sandbox_config(containerd)
    sandbox_id = await cri.run_pod_sandbox(config)
    started: list[str] = []
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.04):
        closing = RuntimeClient(containerd.endpoint, timeout=60.0)
        for client in (cri, closing):
            name = f"c{len(started)}"
            container_id = await client.create_container(sandbox_id, container_config(containerd, name), config)
            caller = asyncio.create_task(client.start_container(container_id))
            await asyncio.sleep(delay)
            caller.cancel()
            await asyncio.gather(caller, return_exceptions=True)  # cancelled, or already done at 40 ms
            started.append(container_id)
        await closing.close()
    cut_short = asyncio.create_task(cri.run_pod_sandbox(sandbox_config(containerd)))
    await asyncio.sleep(0.005)
    cut_short.cancel()
    await asyncio.gather(cut_short, return_exceptions=True)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {c.id: c.state for c in await cri.list_containers()}
        sandboxes = await cri.list_pod_sandbox()
        if all(states.get(i) == pb.CONTAINER_RUNNING for i in started) and len(sandboxes) == 2:
            break
        await asyncio.sleep(0.2)
    assert {i: pb.ContainerState.Name(states.get(i, 0)) for i in started} == {
        i: "CONTAINER_RUNNING" for i in started}
    assert [pb.PodSandboxState.Name(s.state) for s in sandboxes] == ["SANDBOX_READY"] * 2
    await empty_runtime(cri, timeout=20)


async def test_empty_runtime_removes_one_pods_objects_or_everything_running_or_not(cri, containerd):
    """The clean-up every suite and the benchmark use (tests.runtime_cleanup): running and exited containers, a
    sandbox with none, one pod by its labels."""
    kept_sandbox, kept_container, _ = await start_pod(cri, containerd)
    sandbox_id, running_id, config = await start_pod(cri, containerd)
    exited_id = await cri.create_container(sandbox_id, container_config(containerd, "done", ("true",)), config)
    await cri.start_container(exited_id)
    empty_sandbox = await cri.run_pod_sandbox(sandbox_config(containerd))

    await empty_runtime(cri, selector={"io.kubernetes.pod.uid": config.metadata.uid})
    assert {s.id for s in await cri.list_pod_sandbox()} == {kept_sandbox, empty_sandbox}
    assert {c.id for c in await cri.list_containers()} == {kept_container}

    await empty_runtime(cri)
    assert await cri.list_pod_sandbox() == [] and await cri.list_containers() == []


async def test_images(cri, containerd):
    image = await cri.image_status(containerd.image)
    assert image is not None
    assert containerd.image in image.repo_tags
    assert image.size > 0

    assert await cri.image_status("docker.io/library/never-pulled:1") is None

    tags = {tag for listed in await cri.list_images() for tag in listed.repo_tags}
    assert {containerd.image, containerd.pause_image} <= tags

    info = await cri.image_fs_info()
    [filesystem] = info.image_filesystems
    assert filesystem.fs_id.mountpoint.startswith(str(containerd.state_dir))
    # containerd samples usage in the background; right after start the numbers may still be zero.
    assert filesystem.HasField("used_bytes") and filesystem.HasField("inodes_used")


async def test_missing_objects_raise_not_found_and_count_errors(cri):
    errors_before = sample("kubelet_runtime_operations_errors_total", "container_status")
    calls_before = sample("kubelet_runtime_operations_duration_seconds_count", "container_status")
    with pytest.raises(NotFound) as caught:
        await cri.container_status("0" * 64)
    assert caught.value.code == "NOT_FOUND"
    assert sample("kubelet_runtime_operations_errors_total", "container_status") == errors_before + 1
    assert sample("kubelet_runtime_operations_duration_seconds_count", "container_status") == calls_before + 1

    with pytest.raises(NotFound):
        await cri.pod_sandbox_status("0" * 64)


async def test_refused_call_raises_cri_error_with_code_and_details(cri, containerd):
    config = sandbox_config(containerd)
    config.hostname = "not-allowed-with-host-network"
    with pytest.raises(CRIError) as caught:
        await cri.run_pod_sandbox(config)
    assert caught.value.operation == "run_podsandbox"
    assert caught.value.code == "UNKNOWN"
    assert "hostname" in caught.value.details


async def test_pull_from_unreachable_registry_fails_permanently(cri):
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    with pytest.raises(CRIError) as caught:
        await cri.pull_image("127.0.0.1:1/nothing:1")
    assert "127.0.0.1:1" in caught.value.details


async def test_unreachable_endpoint_raises_runtime_unavailable_at_once(tmp_path):
    endpoint = f"unix://{tmp_path}/no-such.sock"
    async with RuntimeClient(endpoint, timeout=3600.0) as client:
        # Fail fast, not after the call deadline: a wait of the full hour would hit this bound.
        with pytest.raises(RuntimeUnavailable) as caught:
            await asyncio.wait_for(client.version(), 30)
    assert caught.value.endpoint == endpoint
    assert endpoint in str(caught.value)


async def test_a_client_connected_ahead_answers_and_an_unreachable_one_still_fails_fast(tmp_path, containerd):
    async with RuntimeClient(containerd.endpoint) as client:
        client.connect()
        client.connect()  # again: the same channel
        assert (await client.version()).runtime_name == "containerd"
    endpoint = f"unix://{tmp_path}/no-such.sock"
    async with RuntimeClient(endpoint, timeout=3600.0) as client:
        client.connect()  # no error here: the connection is tried in the background
        await asyncio.sleep(0.2)
        with pytest.raises(RuntimeUnavailable):
            await asyncio.wait_for(client.version(), 30)


async def test_raw_cri_pod_start_time(cri, containerd, record_property):
    """Measures RunPodSandbox + CreateContainer + StartContainer (host network): the floor for an agent."""
    durations = []
    for _ in range(10):
        started = time.perf_counter()
        sandbox_id, _, _ = await start_pod(cri, containerd)
        durations.append(time.perf_counter() - started)
        await cri.stop_pod_sandbox(sandbox_id)
        await cri.remove_pod_sandbox(sandbox_id)
    median_ms = statistics.median(durations) * 1000
    record_property("raw_cri_pod_start_median_ms", round(median_ms, 1))
    print(f"\nraw CRI pod start (host network), median of {len(durations)}: {median_ms:.0f} ms")
    assert await cri.list_pod_sandbox() == []
