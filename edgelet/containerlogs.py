"""Container logs: the runtime writes CRI-format files in the kubelet's layout; we rotate them and read them.

Layout: `<logs_dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`, rotated to
`<restart>.log.<UTC timestamp>` when larger than the configured size, keeping at most N files per
container. Reading works from the files alone, so `edgelet logs` answers when the agent is down.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import IO, Iterable, Iterator

from .errors import EdgeletError

log = logging.getLogger(__name__)

_LINE = re.compile(rb"^(\S+) (stdout|stderr) ([FP]) ?(.*)$", re.DOTALL)
ROTATED_SUFFIX = re.compile(r"\.log\.(\d{8}-\d{6}(?:\.\d+)?)$")


class LogsError(EdgeletError):
    pass


@dataclass(frozen=True, slots=True)
class LogLine:
    timestamp: str
    stream: str
    partial: bool
    text: bytes


def parse_line(raw: bytes) -> LogLine | None:
    """One CRI log line `<RFC3339Nano> <stdout|stderr> <F|P> <text>`; None when it is not one."""
    match = _LINE.match(raw.rstrip(b"\n"))
    if match is None:
        return None
    ts, stream, tag, text = match.groups()
    return LogLine(ts.decode(), stream.decode(), tag == b"P", text)


def join_partials(lines: Iterable[LogLine]) -> Iterator[bytes]:
    """Joins P (partial) lines with the F line that ends them, as the runtime split them."""
    pending: dict[str, bytes] = {}
    for line in lines:
        if line.partial:
            pending[line.stream] = pending.get(line.stream, b"") + line.text
            continue
        yield pending.pop(line.stream, b"") + line.text + b"\n"


# -- rotation -----------------------------------------------------------------------------------

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


# -- reading (edgelet logs) -------------------------------------------------------------------

def find_pod_dir(logs_dir: str, namespace: str | None, pod_name: str, node_name: str) -> str:
    """The log directory of a pod by name; a static pod may be named with or without its node suffix."""
    candidates = []
    for entry in os.listdir(logs_dir) if os.path.isdir(logs_dir) else []:
        parts = entry.split("_")
        if len(parts) != 3:
            continue
        ns, name, _uid = parts
        if namespace is not None and ns != namespace:
            continue
        if name in (pod_name, f"{pod_name}-{node_name}"):
            candidates.append(os.path.join(logs_dir, entry))
    if not candidates:
        where = f" in namespace {namespace}" if namespace else ""
        raise LogsError(f"pod {pod_name!r} not found{where} (no logs under {logs_dir})")
    return max(candidates, key=os.path.getmtime)


def container_log_files(pod_dir: str, container: str | None, previous: bool) -> list[str]:
    containers = sorted(d for d in os.listdir(pod_dir) if os.path.isdir(os.path.join(pod_dir, d)))
    if container is None:
        if len(containers) != 1:
            raise LogsError(f"a container name must be given with -c, one of: {' '.join(containers)}")
        container = containers[0]
    directory = os.path.join(pod_dir, container)
    if not os.path.isdir(directory):
        raise LogsError(f"container {container!r} not found, one of: {' '.join(containers)}")
    restarts = sorted(
        int(name[:-4]) for name in os.listdir(directory) if name.endswith(".log") and name[:-4].isdigit()
    )
    if previous:
        if len(restarts) < 2:
            raise LogsError(f"previous terminated container {container!r} not found")
        chosen = restarts[-2]
    elif restarts:
        chosen = restarts[-1]
    else:
        raise LogsError(f"no logs for container {container!r} yet")
    live = os.path.join(directory, f"{chosen}.log")
    return rotated_files(live) + [live]


def _read_lines(handle: IO[bytes]) -> Iterator[LogLine]:
    for raw in handle:
        line = parse_line(raw)
        if line is not None:
            yield line


def print_logs(config, *, namespace: str | None, pod_name: str, container: str | None,
               follow: bool, previous: bool, out) -> int:
    pod_dir = find_pod_dir(config.logs_dir, namespace, pod_name, config.node_name)
    files = container_log_files(pod_dir, container, previous)
    for path in files[:-1]:
        with open(path, "rb") as handle:
            _write(out, join_partials(_read_lines(handle)))
    live = files[-1]
    with open(live, "rb") as handle:
        _write(out, join_partials(_read_lines(handle)))
        if not follow:
            return 0
        asyncio.run(_follow(live, handle, out))
    return 0


async def _follow(path: str, handle: IO[bytes], out) -> None:
    """Tails the live file, reopening it when rotation replaced it."""
    buffer = b""
    inode = os.fstat(handle.fileno()).st_ino
    while True:
        chunk = handle.read()
        if chunk:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines = (parse_line(raw) for raw in complete)
            _write(out, join_partials(line for line in lines if line is not None))
            continue
        await asyncio.sleep(0.2)
        try:
            if os.stat(path).st_ino != inode:
                handle.close()
                handle = open(path, "rb")
                inode = os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            continue


def _write(out, chunks: Iterable[bytes]) -> None:
    for chunk in chunks:
        out.write(chunk.decode("utf-8", "replace"))
    out.flush()
