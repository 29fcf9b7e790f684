"""A power cut at each write point of the agent's writers: the process is killed before and after every
file-system call (write-temp, fsync, rename, fsync-dir, ...), and a write is torn in half where it is cut.

After every cut the file (or volume) must read as the old or the new version, never a mix or nothing, and the
next write must succeed and leave no debris. A completed write must fsync the data before the rename and the
directory after it, or a real power cut could lose what a process kill cannot show.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.chaos.power_cut_writers import WRITERS, expected_view, prepare, read_back
from tests.integration.agent_harness import REPO

MAX_STEPS = 400


def cut(writer: str, directory: str, kill_step: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "tests.chaos.power_cut_child", writer, directory, "new",
                           str(kill_step)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def debris(writer: str, directory: str) -> list[str]:
    """What a completed write should not leave beside the file or volume."""
    names = sorted(os.listdir(directory))
    if writer == "volume":
        data_dirs = [n for n in names if n.startswith("..") and n not in ("..data",)]
        return data_dirs[1:] if len(data_dirs) == 1 else data_dirs
    return [n for n in names if n.startswith(".")]


def reads_as_one_version(writer: str, seen: object, old: object, new: object) -> bool:
    if writer == "checkpoint-batch":  # each key is one version, whole; a cut may fall between two keys
        return all(value in (before, after) for value, before, after in zip(seen, old, new))
    if writer != "volume":
        return seen in (old, new)
    # Between the ..data swap and the new top-level links a file the new version adds is not visible yet (the
    # kubelet's writer has the same window; the next sync adds it). What is visible must be one version, whole.
    return "same" in seen and any(all(version.get(name) == data for name, data in seen.items()) for version in (old,
                                                                                                                new))


@pytest.mark.parametrize("writer", WRITERS)
def test_power_cut_at_every_write_point(tmp_path, writer, figures):
    original = tmp_path / "original"
    prepare(writer, str(original), "old")()
    old, new = expected_view(writer, "old"), expected_view(writer, "new")
    failures: list[str] = []
    trace: list[str] = []
    cases = 0
    for kill_step in range(1, MAX_STEPS):
        directory = tmp_path / f"cut-{kill_step}"
        shutil.copytree(original, directory, symlinks=True)
        result = cut(writer, str(directory), kill_step)
        if result.returncode == 0:
            trace = result.stdout.split("\n")
            break
        cases += 1
        if result.returncode != -9:
            failures.append(f"step {kill_step}: the writer failed: {result.stderr[-300:]}")
            continue
        seen = read_back(writer, str(directory))
        if not reads_as_one_version(writer, seen, old, new):
            failures.append(f"step {kill_step}: reads as neither version: {str(seen)[:100]}")
        prepare(writer, str(directory), "new")()
        if read_back(writer, str(directory)) != new:
            failures.append(f"step {kill_step}: the next write did not take")
        if left := debris(writer, str(directory)):
            failures.append(f"step {kill_step}: the next write left {left}")
        shutil.rmtree(directory)
    else:
        failures.append(f"the write never completed within {MAX_STEPS} steps")
    calls = [line.split(" ")[0] for line in trace]
    # Volume files live on tmpfs or are rewritten on every sync, and a pod's hosts file is compared and rewritten
    # before every container start that mounts it: no fsync, as the kubelet. Checkpoints must be durable.
    if writer not in ("volume", "etc-hosts"):
        renamed = max((i for i, call in enumerate(calls) if call in ("replace", "rename")), default=-1)
        if renamed < 0 or "fsync" not in calls[:renamed] or "fsync" not in calls[renamed:]:
            failures.append(f"no fsync of the data before the rename and of the directory after it: {calls}")
    figures.add("damage_cases", cases)
    figures.add("damage_failures", len(failures))
    figures.note(f"power cut {writer}: cut points={cases} failures={len(failures)}"
                 + "".join(f"\n    {f[:160]}" for f in failures[:10]))
    assert not failures, "\n".join(failures)
