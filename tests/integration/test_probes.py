"""Probe checks against real containers of the private containerd: exec through ExecSync, httpGet and
tcpSocket to a busybox httpd on the pod network, grpc to a health server on 127.0.0.1, and the
ProbeManager's workers driving readiness and liveness of a running container."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from edgelet.container.runtime import ContainerState, ContainerStatus
from edgelet.kuberuntime.container import make_container_config
from edgelet.kuberuntime.sandbox import make_sandbox_config
from edgelet.prober.manager import ProbeManager
from edgelet.prober.probes import (
    HttpGetter,
    Prober,
    exec_check,
    grpc_check,
    http_check,
    http_headers,
    parse_probe,
    tcp_check,
)
from edgelet.prober.results import ProbeError, ProbeType, Result
from tests.helpers import busybox_pod, eventually

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

# httpd serves /tmp/www on 8080: / is a file, /dir a directory (busybox answers /dir with a redirect to /dir/).
WEB_SERVER = ("mkdir -p /tmp/www/dir && echo hello > /tmp/www/index.html && echo d > /tmp/www/dir/index.html"
              " && httpd -p 8080 -h /tmp/www && exec sleep 3600")
CLOSED_PORT = 8099


async def start_pod(cri, containerd, pod: dict) -> tuple[str, str]:
    """Runs the pod's sandbox and its one container as the agent would; returns (container id, pod IP)."""
    sandbox_config = make_sandbox_config(pod, 0, logs_root=str(containerd.state_dir / "pods"))
    sandbox_id = await cri.run_pod_sandbox(sandbox_config)
    container = pod["spec"]["containers"][0]
    config = make_container_config(
        pod, container, image_ref=containerd.image, restart_count=0, container_hash="0",
        env=[], command=container["command"], args=[], mounts=[],
    )
    container_id = await cri.create_container(sandbox_id, config, sandbox_config)
    await cri.start_container(container_id)
    pod_ip = (await cri.pod_sandbox_status(sandbox_id)).status.network.ip
    return container_id, pod_ip


@pytest.fixture
async def web_pod(cri, containerd):
    """A pod-network pod whose httpd answers on 8080; yields (pod, container id, pod IP)."""
    pod = busybox_pod(WEB_SERVER, name="probe", host_network=False, ports=[{"name": "web", "containerPort": 8080}])
    container_id, pod_ip = await start_pod(cri, containerd, pod)
    assert pod_ip, "the pod network sandbox got no address"

    async def listening():
        return (await tcp_check(pod_ip, 8080, 1)).result is Result.SUCCESS

    await eventually(listening, what="httpd to listen", timeout=15, interval=0.05)
    return pod, container_id, pod_ip


@pytest.fixture
async def http():
    getter = HttpGetter()
    yield getter
    await getter.close()


# -- exec ------------------------------------------------------------------------------------


async def test_exec_success_failure_and_timeout(cri, containerd):
    pod = busybox_pod("exec sleep 3600", name="probe", host_network=True)
    container_id, _ = await start_pod(cri, containerd, pod)

    ok = await exec_check(cri, container_id, ["sh", "-c", "echo fine"], 1)
    assert ok.result is Result.SUCCESS and ok.output == "fine\n"

    failed = await exec_check(cri, container_id, ["sh", "-c", "echo broken >&2; exit 3"], 1)
    assert failed.result is Result.FAILURE and "broken" in failed.output

    timed_out = await exec_check(cri, container_id, ["sleep", "30"], 1)
    assert timed_out.result is Result.FAILURE and "timed out" in timed_out.output


async def test_exec_in_a_missing_container_is_an_error(cri):
    with pytest.raises(ProbeError):
        await exec_check(cri, "0" * 64, ["true"], 1)


async def test_exec_probe_expands_the_container_env(cri, containerd):
    pod = busybox_pod("exec sleep 3600", name="probe", host_network=True, env=[{"name": "WANT", "value": "7"}])
    container_id, _ = await start_pod(cri, containerd, pod)
    container = pod["spec"]["containers"][0]
    spec = parse_probe({"exec": {"command": ["sh", "-c", "exit $(WANT)"]}}, "pod", "probe", ProbeType.LIVENESS)
    prober = Prober(cri)
    outcome = await prober.probe(spec, container, container_id, "")
    await prober.close()
    assert outcome.result is Result.FAILURE and "exited with 7" in outcome.output


# -- httpGet and tcpSocket on the pod network ----------------------------------------------------


async def test_http_probe_against_the_pod(web_pod, cri):
    pod, container_id, pod_ip = web_pod
    container = pod["spec"]["containers"][0]
    prober = Prober(cri)
    try:
        async def probe(action):
            spec = parse_probe({"httpGet": action}, "pod", "probe", ProbeType.READINESS)
            return await prober.probe(spec, container, container_id, pod_ip)

        assert (await probe({"port": 8080, "path": "/"})).result is Result.SUCCESS
        assert (await probe({"port": "web", "path": "/index.html"})).result is Result.SUCCESS
        assert (await probe({"port": 8080, "path": "/dir"})).result is Result.SUCCESS  # same-host redirect

        missing = await probe({"port": 8080, "path": "/missing"})
        assert missing.result is Result.FAILURE and "404" in missing.output

        refused = await probe({"port": CLOSED_PORT})
        assert refused.result is Result.FAILURE

        with pytest.raises(ProbeError):
            await probe({"port": "nonexistent"})
    finally:
        await prober.close()


async def test_tcp_probe_against_the_pod(web_pod):
    _, _, pod_ip = web_pod
    assert (await tcp_check(pod_ip, 8080, 1)).result is Result.SUCCESS
    refused = await tcp_check(pod_ip, CLOSED_PORT, 1)
    assert refused.result is Result.FAILURE and f"{pod_ip}:{CLOSED_PORT}" in refused.output


# -- HTTP redirects, on loopback -----------------------------------------------------------------


@pytest.fixture
async def redirecting_server():
    """An HTTP server on 127.0.0.1: /loop/N redirects to /loop/N+1, /away to the same port via
    "localhost" (another host name), /ua echoes the User-Agent it got in a header of the reply."""
    seen: list[str] = []

    async def handle(reader, writer):
        request = (await reader.readuntil(b"\r\n\r\n")).decode()
        path = request.split()[1]
        seen.append(request)
        port = writer.get_extra_info("sockname")[1]
        body = ""
        if path.startswith("/loop/"):
            head = f"HTTP/1.1 302 Found\r\nLocation: /loop/{int(path[6:]) + 1}\r\n"
        elif path == "/away":
            head = f"HTTP/1.1 301 Moved\r\nLocation: http://localhost:{port}/\r\n"
            body = f'<a href="http://localhost:{port}/">Moved Permanently</a>.\n'  # as Go's http.Redirect writes
        else:
            head = "HTTP/1.1 200 OK\r\n"
        writer.write((head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, seen
    server.close()
    await server.wait_closed()


async def test_redirects(redirecting_server, http):
    port, seen = redirecting_server
    headers = http_headers(None, "probe")

    away = await http_check(http, f"http://127.0.0.1:{port}/away", headers, 2)
    assert away.result is Result.SUCCESS and away.warning
    assert away.output == (f'Probe terminated redirects, Response body: '
                           f'<a href="http://localhost:{port}/">Moved Permanently</a>.\n')
    assert len(seen) == 1  # the other host was not asked

    seen.clear()
    ten = await http_check(http, f"http://127.0.0.1:{port}/loop/1", headers, 2)
    assert ten.result is Result.FAILURE and "10 redirects" in ten.output
    assert len(seen) == 11
    assert all("User-Agent: kube-probe/1." in request for request in seen)


# -- grpc on loopback ------------------------------------------------------------------------------


@pytest.fixture
async def health_server():
    """A grpc server on 127.0.0.1 with grpc.health.v1.Health/Check: statuses[service] -> status code."""
    statuses = {"": 1, "sick": 2}

    async def check(request: bytes, context):
        service = request[2:].decode() if request else ""
        if service not in statuses:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return bytes([0x08, statuses[service]])

    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port
    await server.stop(None)


@pytest.fixture
async def bare_grpc_server():
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port
    await server.stop(None)


async def test_grpc_health(health_server, bare_grpc_server):
    serving = await grpc_check("127.0.0.1", health_server, "", 2)
    assert serving.result is Result.SUCCESS

    sick = await grpc_check("127.0.0.1", health_server, "sick", 2)
    assert sick.result is Result.FAILURE and "NOT_SERVING" in sick.output

    unknown = await grpc_check("127.0.0.1", health_server, "other", 2)
    assert unknown.result is Result.FAILURE and "NOT_FOUND" in unknown.output

    unimplemented = await grpc_check("127.0.0.1", bare_grpc_server, "", 2)
    assert unimplemented.result is Result.FAILURE and "does not implement" in unimplemented.output


async def test_grpc_nothing_listening_fails_within_the_timeout():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free again once closed: nothing listens there
    outcome = await grpc_check("127.0.0.1", port, "", 1)
    assert outcome.result is Result.FAILURE and "timeout" in outcome.output


# -- the manager's workers against a real container ----------------------------------------------


async def test_manager_drives_readiness_and_liveness(cri, containerd):
    pod = busybox_pod(
        "touch /tmp/alive && exec sleep 3600", name="probe", host_network=True,
        readinessProbe={"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1,
                        "failureThreshold": 1},
        livenessProbe={"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1,
                       "failureThreshold": 2},
    )
    uid = pod["metadata"]["uid"]
    container_id, _ = await start_pod(cri, containerd, pod)
    status = await cri.container_status(container_id)
    known = ContainerStatus(id=container_id, name="app", sandbox_id="", state=ContainerState.RUNNING,
                            created_at=status.created_at, started_at=status.started_at)
    changes: list[str] = []
    manager = ProbeManager(cri, on_change=changes.append,
                           container_lookup=lambda u, name: known if (u, name) == (uid, "app") else None,
                           pod_ip=lambda u: "")
    manager.add_pod(pod)
    try:
        assert manager.readiness(pod) == {"app": False}

        await cri.exec_sync(container_id, ["touch", "/tmp/ready"], 5)

        async def ready():
            return manager.readiness(pod) == {"app": True}

        await eventually(ready, what="the container to turn ready", timeout=15, interval=0.05)
        assert uid in changes

        await cri.exec_sync(container_id, ["rm", "/tmp/alive"], 5)

        async def dead():
            return manager.liveness_failed(uid) == {container_id}

        await eventually(dead, what="the liveness probe to fail twice", timeout=15, interval=0.05)
        liveness = manager.worker(uid, "app", ProbeType.LIVENESS)
        assert liveness is not None and liveness.on_hold
    finally:
        await manager.close()
    assert manager.worker_count() == 0


async def test_asking_for_readiness_probes_a_started_container_at_once(cri, containerd):
    pod = busybox_pod("exec sleep 3600", name="probe", host_network=True,
                      readinessProbe={"exec": {"command": ["true"]}, "periodSeconds": 300})
    container_id, _ = await start_pod(cri, containerd, pod)
    known = ContainerStatus(id=container_id, name="app", sandbox_id="", state=ContainerState.RUNNING,
                            created_at=1, started_at=1)
    manager = ProbeManager(cri, on_change=lambda uid: None, container_lookup=lambda u, name: known,
                           pod_ip=lambda u: "")
    manager.add_pod(pod)
    try:
        async def ready():
            return manager.readiness(pod) == {"app": True}

        # Its own schedule would probe it within 300 s; being asked makes it probe now.
        await eventually(ready, timeout=10, what="readiness after being asked", interval=0.05)
    finally:
        await manager.close()
