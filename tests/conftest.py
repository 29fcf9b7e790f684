"""Session-wide test fixtures: the private containerd that integration tests run against, a CRI client
connected to it and a runtime emptied around a test.

`containerd` starts one instance per test session through hack/local-containerd.sh in a temporary
directory and stops it at the end, failing the session if anything (process, mount) outlives it. The
release it runs is the script's choice: CONTAINERD=1.6|1.7|2.1 in the environment, else its default.
Without root or the needed tools the fixture skips, except under CI=true, where it fails. A module opts into a
runtime emptied before and after each test with `pytestmark = pytest.mark.usefixtures("clean_runtime")`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

# The helper modules' asserts are the tests' too: rewritten as the test modules' are, they hold at -OO (the pure
# suite runs so, as the package ships), where a plain assert would vanish. Before any of them is imported.
pytest.register_assert_rewrite("tests.helpers", "tests.runtime_cleanup", "tests.scrape", "tests.logind_double",
                               "tests.kubeapi_double", "tests.unit", "tests.integration", "tests.e2e", "tests.chaos",
                               "tests.conformance", "bench")

from edgelet.cri.client import RuntimeClient  # noqa: E402
from tests.runtime_cleanup import empty_runtime, recorded, remove_pod_cgroups, run_ctr  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCAL_CONTAINERD = REPO_ROOT / "hack" / "local-containerd.sh"
BUSYBOX_IMAGE = "docker.io/library/busybox:local"
PAUSE_IMAGE = "edgelet.local/pause:1"
# containerd itself comes from the machine or Debian's archive, whichever the script picks for the release.
REQUIRED_TOOLS = ("runc", "umoci", "busybox", "python3", "ip")
READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Containerd:
    """A running private containerd: its CRI endpoint, its state directory and the images it holds."""

    endpoint: str
    state_dir: Path
    image: str = BUSYBOX_IMAGE
    pause_image: str = PAUSE_IMAGE

    @property
    def socket(self) -> str:
        return self.endpoint.removeprefix("unix://")

    def _recorded(self, key: str) -> str:
        """A value hack/local-containerd.sh recorded for this instance in instance.env."""
        return recorded(self.state_dir, key)

    @property
    def pod_subnet(self) -> str:
        """The CNI bridge subnet pods on the pod network get their addresses from."""
        return self._recorded("SUBNET")

    @property
    def release(self) -> str:
        """The containerd release this instance runs ("1.6", "1.7" or "2.1")."""
        return self._recorded("RELEASE")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs the instance's own `ctr` against it in the CRI namespace (k8s.io)."""
        return run_ctr(self.socket, *args, check=check)


def _cannot_run(reason: str) -> None:
    """Integration tests must not silently vanish in CI: there a missing prerequisite is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"containerd integration tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def _local_containerd(action: str, state_dir: Path, env: dict[str, str] | None = None
                      ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOCAL_CONTAINERD), action, str(state_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def containerd_release() -> str:
    """The containerd release hack/local-containerd.sh runs here ("1.6", "1.7" or "2.1")."""
    fetched = subprocess.run(["bash", str(LOCAL_CONTAINERD), "fetch"], capture_output=True, text=True, timeout=600)
    if fetched.returncode != 0:
        pytest.fail(f"hack/local-containerd.sh fetch failed:\n{fetched.stderr}", pytrace=False)
    return fetched.stdout.split()[0]


@contextlib.contextmanager
def private_containerd(state_dir: Path, env: dict[str, str] | None = None) -> Iterator[Containerd]:
    """A containerd of its own for tests that need it configured otherwise (`env` for hack/local-containerd.sh),
    stopped at the end; the tools it needs are the session fixture's, so use it beside `containerd`."""
    started = _local_containerd("start", state_dir, env)
    try:
        if started.returncode != 0:
            pytest.fail(f"hack/local-containerd.sh start failed:\n{started.stderr}", pytrace=False)
        instance = Containerd(endpoint=started.stdout.strip().splitlines()[-1], state_dir=state_dir)
        _wait_until_ready(instance.endpoint, (instance.image, instance.pause_image))
        yield instance
    finally:
        stopped = _local_containerd("stop", state_dir)
    if stopped.returncode != 0:
        pytest.fail(f"hack/local-containerd.sh stop left things behind:\n{stopped.stderr}", pytrace=False)


def _wait_until_ready(endpoint: str, images: tuple[str, ...]) -> None:
    """Waits until the CRI reports RuntimeReady and NetworkReady and has indexed the imported images."""
    from edgelet.cri import runtime_v1_pb2 as pb
    from edgelet.cri import runtime_v1_pb2_grpc as pb_grpc

    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer"
    with grpc.insecure_channel(endpoint) as channel:
        runtime = pb_grpc.RuntimeServiceStub(channel)
        image_service = pb_grpc.ImageServiceStub(channel)
        while time.monotonic() < deadline:
            try:
                conditions = runtime.Status(pb.StatusRequest(), timeout=5).status.conditions
                not_ready = [c.type for c in conditions if not c.status]
                missing = [
                    ref
                    for ref in images
                    if not image_service.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)),
                                                     timeout=5).image.id
                ]
                if not not_ready and not missing:
                    return
                last = f"not ready: {not_ready}, images missing: {missing}"
            except grpc.RpcError as err:
                last = f"{err.code().name}: {err.details()}"
            time.sleep(0.1)
    pytest.fail(f"containerd at {endpoint} not ready within {READY_TIMEOUT_S:.0f} s ({last})", pytrace=False)


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory):
    """A private containerd for the whole session; see hack/local-containerd.sh for what it sets up."""
    if os.geteuid() != 0:
        _cannot_run("needs root to run containerd")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        _cannot_run(f"missing tools: {', '.join(missing)}")

    state_dir = tmp_path_factory.mktemp("containerd")
    started = _local_containerd("start", state_dir)
    if started.returncode != 0:
        _local_containerd("stop", state_dir)
        pytest.fail(f"hack/local-containerd.sh start failed:\n{started.stderr}", pytrace=False)
    instance = Containerd(endpoint=started.stdout.strip().splitlines()[-1], state_dir=state_dir)
    try:
        _wait_until_ready(instance.endpoint, (instance.image, instance.pause_image))
        yield instance
    finally:
        stopped = _local_containerd("stop", state_dir)
        # The pod cgroups of agents stopped before their housekeeping removed them, now that nothing runs in them:
        # the machine's next agent would otherwise remove them as orphans, in the middle of what it is measured on.
        asyncio.run(remove_pod_cgroups())
    if stopped.returncode != 0:
        pytest.fail(f"hack/local-containerd.sh stop left things behind:\n{stopped.stderr}", pytrace=False)


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
