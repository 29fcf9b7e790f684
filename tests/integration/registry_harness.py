"""Registries and images for the image tests: private docker-registry instances on 127.0.0.1 (one open, one
behind htpasswd) and images that no other test shares.

The session's fixtures (`registry`, `auth_registry`, `base_images`) are in tests/integration/conftest.py. `make_image`
derives a new image from the session's busybox archive by adding a unique label to its config, so each test owns its
image ids and pulls or removals elsewhere cannot disturb it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
LOCAL_REGISTRY = REPO_ROOT / "hack" / "local-registry.sh"
BUSYBOX_IMAGE_SH = REPO_ROOT / "hack" / "busybox-image.sh"
AUTH_USER = "edgelet"
AUTH_PASSWORD = "s3cret-for-tests"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


def _cannot_run(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"registry tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class LocalRegistry:
    """A running hack/local-registry.sh instance."""

    address: str  # 127.0.0.1:PORT
    directory: Path
    credentials: tuple[str, str] | None = None

    def push(self, archive: Path, ref_name: str, destination: str) -> str:
        """Copies image `ref_name` of an OCI archive to `destination` (NAME:TAG here); returns the full ref."""
        args = ["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.credentials:
            args += ["--dest-creds", ":".join(self.credentials)]
        full = f"{self.address}/{destination}"
        subprocess.run([*args, f"oci-archive:{archive}:{ref_name}", f"docker://{full}"], check=True, timeout=60,
                       capture_output=True)
        return full

    def manifest_requests_by_runtime(self, repository: str, tag: str) -> int:
        """How often containerd asked for `repository:tag` (the access log's manifest requests by tag)."""
        request = rf'"(?:GET|HEAD) /v2/{re.escape(repository)}/manifests/{re.escape(tag)} HTTP[^"]*"'
        pattern = re.compile(request + " .*containerd")
        return sum(1 for line in (self.directory / "registry.log").read_text().splitlines() if pattern.search(line))


def start_registry(directory: Path, *, auth: bool) -> LocalRegistry:
    for tool in ("docker-registry", "skopeo", "python3"):
        if shutil.which(tool) is None:
            _cannot_run(f"{tool} not found")
    env = dict(os.environ)
    env.pop("EDGELET_REGISTRY_AUTH", None)
    if auth:
        env["EDGELET_REGISTRY_AUTH"] = f"{AUTH_USER}:{AUTH_PASSWORD}"
    started = subprocess.run(["bash", str(LOCAL_REGISTRY), "start", str(directory)], capture_output=True, text=True,
                             env=env, timeout=60)
    if started.returncode != 0:
        pytest.fail(f"hack/local-registry.sh start failed:\n{started.stderr}", pytrace=False)
    address = started.stdout.strip().splitlines()[-1]
    return LocalRegistry(address, directory, (AUTH_USER, AUTH_PASSWORD) if auth else None)


def stop_registry(directory: Path) -> None:
    stopped = subprocess.run(["bash", str(LOCAL_REGISTRY), "stop", str(directory)], capture_output=True, text=True,
                             timeout=60)
    if stopped.returncode != 0:
        pytest.fail(f"hack/local-registry.sh stop failed:\n{stopped.stderr}", pytrace=False)


def build_base_images(directory: Path) -> Path:
    if shutil.which("umoci") is None or shutil.which("busybox") is None:
        _cannot_run("umoci or busybox not found")
    archive = directory / "images.tar"
    subprocess.run(["bash", str(BUSYBOX_IMAGE_SH), str(archive)], check=True, capture_output=True, timeout=120)
    return archive


def _write_blob(layout: Path, content: bytes) -> dict:
    digest = hashlib.sha256(content).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(content)
    return {"digest": f"sha256:{digest}", "size": len(content)}


def make_image(base: Path, out: Path, *, source: str = "busybox", name: str | None = None,
               ref_name: str = "app") -> Path:
    """Writes an OCI archive at `out` with one image: `source` of `base` plus a unique config label.

    Inside, the image's OCI ref name is `ref_name`; `name` also sets containerd's full-name annotation.
    """
    layout = out.parent / f".{out.name}.layout"
    shutil.rmtree(layout, ignore_errors=True)
    layout.mkdir(parents=True)
    with tarfile.open(base) as tar:
        tar.extractall(layout, filter="data")
    index = json.loads((layout / "index.json").read_text())
    (descriptor,) = [d for d in index["manifests"] if d.get("annotations", {}).get(OCI_REF_NAME) == source]
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / descriptor["digest"].split(":")[1]).read_bytes())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
    config.setdefault("config", {}).setdefault("Labels", {})["io.edgelet.test.nonce"] = uuid.uuid4().hex
    manifest["config"].update(_write_blob(layout, json.dumps(config).encode()))
    new_descriptor = {"mediaType": manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json")}
    new_descriptor.update(_write_blob(layout, json.dumps(manifest).encode()))
    new_descriptor["annotations"] = {OCI_REF_NAME: ref_name, **({CONTAINERD_NAME: name} if name else {})}
    index["manifests"] = [new_descriptor]
    (layout / "index.json").write_text(json.dumps(index))
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for entry in ("oci-layout", "index.json", "blobs"):
            tar.add(layout / entry, arcname=entry)
    shutil.rmtree(layout)
    return out


def image_config_id(archive: Path) -> str:
    """The image id (config digest) of the single image in an archive written by `make_image`."""
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))
        digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{digest}"))
    return manifest["config"]["digest"]
