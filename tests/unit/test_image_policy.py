"""Image decisions without a runtime: reference normalization, imagePullPolicy defaults and when to pull,
air-gap naming, and the loopback registry's answers to pull requests."""

from __future__ import annotations

import asyncio
import hashlib
import io

import orjson
import pytest

from edgelet.images import reference
from edgelet.images.airgap import is_archive_name, mirror_repository
from edgelet.images.archive import MEDIA_OCI_MANIFEST, Blob, image_name
from edgelet.images.manager import _KeyedLocks, pull_policy, should_pull
from edgelet.images.registry import route


@pytest.mark.parametrize(
    ("image", "normalized"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ("library/busybox", "docker.io/library/busybox:latest"),
        ("myorg/app:2", "docker.io/myorg/app:2"),
        ("index.docker.io/myorg/app", "docker.io/myorg/app:latest"),
        ("docker.io/busybox", "docker.io/library/busybox:latest"),
        ("localhost/app", "localhost/app:latest"),
        ("localhost:5000/app:1", "localhost:5000/app:1"),
        ("127.0.0.1:5000/team/app:v1.2-rc_3", "127.0.0.1:5000/team/app:v1.2-rc_3"),
        ("Registry.Example.com/app", "Registry.Example.com/app:latest"),
        ("quay.io/org/sub/app@sha256:" + "a" * 64, "quay.io/org/sub/app@sha256:" + "a" * 64),
        ("app:1.0@sha256:" + "b" * 64, "docker.io/library/app:1.0@sha256:" + "b" * 64),
        ("example.local/airgap/app:1.0", "example.local/airgap/app:1.0"),
        ("a__b/c--d/e.f", "docker.io/a__b/c--d/e.f:latest"),
    ],
)
def test_normalize(image, normalized):
    assert reference.normalize(image) == normalized


@pytest.mark.parametrize(
    ("image", "complaint"),
    [
        ("", "at least one component"),
        ("Busybox", "lowercase"),
        ("myorg/App", "lowercase"),
        ("app:bad tag", "invalid tag"),
        ("app:" + "t" * 129, "invalid tag"),
        ("app@sha256:abc", "invalid digest"),
        ("app@sha256:" + "a" * 63 + "g", "invalid digest"),
        ("a" * 64, "64-byte hexadecimal"),
        ("reg.io//app", "invalid repository path"),
        ("reg.io/app-", "invalid repository path"),
        ("-reg.io/app", "invalid registry domain"),
        (" busybox", "whitespace"),
    ],
)
def test_invalid_references(image, complaint):
    with pytest.raises(reference.InvalidReference, match=complaint):
        reference.parse(image)


@pytest.mark.parametrize(
    ("image", "with_tag"),
    [
        ("busybox", "busybox:latest"),
        ("busybox:1", "busybox:1"),
        ("localhost:5000/app", "localhost:5000/app:latest"),
        ("app@sha256:" + "c" * 64, "app@sha256:" + "c" * 64),
    ],
)
def test_default_tag_keeps_the_name_as_written(image, with_tag):
    assert reference.with_default_tag(image) == with_tag


@pytest.mark.parametrize(
    ("container", "policy"),
    [
        ({"image": "busybox"}, "Always"),
        ({"image": "busybox:latest"}, "Always"),
        ({"image": "busybox:1.36"}, "IfNotPresent"),
        ({"image": "busybox@sha256:" + "d" * 64}, "IfNotPresent"),
        ({"image": "busybox:latest@sha256:" + "d" * 64}, "Always"),
        ({"image": "busybox", "imagePullPolicy": "Never"}, "Never"),
        ({"image": "busybox:1", "imagePullPolicy": "Always"}, "Always"),
    ],
)
def test_pull_policy_defaults(container, policy):
    assert pull_policy(container) == policy


@pytest.mark.parametrize(
    ("policy", "present", "pull"),
    [
        ("Always", True, True),
        ("Always", False, True),
        ("IfNotPresent", True, False),
        ("IfNotPresent", False, True),
        ("Never", True, False),
        ("Never", False, False),
    ],
)
def test_should_pull(policy, present, pull):
    assert should_pull(policy, present) is pull


@pytest.mark.parametrize(
    ("image", "mirror"),
    [
        ("example.local/airgap/app:1.0", "example.local/airgap/app"),
        ("busybox", "docker.io/library/busybox"),
        ("localhost:5000/app", "localhost_5000/app"),
        ("Registry.Example.com/app", "registry.example.com/app"),
    ],
)
def test_mirror_repository_is_a_valid_path(image, mirror):
    assert mirror_repository(reference.parse(image)) == mirror
    reference.parse(f"127.0.0.1:5000/{mirror}:1")  # a name the runtime accepts


@pytest.mark.parametrize(
    ("annotations", "name"),
    [
        (
            {"io.containerd.image.name": "example.local/app:1", "org.opencontainers.image.ref.name": "1"},
            "example.local/app:1",
        ),
        ({"org.opencontainers.image.ref.name": "example.local/app:1"}, "example.local/app:1"),
        ({"org.opencontainers.image.ref.name": "app:1"}, "app:1"),
        ({"org.opencontainers.image.ref.name": "1.0"}, None),
        ({}, None),
    ],
)
def test_archive_image_names(annotations, name):
    assert image_name(annotations) == name


@pytest.mark.parametrize(
    ("file_name", "is_archive"),
    [
        ("app.tar", True),
        ("app.tar.gz", True),
        ("app.tgz", True),
        ("app.tar.zst", True),
        (".app.tar", False),
        ("app.tar.part", False),
        ("README", False),
    ],
)
def test_archive_file_names(file_name, is_archive):
    assert is_archive_name(file_name) is is_archive


class MemoryStore:
    """A ContentStore over bytes in memory: one repository, one tag."""

    def __init__(self) -> None:
        self.layer = bytes(range(256)) * 40
        self.layer_digest = "sha256:" + hashlib.sha256(self.layer).hexdigest()
        self.manifest_bytes = orjson.dumps({"schemaVersion": 2, "mediaType": MEDIA_OCI_MANIFEST, "layers": []})
        self.manifest_digest = "sha256:" + hashlib.sha256(self.manifest_bytes).hexdigest()

    def _opener(self):
        return lambda: io.BytesIO(self.layer)

    def manifest(self, repository, ref):
        if repository != "example.local/app" or ref not in ("1.0", self.manifest_digest):
            return None
        blob = Blob(len(self.manifest_bytes), data=self.manifest_bytes, media_type=MEDIA_OCI_MANIFEST)
        return self.manifest_digest, blob, self._opener()

    def blob(self, repository, digest):
        if repository != "example.local/app" or digest != self.layer_digest:
            return None
        return Blob(len(self.layer), offset=0), self._opener()


def header(reply, name: bytes) -> bytes | None:
    return dict(reply.headers).get(name)


def test_registry_base_endpoint():
    reply = route(MemoryStore(), "GET", "/v2/")
    assert reply.status == 200


def test_registry_manifest_by_tag_and_digest():
    store = MemoryStore()
    for ref in ("1.0", store.manifest_digest):
        reply = route(store, "GET", f"/v2/example.local/app/manifests/{ref}")
        assert reply.status == 200
        assert header(reply, b"Content-Type") == MEDIA_OCI_MANIFEST.encode()
        assert header(reply, b"Docker-Content-Digest") == store.manifest_digest.encode()
        assert reply.length == len(store.manifest_bytes)


@pytest.mark.parametrize(
    ("method", "target", "status", "code"),
    [
        ("GET", "/v2/example.local/app/manifests/2.0", 404, b"MANIFEST_UNKNOWN"),
        ("GET", "/v2/other/manifests/1.0", 404, b"MANIFEST_UNKNOWN"),
        ("GET", "/v2/example.local/app/blobs/sha256:" + "0" * 64, 404, b"BLOB_UNKNOWN"),
        ("GET", "/v2/example.local/app/blobs/latest", 400, b"DIGEST_INVALID"),
        ("GET", "/v2/_catalog", 404, b"NOT_FOUND"),
        ("PUT", "/v2/example.local/app/manifests/1.0", 405, b"UNSUPPORTED"),
        ("POST", "/v2/example.local/app/blobs/uploads/", 405, b"UNSUPPORTED"),
    ],
)
def test_registry_errors(method, target, status, code):
    reply = route(MemoryStore(), method, target)
    assert reply.status == status
    assert code in reply.body


@pytest.mark.parametrize(
    ("range_header", "status", "start", "length"),
    [
        (None, 200, 0, 10240),
        ("bytes=0-", 206, 0, 10240),
        ("bytes=100-199", 206, 100, 100),
        ("bytes=10000-", 206, 10000, 240),
        ("bytes=10000-99999", 206, 10000, 240),
        ("bytes=-40", 206, 10200, 40),
        ("bytes=10240-", 416, 0, 0),
        ("bytes=5-4", 416, 0, 0),
        ("items=1-2", 416, 0, 0),
    ],
)
def test_registry_blob_ranges(range_header, status, start, length):
    store = MemoryStore()
    reply = route(store, "GET", f"/v2/example.local/app/blobs/{store.layer_digest}", range_header)
    assert reply.status == status
    if status != 416:
        assert (reply.start, reply.length) == (start, length)
        assert header(reply, b"Docker-Content-Digest") == store.layer_digest.encode()
    if status == 206:
        assert header(reply, b"Content-Range") == f"bytes {start}-{start + length - 1}/10240".encode()


def test_keyed_locks_serialize_one_key_and_not_others():
    async def scenario() -> list[str]:
        locks = _KeyedLocks()
        events: list[str] = []

        async def hold(key: str, name: str) -> None:
            async with locks.hold(key):
                events.append(f"{name}+")
                await asyncio.sleep(0.01)
                events.append(f"{name}-")

        await asyncio.gather(hold("a", "a1"), hold("a", "a2"), hold("b", "b1"))
        assert not locks._locks, "locks are dropped once nobody uses them"
        return events

    events = asyncio.run(scenario())
    # a2 enters only after a1 left; b1 runs beside a1.
    assert events.index("a2+") > events.index("a1-")
    assert events.index("b1+") < events.index("a1-")
