"""Size-based rotation of the containers' CRI log files, as the kubelet's container log manager does it:
`<restart>.log` larger than the configured size becomes `<restart>.log.<UTC timestamp>`, and at most
N files per container are kept."""

from __future__ import annotations

import glob
import logging
import os
import re
import time
from collections.abc import Iterable

from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

ROTATED_SUFFIX = re.compile(r"\.log\.(\d{8}-\d{6}(?:\.\d+)?)$")


def rotated_files(path: str) -> list[str]:
    """Rotated siblings of a live log file, oldest first."""
    files = [p for p in glob.glob(glob.escape(path) + ".*") if ROTATED_SUFFIX.search(p)]
    return sorted(files)


def files_to_delete(rotated: list[str], max_files: int) -> list[str]:
    """Keep the live file plus max_files - 1 rotated ones (the kubelet's containerLogMaxFiles)."""
    keep = max(max_files - 1, 0)
    return rotated[: max(len(rotated) - keep, 0)]


class LogRotator:
    """Rotates the live log files of running containers that grew past max_size."""

    def __init__(self, runtime, *, max_size: int, max_files: int, clock=time.time):
        self._runtime = runtime
        self._max_size = max_size
        self._max_files = max_files
        self._clock = clock

    async def rotate(self, containers: Iterable[tuple[str, str]]) -> int:
        """containers: (container id, absolute log path) of running containers. Returns rotations done."""
        rotated = 0
        for container_id, path in containers:
            try:
                if not path or os.stat(path).st_size <= self._max_size:
                    continue
            except FileNotFoundError:
                continue
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self._clock()))
            target = f"{path}.{stamp}"
            if os.path.exists(target):
                target = f"{target}.{int(self._clock() * 1000) % 1000:03d}"
            os.rename(path, target)
            try:
                await self._runtime.reopen_container_log(container_id)
            except EdgeletError as exc:
                # The runtime keeps writing the renamed file; undo so no line is lost.
                log.warning("reopening the log of %s failed, rotation undone: %s", container_id[:13], exc)
                os.rename(target, path)
                continue
            for old in files_to_delete(rotated_files(path), self._max_files):
                os.unlink(old)
            rotated += 1
        return rotated
