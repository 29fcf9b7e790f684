"""ImageManager's pull scheduling and stall handling against a scripted runtime (a pure unit: the integration tests
pull from real registries through containerd): serialized or parallel pulls as the kubelet's settings say, and a
pull the runtime cancelled for lack of progress explained once, not retried with the next credential."""

from __future__ import annotations

import asyncio
import json

import pytest

from edgelet.cri import CRIError
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images.manager import ImageError, ImageManager
from edgelet.util.backoff import Backoff


class Runtime:
    """Answers as containerd `version` would; each pull waits for `release` (or fails with `failure`)."""

    def __init__(self, version: str = "v2.1.9", failure: str = ""):
        self._version = version
        self.failure = failure
        self.release = asyncio.Event()
        self.running = 0
        self.most = 0
        self.pulls: list[tuple[str, str]] = []  # (image, username)

    async def version(self):
        return pb.VersionResponse(runtime_name="containerd", runtime_version=self._version)

    async def status(self, *, verbose: bool = False):
        return pb.StatusResponse(info={"config": json.dumps({})})

    async def image_status(self, image):
        return None

    async def image_fs_info(self):
        return pb.ImageFsInfoResponse()

    async def pull_image(self, image, auth=None, sandbox_config=None):
        self.pulls.append((image, auth.username if auth else ""))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        if self.failure:
            raise CRIError("pull_image", "UNKNOWN", self.failure)
        return f"sha256:{len(self.pulls):064x}"


def pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}}


@pytest.mark.parametrize(("parallel", "most"), [(1, 1), (2, 2), (None, 3)])
async def test_pulls_in_flight_as_the_settings_say(parallel, most):
    runtime = Runtime()
    manager = ImageManager(runtime, pull_backoff=Backoff(10, 300), max_parallel_pulls=parallel)
    pulls = [asyncio.ensure_future(manager.ensure_image(pod(f"p{n}"), {"name": "app", "image": f"r.io/app{n}:1"}))
             for n in range(3)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert runtime.running == most
    runtime.release.set()
    await asyncio.gather(*pulls)
    assert runtime.most == most and len(runtime.pulls) == 3


async def test_a_pull_the_runtime_cancelled_for_lack_of_progress_is_explained_and_not_retried():
    runtime = Runtime(failure='failed to pull and unpack image "r.io/app:1": context canceled')
    runtime.release.set()
    class Keyring:
        async def lookup(self, image):
            return [{"username": "robot", "password": "pw"}]

    manager = ImageManager(runtime, pull_backoff=Backoff(10, 300), node_keyring=Keyring())
    with pytest.raises(ImageError) as failed:
        await manager.ensure_image(pod("web"), {"name": "app", "image": "r.io/app:1"})
    assert failed.value.reason == "ErrImagePull"
    assert failed.value.message.endswith(
        "context canceled (the runtime cancels a pull that makes no progress for its image_pull_progress_timeout)")
    assert runtime.pulls == [("r.io/app:1", "robot")]  # the stalled link is not tried again anonymously
