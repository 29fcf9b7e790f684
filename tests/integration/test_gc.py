"""Image and container garbage collection against the private containerd."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images.gc import ImageGC
from edgelet.kuberuntime.gc import ContainerGC
from edgelet.kuberuntime.loglinks import link_name, make_link
from tests.integration.registry_harness import image_config_id, make_image
from tests.runtime_cleanup import empty_runtime

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sandbox_config(logs_dir: Path, *, managed: bool = True) -> pb.PodSandboxConfig:
    name, uid = f"web-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    pod_labels = {labels.POD_NAME: name, labels.POD_NAMESPACE: "default", labels.POD_UID: uid}
    if managed:
        pod_labels[labels.MANAGED_BY] = "edgelet"
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
        log_directory=str(logs_dir / f"default_{name}_{uid}"),
        labels=pod_labels,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE))
        ),
    )


async def run_container(cri, sandbox_id, config, image, name, attempt, command) -> str:
    os.makedirs(os.path.join(config.log_directory, name), exist_ok=True)
    container_labels = {**config.labels, labels.CONTAINER_NAME: name}
    container_id = await cri.create_container(
        sandbox_id,
        pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=list(command),
            log_path=f"{name}/{attempt}.log",
            labels=container_labels,
        ),
        config,
    )
    await cri.start_container(container_id)
    return container_id


async def wait_exited(cri, container_id: str) -> None:
    deadline = time.monotonic() + 20
    while (await cri.container_status(container_id)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, f"container {container_id} did not exit"
        await asyncio.sleep(0.05)


async def test_image_gc_removes_unused_images_and_keeps_those_in_use(
    cri, containerd, registry, base_images, tmp_path
):
    used_archive = make_image(base_images, tmp_path / "used.tar")
    unused_archive = make_image(base_images, tmp_path / "unused.tar")
    used_id, unused_id = image_config_id(used_archive), image_config_id(unused_archive)
    # Other tests' images stay out of this test; the sandbox image must be kept by ImageGC itself.
    pause_id = (await cri.image_status(containerd.pause_image)).id
    baseline = {image.id for image in await cri.list_images()} - {pause_id}
    repository = f"edgelet-test/gc-{uuid.uuid4().hex[:8]}"
    used = registry.push(used_archive, "app", f"{repository}:used")
    unused = registry.push(unused_archive, "app", f"{repository}:unused")
    try:
        assert await cri.pull_image(used) == used_id
        assert await cri.pull_image(unused) == unused_id
        config = sandbox_config(tmp_path / "logs")
        sandbox_id = await cri.run_pod_sandbox(config)
        await run_container(cri, sandbox_id, config, used_id, "app", 0, ["sleep", "3600"])

        clock = FakeClock()
        # Below the high threshold (100 %: a full disk) nothing goes.
        relaxed = ImageGC(cri, high=100, low=100, min_age=0, pinned_images=lambda: baseline, clock=clock)
        result = await relaxed.collect()
        assert result.to_free == 0 and result.removed == []

        # Thresholds of 0 % make the policy free every byte it may, without filling the disk.
        gc = ImageGC(cri, high=0, low=0, min_age=120, pinned_images=lambda: baseline, clock=clock)
        result = await gc.collect()
        assert result.to_free > 0
        assert result.removed == [], "images first seen less than min_age ago stay"
        clock.now += 121
        result = await gc.collect()
        assert result.removed == [unused_id]
        assert result.freed > 0
        assert await cri.image_status(unused_id) is None
        assert (await cri.image_status(used_id)).id == used_id
        assert baseline | {pause_id} <= {image.id for image in await cri.list_images()}
        if containerd.release.startswith("1."):
            assert await gc.sandbox_image() == containerd.pause_image
        else:
            # 2.x no longer names it in Status(verbose) but pins it, which keeps it just as well.
            assert await gc.sandbox_image() is None
            assert [image.pinned for image in await cri.list_images() if image.id == pause_id] == [True]
    finally:
        await empty_runtime(cri)  # the images are removed only once no container uses them
        await cri.remove_image(used_id)
        await cri.remove_image(unused_id)


async def test_container_gc_keeps_the_newest_dead_container_per_name(cri, containerd, tmp_path):
    logs_dir, links_dir = tmp_path / "logs", tmp_path / "containers"
    config = sandbox_config(logs_dir)
    uid = config.metadata.uid
    sandbox_id = await cri.run_pod_sandbox(config)
    app = [await run_container(cri, sandbox_id, config, containerd.image, "app", n, ["true"]) for n in range(3)]
    side = await run_container(cri, sandbox_id, config, containerd.image, "side", 0, ["true"])
    for container_id in (*app, side):
        await wait_exited(cri, container_id)
    # The collectors' links, as the runtime manager makes them, and a rotated file of the first instance.
    links = {}
    for name, container_id, attempt in [*(("app", cid, n) for n, cid in enumerate(app)), ("side", side, 0)]:
        links[container_id] = link_name(config.metadata.name, "default", name, container_id)
        make_link(str(links_dir), links[container_id], os.path.join(config.log_directory, name, f"{attempt}.log"))
    rotated = Path(config.log_directory) / "app" / "0.log.20260101-000000.gz"
    rotated.write_bytes(b"")
    stray = f"gone_default_app-{'f' * 64}.log"  # a dangling link of a container the runtime no longer has
    make_link(str(links_dir), stray, str(tmp_path / "nowhere.log"))
    # A pod that still exists keeps its log directory; so does anything edgelet did not create.
    kept_config = sandbox_config(logs_dir)
    os.makedirs(kept_config.log_directory)
    foreign_config = sandbox_config(logs_dir, managed=False)
    foreign_id = await cri.run_pod_sandbox(foreign_config)
    await cri.stop_pod_sandbox(foreign_id)

    active = {uid, kept_config.metadata.uid}
    gc = ContainerGC(cri, lambda: active, logs_dir=str(logs_dir), container_logs_dir=str(links_dir))
    result = await gc.collect()
    assert sorted(result.containers) == sorted(app[:2])
    assert result.sandboxes == [] and result.log_dirs == []
    remaining = {c.id for c in await cri.list_containers()}
    assert remaining == {app[2], side}
    pod_logs = Path(config.log_directory)
    assert not (pod_logs / "app" / "0.log").exists() and not (pod_logs / "app" / "1.log").exists()
    assert not rotated.exists()  # a container's rotated files go with it
    assert (pod_logs / "app" / "2.log").exists()
    assert sorted(os.listdir(links_dir)) == sorted([links[app[2]], links[side]])  # and its link; the stray one too

    # The pod is deleted: its sandbox was stopped; now everything of it goes, its logs too.
    await cri.stop_pod_sandbox(sandbox_id)
    active.discard(uid)
    result = await gc.collect()
    assert sorted(result.containers) == sorted([app[2], side])
    assert result.sandboxes == [sandbox_id]
    assert result.log_dirs == [pod_logs.name]
    assert not pod_logs.exists()
    assert os.listdir(links_dir) == []
    assert Path(kept_config.log_directory).exists()
    assert [s.id for s in await cri.list_pod_sandbox()] == [foreign_id]
