"""The private containerd the suites run on is the release the CONTAINERD knob asks for (hack/local-containerd.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.containerd]

RELEASES = ("1.6", "1.7", "2.1")


def release_of(version: str) -> str:
    """ "1.6" of "1.6.20~ds1", "2.1" of "v2.1.9+unknown"."""
    found = re.match(r"v?(\d+)\.(\d+)\.", version)
    assert found, f"not a containerd version: {version!r}"
    return f"{found.group(1)}.{found.group(2)}"


def knob_release() -> str:
    """What the knob asks for: CONTAINERD, else the machine's own containerd's release if known, else 2.1."""
    if os.environ.get("CONTAINERD"):
        return os.environ["CONTAINERD"]
    own = shutil.which("containerd")
    if own:
        printed = subprocess.run([own, "--version"], capture_output=True, text=True, check=True).stdout.split()
        if len(printed) >= 3 and release_of(printed[2]) in RELEASES:
            return release_of(printed[2])
    return "2.1"


@pytest.mark.parametrize(("version", "release"), [
    ("1.6.20~ds1", "1.6"), ("1.7.24~ds1", "1.7"), ("2.1.9+unknown", "2.1"), ("v2.1.9", "2.1"), ("1.10.3", "1.10"),
])
def test_release_of(version, release):
    assert release_of(version) == release


async def test_the_running_containerd_is_the_release_asked_for(containerd):
    from edgelet.cri.client import RuntimeClient

    async with RuntimeClient(containerd.endpoint, timeout=10.0) as client:
        version = await client.version()
    assert version.runtime_name == "containerd"
    assert release_of(version.runtime_version) == knob_release() == containerd.release
