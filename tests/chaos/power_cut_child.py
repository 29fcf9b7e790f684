"""The child of the power-cut experiment: runs one real writer of the agent and SIGKILLs itself at a given step.

    python -m tests.chaos.power_cut_child WRITER DIRECTORY VERSION KILL_STEP

Every file-system call the writer makes (open, write, fsync, close, rename, ...) is two steps: before and after
it. At KILL_STEP the process kills itself with SIGKILL; a kill before a write of more than a byte first writes
half of it (a torn write). A run that reaches the end prints the calls it made, one per line.
"""

from __future__ import annotations

import os
import signal
import sys

from tests.chaos import power_cut_writers

_HOOKED = ("open", "write", "fsync", "close", "replace", "rename", "symlink", "unlink", "fchmod", "chmod", "mkdir",
           "rmdir", "truncate", "ftruncate")


def main(writer: str, directory: str, version: str, kill_step: int) -> None:
    step = 0
    trace: list[str] = []
    real = {name: getattr(os, name) for name in _HOOKED}

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def hooked(name: str):
        def call(*args, **kwargs):
            nonlocal step
            step += 1
            if step == kill_step:
                if name == "write" and len(args[1]) > 1:
                    real["write"](args[0], bytes(args[1])[: len(args[1]) // 2])
                die()
            result = real[name](*args, **kwargs)
            trace.append(f"{name} {os.path.basename(str(args[0])) if args and not isinstance(args[0], int) else ''}")
            step += 1
            if step == kill_step:
                die()
            return result
        return call

    prepared = power_cut_writers.prepare(writer, directory, version)
    for name in _HOOKED:
        setattr(os, name, hooked(name))
    prepared()
    for name, function in real.items():
        setattr(os, name, function)
    print("\n".join(trace))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
