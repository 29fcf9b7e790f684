"""A full disk under root_dir: root_dir is a small tmpfs the test mounts and then fills to the last byte.

While it is full a pod keeps crash-looping (its status changes, so the agent has to write) and a new pod is
added. Goal: the agent and the running pods carry on, once space is freed the writes resume (the new pod runs,
the statuses on disk are current again) and nothing under root_dir is left half-written.
"""

from __future__ import annotations

import errno
import subprocess
import time

import pytest

from edgelet.podconfig.manifest import load_manifest_file
from edgelet.util import checkpoint
from tests.chaos.harness import ChaosAgent, checkpoint_problem
from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import unmount_under

TMPFS_SIZE = "16m"
FULL_FOR_S = 8.0


def fill(directory) -> int:
    """Writes a filler file until the file system refuses; returns its size."""
    written = 0
    chunk = b"\0" * 65536
    with open(directory / "filler", "wb", buffering=0) as filler:
        while True:
            try:
                written += filler.write(chunk) or 0
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 2]


def half_written(root) -> list[str]:
    problems = []
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink() or f"/{checkpoint.CORRUPT_DIR}/" in str(path):
            continue
        if path.name.startswith(".tmp-"):
            problems.append(f"temp file left: {path.relative_to(root)}")
        elif path.suffix == checkpoint.SUFFIX:
            if problem := checkpoint_problem(path):
                problems.append(f"{path.relative_to(root)}: {problem}")
        elif path.name == "etc-hosts" and b"localhost" not in path.read_bytes():
            problems.append(f"{path.relative_to(root)} is incomplete")
    return problems


@pytest.mark.timeout(300)
def test_full_disk(tmp_path, containerd, runtime, figures):
    agent = ChaosAgent(tmp_path, containerd.endpoint, figures)
    agent.root_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(agent.root_dir)],
                   check=True)
    failures: list[str] = []
    filled = log_lines = 0
    resumed_s = 0.0
    try:
        agent.write_manifest("steady.yaml", busybox_manifest("steady", "exec sleep 3600"))
        agent.write_manifest("crasher.yaml", busybox_manifest("crasher", "echo crash; sleep 1; exit 1"))
        steady = load_manifest_file(str(agent.manifest_dir / "steady.yaml"), agent.node_name).pods[0]["metadata"]["uid"]
        agent.start()
        wait_for(lambda: runtime.view().running(steady), 60, what="the steady pod running")
        steady_ids = {c.id for c in runtime.view().running(steady)}
        offset = agent.log_size()

        filled = fill(agent.root_dir)
        agent.write_manifest("latecomer.yaml", busybox_manifest("latecomer", "exec sleep 3600"))
        time.sleep(FULL_FOR_S)
        if not agent.alive():
            failures.append("the agent exited on a full disk")
        if {c.id for c in runtime.view().running(steady)} != steady_ids:
            failures.append("the steady pod's container was replaced while the disk was full")
        full_log = agent.log_since(offset)
        log_lines = len(full_log.splitlines())
        if "No space left" not in full_log:
            failures.append("the agent never met the full disk (no write failed): the experiment proved nothing")

        (agent.root_dir / "filler").unlink()
        freed_at = time.monotonic()

        def current() -> bool:
            pods = agent.pods()
            latecomer = pods.get(f"latecomer-{agent.node_name}")
            return bool(latecomer) and latecomer["status"].get("phase") == "Running"

        try:
            wait_for(current, 60, interval=0.5, what="the new pod running and its status on disk")
        except AssertionError as err:
            failures.append(f"writes did not resume: {str(err)[-200:]}")
        resumed_s = time.monotonic() - freed_at
        time.sleep(2.0)
        failures += half_written(agent.root_dir)
        if "Traceback" in agent.log_since(offset):
            failures.append("traceback in the log")
        if not agent.alive():
            failures.append("the agent exited")
    finally:
        agent.close()
        unmount_under(tmp_path)
    figures.add("damage_cases", 1)
    figures.add("damage_failures", len(failures))
    figures.note(f"full disk: tmpfs={TMPFS_SIZE} filler={filled >> 10} KiB full_for={FULL_FOR_S:.0f}s "
                 f"log_lines_while_full={log_lines} resumed_after_s={resumed_s:.1f} failures={len(failures)}"
                 + "".join(f"\n    {f[:200]}" for f in failures))
    assert not failures, "\n".join(failures)
