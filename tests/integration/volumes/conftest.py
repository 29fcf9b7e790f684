"""Fixtures of the volume tests: a scratch root whose mounts go with the test, an object store, and the volume
manager over both."""

from __future__ import annotations

import os

import pytest

from edgelet.api.objectstore import ObjectStore
from edgelet.volumes import VolumeManager
from edgelet.volumes.mountutil import MNT_DETACH, mounts_under, unmount


@pytest.fixture
def root(tmp_path):
    """A scratch directory whose mounts are all gone after the test, whatever happened in it."""
    base = os.path.realpath(tmp_path)
    yield base
    for entry in mounts_under(base):
        unmount(entry.mount_point, MNT_DETACH)
    assert not mounts_under(base)


@pytest.fixture
def store():
    return ObjectStore()


@pytest.fixture
def manager(root, store):
    return VolumeManager(os.path.join(root, "pods"), store=store, node_name="edge-1",
                         node_allocatable={"memory": "512Mi"})
