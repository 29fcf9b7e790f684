"""Size-based rotation of the containers' CRI log files, as the kubelet's container log manager does it.

A live `<restart>.log` larger than the configured size is renamed `<restart>.log.<UTC YYYYmmdd-HHMMSS>` and the
runtime reopens the live name; the rotated file before it is gzipped to `<...>.gz` at that point (the newest
rotated file stays plain, so a collector still reading it finishes), and at most N files per container are kept,
the live one included (the kubelet's containerLogMaxSize and containerLogMaxFiles).
"""

from __future__ import annotations

import asyncio
import glob
import gzip
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import IO, cast

from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

COMPRESS_SUFFIX = ".gz"
TMP_SUFFIX = ".tmp"  # a compression under way (or cut short by a crash)
ROTATED_SUFFIX = re.compile(r"\.log\.(\d{8}-\d{6}(?:\.\d+)?)(?:\.gz)?$")
_LEFT_OVER = re.compile(r"\.log\.\d{8}-\d{6}(?:\.\d+)?(?:\.gz)?\.tmp$")


def _age_key(path: str) -> str:
    return path.removesuffix(COMPRESS_SUFFIX)


def rotated_files(path: str) -> list[str]:
    """Rotated siblings of a live log file (plain or gzipped), oldest first."""
    files = [p for p in glob.glob(glob.escape(path) + ".*") if ROTATED_SUFFIX.search(p)]
    return sorted(files, key=_age_key)


def open_log_file(path: str) -> IO[bytes]:
    """A rotated log file for reading its lines, a gzipped one unpacked on the fly; a plain one gzipped since it
    was listed is read from its .gz."""
    if path.endswith(COMPRESS_SUFFIX):
        return _gunzip(path)
    try:
        return open(path, "rb")
    except FileNotFoundError:
        return _gunzip(path + COMPRESS_SUFFIX)


def _gunzip(path: str) -> IO[bytes]:
    # A GzipFile reads as a binary file does; typeshed types it as a BufferedIOBase, not an IO[bytes].
    return cast(IO[bytes], gzip.open(path, "rb"))


def plan_rotation(siblings: list[str], max_files: int) -> tuple[list[str], list[str]]:
    """Before rotating a live file: (files to delete, files to gzip) among its siblings `<live>.*`, as the
    kubelet's rotateLog decides: left-over temporary files and plain files whose .gz exists go; of the rest the
    oldest go until max_files - 2 remain (the live file and the one about to be rotated make max_files); the
    plain ones kept are gzipped."""
    in_use: list[str] = []
    unused: list[str] = []
    names = set(siblings)
    for path in siblings:
        if path.endswith(TMP_SUFFIX) and _LEFT_OVER.search(path):
            unused.append(path)
        elif ROTATED_SUFFIX.search(path):
            (unused if path + COMPRESS_SUFFIX in names else in_use).append(path)
    in_use.sort(key=_age_key)
    excess = max(len(in_use) - max(max_files - 2, 0), 0)
    delete = unused + in_use[:excess]
    kept = in_use[excess:]
    return delete, [path for path in kept if not path.endswith(COMPRESS_SUFFIX)]


def compress(path: str) -> None:
    """`path` to `path.gz` through a temporary file, then `path` removed (blocking: run in a thread)."""
    tmp = path + COMPRESS_SUFFIX + TMP_SUFFIX
    try:
        with open(path, "rb") as source, open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as packed:
            while chunk := source.read(256 * 1024):
                packed.write(chunk)
        os.rename(tmp, path + COMPRESS_SUFFIX)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    os.unlink(path)


def _tidy(live: str, max_files: int) -> None:
    """Deletes and gzips what plan_rotation says for the siblings of `live` (blocking: run in a thread)."""
    delete, pack = plan_rotation(glob.glob(glob.escape(live) + ".*"), max_files)
    for path in delete:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    for path in pack:
        compress(path)


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
            # The older rotated files are deleted and gzipped first, in a thread: gzip of a 10 MiB file is CPU.
            await asyncio.to_thread(_tidy, path, self._max_files)
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self._clock()))
            target = f"{path}.{stamp}"
            if os.path.exists(target) or os.path.exists(target + COMPRESS_SUFFIX):
                target = f"{target}.{int(self._clock() * 1000) % 1000:03d}"
            os.rename(path, target)
            try:
                await self._runtime.reopen_container_log(container_id)
            except EdgeletError as exc:
                # The runtime keeps writing the renamed file; undo so no line is lost.
                log.warning("reopening the log of %s failed, rotation undone: %s", container_id[:13], exc)
                os.rename(target, path)
                continue
            rotated += 1
        return rotated
