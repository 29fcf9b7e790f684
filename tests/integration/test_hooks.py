"""Lifecycle hooks against real containers: postStart through the runtime manager's sync, a failing
postStart that gets the container killed, preStop (exec, httpGet, sleep) before the stop, within the
grace period."""

from __future__ import annotations

import asyncio
import time

import pytest

from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images.manager import ImageManager
from edgelet.kuberuntime.manager import Collaborators, RuntimeManager
from edgelet.prober.hooks import HookRunner
from edgelet.util.backoff import Backoff
from tests.helpers import busybox_pod

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

# The main process exits 0 on SIGTERM when the preStop hook left its mark, 9 when it did not: the
# exit code tells whether the hook ran before the stop. /tmp/armed says the trap is in place.
TRAP = "trap 'test -f /tmp/prestop && exit 0; exit 9' TERM; "
LOOP = "touch /tmp/armed; while true; do sleep 0.1; done"
MARKED_EXIT = TRAP + LOOP
# The same, plus an httpd whose CGI /cgi-bin/mark leaves the mark.
MARKING_WEB_SERVER = (
    TRAP + "mkdir -p /tmp/www/cgi-bin"
    " && printf '#!/bin/sh\\ntouch /tmp/prestop\\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nok\"\\n'"
    " > /tmp/www/cgi-bin/mark && chmod +x /tmp/www/cgi-bin/mark && httpd -p 8080 -h /tmp/www; " + LOOP
)

@pytest.fixture
async def hooks(cri):
    runner = HookRunner(cri, pod_ip=lambda uid: "")  # unknown: the runner asks the sandbox
    yield runner
    await runner.close()


@pytest.fixture
def runtime_manager(cri, hooks, tmp_path):
    images = ImageManager(cri, pull_backoff=Backoff(10, 300))
    return RuntimeManager(cri, Collaborators(images=images, hooks=hooks), logs_root=str(tmp_path / "logs"),
                          crash_backoff=Backoff(10, 300))


async def app_container(cri, pod) -> pb.ContainerStatus:
    [container] = await cri.list_containers(
        pb.ContainerFilter(label_selector={"io.kubernetes.pod.uid": pod["metadata"]["uid"]}))
    return await cri.container_status(container.id)


async def armed_container(cri, pod) -> pb.ContainerStatus:
    """The pod's container once its SIGTERM trap is in place (and its httpd listens, if any)."""
    status = await app_container(cri, pod)
    deadline = time.monotonic() + 10
    while (await cri.exec_sync(status.id, ["test", "-f", "/tmp/armed"], 5))[0] != 0:
        assert time.monotonic() < deadline, "the container never armed its trap"
        await asyncio.sleep(0.05)
    return status


def runtime_status(pod, status: pb.ContainerStatus) -> PodRuntimeStatus:
    return PodRuntimeStatus(uid=pod["metadata"]["uid"], containers=[ContainerStatus(
        id=status.id, name="app", sandbox_id="", state=ContainerState(status.state), created_at=status.created_at)])


async def test_post_start_runs_once_the_container_started(cri, runtime_manager):
    pod = busybox_pod("exec sleep 3600", name="hook", grace=5, lifecycle={
        "postStart": {"exec": {"command": ["sh", "-c", "echo started > /tmp/post-start"]}}})
    result = await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    assert result.started == ["app"]

    status = await app_container(cri, pod)
    assert status.state == pb.CONTAINER_RUNNING
    assert await cri.exec_sync(status.id, ["cat", "/tmp/post-start"], 5) == (0, b"started\n", b"")


async def test_failing_post_start_kills_the_container_after_its_pre_stop(cri, runtime_manager, hooks, caplog):
    pod = busybox_pod(MARKED_EXIT, name="hook", grace=5, lifecycle={
        # it fails once the trap is armed, so that the exit code tells about the preStop hook
        "postStart": {"exec": {"command": ["sh", "-c", "until test -f /tmp/armed; do sleep 0.05; done; "
                                                      "echo no luck >&2; exit 7"]}},
        "preStop": {"exec": {"command": ["touch", "/tmp/prestop"]}},
    })
    await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))

    status = await app_container(cri, pod)
    assert status.state == pb.CONTAINER_EXITED
    assert status.exit_code == 0  # SIGTERM came after the preStop hook
    assert any("FailedPostStartHook" in r.getMessage() and "exited with 7" in r.getMessage()
               for r in caplog.records)


class EventList(list):
    def event(self, ref, event_type, reason, message):
        self.append((ref["fieldPath"], reason, message))


async def test_failed_post_start_events(cri, tmp_path):
    events = EventList()
    hooks = HookRunner(cri, pod_ip=lambda uid: "", recorder=events)
    manager = RuntimeManager(cri, Collaborators(images=ImageManager(cri, pull_backoff=Backoff(10, 300)), hooks=hooks,
                                                recorder=events),
                             logs_root=str(tmp_path / "logs"), crash_backoff=Backoff(10, 300))
    pod = busybox_pod("exec sleep 3600", grace=2, name="hook", lifecycle={
        "postStart": {"exec": {"command": ["sh", "-c", "echo no luck >&2; exit 7"]}}})
    try:
        await manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    finally:
        await hooks.close()
    assert [reason for _, reason, _ in events] == ["Created", "Started", "FailedPostStartHook", "Killing"]
    assert {path for path, _, _ in events} == {"spec.containers{app}"}
    assert "exited with 7" in events[2][2] and events[3][2] == "FailedPostStartHook"


async def test_post_start_failure_message(cri, hooks, runtime_manager):
    pod = busybox_pod(MARKED_EXIT, name="hook", grace=5, lifecycle={})
    await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    status = await armed_container(cri, pod)
    container = {"name": "app", "lifecycle": {"postStart": {"httpGet": {"port": 8099, "host": "127.0.0.1"}}}}

    message = await hooks.post_start(pod, container, status.id)
    assert message is not None and "HTTP lifecycle hook" in message and "127.0.0.1:8099" in message
    # Stopping the container is the runtime manager's job (the tests above), not the hook runner's.
    assert (await cri.container_status(status.id)).state == pb.CONTAINER_RUNNING


async def test_pre_stop_exec_runs_before_the_stop(cri, runtime_manager):
    pod = busybox_pod(MARKED_EXIT, name="hook", grace=5,
                      lifecycle={"preStop": {"exec": {"command": ["touch", "/tmp/prestop"]}}})
    await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    status = await armed_container(cri, pod)

    await runtime_manager.kill_pod(pod, runtime_status(pod, status), None)
    stopped = await cri.container_status(status.id)
    assert (stopped.state, stopped.exit_code) == (pb.CONTAINER_EXITED, 0)


async def test_forced_stop_skips_pre_stop(cri, runtime_manager):
    pod = busybox_pod(MARKED_EXIT, name="hook", grace=5,
                      lifecycle={"preStop": {"exec": {"command": ["touch", "/tmp/prestop"]}}})
    await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    status = await armed_container(cri, pod)

    await runtime_manager.kill_pod(pod, runtime_status(pod, status), 0)
    stopped = await cri.container_status(status.id)
    assert stopped.state == pb.CONTAINER_EXITED and stopped.exit_code != 0


async def test_pre_stop_http_get_to_the_pod(cri, runtime_manager):
    pod = busybox_pod(MARKING_WEB_SERVER, host_network=False, name="hook", grace=5, lifecycle={
        "preStop": {"httpGet": {"port": 8080, "path": "/cgi-bin/mark"}}})
    await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    status = await armed_container(cri, pod)

    await runtime_manager.kill_pod(pod, runtime_status(pod, status), None)
    stopped = await cri.container_status(status.id)
    assert (stopped.state, stopped.exit_code) == (pb.CONTAINER_EXITED, 0)


async def test_pre_stop_sleep_uses_part_of_the_grace_period(hooks):
    pod = busybox_pod("", name="hook", grace=5, lifecycle={"preStop": {"sleep": {"seconds": 1}}})
    remaining = await hooks.pre_stop(pod, "app", "0" * 64, 30)
    assert 2 <= remaining <= 29


async def test_pre_stop_is_cut_short_by_the_grace_period(cri, runtime_manager, hooks):
    pod = busybox_pod("exec sleep 3600", name="hook", grace=5, lifecycle={
        "preStop": {"exec": {"command": ["sh", "-c", "touch /tmp/began; sleep 600"]}}})
    await runtime_manager.sync_pod(pod, PodRuntimeStatus(uid=pod["metadata"]["uid"]))
    status = await app_container(cri, pod)

    # Far sooner than the hook would end on its own; never less than the minimum stop window.
    assert await asyncio.wait_for(hooks.pre_stop(pod, "app", status.id, 1), 60) == 2
    assert (await cri.exec_sync(status.id, ["test", "-f", "/tmp/began"], 5))[0] == 0
