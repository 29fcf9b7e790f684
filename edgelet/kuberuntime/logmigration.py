"""The one-time move of container logs from `<root_dir>/logs` (where nodes kept them before) to pod_logs_dir.

Runs at start, before the first pod sync, while running containers keep writing. No line is lost:

- on one file system each pod's directory is renamed: the runtime's open file moves with it;
- across file systems the old tree is first renamed aside, `<root_dir>/logs` made a symlink to pod_logs_dir, and
  each running container's log reopened (the runtime opens its old path, now in pod_logs_dir, afresh); only then
  is the old tree copied over, each live file as a rotated file beside its successor, so it is complete. The copy
  (gigabytes on a full node) runs beside the pods' syncs, not before them.

`<root_dir>/logs` stays a symlink to pod_logs_dir: the containers created before keep their log paths (the
runtime's, for reopening at rotation and removal at GC). The containers found get their `/var/log/containers`
links. A move cut short (power loss) resumes at the next start; a file copied twice is the worst case.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from typing import Any

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.kuberuntime.loglinks import link_name, make_link
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

STAGING_SUFFIX = ".moving"


def moved_path(path: str, legacy_dir: str, pod_logs_dir: str) -> str:
    """A log path under the old directory as it is named under the new one (others unchanged)."""
    prefix = legacy_dir.rstrip("/") + "/"
    return os.path.join(pod_logs_dir, path[len(prefix):]) if path.startswith(prefix) else path


def rotated_name(name: str, mtime: float, taken: set[str]) -> str:
    """The name a live `<n>.log` gets when kept as rotated: `<n>.log.<UTC time of its last write>`, made unique."""
    candidate = f"{name}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime(mtime))}"
    suffix = 0
    unique = candidate
    while unique in taken or unique + ".gz" in taken:
        suffix += 1
        unique = f"{candidate}.{suffix:03d}"
    return unique


async def migrate_pod_logs(legacy_dir: str, pod_logs_dir: str, container_logs_dir: str,
                           runtime: Any) -> Coroutine[Any, Any, None] | None:
    """Moves what is under legacy_dir to pod_logs_dir, so that containers write and are read there from now on;
    returns the copy of old files still to do (across file systems), to be run as a task, else None."""
    staging = legacy_dir.rstrip("/") + STAGING_SUFFIX
    resuming = os.path.isdir(staging)
    if not resuming and (os.path.islink(legacy_dir) or not os.path.isdir(legacy_dir)):
        return None
    os.makedirs(pod_logs_dir, mode=0o755, exist_ok=True)
    if not resuming and os.path.samefile(legacy_dir, pod_logs_dir):
        return None  # configured to the same place: nothing to move
    copy = None
    log.info("moving container logs from %s to %s", legacy_dir, pod_logs_dir)
    if not resuming and os.stat(legacy_dir).st_dev == os.stat(pod_logs_dir).st_dev:
        leftovers = await asyncio.to_thread(_rename_tree, legacy_dir, pod_logs_dir)
        if leftovers:
            log.warning("container logs not moved (a file of the same name is in %s): %s", pod_logs_dir,
                        ", ".join(leftovers[:10]))
        else:
            os.rmdir(legacy_dir)
            os.symlink(pod_logs_dir, legacy_dir)
    else:
        if not resuming:
            os.rename(legacy_dir, staging)
            os.symlink(pod_logs_dir, legacy_dir)
        await asyncio.to_thread(_make_dirs, staging, pod_logs_dir)
        await _reopen_running(runtime)
        copy = _copy_old_files(staging, pod_logs_dir)
    if container_logs_dir:
        await _link_containers(runtime, legacy_dir, pod_logs_dir, container_logs_dir)
    log.info("container logs are now written under %s (%s points there)", pod_logs_dir, legacy_dir)
    return copy


async def _copy_old_files(staging: str, pod_logs_dir: str) -> None:
    import shutil  # only here: it brings bz2 and lzma, which a running agent otherwise never loads

    try:
        await asyncio.to_thread(_copy_tree, staging, pod_logs_dir)
        await asyncio.to_thread(shutil.rmtree, staging, True)
    except OSError as err:  # the rest is copied at the next start
        log.error("copying the container logs of %s to %s: %s", staging, pod_logs_dir, err)
        return
    log.info("container logs of %s copied to %s", staging, pod_logs_dir)


def _rename_tree(source: str, target: str) -> list[str]:
    """Renames each entry of source into target, merging directories both have; returns files left behind."""
    leftovers = []
    for entry in os.scandir(source):
        destination = os.path.join(target, entry.name)
        if not os.path.lexists(destination):
            os.rename(entry.path, destination)
        elif entry.is_dir(follow_symlinks=False) and os.path.isdir(destination):
            leftovers += _rename_tree(entry.path, destination)
            if not leftovers:
                os.rmdir(entry.path)
        else:
            leftovers.append(entry.path)
    return leftovers


def _make_dirs(source: str, target: str) -> None:
    for directory, subdirectories, _files in os.walk(source):
        for name in subdirectories:
            os.makedirs(os.path.join(target, os.path.relpath(os.path.join(directory, name), source)), mode=0o755,
                        exist_ok=True)


def _copy_tree(source: str, target: str) -> None:
    """Copies every file of source into target, then removes it; a file whose name is taken there (a live log
    the runtime reopened in target) is kept under a rotated name."""
    import shutil
    for directory, _subdirectories, files in os.walk(source):
        into = os.path.join(target, os.path.relpath(directory, source))
        os.makedirs(into, mode=0o755, exist_ok=True)
        taken = set(os.listdir(into))
        for name in sorted(files):
            path = os.path.join(directory, name)
            final = name
            if name in taken:
                final = rotated_name(name, os.stat(path).st_mtime, taken)
            shutil.copy2(path, os.path.join(into, final))
            taken.add(final)
            os.unlink(path)


async def _reopen_running(runtime: Any) -> None:
    """Every running container of ours reopens its log (its old path now leads into pod_logs_dir)."""
    running = pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))
    for container in await runtime.list_containers(running):
        if not container.labels.get(labels.MANAGED_BY):
            continue
        try:
            await runtime.reopen_container_log(container.id)
        except EdgeletError as err:
            log.warning("container %s: reopening its log failed: %s", container.id[:13], err)


async def _link_containers(runtime: Any, legacy_dir: str, pod_logs_dir: str, container_logs_dir: str) -> None:
    """The collectors' links of the containers that were there before the move."""
    for container in await runtime.list_containers():
        found = container.labels
        if not found.get(labels.MANAGED_BY):
            continue
        try:
            status = await runtime.container_status(container.id)
        except EdgeletError:
            continue
        target = moved_path(status.log_path, legacy_dir, pod_logs_dir)
        if status.log_path and os.path.exists(target):
            make_link(container_logs_dir, link_name(found.get(labels.POD_NAME, ""), found.get(labels.POD_NAMESPACE, ""),
                                                    found.get(labels.CONTAINER_NAME) or container.metadata.name,
                                                    container.id), target)
