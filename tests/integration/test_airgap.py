"""The air-gap images directory against the private containerd, with no registry at all: archives are
imported through CRI, pods' image names resolve to them, and a container runs from one."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import logging
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images.airgap import AirgapImages
from edgelet.images.archive import ArchiveError, index_archive
from edgelet.images.manager import ImageError, ImageManager
from edgelet.images.registry import RegistryServer
from edgelet.util.backoff import Backoff
from tests.integration.registry_harness import image_config_id, make_image

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def pod() -> dict:
    return {"metadata": {"name": "web", "namespace": "default", "uid": str(uuid.uuid4())}}


def container(image: str, policy: str) -> dict:
    return {"name": "app", "image": image, "imagePullPolicy": policy}


def unique_name(kind: str) -> str:
    return f"example.local/airgap/{kind}-{uuid.uuid4().hex[:8]}:1.0"


@pytest.fixture
async def airgap(cri, tmp_path):
    instance = AirgapImages(cri, str(tmp_path / "images"), str(tmp_path / "state"), settle=0)
    (tmp_path / "images").mkdir()
    await instance.start()
    yield instance
    await instance.close()


async def run_and_read_log(cri, image_ref: str, logs_dir: Path) -> str:
    """Runs `echo` in a container made from `image_ref`; returns its log once it exited."""
    name, uid = f"airgap-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
        log_directory=str(logs_dir / f"default_{name}_{uid}"),
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE))
        ),
    )
    sandbox_id = await cri.run_pod_sandbox(config)
    container_id = await cri.create_container(
        sandbox_id,
        pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"),
            image=pb.ImageSpec(image=image_ref),
            command=["sh", "-c", "echo hello from the air-gap directory"],
            log_path="app.log",
        ),
        config,
    )
    await cri.start_container(container_id)
    deadline = time.monotonic() + 20
    while (status := await cri.container_status(container_id)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, "the container did not finish"
        await asyncio.sleep(0.05)
    assert status.exit_code == 0
    return Path(status.log_path).read_text()


async def test_archive_is_imported_and_runs_without_a_registry(cri, airgap, base_images, tmp_path):
    name = unique_name("app")
    archive = make_image(base_images, tmp_path / "images" / "app.tar", name=name)
    image_id = image_config_id(archive)
    manager = ImageManager(cri, pull_backoff=Backoff(10, 300), airgap=airgap)
    try:
        assert await airgap.scan() == ["app.tar"]
        assert airgap.provides(name) and airgap.image_id(name) == image_id
        assert image_id in airgap.image_ids()
        # The runtime knows the image only under the loopback registry's name; the manager answers for the pod's.
        assert await cri.image_status(name) is None
        assert (await manager.image_status(name)).id == image_id
        for policy in ("Never", "IfNotPresent", "Always"):
            assert await manager.ensure_image(pod(), container(name, policy)) == image_id

        log = await run_and_read_log(cri, image_id, tmp_path / "logs")
        assert "stdout F hello from the air-gap directory" in log

        assert await airgap.scan() == [], "an unchanged archive is not imported again"

        # After a restart the checkpoint answers at once, before any scan.
        await airgap.close()
        restarted = AirgapImages(cri, airgap.directory, str(tmp_path / "state"), settle=0)
        await restarted.start()
        try:
            assert restarted.image_id(name) == image_id
            # The image vanished from the runtime: it is pulled from the archive again when needed.
            await cri.remove_image(image_id)
            again = ImageManager(cri, pull_backoff=Backoff(10, 300), airgap=restarted)
            assert await again.ensure_image(pod(), container(name, "IfNotPresent")) == image_id
            assert (await cri.image_status(image_id)).id == image_id

            # Removing the archive withdraws its images.
            archive.unlink()
            assert await restarted.scan() == []
            assert not restarted.provides(name)
            with pytest.raises(ImageError) as caught:
                await again.ensure_image(pod(), container(name, "Never"))
            assert caught.value.reason == "ErrImageNeverPull"
        finally:
            await restarted.close()
    finally:
        await cri.remove_image(image_id)


def to_docker_archive(oci_archive: Path, out: Path, name: str) -> None:
    """Rewrites a one-image OCI archive as `docker save` writes it: uncompressed layers, manifest.json."""
    work = out.parent / f".{out.name}.work"
    work.mkdir(parents=True)
    with tarfile.open(oci_archive) as tar:
        tar.extractall(work / "oci", filter="data")
    blobs = work / "oci" / "blobs" / "sha256"
    index = json.loads((work / "oci" / "index.json").read_text())
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_bytes())
    docker = work / "docker"
    docker.mkdir()
    config_hex = manifest["config"]["digest"].split(":")[1]
    shutil.copy(blobs / config_hex, docker / f"{config_hex}.json")
    layers = []
    for layer in manifest["layers"]:
        plain = gzip.decompress((blobs / layer["digest"].split(":")[1]).read_bytes())
        layer_dir = docker / hashlib.sha256(plain).hexdigest()
        layer_dir.mkdir()
        (layer_dir / "layer.tar").write_bytes(plain)
        layers.append(f"{layer_dir.name}/layer.tar")
    entry = {"Config": f"{config_hex}.json", "RepoTags": [name], "Layers": layers}
    (docker / "manifest.json").write_text(json.dumps([entry]))
    with tarfile.open(out, "w") as tar:
        for path in sorted(docker.iterdir()):
            tar.add(path, arcname=path.name)
    shutil.rmtree(work)


def compress(path: Path, kind: str) -> Path:
    if kind == "gzip":
        target = path.with_name(path.name + ".gz")
        target.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
    else:
        target = path.with_name(path.name + ".zst")
        subprocess.run(["zstd", "-q", "-1", str(path), "-o", str(target)], check=True)
    path.unlink()
    return target


@pytest.mark.parametrize(
    ("layout", "compression"),
    [("oci", "gzip"), ("docker", None), ("docker", "gzip"), ("oci", "zstd")],
)
async def test_archive_formats(cri, airgap, base_images, tmp_path, layout, compression):
    if compression == "zstd" and shutil.which("zstd") is None:
        pytest.skip("zstd not installed")
    name = unique_name(layout)
    oci = make_image(base_images, tmp_path / "build" / "image.tar", name=name)
    image_id = image_config_id(oci)
    archive = tmp_path / "build" / "image.tar"
    if layout == "docker":
        to_docker_archive(oci, tmp_path / "build" / "docker.tar", name)
        archive = tmp_path / "build" / "docker.tar"
    if compression:
        archive = compress(archive, compression)
    archive.rename(tmp_path / "images" / archive.name)
    try:
        assert await airgap.scan() == [archive.name]
        assert airgap.image_id(name) == image_id
        assert (await cri.image_status(image_id)).id == image_id
        assert list((tmp_path / "state" / "cache").glob("*")) == [], "decompressed copies are deleted after import"
    finally:
        await cri.remove_image(image_id)


async def test_bad_archives_are_reported_and_skipped(cri, airgap, base_images, tmp_path, caplog):
    images = tmp_path / "images"
    (images / "garbage.tar").write_bytes(b"this is not a tar archive" * 100)
    (images / "partial.tar.part").write_bytes(b"ignored: not an archive name")
    name = unique_name("good")
    good = make_image(base_images, images / "good.tar", name=name)
    try:
        with caplog.at_level(logging.WARNING):
            assert await airgap.scan() == ["good.tar"]
        assert "garbage.tar" in caplog.text
        assert airgap.provides(name)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert await airgap.scan() == []
        assert "garbage.tar" not in caplog.text, "an unchanged bad archive is reported once"
    finally:
        await cri.remove_image(image_config_id(good))


async def test_loopback_registry_speaks_the_distribution_api(cri, airgap, base_images, tmp_path):
    import httpx

    name = unique_name("http")
    archive = make_image(base_images, tmp_path / "images" / "http.tar", name=name)
    try:
        assert await airgap.scan() == ["http.tar"]
        repository = "example.local/" + name.split("/", 1)[1].rsplit(":", 1)[0]
        async with httpx.AsyncClient(base_url=f"http://{airgap.registry_address}") as client:
            assert (await client.get("/v2/")).status_code == 200
            head = await client.head(f"/v2/{repository}/manifests/1.0")
            assert head.status_code == 200 and head.content == b""
            digest = head.headers["docker-content-digest"]
            got = await client.get(f"/v2/{repository}/manifests/{digest}")
            assert got.headers["content-type"] == "application/vnd.oci.image.manifest.v1+json"
            assert int(head.headers["content-length"]) == len(got.content)
            assert "sha256:" + hashlib.sha256(got.content).hexdigest() == digest
            layer = json.loads(got.content)["layers"][0]
            whole = await client.get(f"/v2/{repository}/blobs/{layer['digest']}")
            assert "sha256:" + hashlib.sha256(whole.content).hexdigest() == layer["digest"]
            part = await client.get(f"/v2/{repository}/blobs/{layer['digest']}", headers={"Range": "bytes=10-19"})
            assert part.status_code == 206 and part.content == whole.content[10:20]
            missing = await client.get(f"/v2/{repository}/manifests/2.0")
            assert missing.status_code == 404 and missing.json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"
            assert (await client.get("/v2/other/app/manifests/1.0")).status_code == 404
            assert (await client.put(f"/v2/{repository}/manifests/1.0", content=b"{}")).status_code == 405
    finally:
        await cri.remove_image(image_config_id(archive))


class EmptyStore:
    def manifest(self, repository, reference):
        return None

    def blob(self, repository, digest):
        return None


async def test_loopback_registry_answers_a_tls_hello_in_http():
    """containerd 2.x tries HTTPS first on loopback too; it falls back to plain HTTP when its TLS hello is
    answered in HTTP, as Go's server answers one, but not when the connection is just closed."""
    import ssl

    hello_out = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), hello_out, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    server = RegistryServer(EmptyStore())
    host, port = (await server.start()).rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(hello_out.read())
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await server.close()
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n"), reply


async def test_archives_dropped_in_while_running_are_imported(cri, base_images, tmp_path):
    directory = tmp_path / "images"
    directory.mkdir()
    # An hour between polls: only the directory watch can bring the archive in while the test waits.
    airgap = AirgapImages(cri, str(directory), str(tmp_path / "state"), poll_interval=3600, settle=0)
    task = asyncio.create_task(airgap.run())
    name = unique_name("dropped")
    staged = make_image(base_images, tmp_path / "staging" / "dropped.tar", name=name)
    try:
        await asyncio.sleep(0.2)  # let run() start and do its first (empty) scan
        staged.rename(directory / ".dropped.tar.partial")  # how a careful copy lands: hidden, then renamed
        (directory / ".dropped.tar.partial").rename(directory / "dropped.tar")
        deadline = time.monotonic() + 20
        while airgap.image_id(name) is None:
            assert not task.done(), task
            assert time.monotonic() < deadline, "the dropped archive was not imported"
            await asyncio.sleep(0.05)
        assert (await cri.image_status(airgap.image_id(name))).id == image_config_id(directory / "dropped.tar")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await cri.remove_image(image_config_id(directory / "dropped.tar"))


async def test_new_archives_wait_until_they_settle(cri, base_images, tmp_path):
    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    directory = tmp_path / "images"
    first_name, second_name = unique_name("first"), unique_name("second")
    first = make_image(base_images, directory / "first.tar", name=first_name)
    airgap = AirgapImages(cri, str(directory), str(tmp_path / "state"), settle=5, clock=clock)
    await airgap.start()
    try:
        assert await airgap.scan() == ["first.tar"], "what is there at start is imported at once"
        second = make_image(base_images, directory / "second.tar", name=second_name)
        assert await airgap.scan() == []
        clock.now += 4
        assert await airgap.scan() == []
        clock.now += 1
        assert await airgap.scan() == ["second.tar"]
        assert airgap.provides(second_name)
    finally:
        await airgap.close()
        await cri.remove_image(image_config_id(first))
        await cri.remove_image(image_config_id(second))


def write_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def digest_of(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


CONFIG = b'{"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}'
MANIFEST = json.dumps(
    {"schemaVersion": 2, "config": {"digest": digest_of(CONFIG), "size": len(CONFIG)}, "layers": []}
).encode()


def oci_members(index: dict, blobs: list[bytes]) -> dict[str, bytes]:
    members = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index).encode()}
    members.update({f"blobs/sha256/{digest_of(blob)[7:]}": blob for blob in blobs})
    return members


def named(digest: str, name: str = "example.local/app:1") -> dict:
    return {"manifests": [{"digest": digest, "annotations": {"io.containerd.image.name": name}}]}


@pytest.mark.parametrize(
    ("members", "complaint"),
    [
        ({"README": b"hello"}, "neither index.json (OCI layout) nor manifest.json (docker archive) found"),
        (oci_members({"schemaVersion": 2}, []), "index.json: no manifests list"),
        (oci_members(named(digest_of(MANIFEST)), []), f"[0]: blob {digest_of(MANIFEST)} is not in the archive"),
        (oci_members(named(digest_of(MANIFEST)), [MANIFEST]), f"needs blob {digest_of(CONFIG)}, which is not in the"),
        (oci_members(named(digest_of(MANIFEST), "Example/App:1"), [MANIFEST, CONFIG]), "image name 'Example/App:1'"),
        ({"manifest.json": b"{}"}, "manifest.json: expected a list"),
        ({"manifest.json": b"[{"}, "manifest.json: not JSON"),
        (
            {"manifest.json": b'[{"Config": "c.json", "Layers": ["l/layer.tar"]}]', "c.json": CONFIG},
            "manifest.json [0].Layers[0]: 'l/layer.tar' is not in the archive",
        ),
    ],
)
def test_unusable_archives_are_explained(tmp_path, members, complaint):
    archive = write_tar(tmp_path / "bad.tar", members)
    with pytest.raises(ArchiveError) as caught:
        index_archive(str(archive), "images/bad.tar")
    assert str(caught.value).startswith("images/bad.tar: ")
    assert complaint in str(caught.value)


def test_oci_layout_index(tmp_path):
    archive = write_tar(tmp_path / "ok.tar", oci_members(named(digest_of(MANIFEST), "app:1"), [MANIFEST, CONFIG]))
    index = index_archive(str(archive), "ok.tar")
    assert index.images == {"docker.io/library/app:1": digest_of(MANIFEST)}
    assert index.blobs[digest_of(MANIFEST)].media_type == "application/vnd.oci.image.manifest.v1+json"
    assert index.blobs[digest_of(CONFIG)].size == len(CONFIG)
