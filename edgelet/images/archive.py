"""Reads image archives (an OCI image layout or a `docker save` archive, as a tar, optionally gzip or zstd
compressed) into a content index: which image names the archive holds and where each blob's bytes are.

Docker archives carry configs and layers but no registry manifests, so one OCI manifest is built per
image (digests computed here). Nothing is extracted: blobs are served from their offsets in the tar.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import orjson

from edgelet.images import reference
from edgelet.util.errors import PermanentError

MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_MEDIA_TYPES = frozenset({MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST})
MANIFEST_MEDIA_TYPES = frozenset({MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST, *INDEX_MEDIA_TYPES})

CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"
OCI_REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOB_PATH = re.compile(r"blobs/([A-Za-z0-9_+.-]+)/([A-Fa-f0-9]+)")
_JSON_LIMIT = 4 * 1024 * 1024  # manifests, indexes and configs are small; refuse to load a huge "JSON"
_HASH_CHUNK = 1024 * 1024


class ArchiveError(PermanentError):
    """The archive cannot be used; the message names the file and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Blob:
    """Where a blob's bytes are: `offset` into the plain tar, or `data` when built here."""

    size: int
    offset: int = -1
    data: bytes | None = None
    media_type: str = ""  # set for manifests and indexes, served as their Content-Type


@dataclass(slots=True)
class ArchiveIndex:
    images: dict[str, str] = field(default_factory=dict)  # normalized name:tag -> manifest digest
    blobs: dict[str, Blob] = field(default_factory=dict)  # digest -> location


def compression_of(path: str) -> str:
    """"gzip", "zstd" or "" (plain tar), by the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return ""


def decompress(path: str, dest: str, compression: str) -> None:
    """Writes the plain tar of `path` to `dest` (streaming; memory stays flat)."""
    tmp = dest + ".tmp"
    try:
        if compression == "gzip":
            with gzip.open(path, "rb") as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, _HASH_CHUNK)
        elif compression == "zstd":
            if shutil.which("zstd") is None:
                raise ArchiveError(f"{path}: zstd-compressed, but the zstd program is not installed")
            done = subprocess.run(["zstd", "-d", "-q", "-f", "-o", tmp, path], capture_output=True, text=True)
            if done.returncode != 0:
                raise ArchiveError(f"{path}: zstd: {done.stderr.strip()}")
        else:
            raise ValueError(f"unknown compression {compression!r}")
        os.replace(tmp, dest)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise ArchiveError(f"{path}: decompressing: {err}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def image_name(annotations: dict[str, str]) -> str | None:
    """The full image name of an index.json entry: containerd's annotation, else an OCI ref name that is
    a whole reference (has a '/' or a ':'); a bare tag like "1.0" names no image."""
    name = annotations.get(CONTAINERD_NAME_ANNOTATION)
    if name:
        return name
    ref_name = annotations.get(OCI_REF_NAME_ANNOTATION, "")
    return ref_name if ("/" in ref_name or ":" in ref_name) else None


class _Tar:
    """Member lookup and reads by offset in one plain tar file."""

    def __init__(self, f: BinaryIO, label: str):
        self.f = f
        self.label = label
        self.members: dict[str, tuple[int, int]] = {}
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for member in tar:
                    if member.isfile():
                        self.members[member.name.removeprefix("./")] = (member.offset_data, member.size)
        except tarfile.TarError as err:
            raise ArchiveError(f"{label}: not a tar archive: {err}") from None

    def read(self, name: str, limit: int = _JSON_LIMIT) -> bytes:
        offset, size = self.members[name]
        if size > limit:
            raise ArchiveError(f"{self.label}: {name} is {size} bytes, more than {limit} allowed")
        self.f.seek(offset)
        return self.f.read(size)

    def json(self, name: str) -> Any:
        try:
            return orjson.loads(self.read(name))
        except orjson.JSONDecodeError as err:
            raise ArchiveError(f"{self.label}: {name}: not JSON: {err}") from None

    def sha256_and_head(self, name: str) -> tuple[str, bytes]:
        offset, size = self.members[name]
        self.f.seek(offset)
        digest = hashlib.sha256()
        head = b""
        left = size
        while left:
            chunk = self.f.read(min(left, _HASH_CHUNK))
            if not chunk:
                raise ArchiveError(f"{self.label}: {name} is truncated")
            head = head or chunk[:4]
            digest.update(chunk)
            left -= len(chunk)
        return "sha256:" + digest.hexdigest(), head


def index_archive(plain_tar: str, label: str) -> ArchiveIndex:
    """Indexes a plain tar holding an OCI layout (index.json) or a docker archive (manifest.json).

    `label` names the archive in errors (the file the user dropped, not a decompressed copy).
    """
    with open(plain_tar, "rb") as f:
        tar = _Tar(f, label)
        if "index.json" in tar.members:
            return _index_oci_layout(tar)
        if "manifest.json" in tar.members:
            return _index_docker_archive(tar)
    raise ArchiveError(f"{label}: neither index.json (OCI layout) nor manifest.json (docker archive) found")


def _normalized(name: str, label: str, where: str) -> str:
    try:
        return reference.normalize(name)
    except reference.InvalidReference as err:
        raise ArchiveError(f"{label}: {where}: image name {name!r}: {err}") from None


def _index_oci_layout(tar: _Tar) -> ArchiveIndex:
    index = ArchiveIndex()
    for name, (offset, size) in tar.members.items():
        match = _BLOB_PATH.fullmatch(name)
        if match:
            index.blobs[f"{match.group(1)}:{match.group(2).lower()}"] = Blob(size, offset)
    top = tar.json("index.json")
    descriptors = top.get("manifests") if isinstance(top, dict) else None
    if not isinstance(descriptors, list):
        raise ArchiveError(f"{tar.label}: index.json: no manifests list")
    for position, descriptor in enumerate(descriptors):
        where = f"index.json manifests[{position}]"
        digest = _mark_manifest(tar, index, descriptor, where, required=True)
        image = image_name((descriptor.get("annotations") or {}) if isinstance(descriptor, dict) else {})
        if image is not None:
            index.images[_normalized(image, tar.label, where)] = digest
    return index


def _mark_manifest(tar: _Tar, index: ArchiveIndex, descriptor: Any, where: str, *, required: bool) -> str:
    """Records the manifest or index a descriptor points to (and, for an index, its children)."""
    if not isinstance(descriptor, dict) or not isinstance(descriptor.get("digest"), str):
        raise ArchiveError(f"{tar.label}: {where}: descriptor without a digest")
    digest = descriptor["digest"]
    blob = index.blobs.get(digest)
    if blob is None:
        if required:
            raise ArchiveError(f"{tar.label}: {where}: blob {digest} is not in the archive")
        return digest
    algorithm, _, hex_digest = digest.partition(":")
    content = tar.read(f"blobs/{algorithm}/{hex_digest}")
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError as err:
        raise ArchiveError(f"{tar.label}: {where}: manifest {digest} is not JSON: {err}") from None
    media_type = descriptor.get("mediaType") or document.get("mediaType") or MEDIA_OCI_MANIFEST
    index.blobs[digest] = Blob(blob.size, blob.offset, media_type=media_type)
    if media_type in INDEX_MEDIA_TYPES or "manifests" in document:
        # A multi-platform archive may hold only some platforms; the runtime fetches only its own.
        for position, child in enumerate(document.get("manifests") or []):
            _mark_manifest(tar, index, child, f"{where} -> {digest} manifests[{position}]", required=False)
    else:
        for part in [document.get("config"), *(document.get("layers") or [])]:
            part_digest = part.get("digest") if isinstance(part, dict) else None
            if part_digest not in index.blobs:
                missing = f"manifest {digest} needs blob {part_digest}, which is not in the archive"
                raise ArchiveError(f"{tar.label}: {where}: {missing}")
    return digest


def _layer_media_type(head: bytes) -> str:
    if head.startswith(_GZIP_MAGIC):
        return MEDIA_OCI_LAYER + "+gzip"
    if head.startswith(_ZSTD_MAGIC):
        return MEDIA_OCI_LAYER + "+zstd"
    return MEDIA_OCI_LAYER


def _index_docker_archive(tar: _Tar) -> ArchiveIndex:
    index = ArchiveIndex()
    entries = tar.json("manifest.json")
    if not isinstance(entries, list):
        raise ArchiveError(f"{tar.label}: manifest.json: expected a list")
    hashed: dict[str, tuple[str, bytes]] = {}

    def blob_of(member: Any, where: str) -> tuple[str, int, bytes]:
        if not isinstance(member, str) or member.removeprefix("./") not in tar.members:
            raise ArchiveError(f"{tar.label}: manifest.json {where}: {member!r} is not in the archive")
        member = member.removeprefix("./")
        if member not in hashed:
            hashed[member] = tar.sha256_and_head(member)
        digest, head = hashed[member]
        offset, size = tar.members[member]
        index.blobs.setdefault(digest, Blob(size, offset))
        return digest, size, head

    for position, entry in enumerate(entries):
        where = f"[{position}]"
        if not isinstance(entry, dict):
            raise ArchiveError(f"{tar.label}: manifest.json {where}: expected an object")
        config_digest, config_size, _ = blob_of(entry.get("Config"), f"{where}.Config")
        layers = []
        for number, layer in enumerate(entry.get("Layers") or []):
            digest, size, head = blob_of(layer, f"{where}.Layers[{number}]")
            layers.append({"mediaType": _layer_media_type(head), "digest": digest, "size": size})
        manifest = orjson.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_OCI_MANIFEST,
                "config": {"mediaType": MEDIA_OCI_CONFIG, "digest": config_digest, "size": config_size},
                "layers": layers,
            }
        )
        manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        index.blobs[manifest_digest] = Blob(len(manifest), data=manifest, media_type=MEDIA_OCI_MANIFEST)
        for tag in entry.get("RepoTags") or []:
            index.images[_normalized(tag, tar.label, f"manifest.json {where}.RepoTags")] = manifest_digest
    return index


@dataclass(slots=True)
class ArchiveSource:
    """One archive file; compressed ones are decompressed into `cache_dir` while their bytes are needed."""

    path: str
    cache_dir: str
    compression: str | None = None  # None until the file's first bytes were read
    index: ArchiveIndex | None = None

    @property
    def plain_path(self) -> str:
        if not self.compression:
            return self.path
        return os.path.join(self.cache_dir, os.path.basename(self.path) + ".plain.tar")

    def load(self) -> ArchiveIndex:
        """Decompresses if needed and indexes (blocking; run it in a thread)."""
        if self.compression is None:
            try:
                self.compression = compression_of(self.path)
            except OSError as err:
                raise ArchiveError(f"{self.path}: {err.strerror}") from None
        if self.compression and not os.path.exists(self.plain_path):
            os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
            decompress(self.path, self.plain_path, self.compression)
        if self.index is None:
            self.index = index_archive(self.plain_path, self.path)
        return self.index

    def release(self) -> None:
        """Deletes the decompressed copy; the index stays and `load` makes the copy again on demand."""
        if self.compression:
            try:
                os.remove(self.plain_path)
            except FileNotFoundError:
                pass

    def opener(self) -> Callable[[], BinaryIO]:
        """Opens the plain tar (raises OSError once `release` removed a decompressed copy)."""
        return lambda: open(self.plain_path, "rb")
