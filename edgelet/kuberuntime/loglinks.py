"""The symlinks the kubelet keeps for log collectors: `<container_logs_dir>/<pod>_<namespace>_<container>-<id>.log`
pointing at the container's current file under the pod log directory.

fluent-bit, Vector, Promtail and Alloy tail `/var/log/containers/*.log` and read the pod, namespace, container
and container id from the link's name alone. A link is made when its container is created and removed with it;
links left dangling (their pod's logs removed) are swept by the container GC, as the kubelet's
evictPodLogsDirectories does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
# ext4 (and most file systems) cap a file name at 255 bytes; the kubelet cuts the name before `.log`.
MAX_FILE_NAME = 255
# A container id may be given as short as this (the kubelet refuses shorter ones when parsing a link).
MIN_ID_LENGTH = 6


def link_name(pod_name: str, namespace: str, container_name: str, container_id: str) -> str:
    """The kubelet's link name: `<pod>_<namespace>_<container>-<id>.log`, cut to fit a file name."""
    stem = f"{pod_name}_{namespace}_{container_name}-{container_id}"
    return stem[:MAX_FILE_NAME - len(LOG_SUFFIX)] + LOG_SUFFIX


def container_id_of(name: str) -> str | None:
    """The container id a link's name ends with; None for a name that is not a link of ours (no `-`, not
    `.log`, or an id cut below 6 characters by a long name)."""
    if not name.endswith(LOG_SUFFIX) or "-" not in name:
        return None
    container_id = name[:-len(LOG_SUFFIX)].rsplit("-", 1)[1]
    return container_id if len(container_id) >= MIN_ID_LENGTH else None


def dead_links_to_remove(dead: Iterable[str], running: Mapping[str, bool]) -> list[str]:
    """Of the links whose target is gone (names), those to remove: all but a running container's, whose file
    may only be between rename and reopen of a rotation (the kubelet's rule). `running` holds every container
    the runtime knows by id, True while it runs; a short id in a name matches by prefix."""
    chosen = []
    for name in dead:
        container_id = container_id_of(name)
        if container_id is not None and _is_running(container_id, running):
            continue
        chosen.append(name)
    return chosen


def _is_running(container_id: str, running: Mapping[str, bool]) -> bool:
    if container_id in running:
        return running[container_id]
    return any(state for known, state in running.items() if known.startswith(container_id))


# -- I/O ---------------------------------------------------------------------------------------

def make_link(container_logs_dir: str, name: str, target: str) -> None:
    """Points `name` at `target`, replacing an older link of that name; a failure is logged, not raised: the
    container runs and its log is written either way (the kubelet's behaviour)."""
    path = os.path.join(container_logs_dir, name)
    try:
        os.makedirs(container_logs_dir, mode=0o755, exist_ok=True)
        try:
            os.symlink(target, path)
        except FileExistsError:
            os.unlink(path)
            os.symlink(target, path)
    except OSError as err:
        log.error("cannot link %s to the container log %s: %s", path, target, err)


def remove_link(container_logs_dir: str, name: str) -> None:
    try:
        os.unlink(os.path.join(container_logs_dir, name))
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("cannot remove the container log link %s: %s", os.path.join(container_logs_dir, name), err)


def dead_links(container_logs_dir: str) -> list[str]:
    """Names of the `*.log` links in the directory whose target no longer exists."""
    try:
        entries = list(os.scandir(container_logs_dir))
    except FileNotFoundError:
        return []
    return [entry.name for entry in entries
            if entry.name.endswith(LOG_SUFFIX) and entry.is_symlink() and not os.path.exists(entry.path)]
