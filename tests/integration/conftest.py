"""Fixtures of the integration tests: an agent (standalone, or a cluster node against the API server double) and
the image tests' private registries; the CRI client and the clean runtime are the session's (tests/conftest.py).

A module's own `api` fixture (another double) overrides the one here, and `cluster_node` then joins that one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.agent_harness import AgentProcess
from tests.integration.cluster_harness import NODE, cluster_agent, unmount_below
from tests.integration.registry_harness import build_base_images, start_registry, stop_registry
from tests.kubeapi_double import ApiServerDouble


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
