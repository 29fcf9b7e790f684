"""Fixtures for tests against the session's private containerd: a connected CRI client and a clean runtime, an
agent (standalone, or a cluster node against the API server double) and the image tests' private registries.

Opt a module into a runtime emptied before and after each test with
`pytestmark = pytest.mark.usefixtures("clean_runtime")`. A module's own `api` fixture (another double) overrides
the one here, and `cluster_node` then joins that one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgelet.cri.client import RuntimeClient
from tests.integration.agent_harness import AgentProcess
from tests.integration.cluster_harness import NODE, cluster_agent, unmount_below
from tests.integration.registry_harness import build_base_images, start_registry, stop_registry
from tests.kubeapi_double import ApiServerDouble
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


@pytest.fixture
def api():
    """The API server double; its requests are checked as a node's (NodeRestriction), as with a real control plane."""
    with ApiServerDouble(bookmark_interval=0.5, node_name=NODE) as double:
        yield double


@pytest.fixture
def cluster_node(tmp_path, containerd, api):
    """A cluster-mode agent joined to `api`, not yet started; stopped afterwards, its volumes unmounted."""
    process = cluster_agent(tmp_path, containerd.endpoint, api)
    yield process
    process.stop()
    unmount_below(tmp_path)


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """An open registry (no authentication) for the session."""
    instance = start_registry(tmp_path_factory.mktemp("registry"), auth=False)
    yield instance
    stop_registry(instance.directory)


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory):
    """A registry that wants HTTP basic authentication (user AUTH_USER, password AUTH_PASSWORD)."""
    instance = start_registry(tmp_path_factory.mktemp("registry-auth"), auth=True)
    yield instance
    stop_registry(instance.directory)


@pytest.fixture(scope="session")
def base_images(tmp_path_factory) -> Path:
    """The busybox and pause images of hack/busybox-image.sh as an OCI archive (ref names "busybox", "pause")."""
    return build_base_images(tmp_path_factory.mktemp("base-images"))
