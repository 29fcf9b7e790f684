"""The agent's writers the power-cut experiment interrupts, each with its two versions and what a reader sees."""

from __future__ import annotations

import os
from collections.abc import Callable

from edgelet.util.checkpoint import CheckpointStore
from edgelet.volumes.atomic_writer import FileProjection, write_payload

WRITERS = ("checkpoint", "checkpoint-batch", "volume", "etc-hosts")
KEY = "0123abcd-pod"
BATCH_KEYS = ("0123abcd-pod", "4567efab-pod", "89abcdef-pod")  # the last one is deleted by the new version
KIND = "pod-status"


def version_bytes(version: str) -> bytes:
    return (f'{{"version": "{version}", "padding": "' + version * 3000 + '"}').encode()


def volume_payload(version: str) -> dict[str, FileProjection]:
    # Both versions hold a file the other lacks, so a mixed view would show.
    return {"same": FileProjection(version_bytes(version)), f"only-{version}": FileProjection(version.encode()),
            "dir/nested": FileProjection(version.encode() * 100)}


def prepare(writer: str, directory: str, version: str) -> Callable[[], None]:
    """The write of `version` into `directory`, ready to call (set-up I/O done outside the hooks)."""
    if writer == "checkpoint":
        store = CheckpointStore(directory, kind=KIND)
        return lambda: store.write(KEY, version_bytes(version))
    if writer == "checkpoint-batch":  # the status manager's batch: two writes and, in the new version, a delete
        store = CheckpointStore(directory, kind=KIND)
        changes = dict(zip(BATCH_KEYS, batch_view(version)))
        return lambda: store.write_many(changes)
    if writer == "volume":
        os.makedirs(directory, exist_ok=True)
        return lambda: write_payload(directory, volume_payload(version))
    if writer == "etc-hosts":
        from edgelet.volumes.hosts import write_hosts_file

        os.makedirs(directory, exist_ok=True)
        return lambda: write_hosts_file(os.path.join(directory, "etc-hosts"), version_bytes(version))
    raise ValueError(writer)


def read_back(writer: str, directory: str) -> object:
    """What a reader (the agent after a restart, or a container) sees: compared with each version's view."""
    if writer == "checkpoint":
        return CheckpointStore(directory, kind=KIND).read(KEY)
    if writer == "checkpoint-batch":
        store = CheckpointStore(directory, kind=KIND)
        return tuple(store.read(key) for key in BATCH_KEYS)
    if writer == "volume":
        view = {}
        for name in ("same", "only-old", "only-new", "dir/nested"):
            path = os.path.join(directory, name)
            if os.path.exists(path):
                with open(path, "rb") as file:
                    view[name] = file.read()
        return view
    with open(os.path.join(directory, "etc-hosts"), "rb") as file:
        return file.read()


def batch_view(version: str) -> tuple[bytes | None, ...]:
    return (version_bytes(version), version_bytes(version + "2"), version_bytes(version) if version == "old" else None)


def expected_view(writer: str, version: str) -> object:
    if writer == "checkpoint-batch":
        return batch_view(version)
    if writer == "volume":
        return {name: projection.data for name, projection in volume_payload(version).items()}
    return version_bytes(version)
