"""The HTTP source against a real HTTP server on 127.0.0.1: pods served, changed, and kept through failures."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import threading

import httpx
import pytest

from edgelet.api import podutil
from edgelet.podconfig.config import Op, PodConfig
from edgelet.podconfig.http import HTTPSource

NODE = "node1"
WAIT = 10.0


def pod_yaml(name: str, tag: str = "1") -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: app
    image: busybox:{tag}
"""


class ManifestServer:
    """A real HTTP server on a free loopback port whose answer the test changes at will."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                self.send_response(server.status)
                self.send_header("Content-Type", "application/yaml")
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/pods.yaml"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def serve(self, text: str, status: int = 200) -> None:
        self.body, self.status = text.encode(), status

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


@pytest.fixture
def server():
    manifest_server = ManifestServer()
    yield manifest_server
    manifest_server.close()


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=5) as http_client:
        yield http_client


def names(config: PodConfig) -> set[str]:
    return {podutil.name(p) for p in config.get_pods()}


def drain(config: PodConfig) -> list:
    updates = []
    while not config.updates.empty():
        updates.append(config.updates.get_nowait())
    return updates


async def test_serves_static_pods_with_the_http_source(server, client):
    config = PodConfig()
    source = HTTPSource(server.url, NODE, config.source("http"))
    server.serve(pod_yaml("web"))
    assert await source.fetch_once(client)
    (pod,) = config.get_pods()
    assert podutil.name(pod) == "web-node1"
    assert podutil.source(pod) == "http"
    assert pod["spec"]["nodeName"] == NODE
    assert podutil.annotations(pod)[podutil.CONFIG_HASH_ANNOTATION] == podutil.uid(pod)
    assert config.all_sources_ready()

    assert await source.fetch_once(client)  # same content: nothing to say
    assert [u.op for u in drain(config)] == [Op.ADD]

    server.serve(pod_yaml("web", tag="2"))  # changed content: new uid, the old pod goes
    assert await source.fetch_once(client)
    assert [u.op for u in drain(config)] == [Op.REMOVE, Op.ADD]
    assert config.get_pods()[0]["spec"]["containers"][0]["image"] == "busybox:2"


async def test_pod_list_and_multi_document_yaml(server, client):
    config = PodConfig()
    handed_over = []
    source = HTTPSource(server.url, NODE, config.source("http"), on_objects=handed_over.append)
    pod_list = {"apiVersion": "v1", "kind": "PodList", "items": [
        {"kind": "Pod", "metadata": {"name": n}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}
        for n in ("a", "b")]}
    server.serve(json.dumps(pod_list))
    assert await source.fetch_once(client)
    assert names(config) == {"a-node1", "b-node1"}
    server.serve(pod_yaml("c") + "---\n" + pod_yaml("d") + "---\nkind: ConfigMap\nmetadata: {name: cfg}\n")
    assert await source.fetch_once(client)
    assert names(config) == {"c-node1", "d-node1"}
    assert [c["metadata"]["name"] for c in source.objects.configmaps] == ["cfg"]
    assert [[o["metadata"]["name"] for o in objects] for objects in handed_over] == [[], ["cfg"]]


async def test_failures_keep_the_pods_and_are_logged_once(server, client, caplog):
    config = PodConfig()
    source = HTTPSource(server.url, NODE, config.source("http"))
    server.serve(pod_yaml("web"))
    assert await source.fetch_once(client)
    drain(config)
    caplog.set_level(logging.INFO, logger="edgelet.podconfig.http")
    server.serve("oops", status=500)
    for _ in range(3):
        assert not await source.fetch_once(client)
    server.serve("kind: Pod\nmetadata: {name: [\n")
    for _ in range(3):
        assert not await source.fetch_once(client)
    assert names(config) == {"web-node1"} and drain(config) == []  # the kubelet keeps the pods it had
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "HTTP 500" in warnings[0] and server.url in warnings[0]
    assert "invalid YAML at line" in warnings[1]

    server.serve(pod_yaml("web"))
    assert await source.fetch_once(client)
    assert drain(config) == [] and "valid again" in caplog.text


async def test_unreachable_server_keeps_pods_and_readiness_waits(server, client, caplog):
    config = PodConfig()
    url = server.url
    server.close()  # nothing listens there any more
    source = HTTPSource(url, NODE, config.source("http"))
    with caplog.at_level(logging.WARNING, logger="edgelet.podconfig.http"):
        assert not await source.fetch_once(client)
        assert not await source.fetch_once(client)
    assert not config.all_sources_ready()  # never reached: nothing may be treated as orphaned yet
    assert caplog.text.count("fetching pod manifests failed") == 1


async def test_empty_answer_means_no_pods(server, client):
    config = PodConfig()
    source = HTTPSource(server.url, NODE, config.source("http"))
    server.serve(pod_yaml("web"))
    assert await source.fetch_once(client)
    server.serve("")
    assert await source.fetch_once(client)
    assert config.get_pods() == [] and config.all_sources_ready()


async def test_run_polls_periodically(server):
    config = PodConfig()
    source = HTTPSource(server.url, NODE, config.source("http"), check_frequency=0.02)
    server.serve(pod_yaml("web"))
    task = asyncio.create_task(source.run())
    try:
        async def until(predicate) -> None:
            while not predicate():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(until(lambda: names(config) == {"web-node1"}), WAIT)
        server.serve(pod_yaml("db"))
        await asyncio.wait_for(until(lambda: names(config) == {"db-node1"}), WAIT)
        assert server.requests >= 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_oversized_answer_is_refused_by_size_and_the_pods_kept(server, client, caplog):
    from edgelet.podconfig.manifest import MAX_MANIFEST_BYTES

    config = PodConfig()
    source = HTTPSource(server.url, NODE, config.source("http"))
    server.serve(pod_yaml("web"))
    assert await source.fetch_once(client)
    server.serve(pod_yaml("web", tag="2") + "#" * (4 * MAX_MANIFEST_BYTES))
    with caplog.at_level(logging.WARNING):
        assert not await source.fetch_once(client)
    assert "bytes allowed" in caplog.text and server.url in caplog.text
    assert [p["spec"]["containers"][0]["image"] for p in config.get_pods()] == ["busybox:1"]
