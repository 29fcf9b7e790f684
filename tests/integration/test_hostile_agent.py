"""The agent under hostile conditions, against the private containerd: a second agent on one root_dir, stale pod
versions after a kill, a kill between CreateContainer and StartContainer or during StartContainer, runtime loss
and CrashLoopBackOff, a manifest that once stopped the sync loop for good, and a sync that stops a pod saying so
(its worker must not act next on a view without the stop)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from edgelet.container import labels
from edgelet.container.runtime import ContainerState
from edgelet.cri import CRIError
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images.manager import ImageManager
from edgelet.kuberuntime.manager import Collaborators, RuntimeManager
from edgelet.pleg.generic import GenericPLEG
from edgelet.podconfig.defaults import apply_defaults
from edgelet.util.backoff import Backoff
from tests.helpers import busybox_manifest, eventually, wait_for
from tests.integration.agent_harness import REPO, AgentProcess, container_state, is_running
from tests.integration.cri_harness import SocketProxy, runtime_objects

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(tmp_path, containerd):
    process = AgentProcess(tmp_path, containerd.endpoint)
    yield process
    process.close()


def since_last_start(agent: AgentProcess) -> list[str]:
    text = agent.log_text()
    return text[text.rindex("edgelet starting"):].splitlines()


def test_second_agent_on_the_same_root_dir_exits_at_once(agent):
    agent.start()
    lock = agent.root_dir / "edgelet.lock"
    wait_for(lambda: lock.exists() and lock.read_text().strip() == str(agent.proc.pid), 30, what="the lock")
    started = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "edgelet", "run", "--config", str(agent.config_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert time.monotonic() - started < 20
    (line,) = second.stderr.strip().splitlines()
    assert str(agent.root_dir) in line and f"PID {agent.proc.pid}" in line
    assert agent.proc.poll() is None  # the first one runs on


def test_stale_pod_versions_are_stopped_before_any_pod_is_synced(agent, containerd):
    agent.start()
    agent.write_manifest("web.yaml", busybox_manifest("web", "exec sleep 3600"))
    agent.write_manifest("gone.yaml", busybox_manifest("gone", "exec sleep 3600"))
    old = wait_for(lambda: (p := agent.pod("web")) and is_running(p) and p, 60, what="web Running")
    gone = wait_for(lambda: (p := agent.pod("gone")) and is_running(p) and p, 60, what="gone Running")
    agent.kill9()
    agent.write_manifest("web.yaml", busybox_manifest("web", "echo edited; exec sleep 3600"))
    (agent.manifest_dir / "gone.yaml").unlink()
    agent.start()
    new = wait_for(lambda: (p := agent.pod("web")) and is_running(p) and p["metadata"]["uid"] != old["metadata"]["uid"]
                   and p, 60, what="the edited web Running")
    for stale in (old, gone):
        uid = stale["metadata"]["uid"]
        wait_for(lambda uid=uid: runtime_objects(containerd.endpoint, uid) == ([], []), 30, what=f"{uid} removed")
    lines = since_last_start(agent)
    first_start = next(i for i, line in enumerate(lines) if "started sandbox" in line)
    for stale in (old, gone):
        uid = stale["metadata"]["uid"]
        (removal,) = [i for i, line in enumerate(lines) if f"({uid}): no source wants it any more" in line]
        assert removal < first_start, f"{uid} was removed after the first new sandbox started"
    assert new["metadata"]["uid"] not in {old["metadata"]["uid"], gone["metadata"]["uid"]}


class AgentKilled(BaseException):
    """Stands for SIGKILL between CreateContainer and StartContainer."""


class DiesBeforeStart:
    """The real runtime client, except that the process "dies" where StartContainer would be sent."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def start_container(self, container_id: str) -> None:
        raise AgentKilled(container_id)


def runtime_manager(client, tmp_path) -> RuntimeManager:
    """A fresh runtime manager, as a (re)started agent has one; back-off long enough to show in a test."""
    images = ImageManager(client, pull_backoff=Backoff(10, 300))
    return RuntimeManager(client, Collaborators(images=images), logs_root=str(tmp_path / "logs"),
                          crash_backoff=Backoff(10, 300))


def app_pod() -> dict:
    return apply_defaults({
        "metadata": {"name": f"adopt-{uuid.uuid4().hex[:8]}", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [
            {"name": "app", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
             "command": ["sh", "-c", "exec sleep 3600"]}]},
    })


async def test_container_created_before_a_kill_is_started_not_doubled(cri, tmp_path):
    pod = app_pod()
    uid = pod["metadata"]["uid"]
    pleg = GenericPLEG(cri)
    await pleg.relist()
    with pytest.raises(AgentKilled) as killed:
        await runtime_manager(DiesBeforeStart(cri), tmp_path).sync_pod(pod, pleg.get_status(uid))
    created_id = killed.value.args[0]
    await pleg.relist()
    [created] = pleg.get_status(uid).containers
    assert created.id == created_id and created.state == ContainerState.CREATED

    result = await runtime_manager(cri, tmp_path).sync_pod(pod, pleg.get_status(uid))
    assert result.started == ["app"]
    containers = await cri.list_containers(pb.ContainerFilter(label_selector={labels.POD_UID: uid}))
    assert [(c.id, c.state) for c in containers] == [(created_id, pb.CONTAINER_RUNNING)]


async def a_pod_whose_container_never_ran(cri, tmp_path):
    """(pod, PLEG, its container's status): an earlier run left the pod's container exited without ever running.
    A command that cannot be executed leaves the state an agent killed during StartContainer leaves (the spec hash
    covers name and image only, so a restarted agent takes that container for its own)."""
    pod = app_pod()
    uid = pod["metadata"]["uid"]
    unstartable = json.loads(json.dumps(pod))
    unstartable["spec"]["containers"][0]["command"] = ["/no/such/command"]
    pleg = GenericPLEG(cri)
    await pleg.relist()
    failed = await runtime_manager(cri, tmp_path).sync_pod(unstartable, pleg.get_status(uid))
    assert failed.waiting_reasons["app"][0] == "RunContainerError"
    await pleg.relist()
    [never_ran] = pleg.get_status(uid).containers
    assert never_ran.state == ContainerState.EXITED and never_ran.started_at == 0
    return pod, pleg, never_ran


async def test_a_start_cut_short_by_a_kill_is_replaced_without_counting_a_restart(cri, tmp_path):
    # An agent killed during StartContainer leaves the runtime to give that start up: the container ends
    # EXITED without ever having run.
    pod, pleg, never_ran = await a_pod_whose_container_never_ran(cri, tmp_path)
    uid = pod["metadata"]["uid"]
    result = await runtime_manager(cri, tmp_path).sync_pod(pod, pleg.get_status(uid))  # the restarted agent
    assert result.started == ["app"] and not result.waiting_reasons
    containers = await cri.list_containers(pb.ContainerFilter(label_selector={labels.POD_UID: uid}))
    assert [(c.state, c.metadata.attempt) for c in containers] == [(pb.CONTAINER_RUNNING, 0)]
    assert containers[0].id != never_ran.id


class KeepsNeverRun:
    """The real runtime client, except that RemoveContainer is refused as containerd 2.x refuses it for a container
    whose start was cancelled while it made the task (containerd issue 11037)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def remove_container(self, container_id: str) -> None:
        raise CRIError("remove_container", "FAILED_PRECONDITION",
                       f"failed to delete containerd container {container_id!r}: cannot delete running task")


async def test_a_never_run_container_the_runtime_keeps_is_replaced_by_the_next_attempt(cri, tmp_path, caplog):
    pod, pleg, never_ran = await a_pod_whose_container_never_ran(cri, tmp_path)
    uid = pod["metadata"]["uid"]
    result = await runtime_manager(KeepsNeverRun(cri), tmp_path).sync_pod(pod, pleg.get_status(uid))
    assert result.started == ["app"] and not result.waiting_reasons
    containers = await cri.list_containers(pb.ContainerFilter(label_selector={labels.POD_UID: uid}))
    assert sorted((c.metadata.attempt, c.state, c.id == never_ran.id) for c in containers) == [
        (0, pb.CONTAINER_EXITED, True), (1, pb.CONTAINER_RUNNING, False)]
    assert "the runtime keeps container app" in caplog.text and "its replacement is attempt 1" in caplog.text


async def test_a_start_that_failed_in_this_agent_counts_as_a_restart(cri, tmp_path):
    pod = app_pod()
    uid = pod["metadata"]["uid"]
    pod["spec"]["containers"][0]["command"] = ["/no/such/command"]
    pleg = GenericPLEG(cri)
    runtime = runtime_manager(cri, tmp_path)
    for _ in range(2):
        await pleg.relist()
        result = await runtime.sync_pod(pod, pleg.get_status(uid))
        assert result.waiting_reasons["app"][0] == "RunContainerError"
    await pleg.relist()
    assert [(c.state, c.restart_count) for c in pleg.get_status(uid).containers] == [
        (ContainerState.EXITED, 1), (ContainerState.EXITED, 0)]


def test_runtime_loss_does_not_count_toward_crash_loop_backoff(tmp_path, containerd):
    proxy_path = str(tmp_path / "cri.sock")
    proxy = SocketProxy(proxy_path, containerd.socket)
    agent = AgentProcess(tmp_path, f"unix://{proxy_path}")
    # A long back-off, so a restart within seconds after the runtime returns can only mean it was reset.
    agent.config_path.write_text(agent.config_path.read_text()
                                 .replace('crashloop_initial = "1s"', 'crashloop_initial = "90s"')
                                 .replace('crashloop_max = "4s"', 'crashloop_max = "300s"'))
    agent.write_manifest("crash.yaml", busybox_manifest("crash", "sleep 1; exit 3"))
    proxy.up()
    try:
        agent.start()
        backing_off = wait_for(
            lambda: (p := agent.pod("crash")) and container_state(p).get("restartCount") == 1
            and (container_state(p)["state"].get("waiting") or {}).get("reason") == "CrashLoopBackOff" and p,
            60, what="CrashLoopBackOff after one restart")
        assert "back-off 90s" in container_state(backing_off)["state"]["waiting"]["message"]
        proxy.down()
        wait_for(lambda: "container runtime lost" in agent.log_text(), 15, what="the loss noticed")
        proxy.up()
        back = time.monotonic()
        wait_for(lambda: (p := agent.pod("crash")) and container_state(p).get("restartCount") == 2, 30,
                 what="a restart without the 90 s back-off")
        assert time.monotonic() - back < 30
    finally:
        agent.close()
        proxy.down()


def test_a_pod_with_an_out_of_range_number_never_stops_the_node(agent):
    agent.start()
    big = busybox_manifest("big", "exec sleep 3600").replace(
        "terminationGracePeriodSeconds: 1",
        f"terminationGracePeriodSeconds: 1\n          activeDeadlineSeconds: {2**70}")
    agent.write_manifest("big.yaml", big)
    agent.write_manifest("later.yaml", busybox_manifest("later", "exec sleep 3600"))
    wait_for(lambda: is_running(agent.pod("later")), 60, what="a later pod Running")
    log = agent.log_text()
    assert "big.yaml: spec.activeDeadlineSeconds: integer out of range" in log
    assert "Traceback" not in log and agent.proc.poll() is None
    assert json.loads(agent.cli("pods", "-o", "json").stdout)["kind"] == "PodList"


def test_a_listener_that_cannot_bind_takes_the_agent_down_rather_than_leaving_it_half_alive(tmp_path, containerd):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    agent = AgentProcess(tmp_path, containerd.endpoint, server_address=address)
    try:
        agent.start()
        code = agent.proc.wait(60)  # listeners are bound before any task starts: the agent never starts
        assert code == 1
        assert f"cannot run: cannot listen on {address}: Address already in use" in agent.log_text()
        assert "edgelet starting" not in agent.log_text()
    finally:
        agent.close()
        taken.close()


def test_a_second_file_with_the_same_pod_name_never_replaces_the_running_pod(agent, containerd):
    agent.start()
    agent.write_manifest("m-web.yaml", busybox_manifest("web", "exec sleep 3600"))
    running = wait_for(lambda: (p := agent.pod("web")) and is_running(p) and p, 60, what="web Running")
    uid = running["metadata"]["uid"]
    before = runtime_objects(containerd.endpoint, uid)
    agent.write_manifest("a-web.yaml", busybox_manifest("web", "echo impostor; exec sleep 3600"))
    wait_for(lambda: "a-web.yaml: metadata.name: pod default/web-testnode is already defined in" in agent.log_text(),
             30, what="the duplicate reported")
    agent.kill9()  # and across a restart, where a-web.yaml would sort first
    agent.start()
    wait_for(lambda: any("container runtime ready" in line for line in since_last_start(agent)), 60,
             what="agent restarted")
    time.sleep(3)
    assert agent.pod("web")["metadata"]["uid"] == uid
    after = runtime_objects(containerd.endpoint, uid)
    assert [c.id for c in after[1] if c.state == pb.CONTAINER_RUNNING] == \
        [c.id for c in before[1] if c.state == pb.CONTAINER_RUNNING]
    assert len(agent.log_text().split("is already defined in")) == 3  # once per run


async def test_a_sync_that_stops_the_pod_says_so(cri, tmp_path):
    # The worker inspects the pod after such a sync: the runtime's events for the stop travel apart from the
    # calls' replies, and a view without them showed stopped sidecars in a sandbox still ready (so to restart).
    pod = app_pod()
    uid = pod["metadata"]["uid"]
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", "exit 0"]
    pleg = GenericPLEG(cri)
    runtime = runtime_manager(cri, tmp_path)
    await pleg.relist()
    first = await runtime.sync_pod(pod, pleg.get_status(uid))
    assert first.started == ["app"] and not first.stopped
    await eventually(lambda: pleg_sees(pleg, uid, ContainerState.EXITED), 20, what="the app container exited",
                     interval=0.05)

    done = await runtime.sync_pod(pod, pleg.get_status(uid))  # every app container is done: the pod stops
    assert done.stopped and not done.started
    [sandbox] = await cri.list_pod_sandbox(pb.PodSandboxFilter(label_selector={labels.POD_UID: uid}))
    assert sandbox.state == pb.SANDBOX_NOTREADY
    await pleg.relist()
    idle = await runtime.sync_pod(pod, pleg.get_status(uid))  # nothing left to do
    assert not idle.stopped and not idle.started


async def pleg_sees(pleg: GenericPLEG, uid: str, state: ContainerState) -> bool:
    await pleg.relist()
    return [c.state for c in pleg.get_status(uid).containers] == [state]
