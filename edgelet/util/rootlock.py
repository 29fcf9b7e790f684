"""One agent per root_dir: an flock on `<root_dir>/edgelet.lock`, held for the life of the process.

Two agents on one root_dir fight over pods and checkpoints; the second one must stop before it touches
anything. flock is released by the kernel when the process dies, so a kill -9 never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os

from edgelet.util.errors import EdgeletError

LOCK_NAME = "edgelet.lock"


class RootDirLocked(EdgeletError):
    """Another agent holds root_dir."""


class RootLock:
    def __init__(self, root_dir: str):
        self.path = os.path.join(root_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Takes the lock and records our PID in it; RootDirLocked names root_dir and the holder's PID."""
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise EdgeletError(f"root_dir {os.path.dirname(self.path)}: cannot create {LOCK_NAME}: "
                               f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"PID {holder}" if holder else "another process"
            raise RootDirLocked(f"root_dir {os.path.dirname(self.path)} is in use by another edgelet ({who}); "
                                f"one agent per root_dir") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays (removing it would race a new holder)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
