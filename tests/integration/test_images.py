"""ImageManager against the private containerd and real registries on 127.0.0.1: pull policies, pull
errors and back-off, pull secrets, and one pull per image at a time."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import pytest

from edgelet.images.manager import ImageError, ImageManager
from edgelet.util.backoff import Backoff
from tests.integration.registry_harness import AUTH_PASSWORD, AUTH_USER, image_config_id, make_image

pytestmark = pytest.mark.containerd


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str = "web") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())}}


def container(image: str, policy: str | None = None) -> dict:
    spec = {"name": "app", "image": image}
    if policy:
        spec["imagePullPolicy"] = policy
    return spec


def pull_secret(server: str, username: str, password: str, *, legacy: bool = False) -> dict:
    entry = {"auth": base64.b64encode(f"{username}:{password}".encode()).decode()}
    if legacy:
        kind, key, payload = "kubernetes.io/dockercfg", ".dockercfg", {server: entry}
    else:
        kind, key, payload = "kubernetes.io/dockerconfigjson", ".dockerconfigjson", {"auths": {server: entry}}
    return {
        "metadata": {"name": "regcred", "namespace": "default"},
        "type": kind,
        "data": {key: base64.b64encode(json.dumps(payload).encode()).decode()},
    }


@pytest.fixture
def manager(cri):
    return ImageManager(cri, pull_backoff=Backoff(10, 300, clock=FakeClock()))


@pytest.fixture
def repository() -> str:
    return f"edgelet-test/{uuid.uuid4().hex[:12]}"


async def test_pull_policies(cri, manager, registry, base_images, tmp_path, repository):
    first_archive = make_image(base_images, tmp_path / "first.tar")
    second_archive = make_image(base_images, tmp_path / "second.tar")
    image = registry.push(first_archive, "app", f"{repository}:1")
    first_id = image_config_id(first_archive)
    try:
        with pytest.raises(ImageError) as never:
            await manager.ensure_image(pod(), container(image, "Never"))
        assert never.value.reason == "ErrImageNeverPull"
        assert never.value.message == f'Container image "{image}" is not present with pull policy of Never'

        assert await manager.ensure_image(pod(), container(image, "IfNotPresent")) == first_id
        assert (await cri.image_status(image)).id == first_id
        assert registry.manifest_requests_by_runtime(repository, "1") == 1

        # The tag moves to another image: IfNotPresent and Never keep the one they have, Always fetches it.
        registry.push(second_archive, "app", f"{repository}:1")
        assert await manager.ensure_image(pod(), container(image, "IfNotPresent")) == first_id
        assert await manager.ensure_image(pod(), container(image, "Never")) == first_id
        assert registry.manifest_requests_by_runtime(repository, "1") == 1
        assert await manager.ensure_image(pod(), container(image, "Always")) == image_config_id(second_archive)
        assert registry.manifest_requests_by_runtime(repository, "1") == 2
        # A tag of "latest" (or none) defaults to Always.
        registry.push(first_archive, "app", f"{repository}:latest")
        latest = image.rsplit(":", 1)[0]
        assert await manager.ensure_image(pod(), container(latest)) == first_id
        assert await manager.ensure_image(pod(), container(latest)) == first_id
        assert registry.manifest_requests_by_runtime(repository, "latest") == 2
    finally:
        await cri.remove_image(image_config_id(first_archive))
        await cri.remove_image(image_config_id(second_archive))


async def test_failed_pull_then_back_off(cri, registry, base_images, tmp_path, repository):
    clock = FakeClock()
    manager = ImageManager(cri, pull_backoff=Backoff(10, 300, clock=clock))
    image = f"{registry.address}/{repository}:1"
    web = pod()

    async def failure(the_pod=web) -> ImageError:
        with pytest.raises(ImageError) as caught:
            await manager.ensure_image(the_pod, container(image, "IfNotPresent"))
        return caught.value

    first = await failure()
    assert first.reason == "ErrImagePull"
    assert first.message.startswith(f'Failed to pull image "{image}": ')
    assert "not found" in first.message
    assert first.retry_after == 10

    backing_off = await failure()
    assert backing_off.reason == "ImagePullBackOff"
    assert backing_off.message == f'Back-off pulling image "{image}"'
    assert backing_off.retry_after == 10
    assert registry.manifest_requests_by_runtime(repository, "1") == 1, "no pull while backing off"

    clock.now += 10
    second = await failure()
    assert (second.reason, second.retry_after) == ("ErrImagePull", 20)
    clock.now += 15
    assert (await failure()).reason == "ImagePullBackOff"
    # The back-off is per (pod, image): another pod tries at once.
    assert (await failure(pod("other"))).reason == "ErrImagePull"
    assert registry.manifest_requests_by_runtime(repository, "1") == 3

    archive = make_image(base_images, tmp_path / "late.tar")
    registry.push(archive, "app", f"{repository}:1")
    clock.now += 5
    try:
        assert await manager.ensure_image(web, container(image, "Always")) == image_config_id(archive)
        # Success forgets the back-off: the next pull goes out at once.
        assert await manager.ensure_image(web, container(image, "Always")) == image_config_id(archive)
    finally:
        await cri.remove_image(image_config_id(archive))


class EventList:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def event(self, ref, event_type, reason, message):
        assert ref["kind"] == "Pod" and ref["fieldPath"] == "spec.containers{app}"
        self.events.append((event_type, reason, message))


async def test_image_events_as_the_kubelet_records_them(cri, registry, base_images, tmp_path, repository):
    recorder = EventList()
    manager = ImageManager(cri, pull_backoff=Backoff(10, 300, clock=FakeClock()), recorder=recorder)
    archive = make_image(base_images, tmp_path / "events.tar")
    image = registry.push(archive, "app", f"{repository}:1")
    missing = f"{registry.address}/{repository}:missing"
    web = pod()  # the second failed pull of the same pod is backed off
    try:
        for the_pod, spec in ((pod(), container(image, "Never")), (pod(), container(image, "IfNotPresent")),
                              (pod(), container(image, "IfNotPresent")), (web, container(missing, "IfNotPresent")),
                              (web, container(missing, "IfNotPresent")), (pod(), container("Bad/Name:1"))):
            try:
                await manager.ensure_image(the_pod, spec)
            except ImageError:
                pass
        kinds = [(t, r) for t, r, _ in recorder.events]
        assert kinds == [("Warning", "ErrImageNeverPull"), ("Normal", "Pulling"), ("Normal", "Pulled"),
                         ("Normal", "Pulled"), ("Normal", "Pulling"), ("Warning", "Failed"), ("Normal", "BackOff"),
                         ("Warning", "InspectFailed")]
        messages = [m for _, _, m in recorder.events]
        assert messages[1] == f'Pulling image "{image}"'
        assert messages[2].startswith(f'Successfully pulled image "{image}" in ')
        assert messages[3] == f'Container image "{image}" already present on machine'
        assert messages[5].startswith(f'Failed to pull image "{missing}": ')
        assert messages[6] == f'Back-off pulling image "{missing}"'
    finally:
        await cri.remove_image(image_config_id(archive))


async def test_invalid_image_name(manager):
    with pytest.raises(ImageError) as caught:
        await manager.ensure_image(pod(), container("Example/App:1"))
    assert caught.value.reason == "InvalidImageName"
    assert caught.value.message.startswith('Failed to apply default image tag "Example/App:1": ')


async def test_pull_secrets(cri, manager, auth_registry, base_images, tmp_path, repository, containerd):
    archive = make_image(base_images, tmp_path / "private.tar")
    image = auth_registry.push(archive, "app", f"{repository}:1")
    image_id = image_config_id(archive)
    server = auth_registry.address
    try:
        with pytest.raises(ImageError) as anonymous:
            await manager.ensure_image(pod(), container(image, "Always"))
        assert anonymous.value.reason == "ErrImagePull"
        # The runtime's own words, as the kubelet passes them on: 1.7 and later do not quote the registry's status.
        refusal = "401 Unauthorized" if containerd.release == "1.6" else "no basic auth credentials"
        assert refusal in anonymous.value.message

        wrong = pull_secret(server, AUTH_USER, "wrong")
        with pytest.raises(ImageError) as denied:
            await manager.ensure_image(pod(), container(image, "Always"), [wrong])
        # Each credential is tried, then anonymously; the message names both.
        assert f"as {AUTH_USER}: " in denied.value.message
        assert "anonymously: " in denied.value.message
        assert await cri.image_status(image) is None

        other_registry = pull_secret("registry.example.com", AUTH_USER, AUTH_PASSWORD)
        right = pull_secret(server, AUTH_USER, AUTH_PASSWORD)
        assert await manager.ensure_image(pod(), container(image, "Always"), [wrong, other_registry, right]) == image_id
        legacy = pull_secret(f"http://{server}/v2/", AUTH_USER, AUTH_PASSWORD, legacy=True)
        assert await manager.ensure_image(pod(), container(image, "Always"), [legacy]) == image_id
    finally:
        await cri.remove_image(image_id)


async def test_concurrent_pulls_of_one_image_pull_once(cri, manager, registry, base_images, tmp_path, repository):
    archive = make_image(base_images, tmp_path / "shared.tar")
    image = registry.push(archive, "app", f"{repository}:1")
    try:
        refs = await asyncio.gather(
            *(manager.ensure_image(pod(f"web-{n}"), container(image, "IfNotPresent")) for n in range(4))
        )
        assert refs == [image_config_id(archive)] * 4
        assert registry.manifest_requests_by_runtime(repository, "1") == 1
    finally:
        await cri.remove_image(image_config_id(archive))
